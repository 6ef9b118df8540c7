"""The SparkSession every Weir job and test uses: local mode sized for a small machine.

`session(app)` builds (or returns the running) SparkSession. Without a
master from the environment (`spark-submit --master ...` or
WEIR_SPARK_MASTER) it runs `local[N]` on this machine's cores, with the
settings that matter on two cores: few shuffle partitions (the default 200
turns a 1,000-row batch into 200 tasks), no UI, and Spark's own logging
held at WARN so a job's output stays readable. Its Python workers run the
interpreter that runs the job (`sys.executable`), so a job started from a
virtualenv that is not activated still finds its packages.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SHUFFLE_PARTITIONS: Final = 4  # small batches: a few tasks each, not Spark's default 200
DRIVER_MEMORY: Final = "2g"  # measured: the state-store job peaks near 2 GiB (KAFKA-NOTES)


def session(app: str, *, master: str | None = None) -> SparkSession:
    from pyspark.sql import SparkSession

    # Spark's Python workers run this interpreter (its virtualenv has pyarrow and
    # confluent-kafka), not whichever `python3` comes first on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app).config("spark.pyspark.python", sys.executable)
    master = master or os.environ.get("WEIR_SPARK_MASTER")
    if master is not None:
        builder = builder.master(master)
    elif not os.environ.get("SPARK_HOME"):  # not under spark-submit: run locally
        builder = builder.master(f"local[{os.cpu_count() or 2}]")
    spark = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # no progress bars in job logs
        .config("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
        .config("spark.driver.memory", DRIVER_MEMORY)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    return spark
