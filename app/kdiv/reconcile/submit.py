"""`kdiv reconcile`: runs the reconciliation job through spark-submit with working defaults.

spark-submit takes a Python application as a file. The entry it gets is the one in the source
tree's reconcile/main.py, written into a scratch folder: an installed kdiv has no source tree,
and a script inside the package would put a package folder first on sys.path.

Local mode needs nothing shipped. Any other master gets the `kdiv` package as a zip (--py-files); the executors' Python must have kdiv's dependencies (the docker
image does). Spark's kafka connector, when `kdiv fetch-jars` cached it, goes in spark.jars. Executors must run this interpreter, which has pyarrow and kdiv, so
PYSPARK_PYTHON defaults to it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path


class SubmitError(RuntimeError):
    pass


def spark_submit_path() -> str:
    beside = Path(sys.executable).with_name("spark-submit")
    if beside.exists():
        return str(beside)
    spark_home = os.environ.get("SPARK_HOME")
    if spark_home and (Path(spark_home) / "bin" / "spark-submit").exists():
        return str(Path(spark_home) / "bin" / "spark-submit")
    found = shutil.which("spark-submit")
    if found:
        return found
    raise SubmitError(
        "spark-submit not found beside this Python, in $SPARK_HOME/bin or on PATH: "
        "install kdiv with its spark extra (pip install 'kdiv[spark]')"
    )


def package_zip(directory: Path) -> Path:
    """The kdiv package as one zip for --py-files."""
    import kdiv

    assert kdiv.__file__ is not None, "kdiv is a regular package"
    folder = Path(kdiv.__file__).resolve().parent
    target = directory / "kdiv-packages.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(folder.rglob("*.py")):
            archive.write(path, Path("kdiv") / path.relative_to(folder))
    return target


ENTRY_SCRIPT = """import sys

from kdiv.reconcile.job import main_guarded

if __name__ == "__main__":
    sys.exit(main_guarded())
"""


def write_entry(directory: Path) -> Path:
    entry = directory / "kdiv_reconcile.py"
    entry.write_text(ENTRY_SCRIPT)
    return entry


def submit_command(
    master: str,
    entry: Path,
    job_args: list[str],
    *,
    spark_conf: dict[str, str] | None = None,
    py_files: Path | None = None,
) -> list[str]:
    command = [spark_submit_path(), "--master", master]
    for key, value in sorted((spark_conf or {}).items()):
        command += ["--conf", f"{key}={value}"]
    if py_files is not None:
        command += ["--py-files", str(py_files)]
    return [*command, str(entry), *job_args]


def submit_environment(master: str, environ=os.environ) -> dict[str, str]:
    env = dict(environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    if master.startswith("local"):
        # A laptop's hostname may resolve to an address nothing listens on.
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def run(master: str, job_args: list[str], spark_conf: dict[str, str] | None = None) -> int:
    """Run the job; its exit status (0 clean, 1 discrepancies, 2 failure)."""
    import subprocess

    from kdiv.reconcile.connector import spark_kafka_jars, with_jars

    # Through spark-submit: jars the job added itself would miss the driver's classpath.
    spark_conf = with_jars(spark_conf or {}, spark_kafka_jars())
    with tempfile.TemporaryDirectory(prefix="kdiv-submit-") as scratch:
        py_files = None if master.startswith("local") else package_zip(Path(scratch))
        command = submit_command(master, write_entry(Path(scratch)), job_args, spark_conf=spark_conf, py_files=py_files)
        completed = subprocess.run(command, env=submit_environment(master), check=False)
    # spark-submit itself failing (e.g. no Java) is a failure of the job.
    return completed.returncode if completed.returncode in (0, 1, 2) else 2
