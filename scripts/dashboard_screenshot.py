"""Make docs/dashboard.png: the overview of a running node while a small load runs.

    .venv/bin/python scripts/dashboard_screenshot.py --key admin:SECRET \\
        [--http 127.0.0.1:18083] [--mqtt 127.0.0.1:1883] [--seconds 110] [--out docs/dashboard.png]

The load is bounded: a few subscribers on demo/#, a few publishers whose
pace swings between about 50 and 350 messages a second for --seconds, and
clients that come and go, so every chart has something to show. Needs the
test extra (paho-mqtt, selenium) and Debian's chromium + chromium-driver,
as the browser tests do (scripts/setup.sh installs them).
"""

from __future__ import annotations

import argparse
import math
import threading
import time

import paho.mqtt.client as mqtt
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

SUBSCRIBERS = 4
PUBLISHERS = 3
VISITORS = 6  # clients that come and go: at most this many at once,
VISIT_EVERY_S = 4  # one more every 4 s (the oldest then leaves)


def client(host: str, port: int, name: str) -> mqtt.Client:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=name)
    c.connect(host, port)
    c.loop_start()
    return c


def load(host: str, port: int, seconds: float, stop: threading.Event) -> None:
    subs = [client(host, port, f"demo-sub-{i}") for i in range(SUBSCRIBERS)]
    for s in subs:
        s.subscribe("demo/#", qos=0)
    pubs = [client(host, port, f"demo-pub-{i}") for i in range(PUBLISHERS)]
    visitors: list[mqtt.Client] = []
    start = time.monotonic()
    sent = arrived = 0
    while not stop.is_set() and (elapsed := time.monotonic() - start) < seconds:
        rate = 200 + 150 * math.sin(elapsed / 8)  # messages a second, all publishers
        pubs[sent % PUBLISHERS].publish(f"demo/{sent % 10}/reading", b"%d" % sent, qos=0)
        sent += 1
        if elapsed > VISIT_EVERY_S * arrived:  # one more visitor; the oldest leaves
            arrived += 1
            visitors.append(client(host, port, f"demo-visitor-{arrived}"))
            if len(visitors) > VISITORS:
                gone = visitors.pop(0)
                gone.loop_stop()
                gone.disconnect()
        time.sleep(1 / rate)
    for c in subs + pubs + visitors:
        c.loop_stop()
        c.disconnect()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key", required=True, help="key:secret of an API key")
    parser.add_argument("--http", default="127.0.0.1:18083")
    parser.add_argument("--mqtt", default="127.0.0.1:1883")
    parser.add_argument("--seconds", type=float, default=110.0)
    parser.add_argument("--out", default="docs/dashboard.png")
    args = parser.parse_args()
    key, _, secret = args.key.partition(":")
    host, _, port = args.mqtt.rpartition(":")

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    stop = threading.Event()
    worker = threading.Thread(target=load, args=(host, int(port), args.seconds + 10, stop))
    try:
        driver.get(f"http://{args.http}/#/overview")
        driver.find_element(By.ID, "login-key").send_keys(key)
        driver.find_element(By.ID, "login-secret").send_keys(secret)
        driver.find_element(By.ID, "login-submit").click()
        WebDriverWait(driver, 20).until(lambda d: d.find_element(By.ID, "app").is_displayed())
        worker.start()
        time.sleep(args.seconds)  # the charts fill: this is the picture, not a wait for a state
        driver.find_element(By.CSS_SELECTOR, "main h2").click()  # nothing hovered in the picture
        driver.save_screenshot(args.out)
        print(f"wrote {args.out}")
    finally:
        stop.set()
        if worker.is_alive():
            worker.join()
        driver.quit()


if __name__ == "__main__":
    main()
