"""kdiv's Java producer interceptor (docs/java-producers.md), built from its source by Maven.

The source is the repository's `java/interceptor` (a Maven project). `kdiv fetch-jars` builds
it into kdiv's cache, in a directory named by a digest of the source, so a changed source is
built anew; at run time the jar is only looked up there.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

from kdiv.maven import FETCH_COMMAND, JarsError, cache_root

INTERCEPTOR_CLASS = "dev.kdiv.interceptor.DivInterceptor"
JAR_NAME = "kdiv-interceptor.jar"
_COMPLETE_MARKER = ".complete"
# Bounds Maven's build (it downloads its plugins from Maven Central on a first build).
BUILD_TIMEOUT_S = 900.0


def source_directory() -> Path:
    """The interceptor's Maven project: `java/interceptor` of the repository kdiv runs from."""
    return Path(__file__).resolve().parents[3] / "java" / "interceptor"


def _source_files(source: Path) -> list[Path]:
    return sorted([source / "pom.xml", *(source / "src").rglob("*.java")])


def _digest(source: Path) -> str:
    digest = hashlib.sha256()
    for path in _source_files(source):
        digest.update(str(path.relative_to(source)).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _directory(source: Path) -> Path:
    return cache_root() / f"kdiv-interceptor-{_digest(source)}"


def _require_source(source: Path) -> None:
    if not (source / "pom.xml").is_file():
        raise JarsError(
            f"no interceptor source at {source} (java/interceptor of the kdiv repository): "
            "the interceptor is built from a checkout of the repository"
        )


def interceptor_jar(source: Path | None = None) -> Path:
    """The built interceptor jar, from the cache; JarsError naming the build command when absent."""
    source = source or source_directory()
    _require_source(source)
    directory = _directory(source)
    if not (directory / _COMPLETE_MARKER).is_file():
        raise JarsError(f"the kdiv interceptor is not built in {directory}: run `{FETCH_COMMAND}`")
    return directory / JAR_NAME


def build_interceptor(maven: str = "mvn", source: Path | None = None) -> Path:
    """Build the interceptor jar with Maven into the cache (a no-op once built); its directory."""
    source = source or source_directory()
    _require_source(source)
    directory = _directory(source)
    if (directory / _COMPLETE_MARKER).is_file():
        return directory
    executable = shutil.which(maven)
    if executable is None:
        raise JarsError(f"cannot build the kdiv interceptor: Maven ({maven}) is not on the PATH")
    directory.parent.mkdir(parents=True, exist_ok=True)
    # Built in a copy beside the cache, so the checkout gets no target/ and an interrupted
    # build never leaves a directory that looks complete.
    staging = Path(tempfile.mkdtemp(prefix=".kdiv-interceptor-", dir=directory.parent))
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
            raise JarsError(f"Maven did not build the kdiv interceptor within {BUILD_TIMEOUT_S:.0f} s") from None
        if result.returncode != 0:
            output = (result.stdout + result.stderr).strip().splitlines()
            raise JarsError(
                f"Maven could not build the kdiv interceptor (exit {result.returncode}): "
                + " | ".join(line for line in output if "ERROR" in line)[-2000:]
            )
        built = staging / "built"
        built.mkdir()
        shutil.copy2(project / "target" / JAR_NAME, built / JAR_NAME)
        (built / _COMPLETE_MARKER).write_text("kdiv-interceptor\n")
        shutil.rmtree(directory, ignore_errors=True)
        built.rename(directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory
