"""kdiv's Java producer interceptor (docs/java-producers.md), built from its source by Maven.

The source is the repository's `java/interceptor` (a Maven project), built like kdiv's other
Java programs (`kdiv.maven.project`).
"""

from __future__ import annotations

from pathlib import Path

from kdiv.maven.project import INTERCEPTOR

INTERCEPTOR_CLASS = "dev.kdiv.interceptor.DivInterceptor"
JAR_NAME = INTERCEPTOR.jar_name


def source_directory() -> Path:
    """The interceptor's Maven project: `java/interceptor` of the repository kdiv runs from."""
    return INTERCEPTOR.source_directory()


def interceptor_jar(source: Path | None = None) -> Path:
    """The built interceptor jar, from the cache; JarsError naming the build command when absent."""
    return INTERCEPTOR.jar(source)


def build_interceptor(maven: str = "mvn", source: Path | None = None) -> Path:
    """Build the interceptor jar with Maven into the cache (a no-op once built); its directory."""
    return INTERCEPTOR.build(maven, source)
