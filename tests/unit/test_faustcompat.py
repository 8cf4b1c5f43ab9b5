"""Faust's and aiokafka's internals kdiv relies on are still there, and untested releases are refused."""

from __future__ import annotations

import importlib
import inspect
from importlib.metadata import PackageNotFoundError
from types import SimpleNamespace

import pytest

from kdiv.worker.faustcompat import PRIVATE_NAMES, TESTED, UntestedRelease, check_versions
from kdiv.worker.faustcompat.transport import PARTITION_FETCH_FLOOR, partition_fetch_bytes, within_drain_budget


def _owner_and_attribute(path: str):
    module_name, _, qualified = path.partition(":")
    *owners, attribute = qualified.split(".")
    owner = importlib.import_module(module_name)
    for name in owners:
        owner = getattr(owner, name)
    return owner, attribute


def _source(cls: type) -> str:
    """A class's source; "" for one made without a findable definition (a generic alias or a
    class made at run time, among Faust's stores' bases)."""
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return ""


@pytest.mark.parametrize(("path", "parameters", "why"), PRIVATE_NAMES, ids=[p for p, _, _ in PRIVATE_NAMES])
def test_every_internal_kdiv_relies_on_is_still_there(path, parameters, why):
    owner, attribute = _owner_and_attribute(path)
    if parameters is not None:
        function = getattr(owner, attribute)
        assert callable(function), f"{path} is no longer callable ({why})"
        assert tuple(inspect.signature(function).parameters)[: len(parameters)] == parameters, (
            f"{path} changed its parameters ({why})"
        )
    elif not hasattr(owner, attribute):
        # An attribute set on instances: it must still be assigned by its class.
        assert inspect.isclass(owner), f"{path} is gone ({why})"
        sources = "".join(_source(cls) for cls in owner.__mro__ if cls.__module__.split(".")[0] != "builtins")
        assert f"self.{attribute} " in sources or f"self.{attribute}:" in sources, f"{path} is gone ({why})"


def test_the_installed_releases_are_the_tested_ones():
    check_versions()


@pytest.mark.parametrize(
    ("faust", "aiokafka", "refused"),
    [
        ("0.15.3", "0.14.0", None),
        ("0.15.9", "0.14.2", None),
        ("0.16.0", "0.14.0", "faust-streaming 0.16.0"),
        ("0.15.2", "0.14.0", "faust-streaming 0.15.2"),
        ("0.15.3", "0.15.0", "aiokafka 0.15.0"),
        ("0.15.3rc1", "0.14.0", "faust-streaming 0.15.3rc1"),
    ],
)
def test_an_untested_release_is_refused_naming_it_and_the_tested_range(faust, aiokafka, refused):
    installed = {"faust-streaming": faust, "aiokafka": aiokafka, "aiohttp": "3.14.5"}
    if refused is None:
        check_versions(installed.__getitem__)
        return
    with pytest.raises(UntestedRelease, match=refused) as raised:
        check_versions(installed.__getitem__)
    name = refused.split()[0]
    lowest, first_untested = next((low, high) for dist, low, high in TESTED if dist == name)
    assert f">={lowest},<{first_untested}" in str(raised.value)


def test_a_missing_distribution_is_refused():
    def installed(name: str) -> str:
        raise PackageNotFoundError(name)

    with pytest.raises(UntestedRelease, match="faust-streaming is not installed"):
        check_versions(installed)


def test_a_drain_takes_the_oldest_fetched_partitions_within_its_budget():
    def fetched(size: int) -> SimpleNamespace:
        records = SimpleNamespace(size_in_bytes=lambda: size)
        return SimpleNamespace(_partition_records=SimpleNamespace(_records=records))

    results = {("t", 3): fetched(600), ("t", 1): fetched(300), ("t", 2): fetched(300), ("u", 0): fetched(10)}
    active = {("t", 1), ("t", 2), ("t", 3), ("t", 4)}
    assert within_drain_budget(results, active, 1000) == {("t", 3), ("t", 1)}  # in the order fetched
    assert within_drain_budget(results, active, 100) == {("t", 3)}  # the first whatever its size
    assert within_drain_budget(results, active, 1200) is active  # all fit: as Faust asked
    assert within_drain_budget({}, active, 100) is active  # nothing fetched: wait on all
    assert within_drain_budget(results, None, 905) == {("t", 3), ("t", 1)}  # none given: every partition


def test_the_fetch_size_per_partition_shares_the_budget_between_a_floor_and_the_configured_size():
    mib = 1 << 20
    assert partition_fetch_bytes(64 * mib, 10, mib) == mib  # few partitions: the configured size
    assert partition_fetch_bytes(64 * mib, 1000, mib) == 64 * mib // 1000  # shared
    assert partition_fetch_bytes(64 * mib, 100_000, mib) == PARTITION_FETCH_FLOOR  # never below the floor
    assert partition_fetch_bytes(64 * mib, 0, mib) == mib  # nothing assigned yet
    assert partition_fetch_bytes(64 * mib, 1000, 32 << 10) == 32 << 10  # a configured size under the floor holds
