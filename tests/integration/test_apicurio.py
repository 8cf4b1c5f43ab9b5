"""Apicurio Registry as kdiv runs it (kdiv.dev.apicurio, `kdiv registry --apicurio`): a real JVM
process from the distribution `kdiv fetch-jars` unpacked. Start, answer with Confluent's default
compatibility, stop cleanly; one clear line when no Java runtime or no distribution is found.

The registry tests themselves run on it through the `each_registry_url` fixture."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from kdiv.maven import APICURIO_REGISTRY, JARS_DIR_ENV

REPO_ROOT = Path(__file__).resolve().parents[2]
KDIV = [sys.executable, "-m", "kdiv"]


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def test_kdiv_registry_apicurio_prints_its_confluent_url_and_stops_cleanly_on_sigterm():
    process = subprocess.Popen(
        [*KDIV, "registry", "--apicurio", "--port", "0"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/apis/ccompat/v7"), url
        assert _get(f"{url}/config") == {"compatibilityLevel": "BACKWARD"}
        assert _get(f"{url}/subjects") == []  # in memory: empty at every start

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        stderr = process.stderr.read() if process.stderr else ""
        assert f"Apicurio Registry {APICURIO_REGISTRY.version} (in memory, compatibility BACKWARD)" in stderr
        port = int(url.split(":")[2].split("/")[0])
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0  # the JVM is gone with it
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_without_a_java_runtime_apicurio_fails_in_one_clear_line(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "JAVA_HOME"}
    env["PATH"] = str(tmp_path)  # kdiv runs from sys.executable; nothing else is on this PATH
    assert shutil.which("java", path=env["PATH"]) is None
    result = subprocess.run(
        [*KDIV, "registry", "--apicurio", "--port", "0"],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: no Java runtime (java not on the PATH, JAVA_HOME unset): Apicurio Registry")


def test_without_the_fetched_distribution_apicurio_fails_in_one_clear_line_naming_the_fetch(tmp_path):
    env = {**os.environ, JARS_DIR_ENV: str(tmp_path / "empty-cache")}
    result = subprocess.run(
        [*KDIV, "registry", "--apicurio", "--port", "0"],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0] == (
        f"Error: no apicurio-registry {APICURIO_REGISTRY.version} distribution in {tmp_path / 'empty-cache'}/"
        f"{APICURIO_REGISTRY.directory.name}: run `kdiv fetch-jars` once (it needs Maven and Maven Central)"
    )
