"""One local SparkSession per test module (start costs 5-15 s here), marked `spark`."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/streams/" in str(item.fspath):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    from streams.spark import session

    # Python workers (UDFs, the Python data source) need this interpreter's
    # packages: Spark would start the first `python3` on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = session("weir-tests")
    try:
        yield spark
    finally:
        spark.stop()
