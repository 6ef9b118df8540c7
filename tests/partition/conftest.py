"""The partition suite's cluster: one per module (building it takes a few seconds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.partition.cluster import Cluster, build
from tests.partition.netns import NetnsUnavailable


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("partition")
    try:
        built = build(work)
    except NetnsUnavailable as exc:
        print(f"\npartition tests skipped: cannot make network namespaces ({exc})")
        pytest.skip(f"cannot make network namespaces: {exc}")
    try:
        yield built
    finally:
        built.topology.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The issue's table, from this run: one row per fault the suite made."""
    from tests.partition.test_partitions import ROWS

    if not ROWS:
        return
    write = terminalreporter.write_line
    write("")
    write("| fault | what clients saw | acked lost | duplicates | wills | time to converge |")
    write("|---|---|---|---|---|---|")
    for row in ROWS:
        write(row.row())
