"""A unit test that asks for a broker, a registry or Spark fails at once, saying what to do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

ASKING = """
def test_asks_through_a_fixture(topic_factory):
    pass


def test_asks_for_each_registry(each_registry_url):
    pass


def test_asks_for_spark(spark):
    pass


def test_asks_for_nothing():
    pass
"""


def test_a_unit_test_asking_for_a_broker_registry_or_spark_fails_naming_what_it_asked_for(tmp_path: Path) -> None:
    # The session fixtures as a plugin (as tests/conftest.py is to the unit tests), the
    # refusing ones in a nearer conftest (as tests/unit/conftest.py is): the nearer wins.
    (tmp_path / "conftest.py").write_text(
        "from tests.unit.conftest import apicurio_url, bootstrap, registry_url, spark\n"
    )
    (tmp_path / "test_asking.py").write_text(ASKING)
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'app'}{os.pathsep}{REPO}"}
    env.pop("KDIV_BOOTSTRAP", None)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest", "-rE", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    assert "1 passed, 4 errors" in output, output
    for fixture, what in [
        ("bootstrap", "a Kafka broker"),
        ("registry_url", "a broker and a Schema Registry"),
        ("apicurio_url", "Apicurio Registry"),
        ("spark", "a SparkSession"),
    ]:
        assert f"asks for `{fixture}`, which starts {what}" in output, output
    assert output.count("move the test to tests/integration") >= 4, output
