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

from tests.helpers import FOLDERS, ROOT, Install, fresh_install

# The fresh installs (conftest.py) are made once per test process: the tests that use them share one.
pytestmark = pytest.mark.xdist_group("fresh_install")

# Packages the [test] extra brings and no make target but `make test` installs: neither the run nor the
# demo install may have them, or this module proves nothing.
TEST_ONLY = ("numpy", "pytest", "prometheus_client", "hypothesis", "pyroute2", "grafana_foundation_sdk", "matplotlib")
# What a GPU node runs is the node agent: none of the libraries of the rule pack, the dashboards or
# the report ([rules], [dashboards], [report] in pyproject.toml) may come with `make run`'s install.
EXTRAS_ONLY = ("jinja2", "promql_parser", "grafana_foundation_sdk", "numpy", "matplotlib")
# Modules of the package that need an optional extra ([dashboards]: Grafana's SDK and promql-parser;
# [report]: numpy and matplotlib); their command says so.
OPTIONAL = {"gpunode_rulepack.dashboards": ("grafana_foundation_sdk", "promql_parser"), "gpunode_report": ("numpy",)}

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
    """Every module of a package in the checkout, by its import name, the package included; not
    __main__, which runs the program (the tests of `--help` start those)."""
    found = pkgutil.walk_packages([str(ROOT / FOLDERS.get(package, package))], prefix=f"{package}.")
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
    failed = failed_imports(run_install, [m for p in FOLDERS for m in modules(p)])
    unexpected = {name: error for name, (missing, error) in failed.items()
                  if not any(name.startswith(prefix) and missing in extra for prefix, extra in OPTIONAL.items())}
    assert unexpected == {}
    assert {"gpunode_rulepack.dashboards.board", "gpunode_report.build"} <= set(failed)  # the extras really are missing


def test_a_nodes_install_holds_no_library_of_the_extras(run_install: Install) -> None:
    assert {name for name, (missing, _) in failed_imports(run_install, list(EXTRAS_ONLY)).items() if missing == name} \
        == set(EXTRAS_ONLY)


@pytest.mark.parametrize("command", ["gpunode-exporter", "gpunode-remediate"])
def test_the_installed_commands_start(run_install: Install, command: str) -> None:
    done = run_install.run(command, "--help")
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr


def test_the_doctor_runs_with_make_runs_install(run_install: Install) -> None:
    doctor = run_install.run("gpunode-exporter", "doctor")
    assert doctor.returncode in (0, 1) and "Traceback" not in doctor.stderr, doctor.stderr
    assert doctor.stdout.strip()


@pytest.mark.parametrize("command", ["rules", "dashboards"])
def test_rendering_without_its_extra_says_what_to_install(run_install: Install, tmp_path: Path, command: str) -> None:
    done = run_install.run("gpunode-exporter", command, "render", "--out", str(tmp_path))
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert f"pip install 'gpunode-exporter[{command}]'" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_make_rules_install_renders_the_committed_rules(tmp_path: Path) -> None:
    """`make rules` installs the [rules] extra and regenerates the committed files byte for byte."""
    install = fresh_install(tmp_path, "rules")
    for target in ("prometheus", "vmalert"):
        out = tmp_path / target
        done = install.run("gpunode-exporter", "rules", "render", "--target", target, "--out", str(out))
        assert done.returncode == 0, done.stderr
        assert {p.name: p.read_text() for p in out.iterdir()} == {
            p.name: p.read_text() for p in (ROOT / "rules" / target).glob("*.yml")}


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
