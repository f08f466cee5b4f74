"""The README's commands as a newcomer meets them: a fresh clone, and only what each make target installs.

The suite's own virtualenv has the [test] extra, which holds far more than `make run` (the package)
or `make demo` (the package and [demo]) install: a module that an installed command or the demo
reaches and that imports a test-only package (numpy, through a helper shared with the fleet harness)
passes every other test and fails for every newcomer. Here each make target's install step runs in a
clean copy of the checkout, and its entry points start in that virtualenv alone.
"""

from __future__ import annotations

import pkgutil
from pathlib import Path

import pytest

from tests.helpers import ROOT, Install

# The fresh installs (conftest.py) are made once per test process: the tests that use them share one.
pytestmark = pytest.mark.xdist_group("fresh_install")

# Packages the [test] extra brings and no make target but `make test` installs: neither the run nor the
# demo install may have them, or this module proves nothing.
TEST_ONLY = ("numpy", "pytest", "prometheus_client", "hypothesis", "pyroute2", "grafana_foundation_sdk", "matplotlib")
# Modules of the package that need an optional extra ([dashboards]: Grafana's SDK; [report]: numpy and
# matplotlib); their command says so.
OPTIONAL = {"rulepack.dashboards": "grafana_foundation_sdk", "report": "numpy"}

IMPORT_EACH = """
import importlib, sys, traceback
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as err:
        missing = getattr(err, "name", None) if isinstance(err, ImportError) else None
        print(f"{name}\\t{missing or ''}\\t{traceback.format_exception_only(err)[-1].strip()}")
"""


def modules(package: str) -> list[str]:
    """Every module of a package in the checkout, the package included; not __main__, which runs the
    program (the tests of `--help` start those)."""
    found = pkgutil.walk_packages([str(ROOT / package.replace(".", "/"))], prefix=f"{package}.")
    return [package, *(m.name for m in found if not m.name.endswith(".__main__"))]


def failed_imports(install: Install, names: list[str]) -> dict[str, tuple[str, str]]:
    """{module: (the package missing, the error)} for each module that does not import there."""
    done = install.run("python", "-c", IMPORT_EACH, *names)
    assert done.returncode == 0, done.stderr
    return {name: (missing, error) for name, missing, error in
            (line.split("\t", 2) for line in done.stdout.splitlines())}


@pytest.mark.parametrize("target", ["run", "demo"])
def test_the_install_holds_no_test_only_package(target: str, request: pytest.FixtureRequest) -> None:
    install: Install = request.getfixturevalue(f"{target}_install")
    assert {name for name, (missing, _) in failed_imports(install, list(TEST_ONLY)).items() if missing == name} \
        == set(TEST_ONLY)


def test_every_module_of_the_installed_commands_imports_with_make_runs_install(run_install: Install) -> None:
    """Lazy imports included (the doctor, `rules render`, the remediation service's engine and server)."""
    failed = failed_imports(run_install, [m for p in ("common", "exporter", "rulepack", "report", "remediate")
                                          for m in modules(p)])
    unexpected = {name: error for name, (missing, error) in failed.items()
                  if not any(name.startswith(prefix) and missing == extra for prefix, extra in OPTIONAL.items())}
    assert unexpected == {}
    assert {"rulepack.dashboards.board", "report.build"} <= set(failed)  # the extras really are missing


@pytest.mark.parametrize("command", ["gpunode-exporter", "gpunode-remediate"])
def test_the_installed_commands_start(run_install: Install, command: str) -> None:
    done = run_install.run(command, "--help")
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr


def test_rules_render_and_the_doctor_run_with_make_runs_install(run_install: Install, tmp_path: Path) -> None:
    rendered = run_install.run("gpunode-exporter", "rules", "render", "--out", str(tmp_path / "rules"))
    assert rendered.returncode == 0, rendered.stderr
    assert (tmp_path / "rules" / "exporter.rules.yml").is_file()
    doctor = run_install.run("gpunode-exporter", "doctor")
    assert doctor.returncode in (0, 1) and "Traceback" not in doctor.stderr, doctor.stderr
    assert doctor.stdout.strip()


def test_dashboards_render_without_its_extra_says_what_to_install(run_install: Install, tmp_path: Path) -> None:
    done = run_install.run("gpunode-exporter", "dashboards", "render", "--out", str(tmp_path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "pip install 'gpunode-exporter[dashboards]'" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_report_without_its_extra_says_what_to_install(run_install: Install, tmp_path: Path) -> None:
    done = run_install.run("gpunode-exporter", "report", "--prometheus.url", "http://127.0.0.1:1",
                           "--output", str(tmp_path / "report"))
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stderr.count("\n") == 1
    assert "pip install 'gpunode-exporter[report]'" in done.stderr
    assert not (tmp_path / "report").exists()


def test_the_remediation_service_checks_a_policy_with_make_runs_install(run_install: Install, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yml"
    policy.write_text("mode: enforce\n")
    done = run_install.run("gpunode-remediate", "check", "--config.file", str(policy))
    assert done.returncode == 0 and "valid (enforce" in done.stdout, done.stderr


def test_the_demo_starts_with_make_demos_install(demo_install: Install) -> None:
    done = demo_install.run("python", "-m", "demo", "--help")
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr


def test_each_demo_module_imports_alone_with_make_demos_install(demo_install: Install) -> None:
    """One interpreter a module: none leans on another's imports."""
    for name in modules("demo"):
        assert failed_imports(demo_install, [name]) == {}, name
