"""The command line: dump, --version, flags, and one-line errors with exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpunode_common import __version__
from gpunode_exporter.cli import COMMANDS

ROOT = Path(__file__).parent.parent
EDGE = ROOT / "tests" / "fixtures" / "procfs" / "edge"
SCENARIO = ROOT / "exporter" / "nvmlsim" / "scenarios" / "gpu122-uncorrectable-steps.yaml"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpunode_exporter", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)


def test_version() -> None:
    out = run("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"gpunode-exporter {__version__}"


def test_help_names_every_command() -> None:
    out = subprocess.run([sys.executable, "-m", "gpunode_exporter", "--help"], capture_output=True, text=True, cwd=ROOT,
                         timeout=30)
    text = " ".join(out.stdout.split())  # argparse wraps the description
    assert out.returncode == 0 and all(f"`{c}" in text for c in COMMANDS if c != "serve")


def test_serve_loads_no_template_dashboard_yaml_bcrypt_or_client_library_code() -> None:
    # Memory and start time on every node: those are for `rules`, `dashboards`, config files and
    # basic auth (hashlib maps OpenSSL's libcrypto: ~3.7 MiB); prometheus_client is the tests' oracle.
    code = ("import sys, gpunode_exporter.cli, gpunode_exporter.collector; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'jinja2', 'yaml', 'bcrypt', 'grafana_foundation_sdk', 'promql_parser', 'hashlib', "
            "'_hashlib', 'prometheus_client'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_server_leaves_the_standard_library_whole() -> None:
    # A library added later (an HTTPS client, prometheus_client) must import as it would anywhere.
    code = "import gpunode_common.http, urllib.request, prometheus_client; print(urllib.request.HTTPSHandler.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert out.returncode == 0 and out.stdout.strip() == "HTTPSHandler", out.stderr


@pytest.mark.parametrize("journal", [True, False])
def test_log_lines_carry_their_priority_where_stderr_is_the_journal(tmp_path: Path, journal: bool) -> None:
    # systemd names its journal stream in JOURNAL_STREAM (device:inode); a "<4>" prefix makes
    # the line a warning there, where a plain stderr (a pipe, a file) keeps plain lines.
    log = tmp_path / "stderr"
    with log.open("w") as stderr:
        stat = os.fstat(stderr.fileno())
        env = {**os.environ, "JOURNAL_STREAM": f"{stat.st_dev}:{stat.st_ino}" if journal else "1:2"}
        done = subprocess.run([sys.executable, "-m", "gpunode_exporter", "dump", "--collector.disable-defaults",
                               "--nvml.simulate", str(SCENARIO), "--path.state", str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=stderr, env=env, cwd=ROOT, timeout=60)
    assert done.returncode == 0
    warning = next(line for line in log.read_text().splitlines() if "NVML is SIMULATED" in line)
    assert warning.startswith("<4>") == journal and "level=WARNING" in warning


def test_rules_render_warns_when_runbooks_point_away_from_the_projects(tmp_path: Path) -> None:
    def render(spec: str) -> str:
        (tmp_path / "spec.yaml").write_text(spec)
        out = subprocess.run([sys.executable, "-m", "gpunode_exporter", "rules", "render", "--spec",
                              str(tmp_path / "spec.yaml"), "--out", str(tmp_path / "rules")],
                             capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stderr

    assert render("{}") == ""  # the project's own runbooks: links that open
    warning = render("runbook_base_url: https://wiki.example/gpu-runbooks\n")
    assert "https://wiki.example/gpu-runbooks/AREA.md#alertname" in warning and "docs/runbooks/" in warning


def test_dump_prints_the_exposition() -> None:
    out = run("dump", "--path.procfs", str(EDGE))
    assert out.returncode == 0
    assert 'gpunode_scrape_collector_success{collector="nfs"} 1\n' in out.stdout
    assert "gpunode_nfs_rpc_queue_seconds_total{" in out.stdout


def test_disabled_collector_is_not_run() -> None:
    out = run("dump", "--path.procfs", str(EDGE), "--no-collector.nfs")
    assert out.returncode == 0
    assert "gpunode_nfs_" not in out.stdout and 'collector="nfs"' not in out.stdout


def test_failed_collector_still_gives_exit_0_and_a_metric(tmp_path: Path) -> None:
    out = run("dump", "--path.procfs", str(tmp_path))
    assert out.returncode == 0
    assert 'gpunode_scrape_collector_success{collector="nfs"} 0\n' in out.stdout
    assert "collector nfs failed: FileNotFoundError" in out.stderr


@pytest.mark.parametrize(("args", "config", "message"), [
    (["--bogus"], None, "unrecognized arguments: --bogus"),
    (["--log.level", "loud"], None, "--log.level: invalid choice"),
    ([], "nfs:\n  resolve_devicez: true\n", "unknown key 'nfs.resolve_devicez'"),
    ([], "collector_timeout_seconds: soon\n", "key 'collector_timeout_seconds': want a positive number"),
    ([], "nfs: [1, 2]\n", "nfs: want a mapping"),
    ([], "a: [unclosed\n", "invalid YAML"),
    ([], "gpu:\n  expected_count: eight\n", "key 'gpu.expected_count': want a whole number"),
    (["--nvml.simulate", "/nonexistent/s.yml"], None, "cannot read /nonexistent/s.yml"),
    (["--path.procfs", "/nonexistent/proc"], None, "--path.procfs /nonexistent/proc: no such directory"),
    (["--path.sysfs", "/nonexistent/sys"], None, "--path.sysfs /nonexistent/sys: no such directory"),
    (["--nvml.simulate", "tests/fixtures/nvml/expect-8-gpus.yaml"], None,
     "expect-8-gpus.yaml: scenario: missing key 'gpus'"),
])
def test_bad_flags_and_config_exit_2_with_one_line(tmp_path: Path, args: list[str], config: str | None,
                                                   message: str) -> None:
    if config is not None:
        (tmp_path / "c.yml").write_text(config)
        args = [*args, "--config.file", str(tmp_path / "c.yml")]
    out = run("dump", "--path.procfs", str(EDGE), *args)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and message in out.stderr, out.stderr
    assert out.stdout == ""


def test_missing_config_file_is_named() -> None:
    out = run("dump", "--config.file", "/nonexistent/c.yml")
    assert out.returncode == 2 and "cannot read /nonexistent/c.yml" in out.stderr


def test_valid_config_is_used(tmp_path: Path) -> None:
    (tmp_path / "c.yml").write_text("collector_timeout_seconds: 2\nnfs:\n  resolve_devices: false\n")
    out = run("dump", "--path.procfs", str(EDGE), "--config.file", str(tmp_path / "c.yml"))
    assert out.returncode == 0
    info = [line for line in out.stdout.splitlines() if line.startswith("gpunode_nfs_mount_info{")]
    assert info and all('device=""' in line for line in info)


HEALTHY = "exporter/nvmlsim/scenarios/healthy-h100.yaml"


def test_simulated_scrapes_say_so() -> None:
    out = run("dump", "--no-collector.nfs", "--nvml.simulate", HEALTHY)
    assert out.returncode == 0
    assert "gpunode_nvml_simulated 1\n" in out.stdout
    assert 'gpunode_scrape_collector_success{collector="gpu"} 1\n' in out.stdout
    assert out.stdout.count("gpunode_gpu_up{") == 8
    assert "NVML is SIMULATED" in out.stderr
    real = run("dump", "--no-collector.nfs")
    assert "gpunode_nvml_simulated" not in real.stdout


def test_disable_defaults_keeps_only_the_named_collectors() -> None:
    out = run("dump", "--collector.disable-defaults", "--collector.staging")
    assert out.returncode == 0
    collectors = {line.split('"')[1] for line in out.stdout.splitlines()
                  if line.startswith("gpunode_scrape_collector_success{")}
    assert collectors == {"staging"}


@pytest.mark.parametrize("command", ["serve", "dump", "doctor"])
def test_a_missing_path_is_the_same_one_line_error_for_every_command(command: str) -> None:
    out = run(command, "--path.procfs", "/nonexistent/proc", "--no-collector.gpu")
    assert out.returncode == 2 and "please report" not in out.stderr
    assert out.stderr == "gpunode-exporter: error: --path.procfs /nonexistent/proc: no such directory\n"


@pytest.mark.parametrize(("spec", "message"), [
    ("selectors:\n  gpunode: 'job=\"a'\n", "key 'selectors.gpunode': 'job=\"a' is no list of label matchers"),
    ("selectors:\n  node: 'job=~\"[\"'\n", "key 'selectors.node': 'job=~\"[\"' is no list of label matchers"),
    ("out_of_service: 'foo_bar(up) == 1'\n", "key 'out_of_service': 'foo_bar(up) == 1' is no valid PromQL"),
    ("labels:\n  node: 'in stance'\n", "keys changed from the shipped spec: 'labels.node'"),
    ("failslow:\n  clock_violation_policies: [power, 'thermal\"']\n",
     "key 'failslow.clock_violation_policies': 'thermal\"': a policy is named in"),
    ("failslow:\n  clock_violation_policies: [power, thermal, power]\n",
     "key 'failslow.clock_violation_policies': 'power': a policy is named in"),
])
@pytest.mark.parametrize("command", ["rules", "dashboards"])
def test_a_spec_that_makes_invalid_promql_is_one_line_and_writes_nothing(tmp_path: Path, spec: str, message: str,
                                                                          command: str) -> None:
    (tmp_path / "spec.yaml").write_text(spec)
    out = run(command, "render", "--spec", str(tmp_path / "spec.yaml"), "--out", str(tmp_path / "out"))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and message in out.stderr, out.stderr
    assert not (tmp_path / "out").exists()
