"""Java components kdiv runs beside Python, fetched by Maven from Maven Central.

Each bundle is a small pom in this package (`<name>.xml`). `kdiv fetch-jars` is the one
install step that downloads: Maven resolves the pom and puts what it depends on into kdiv's
cache, either copying the jars, dependencies included, or, for a distribution (a program
Maven Central serves as one zip), unpacking the archive. At run time kdiv only looks the
bundle up there and never downloads; a bundle not fetched yet is one clear error naming the
command that fetches it.

The cache directory is named by the bundle, its version and a digest of its pom, so a
changed pom is fetched anew instead of running against stale jars.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

JARS_DIR_ENV = "KDIV_JARS_DIR"
FETCH_COMMAND = "kdiv fetch-jars"
_POM_NAMESPACE = "{http://maven.apache.org/POM/4.0.0}"
_COMPLETE_MARKER = ".complete"
_MARKERS = ".maven-markers"


class JavaMissing(RuntimeError):
    """No Java runtime to run a bundle with."""


def java_executable(program: str, without_java: str) -> str:
    """`$JAVA_HOME/bin/java`, else `java` on the PATH; JavaMissing in one line naming `program`
    and what to do `without_java` when neither is there."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
        raise JavaMissing(f"$JAVA_HOME={java_home} holds no bin/java: {program} needs a Java 17+ runtime")
    on_path = shutil.which("java")
    if on_path is None:
        raise JavaMissing(
            f"no Java runtime (java not on the PATH, JAVA_HOME unset): {program} needs Java 17+ "
            f"(Debian: apt-get install openjdk-17-jre-headless); without one, {without_java}"
        )
    return on_path


class JarsError(RuntimeError):
    """A bundle is not in the cache, or Maven could not fetch it."""


def cache_root() -> Path:
    """$KDIV_JARS_DIR, else $XDG_CACHE_HOME/kdiv/jars, else ~/.cache/kdiv/jars."""
    configured = os.environ.get(JARS_DIR_ENV)
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kdiv" / "jars"


@dataclass(frozen=True)
class MavenBundle:
    """One pom of this package and what Maven resolved for it: its jars, or with
    `distribution` the archives it depends on, unpacked."""

    name: str
    distribution: bool = False

    @property
    def pom(self) -> Path:
        return Path(__file__).with_name(f"{self.name}.xml")

    @property
    def version(self) -> str:
        """The pom's first `*.version` property: the version of what the bundle runs."""
        properties = ElementTree.parse(self.pom).getroot().find(f"{_POM_NAMESPACE}properties")
        for prop in properties if properties is not None else ():
            if prop.tag.endswith(".version") and prop.text:
                return prop.text.strip()
        raise JarsError(f"{self.pom} names no version property")

    @property
    def directory(self) -> Path:
        digest = hashlib.sha256(self.pom.read_bytes()).hexdigest()[:12]
        return cache_root() / f"{self.name}-{self.version}-{digest}"

    def is_fetched(self) -> bool:
        return (self.directory / _COMPLETE_MARKER).is_file()

    def jars(self) -> list[Path]:
        """The bundle's jars, from the cache; JarsError naming the fetch command when absent."""
        return sorted(self.home().glob("*.jar"))

    def home(self) -> Path:
        """The bundle's directory in the cache; JarsError naming the fetch command when absent."""
        if not self.is_fetched():
            what = "distribution" if self.distribution else "jars"
            raise JarsError(
                f"no {self.name} {self.version} {what} in {self.directory}: run `{FETCH_COMMAND}` "
                "once (it needs Maven and Maven Central)"
            )
        return self.directory

    def fetch(self, maven: str = "mvn") -> Path:
        """Have Maven copy the bundle's runtime jars, or unpack its distribution, into the
        cache (a no-op once there)."""
        if self.is_fetched():
            return self.directory
        executable = shutil.which(maven)
        if executable is None:
            raise JarsError(f"cannot fetch {self.name}: Maven ({maven}) is not on the PATH")
        self.directory.parent.mkdir(parents=True, exist_ok=True)
        # Copied beside the cache and renamed into place, so an interrupted fetch never
        # leaves a directory that looks complete.
        staging = Path(tempfile.mkdtemp(prefix=f".{self.name}-", dir=self.directory.parent))
        if self.distribution:
            # Maven marks what it unpacked under the pom's directory by default; here in the
            # staging directory (removed below), so the installed package stays untouched.
            markers = staging / _MARKERS
            goal = ["dependency:unpack-dependencies", f"-DmarkersDirectory={markers}"]
        else:
            goal = ["dependency:copy-dependencies", "-DincludeScope=runtime"]
        try:
            result = subprocess.run(
                [
                    executable,
                    "--batch-mode",
                    "--quiet",
                    "--file",
                    str(self.pom),
                    *goal,
                    f"-DoutputDirectory={staging}",
                ],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                output = (result.stdout + result.stderr).strip().splitlines()
                raise JarsError(
                    f"Maven could not fetch {self.name} {self.version} (exit {result.returncode}): "
                    + " | ".join(line for line in output if "ERROR" in line)[-2000:]
                )
            shutil.rmtree(staging / _MARKERS, ignore_errors=True)
            (staging / _COMPLETE_MARKER).write_text(f"{self.name} {self.version}\n")
            shutil.rmtree(self.directory, ignore_errors=True)
            staging.rename(self.directory)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return self.directory


KAFKA_BROKER = MavenBundle("kafka-broker")
SPARK_KAFKA = MavenBundle("spark-kafka")
APICURIO_REGISTRY = MavenBundle("apicurio-registry", distribution=True)
# Apache Kafka's command-line tools, run with kdiv's producer interceptor (kdiv.maven.interceptor).
KAFKA_TOOLS = MavenBundle("kafka-tools")
BUNDLES = (KAFKA_BROKER, SPARK_KAFKA, APICURIO_REGISTRY, KAFKA_TOOLS)
