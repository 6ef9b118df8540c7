"""The dashboard in headless Chromium (Debian chromium + chromium-driver, Selenium).

`Dashboard` is one browser (a fresh profile) on one node's page, with the
few moves the tests make: log in, go to a page, wait for text, accept a
confirm(), save a screenshot. Waits poll the page with a deadline
(WebDriverWait), never sleep.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_S = 20.0  # a page answers in milliseconds; a shared two-core machine may stall
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,1000",
)


def missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if shutil.which(CHROMIUM) is None or shutil.which(CHROMEDRIVER) is None:
        return "chromium / chromium-driver are not installed (scripts/setup.sh installs them)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (requirements.lock)"
    return None


class Dashboard:
    def __init__(self, base_url: str) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self.base_url = base_url
        self.profile = tempfile.TemporaryDirectory(prefix="weir-dashboard-")
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in (*FLAGS, f"--user-data-dir={self.profile.name}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))

    def quit(self) -> None:
        self.driver.quit()
        self.profile.cleanup()

    # -- moves -------------------------------------------------------------

    def logged_out(self) -> None:
        """The login form, with no key kept from an earlier test: log out as a
        user does (clearing the storage under the page would race its own
        login, still under way, which stores the key when it succeeds)."""
        self.driver.get(self.base_url)

        def settled() -> bool:
            return bool(self.by_id("login").is_displayed() or self.by_id("app").is_displayed())

        self.wait(settled, "the page to ask for a key or show the dashboard")
        if self.by_id("app").is_displayed():
            self.by_id("logout").click()
        self.wait(lambda: self.by_id("login").is_displayed(), "the login form")
        assert self.driver.execute_script("return sessionStorage.length") == 0

    def log_in(self, key: str, secret: str) -> None:
        self.logged_out()
        self.by_id("login-key").send_keys(key)
        self.by_id("login-secret").send_keys(secret)
        self.by_id("login-submit").click()

    def go(self, hash_path: str) -> None:
        """Open a page (#/clients...) and wait for its heading."""
        self.driver.get(self.base_url + hash_path)
        self.wait(lambda: self.by_id("app").is_displayed(), "the dashboard")
        # The page made for this hash (not the one before it, still shown until
        # the hashchange event runs), with its heading.
        heading = f'main[data-hash="{hash_path}"] h2'
        self.wait(lambda: self.css(heading) is not None, f"the page {hash_path}")

    def accept_confirm(self) -> str:
        from selenium.webdriver.support import expected_conditions
        from selenium.webdriver.support.ui import WebDriverWait

        alert = WebDriverWait(self.driver, WAIT_S).until(expected_conditions.alert_is_present())
        text: str = alert.text
        alert.accept()
        return text

    def shot(self, folder: Path, name: str) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.png"
        assert self.driver.save_screenshot(str(path)), path
        print(f"screenshot: {path}")
        return path

    # -- reading the page ----------------------------------------------------

    def by_id(self, element_id: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.ID, element_id)

    def css(self, selector: str) -> Any:
        from selenium.webdriver.common.by import By

        found = self.driver.find_elements(By.CSS_SELECTOR, selector)
        return found[0] if found else None

    def all(self, selector: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return list(self.driver.find_elements(By.CSS_SELECTOR, selector))

    def rows(self) -> list[list[str]]:
        """The cells' text of the page's first table body."""
        return [[td.text for td in tr.find_elements("css selector", "td")]
                for tr in self.all("main table tbody tr")]  # fmt: skip

    def row_button(self, first_cell: str, label: str) -> Any:
        """The button `label` in the row whose first cell is `first_cell`."""
        for tr in self.all("main table tbody tr"):
            cells = tr.find_elements("css selector", "td")
            if cells and cells[0].text == first_cell:
                for b in tr.find_elements("css selector", "button"):
                    if b.text == label:
                        return b
        raise AssertionError(f"no {label!r} button in a row {first_cell!r}: {self.rows()}")

    def notice(self) -> str:
        box = self.by_id("notice")
        return str(box.text) if box.is_displayed() else ""

    def wait(self, check: Callable[[], object], what: str, timeout: float = WAIT_S) -> None:
        from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
        from selenium.webdriver.support.ui import WebDriverWait

        try:
            WebDriverWait(self.driver, timeout, ignored_exceptions=(
                StaleElementReferenceException,)).until(lambda _: check())  # fmt: skip
        except TimeoutException:
            raise AssertionError(f"timed out waiting for {what}; notice: {self.notice()!r}, "
                                 f"rows: {self.rows()}") from None  # fmt: skip

    def script_errors(self) -> list[str]:
        """The page's uncaught JavaScript errors since the last call."""
        return [e["message"] for e in self.driver.get_log("browser") if e["source"] == "javascript"]
