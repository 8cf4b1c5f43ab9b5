"""The reconciliation job's SparkSession."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from typing import Any

from pyspark.sql import SparkSession

from kdiv.reconcile.connector import spark_kafka_jars, with_jars

DEFAULT_MASTER = "local[2]"

# The job's tables are small next to what Spark's default of 200 shuffle partitions is for.
_SHUFFLE_PARTITIONS = 8

_DEFAULT_CONF: dict[str, str] = {
    "spark.sql.shuffle.partitions": str(_SHUFFLE_PARTITIONS),
    "spark.ui.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    # Quiet from the start; setLogLevel only applies once the context is up.
    "spark.log.level": "WARN",
}


def master_set_outside(environ: Mapping[str, str] = os.environ) -> bool:
    """True when something other than the caller chose the master: spark-submit (which
    started this Python with a gateway to its JVM, whose master is its --master, its
    spark-defaults.conf or its own default), PYSPARK_SUBMIT_ARGS, or Spark's MASTER variable.
    A SparkConf made before the context exists cannot tell: it sees none of these."""
    if environ.get("PYSPARK_GATEWAY_PORT") or environ.get("MASTER"):
        return True
    words = shlex.split(environ.get("PYSPARK_SUBMIT_ARGS", ""))
    return any(word == "--master" or word.startswith(("--master=", "spark.master=")) for word in words)


def build_session(
    master: str | None = None,
    app_name: str = "kdiv-reconcile",
    conf: Mapping[str, Any] | None = None,
) -> SparkSession:
    """A SparkSession with kdiv's data sources registered, and Spark's kafka connector when
    `kdiv fetch-jars` cached it for this pyspark. `conf` overrides the defaults.

    `master`: the caller's wins; None keeps the one chosen outside (`master_set_outside`),
    else local[2]."""
    if master is None and not master_set_outside():
        master = DEFAULT_MASTER
    # Without it, workers may start with the system python (no pyarrow, no kdiv).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master is not None and master.startswith("local"):
        # A laptop's hostname may resolve to an address nothing listens on; on a cluster the
        # executors must reach the driver, so loopback is for local mode only.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    settings = {**_DEFAULT_CONF, **(conf or {})}
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        # This process starts the JVM, which puts spark.jars on the driver's classpath too. Under
        # spark-submit the JVM runs already and jars set now would reach the executors only:
        # `kdiv reconcile` hands them to spark-submit instead.
        settings = with_jars(settings, spark_kafka_jars())
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register_sources(spark)
    return spark


def register_sources(spark: SparkSession) -> None:
    """Register kdiv's Python data sources ("kdiv_kafka") with `spark`."""
    from kdiv.reconcile.kafka_source import register_source

    register_source(spark)
