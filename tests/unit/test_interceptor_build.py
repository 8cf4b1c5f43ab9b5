"""kdiv.maven.interceptor: the Java interceptor built from its source into kdiv's cache, against
a stand-in `mvn` that writes the jar Maven's `package` would."""

from __future__ import annotations

import json
import shutil
import stat
import sys
from pathlib import Path

import pytest

from kdiv.maven import JARS_DIR_ENV, JarsError
from kdiv.maven.interceptor import JAR_NAME, build_interceptor, interceptor_jar, source_directory

FAKE_MAVEN = """#!{python}
import json, os, sys
args = sys.argv[1:]
with open({log!r}, "a") as log:
    log.write(json.dumps(args) + "\\n")
project = os.path.dirname(args[args.index("--file") + 1])
if {fail!r}:
    print("[ERROR] COMPILATION ERROR : DivInterceptor.java:[1,1] broken")
    sys.exit(1)
os.makedirs(os.path.join(project, "target"))
open(os.path.join(project, "target", {jar!r}), "w").write("jar")
"""


def fake_maven(tmp_path, fail: bool = False) -> tuple[str, str]:
    log = tmp_path / "mvn.log"
    script = tmp_path / "mvn"
    script.write_text(FAKE_MAVEN.format(python=sys.executable, log=str(log), fail=fail, jar=JAR_NAME))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script), str(log)


@pytest.fixture
def source(tmp_path, monkeypatch):
    monkeypatch.setenv(JARS_DIR_ENV, str(tmp_path / "cache"))
    copy = tmp_path / "interceptor"
    shutil.copytree(source_directory(), copy, ignore=shutil.ignore_patterns("target"))
    return copy


def test_the_repository_holds_the_source():
    assert (source_directory() / "pom.xml").is_file()
    assert list((source_directory() / "src").rglob("DivInterceptor.java"))


def test_built_once_into_the_cache_outside_the_checkout_and_rebuilt_when_the_source_changes(source, tmp_path):
    maven, log = fake_maven(tmp_path)
    with pytest.raises(JarsError, match="not built in .*run `kdiv fetch-jars`"):
        interceptor_jar(source)
    directory = build_interceptor(maven, source)
    assert interceptor_jar(source) == directory / JAR_NAME and directory.parent == tmp_path / "cache"
    assert not (source / "target").exists()
    (args,) = [json.loads(line) for line in Path(log).read_text().splitlines()]
    assert "package" in args
    assert build_interceptor(maven, source) == directory  # cached: Maven not run again
    java = next((source / "src").rglob("DivHeader.java"))
    java.write_text(java.read_text() + "\n// changed\n")
    assert build_interceptor(maven, source) != directory
    assert len(Path(log).read_text().splitlines()) == 2


def test_a_failed_build_names_maven_s_errors_and_leaves_nothing(source, tmp_path):
    maven, _ = fake_maven(tmp_path, fail=True)
    with pytest.raises(JarsError, match="could not build the kdiv interceptor .*COMPILATION ERROR"):
        build_interceptor(maven, source)
    assert not list((tmp_path / "cache").iterdir())


def test_no_source_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(JARS_DIR_ENV, str(tmp_path / "cache"))
    with pytest.raises(JarsError, match="no interceptor source at .*java/interceptor"):
        build_interceptor("mvn", tmp_path / "nowhere")
