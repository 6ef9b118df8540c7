"""How the suite is shared among pytest-xdist workers, and its two parts.

scripts/test.sh runs the suite in two parts: `--part parallel` on two xdist
workers (`-n 2`), then `--part serial` in one process. Most tests wait on
sockets, subprocesses and timers rather than the CPU, so two workers on two
cores overlap their waits. A test marked `serial` runs alone, as it always
did: the SIGKILL chaos runs load the whole machine against a deadline
(nodes at 1,000 msg/s), and the partition tests fill in a table that their
process prints at the end (a worker's would be lost). Plain `pytest` (no `--part`, no `-n`)
still runs every test in one process.

On the workers (`pytest_xdist_make_scheduler`), each test is its own unit
of work, handed to whichever worker is free, except:

- the tests that run a JVM (SPARK: the Spark modules, each with a
  SparkSession of its own, and test_verify, whose fixture runs the state
  job) are one unit, so one worker runs them one after the other and never
  has a second JVM beside it (two local Spark sessions at once, under load,
  ran past pytest-timeout's 300 s);
- a module that shares a module- or class-scoped fixture (a `weir up`, a
  browser, a cluster; found by reading the module and its conftests) is a
  unit of its own: its fixture starts once, and a test that relies on what
  an earlier one left there still finds it, as in a serial run.

xdist deals the units with the most tests first, so those start early
rather than last. (xdist's `xdist_group` mark cannot do this here: under
pytest 9 it no longer reaches the scheduler, as xdist 3.8 renames
`item._nodeid`, which pytest 9 ignores.)
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import pytest

PARTS = ("all", "parallel", "serial")
SPARK = ("tests/streams/", "tests/integration/test_verify.py")  # one unit: one JVM at a time
SHARED_SCOPE = re.compile(r"""scope\s*=\s*["'](module|class|package)["']""")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--part",
        choices=PARTS,
        default="all",
        help="parallel: leave out the tests marked serial; serial: only those (scripts/test.sh)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    part = config.getoption("--part")
    if part == "all":
        return
    wanted = part == "serial"
    keep = [item for item in items if _serial(item) == wanted]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if _serial(i) != wanted])
        items[:] = keep


def _serial(item: pytest.Item) -> bool:
    return item.get_closest_marker("serial") is not None


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, called only with -n
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "load":  # -n without --dist; another --dist is xdist's own
        return None
    from xdist.scheduler import LoadScopeScheduling

    root = config.rootpath

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(SPARK):
                return "spark"
            module = nodeid.split("::", 1)[0]
            return module if _shares_fixtures(root, module) else nodeid

    return Units(config, log)


@functools.cache
def _shares_fixtures(root: Path, module: str) -> bool:
    """Whether the module, or a conftest.py on its way down from tests/, declares a
    fixture wider than a test (other than the session's, which every worker has)."""
    path = root / module
    sources = [path, *(d / "conftest.py" for d in path.parents if d.is_relative_to(root / "tests"))]
    return any(SHARED_SCOPE.search(p.read_text()) for p in sources if p.is_file())
