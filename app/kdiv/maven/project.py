"""kdiv's own Java programs, built from their source by Maven.

Each is a Maven project under the repository's `java/`. `kdiv fetch-jars` builds it into kdiv's
cache, in a directory named by a digest of the source, so a changed source is built anew; at run
time the jar (and the runtime jars the project copies to `target/lib` beside it, if any) are only
looked up there.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kdiv.maven import FETCH_COMMAND, JarsError, cache_root

_COMPLETE_MARKER = ".complete"
# Where a project's pom has Maven copy the runtime jars it needs beside its own (target/lib).
RUNTIME_LIB = "lib"
# Bounds Maven's build (it downloads its plugins and dependencies from Maven Central on a first build).
BUILD_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class JavaProject:
    """`java/<folder>` of the repository, built by Maven's `package` into `jar_name`."""

    folder: str
    artifact: str  # the pom's finalName: the jar is `<artifact>.jar`, the cache directory `<artifact>-<digest>`
    title: str  # what errors call it

    @property
    def jar_name(self) -> str:
        return f"{self.artifact}.jar"

    def source_directory(self) -> Path:
        """The project: `java/<folder>` of the repository kdiv runs from."""
        return Path(__file__).resolve().parents[3] / "java" / self.folder

    def jar(self, source: Path | None = None) -> Path:
        """The built jar, from the cache; JarsError naming the build command when absent."""
        return self._built(source) / self.jar_name

    def classpath(self, source: Path | None = None) -> list[Path]:
        """The built jar, then the runtime jars built beside it."""
        directory = self._built(source)
        return [directory / self.jar_name, *sorted((directory / RUNTIME_LIB).glob("*.jar"))]

    def _built(self, source: Path | None) -> Path:
        source = source or self.source_directory()
        self._require_source(source)
        directory = self._directory(source)
        if not (directory / _COMPLETE_MARKER).is_file():
            raise JarsError(f"{self.title} is not built in {directory}: run `{FETCH_COMMAND}`")
        return directory

    def build(self, maven: str = "mvn", source: Path | None = None) -> Path:
        """Build the jar with Maven into the cache (a no-op once built); its directory."""
        source = source or self.source_directory()
        self._require_source(source)
        directory = self._directory(source)
        if (directory / _COMPLETE_MARKER).is_file():
            return directory
        executable = shutil.which(maven)
        if executable is None:
            raise JarsError(f"cannot build {self.title}: Maven ({maven}) is not on the PATH")
        directory.parent.mkdir(parents=True, exist_ok=True)
        # Built in a copy beside the cache, so the checkout gets no target/ and an interrupted
        # build never leaves a directory that looks complete.
        staging = Path(tempfile.mkdtemp(prefix=f".{self.artifact}-", dir=directory.parent))
        try:
            project = staging / "project"
            shutil.copytree(source, project, ignore=shutil.ignore_patterns("target"))
            try:
                result = subprocess.run(
                    [executable, "--batch-mode", "--quiet", "--file", str(project / "pom.xml"), "package"],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    text=True,
                    check=False,
                    timeout=BUILD_TIMEOUT_S,
                )
            except subprocess.TimeoutExpired:
                raise JarsError(f"Maven did not build {self.title} within {BUILD_TIMEOUT_S:.0f} s") from None
            if result.returncode != 0:
                output = (result.stdout + result.stderr).strip().splitlines()
                raise JarsError(
                    f"Maven could not build {self.title} (exit {result.returncode}): "
                    + " | ".join(line for line in output if "ERROR" in line)[-2000:]
                )
            built = staging / "built"
            built.mkdir()
            shutil.copy2(project / "target" / self.jar_name, built / self.jar_name)
            if (project / "target" / RUNTIME_LIB).is_dir():
                shutil.copytree(project / "target" / RUNTIME_LIB, built / RUNTIME_LIB)
            (built / _COMPLETE_MARKER).write_text(f"{self.artifact}\n")
            shutil.rmtree(directory, ignore_errors=True)
            built.rename(directory)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return directory

    def _require_source(self, source: Path) -> None:
        if not (source / "pom.xml").is_file():
            raise JarsError(
                f"no {self.folder} source at {source} (java/{self.folder} of the kdiv repository): "
                f"{self.title} is built from a checkout of the repository"
            )

    def _directory(self, source: Path) -> Path:
        digest = hashlib.sha256()
        for path in sorted([source / "pom.xml", *(source / "src").rglob("*.java")]):
            digest.update(str(path.relative_to(source)).encode())
            digest.update(b"\0")
            digest.update(path.read_bytes())
        return cache_root() / f"{self.artifact}-{digest.hexdigest()[:12]}"


INTERCEPTOR = JavaProject("interceptor", "kdiv-interceptor", "the kdiv interceptor")
# A Kafka Streams application as an audited pipeline hop (docs/pipeline-audit.md).
STREAMS_HOP = JavaProject("streams-hop", "kdiv-streams-hop", "the kdiv Kafka Streams hop")
PROJECTS = (INTERCEPTOR, STREAMS_HOP)
