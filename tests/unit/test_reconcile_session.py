"""Which Spark master the nightly job's session takes."""

from __future__ import annotations

import pytest

from kdiv.reconcile.session import master_set_outside


@pytest.mark.parametrize(
    "environ",
    [
        # spark-submit starts the driver's Python with a gateway to its own JVM.
        {"PYSPARK_GATEWAY_PORT": "41234", "PYSPARK_GATEWAY_SECRET": "s"},
        {"PYSPARK_SUBMIT_ARGS": "--master spark://h:7077 pyspark-shell"},
        {"PYSPARK_SUBMIT_ARGS": "--master=yarn pyspark-shell"},
        {"PYSPARK_SUBMIT_ARGS": "--conf spark.master=local[3] pyspark-shell"},
        {"MASTER": "spark://h:7077"},
    ],
)
def test_a_master_chosen_outside_is_seen(environ):
    assert master_set_outside(environ)


@pytest.mark.parametrize(
    "environ",
    [{}, {"PYSPARK_SUBMIT_ARGS": "--driver-memory 2g pyspark-shell"}, {"PYSPARK_SUBMIT_ARGS": ""}],
)
def test_nothing_outside_leaves_the_default(environ):
    assert not master_set_outside(environ)
