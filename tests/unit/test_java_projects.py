"""kdiv.maven.project: a Java program whose pom copies its runtime jars to target/lib is built
into kdiv's cache with them, and run from there with them on its classpath (against a stand-in
`mvn` that writes what Maven's `package` would)."""

from __future__ import annotations

import shutil
import stat
import sys

import pytest

from kdiv.maven import JARS_DIR_ENV, JarsError
from kdiv.maven.project import INTERCEPTOR, PROJECTS, STREAMS_HOP, JavaProject

FAKE_MAVEN = """#!{python}
import os, sys
args = sys.argv[1:]
project = os.path.dirname(args[args.index("--file") + 1])
os.makedirs(os.path.join(project, "target", "lib"))
open(os.path.join(project, "target", {jar!r}), "w").write("jar")
for name in ("kafka-streams-4.4.0.jar", "kafka-clients-4.4.0.jar", "NOTICE.txt"):
    open(os.path.join(project, "target", "lib", name), "w").write(name)
"""


@pytest.fixture
def source(tmp_path, monkeypatch):
    monkeypatch.setenv(JARS_DIR_ENV, str(tmp_path / "cache"))
    copy = tmp_path / "streams-hop"
    shutil.copytree(STREAMS_HOP.source_directory(), copy, ignore=shutil.ignore_patterns("target"))
    return copy


def test_the_repository_holds_every_project_s_source():
    assert [p.folder for p in PROJECTS] == ["interceptor", "streams-hop"]
    for project in PROJECTS:
        assert (project.source_directory() / "pom.xml").is_file(), project
    assert list((STREAMS_HOP.source_directory() / "src").rglob("StreamsHop.java"))


def test_the_runtime_jars_are_cached_beside_the_jar_and_on_its_classpath(source, tmp_path):
    maven = tmp_path / "mvn"
    maven.write_text(FAKE_MAVEN.format(python=sys.executable, jar=STREAMS_HOP.jar_name))
    maven.chmod(maven.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(JarsError, match="Kafka Streams hop is not built in .*run `kdiv fetch-jars`"):
        STREAMS_HOP.classpath(source)
    directory = STREAMS_HOP.build(str(maven), source)
    assert directory.name.startswith("kdiv-streams-hop-") and directory.parent == tmp_path / "cache"
    assert STREAMS_HOP.classpath(source) == [
        directory / "kdiv-streams-hop.jar",
        directory / "lib" / "kafka-clients-4.4.0.jar",
        directory / "lib" / "kafka-streams-4.4.0.jar",
    ]
    assert not (source / "target").exists()


def test_a_project_without_runtime_jars_is_its_jar_alone(tmp_path, monkeypatch):
    monkeypatch.setenv(JARS_DIR_ENV, str(tmp_path / "cache"))
    project = JavaProject("solo", "kdiv-solo", "the solo program")
    source = tmp_path / "solo"
    (source / "src").mkdir(parents=True)
    (source / "pom.xml").write_text("<project/>")
    maven = tmp_path / "mvn"
    maven.write_text(
        f"#!{sys.executable}\nimport os, sys\nargs = sys.argv[1:]\n"
        "project = os.path.dirname(args[args.index('--file') + 1])\n"
        "os.makedirs(os.path.join(project, 'target'))\n"
        "open(os.path.join(project, 'target', 'kdiv-solo.jar'), 'w').write('jar')\n"
    )
    maven.chmod(maven.stat().st_mode | stat.S_IXUSR)
    directory = project.build(str(maven), source)
    assert project.classpath(source) == [directory / "kdiv-solo.jar"]
    # The interceptor keeps its cache directory's name: a checkout's built jar is still found.
    assert INTERCEPTOR.artifact == "kdiv-interceptor"


def test_no_source_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(JARS_DIR_ENV, str(tmp_path / "cache"))
    with pytest.raises(JarsError, match="no streams-hop source at .*java/streams-hop"):
        STREAMS_HOP.build("mvn", tmp_path / "nowhere")
