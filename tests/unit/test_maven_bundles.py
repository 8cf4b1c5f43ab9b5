"""kdiv.maven's bundles against a stand-in `mvn` that writes what Maven would: jars copied, or a
distribution unpacked, and the goal each kind asks Maven for."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from kdiv.maven import APICURIO_REGISTRY, BUNDLES, JARS_DIR_ENV, KAFKA_BROKER, JarsError

# Records its arguments, then writes into -DoutputDirectory (and -DmarkersDirectory, as the
# unpack goal does) what the goal would.
FAKE_MAVEN = """#!{python}
import json, os, sys
args = sys.argv[1:]
defines = dict(a[2:].split("=", 1) for a in args if a.startswith("-D"))
with open({log!r}, "a") as log:
    log.write(json.dumps(args) + "\\n")
out = defines["outputDirectory"]
if "dependency:unpack-dependencies" in args:
    os.makedirs(os.path.join(out, "lib"))
    open(os.path.join(out, "app-runner.jar"), "w").close()
    os.makedirs(defines["markersDirectory"])
    open(os.path.join(defines["markersDirectory"], "app.marker"), "w").close()
else:
    open(os.path.join(out, "a.jar"), "w").close()
"""


@pytest.fixture
def fake_maven(tmp_path, monkeypatch) -> tuple[str, Path]:
    log = tmp_path / "mvn.log"
    script = tmp_path / "mvn"
    script.write_text(FAKE_MAVEN.format(python=sys.executable, log=str(log)))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv(JARS_DIR_ENV, str(tmp_path / "cache"))
    return str(script), log


def test_a_distribution_is_unpacked_into_the_cache_without_maven_markers(fake_maven, tmp_path):
    maven, log = fake_maven
    with pytest.raises(JarsError, match="no apicurio-registry .* distribution in .*run `kdiv fetch-jars`"):
        APICURIO_REGISTRY.home()
    directory = APICURIO_REGISTRY.fetch(maven)
    assert directory == APICURIO_REGISTRY.home() and directory.parent == tmp_path / "cache"
    assert sorted(p.name for p in directory.iterdir()) == [".complete", "app-runner.jar", "lib"]
    (args,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert "dependency:unpack-dependencies" in args and args[args.index("--file") + 1] == str(APICURIO_REGISTRY.pom)
    # Maven's markers went to the staging directory, never beside the pom in the package.
    markers = next(a for a in args if a.startswith("-DmarkersDirectory="))
    assert Path(markers.split("=", 1)[1]).parent.parent == tmp_path / "cache"
    assert not (APICURIO_REGISTRY.pom.parent / "target").exists()
    assert APICURIO_REGISTRY.fetch(maven) == directory and len(log.read_text().splitlines()) == 1  # cached


def test_jars_are_copied_and_every_bundle_is_fetched_by_the_install_step(fake_maven):
    maven, log = fake_maven
    assert not KAFKA_BROKER.is_fetched()
    KAFKA_BROKER.fetch(maven)
    assert [p.name for p in KAFKA_BROKER.jars()] == ["a.jar"]
    (args,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert "dependency:copy-dependencies" in args and "-DincludeScope=runtime" in args
    assert APICURIO_REGISTRY in BUNDLES and APICURIO_REGISTRY.version == "2.6.13.Final"
