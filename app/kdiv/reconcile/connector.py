"""Spark's own kafka connector for the nightly job: the jars `kdiv fetch-jars` cached (kdiv.maven's
spark-kafka bundle). Nothing is downloaded here: the job uses the jars when they are in the cache
and were built for the pyspark it runs on, and reads through kdiv's Python data source otherwise.

Imports neither pyspark nor Kafka clients: `kdiv reconcile` asks before it starts spark-submit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib import metadata

from kdiv.maven import FETCH_COMMAND, SPARK_KAFKA

JARS_CONF = "spark.jars"


def spark_version() -> str:
    """The installed pyspark's version, without importing it."""
    return metadata.version("pyspark")


def spark_kafka_jars() -> list[str]:
    """The connector's jars for this pyspark, or [] when not fetched or fetched for another release
    (a connector of another Spark release fails on the first read, not at start)."""
    if not SPARK_KAFKA.is_fetched() or SPARK_KAFKA.version != spark_version():
        return []
    return [str(path) for path in SPARK_KAFKA.jars()]


def why_missing() -> str:
    """What to do when the connector is wanted but not there."""
    if SPARK_KAFKA.version != spark_version():
        return (
            f"kdiv fetches Spark's kafka connector {SPARK_KAFKA.version}, and this is Spark {spark_version()} "
            f"(install kdiv[spark], which pins pyspark to {SPARK_KAFKA.version})"
        )
    if not SPARK_KAFKA.is_fetched():
        return f"run `{FETCH_COMMAND}` once (Maven fetches it into {SPARK_KAFKA.directory})"
    return (
        f"its jars are in {SPARK_KAFKA.directory}, but this Spark was started without them: start the job "
        "with `kdiv reconcile`, or give spark-submit `--jars` with them"
    )


def with_jars(conf: Mapping[str, str], jars: Sequence[str]) -> dict[str, str]:
    """`conf` with `jars` appended to spark.jars (the caller's own jars kept first)."""
    merged = dict(conf)
    if jars:
        given = [j for j in merged.get(JARS_CONF, "").split(",") if j]
        merged[JARS_CONF] = ",".join([*given, *(j for j in jars if j not in given)])
    return merged
