"""tests/unit is the fast set: no broker, registry or Spark, so no Java and no waiting.

The session fixtures that start them (tests/conftest.py) are replaced here by ones that fail
the unit test asking for them, directly or through another fixture, with what to do instead.
"""

from __future__ import annotations

import pytest


def _refuse(what: str, fixture: str) -> None:
    pytest.fail(
        f"a test in tests/unit asks for `{fixture}`, which starts {what}: tests/unit runs without a broker, "
        "a registry or Spark; move the test to tests/integration",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def bootstrap() -> None:
    _refuse("a Kafka broker", "bootstrap")


@pytest.fixture(scope="session")
def registry_url() -> None:
    _refuse("a broker and a Schema Registry", "registry_url")


@pytest.fixture(scope="session")
def apicurio_url() -> None:
    _refuse("Apicurio Registry", "apicurio_url")


@pytest.fixture(scope="session")
def spark() -> None:
    _refuse("a SparkSession", "spark")
