"""The reconciliation job's SparkSession."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from pyspark.sql import SparkSession

# The job's tables are small next to what Spark's default of 200 shuffle partitions is for.
_SHUFFLE_PARTITIONS = 8

_DEFAULT_CONF: dict[str, str] = {
    "spark.sql.shuffle.partitions": str(_SHUFFLE_PARTITIONS),
    "spark.ui.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    # Quiet from the start; setLogLevel only applies once the context is up.
    "spark.log.level": "WARN",
}


def build_session(
    master: str = "local[2]",
    app_name: str = "kdiv-reconcile",
    conf: Mapping[str, Any] | None = None,
) -> SparkSession:
    """A SparkSession with kdiv's data sources registered. `conf` overrides the defaults."""
    # Without these, workers may start with the system python (no pyarrow, no kdiv) and the
    # driver may bind to an address the executors cannot reach.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**_DEFAULT_CONF, **(conf or {})}.items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register_sources(spark)
    return spark


def register_sources(spark: SparkSession) -> None:
    """Register kdiv's Python data sources ("kdiv_kafka") with `spark`."""
    from kdiv.reconcile.kafka_source import register_source

    register_source(spark)
