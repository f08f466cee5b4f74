"""The rule pack: rendering (drift, overrides, targets, from a wheel), promtool check and unit tests,
vmalert -dryRun, and the guard that every alert has a test that fires and one that stays silent."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

import gpunode_rulepack
from gpunode_common.config import ConfigError
from tests.helpers import build_wheel

ROOT = Path(__file__).parent.parent
RULES = ROOT / "rules"
UNIT_TESTS = sorted((Path(__file__).parent / "rules").glob("*.test.yml"))


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (scripts/install-deps.sh --test installs it)")
    return path


@pytest.mark.parametrize("target", gpunode_rulepack.TARGETS)
def test_committed_files_are_what_the_spec_renders(target: str) -> None:
    """`make rules` regenerates them; CI fails here when a template or the spec changed without it."""
    files = gpunode_rulepack.render(gpunode_rulepack.load_spec(), target)
    committed = {p.name: p.read_text() for p in (RULES / target).glob("*.yml")}
    assert committed == files, "rules/ is stale: run `make rules` and commit the result"


def test_rules_spec_is_the_shipped_spec() -> None:
    assert (RULES / "spec.yaml").read_text() == (ROOT / "rulepack" / "spec.yaml").read_text()


def test_override_merges_key_by_key(tmp_path: Path) -> None:
    override = tmp_path / "mine.yaml"
    override.write_text("selectors: {gpunode: 'job=\"gpu-nodes\"'}\nexporter: {down_for: 120}\n")
    spec = gpunode_rulepack.load_spec(override)
    assert spec["selectors"]["gpunode"] == 'job="gpu-nodes"'
    assert spec["selectors"]["node"] == gpunode_rulepack.shipped_spec()["selectors"]["node"]  # untouched siblings
    text = gpunode_rulepack.render(spec)["exporter.rules.yml"]
    assert 'up{job="gpu-nodes"} == 0' in text and "for: 2m" in text and 'job="gpunode"' not in text


@pytest.mark.parametrize(("override", "message"), [
    ("exporter: {down_fro: 120}\n", "spec.exporter.down_fro: unknown key"),
    ("selectors: 3\n", "spec.selectors: want a mapping"),
    ("[unclosed\n", "invalid YAML"),
])
def test_bad_override_is_one_clear_error(tmp_path: Path, override: str, message: str) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(override)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        gpunode_rulepack.load_spec(path)
    out = subprocess.run([sys.executable, "-m", "gpunode_exporter", "rules", "render", "--spec", str(path),
                          "--out", str(tmp_path / "out")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.splitlines()) == 1


def test_vmalert_target_leaves_out_keep_firing_for() -> None:
    prometheus = "".join(gpunode_rulepack.render(gpunode_rulepack.load_spec(), "prometheus").values())
    vmalert = "".join(gpunode_rulepack.render(gpunode_rulepack.load_spec(), "vmalert").values())
    assert "keep_firing_for" not in vmalert
    if "keep_firing_for" not in prometheus:
        pytest.skip("no rule uses keep_firing_for yet")


@pytest.mark.parametrize("most", [8, 3, 1])
def test_vmalert_groups_run_their_rules_side_by_side(most: int) -> None:
    """vmalert's `concurrency`: every rule of a group at once, at most spec vmalert_concurrency;
    none where that is 1 or the group has one rule. Prometheus has no such key (and rejects it)."""
    spec = gpunode_rulepack.merge(gpunode_rulepack.load_spec(), {"vmalert_concurrency": most})
    groups = [g for text in gpunode_rulepack.render(spec, "vmalert").values() for g in yaml.safe_load(text)["groups"]]
    want = {g["name"]: min(most, len(g["rules"])) for g in groups}
    assert {g["name"]: g.get("concurrency") for g in groups} == {k: n if n > 1 else None for k, n in want.items()}
    assert most == 1 or max(g.get("concurrency") or 0 for g in groups) == most
    prometheus = [g for text in gpunode_rulepack.render(spec, "prometheus").values()
                  for g in yaml.safe_load(text)["groups"]]
    assert not any("concurrency" in g for g in prometheus)


def _alerts(target: str = "prometheus") -> dict[str, dict[str, Any]]:
    alerts = {}
    for path in sorted((RULES / target).glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    assert rule["alert"] not in alerts, f"alert {rule['alert']} defined twice"
                    alerts[rule["alert"]] = rule
    return alerts


def test_promtool_check_rules() -> None:
    """With its lint fatal, as operators run it in CI: records of one name in several groups
    (a group per proxy or signal) carry the label that tells them apart."""
    promtool = _tool("promtool")
    files = sorted(str(p) for p in (RULES / "prometheus").glob("*.yml"))
    out = subprocess.run([promtool, "check", "rules", "--lint-fatal", *files], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("unit_test", UNIT_TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests(unit_test: Path) -> None:
    promtool = _tool("promtool")
    out = subprocess.run([promtool, "test", "rules", unit_test.name], capture_output=True, text=True,
                         cwd=unit_test.parent)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_has_a_firing_and_a_silent_test() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for unit_test in UNIT_TESTS:
        doc = yaml.safe_load(unit_test.read_text())
        for name in doc["rule_files"]:
            assert (unit_test.parent / name).resolve().is_file(), f"{unit_test.name} names a missing {name}"
        for case in doc["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    alerts = set(_alerts())
    assert alerts - firing == set(), "alerts without a test in which they fire"
    assert alerts - silent == set(), "alerts without a test in which they must stay silent"
    assert (firing | silent) - alerts == set(), "tests of alerts that don't exist"


RUNBOOKS_URL = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Runbooks"]


def test_every_alert_has_labels_annotations_and_a_runbook_section() -> None:
    for name, rule in _alerts().items():
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        annotations = rule["annotations"]
        assert {"summary", "description", "runbook_url"} <= set(annotations), name
        # The project's home, as pyproject names it: the link opens the file under docs/runbooks/.
        base, _, link = annotations["runbook_url"].rpartition("/")
        assert base == RUNBOOKS_URL, f"{name}: {base}"
        page, _, anchor = link.partition("#")
        runbook = ROOT / "docs" / "runbooks" / page
        assert runbook.is_file(), f"{name}: no {runbook}"
        headings = {line.lstrip("#").strip().lower() for line in runbook.read_text().splitlines()
                    if line.startswith("#")}
        assert anchor == name.lower() and anchor in headings, f"{name}: no '## {name}' in {runbook}"


FLEET_WIDE = ("GpuNodeClockThrottled", "GpuNodeHostStarved", "GpuNodeFabricLinkErrors", "GpuNodePrecursorMultiSignal")


@pytest.mark.parametrize("name", FLEET_WIDE)
def test_on_vmalert_alerts_that_fire_fleet_wide_give_their_query_instead_of_running_it(name: str) -> None:
    # vmalert runs a description's query over HTTP for every firing alert at every evaluation.
    import promql_parser

    node = gpunode_rulepack.load_spec()["labels"]["node"]
    ours, theirs = _alerts("vmalert")[name]["annotations"], _alerts("prometheus")[name]["annotations"]
    assert "| query" in theirs["description"]  # Prometheus lists the proxies or signals
    assert not any("query" in text.replace("the query", "") for text in ours.values()), ours
    given = ours["description"].split("the query `", 1)[1].split("`", 1)[0]
    parsed = promql_parser.parse(given.replace(f"{{{{ $labels.{node} }}}}", "gpu071"))  # valid PromQL
    assert f'{node}="gpu071"' in str(parsed), given  # of this node
    recorded = {rule["record"] for path in (RULES / "vmalert").glob("*.yml")
                for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"] if "record" in rule}
    assert given.split("(")[-1].split("{")[0] in recorded, given  # a series the pack records


def test_vmalert_accepts_the_vmalert_target() -> None:
    vmalert = _tool("vmalert")
    out = subprocess.run([vmalert, "-dryRun", f"-rule={RULES / 'vmalert'}/*.yml"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "error" not in out.stderr.lower().replace("errors_total", ""), out.stderr


def test_vmalert_rejects_what_we_leave_out(tmp_path: Path) -> None:
    """The reason for the vmalert target: vmalert 1.79 refuses keep_firing_for."""
    vmalert = _tool("vmalert")
    bad = tmp_path / "bad.yml"
    bad.write_text("groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up == 0\n    keep_firing_for: 5m\n")
    out = subprocess.run([vmalert, "-dryRun", f"-rule={bad}"], capture_output=True, text=True)
    assert out.returncode != 0


def test_renders_from_an_installed_wheel(tmp_path: Path) -> None:
    """`rules render` from a wheel installed outside the source tree gives the committed files."""
    wheel = build_wheel(tmp_path / "source", tmp_path / "wheel")
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    out = tmp_path / "out"
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}
    where = subprocess.run([sys.executable, "-c", "import gpunode_exporter; print(gpunode_exporter.__file__)"], env=env,
                           capture_output=True, text=True, cwd=tmp_path, check=True).stdout
    assert where.startswith(str(target)), where
    subprocess.run([sys.executable, "-m", "gpunode_exporter", "rules", "render", "--target", "vmalert",
                    "--out", str(out)],
                   check=True, capture_output=True, cwd=tmp_path, env=env)
    assert {p.name: p.read_text() for p in out.iterdir()} == {
        p.name: p.read_text() for p in (RULES / "vmalert").glob("*.yml")}
