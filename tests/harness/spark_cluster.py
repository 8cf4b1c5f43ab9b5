"""A Spark standalone cluster for the tests: one master and N workers, started from pyspark's
own scripts (no Spark download), each worker in its own JVM with its own work directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyspark

from kdiv.dev.lifetime import dies_with_this_process
from tests.harness.processes import free_port

SPARK_HOME = Path(pyspark.__file__).resolve().parent
_SPARK_CLASS = str(SPARK_HOME / "bin" / "spark-class")


class StandaloneCluster:
    """`with StandaloneCluster(workdir, workers=2) as cluster: cluster.url` ("spark://...")."""

    def __init__(self, workdir: Path, *, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        self.workdir = Path(workdir)
        self.port = free_port()
        self.webui_port = free_port()
        self.worker_webui_ports = [free_port() for _ in range(workers)]
        self.cores = cores
        self.memory = memory
        self.processes: list[tuple[str, subprocess.Popen]] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def worker_dir(self, index: int) -> Path:
        return self.workdir / f"worker-{index}"

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        env.update(SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
        return env

    def _start(self, name: str, *arguments: str) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = (self.workdir / f"{name}.log").open("wb")
        process = subprocess.Popen(
            [_SPARK_CLASS, *arguments],
            env=self.environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=dies_with_this_process(),
        )
        self.processes.append((name, process))

    def start(self) -> StandaloneCluster:
        self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.webui_port),
        )  # fmt: skip
        for index, webui_port in enumerate(self.worker_webui_ports):
            self.worker_dir(index).mkdir(parents=True, exist_ok=True)
            self._start(
                f"worker-{index}",
                "org.apache.spark.deploy.worker.Worker", self.url,
                "--cores", str(self.cores), "--memory", self.memory, "--host", "127.0.0.1",
                "--webui-port", str(webui_port), "--work-dir", str(self.worker_dir(index)),
            )  # fmt: skip
        self.wait_for_workers()
        return self

    def master_json(self) -> dict:
        return _get_json(f"http://127.0.0.1:{self.webui_port}/json/")

    def worker_json(self, index: int) -> dict:
        return _get_json(f"http://127.0.0.1:{self.worker_webui_ports[index]}/json/")

    def wait_for_workers(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        alive = 0
        while time.monotonic() < deadline:
            for name, process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"spark {name} exited with {process.returncode}: {self.log_tail(name)}")
            try:
                alive = sum(w["state"] == "ALIVE" for w in self.master_json()["workers"])
            except OSError:
                alive = 0
            if alive == len(self.worker_webui_ports):
                return
            time.sleep(0.3)
        raise TimeoutError(
            f"{alive} of {len(self.worker_webui_ports)} workers registered in {timeout:.0f} s: {self.log_tail('master')}"
        )

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        # Workers first: a master stopped first makes them retry registering until killed.
        for _name, process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
        for _name, process in reversed(self.processes):
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        self.processes.clear()

    def __enter__(self) -> StandaloneCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)
