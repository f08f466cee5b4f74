"""The remediation service's systemd unit, checked offline as tests/test_systemd.py checks the exporter's.

- `systemd-analyze verify` accepts the shipped unit; the sysusers and tmpfiles files apply.
- Its offline security exposure is at most 1.1, and the score and the table of remaining items in
  systemd/README.md are the tool's (the README cannot drift).
- It runs as its own user, with no capability at all, no new privileges, a sandbox that still
  lets scontrol reach munged's socket and slurmctld (no PrivateNetwork=, AF_UNIX and AF_INET*).
- Its ExecStart is the exporter's install prefix and flags `gpunode-remediate serve` accepts: the
  policy in its ConfigurationDirectory=, listening where alertmanager/alertmanager.yml posts.
- systemd/README.md installs the three files and names the unit's user in the Slurm rights it needs.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from gpunode_remediate.cli import build_parser
from gpunode_remediate.policy import DEFAULT_STATE
from tests.test_systemd import UNIT as EXPORTER_UNIT
from tests.test_systemd import apply_sysusers_and_tmpfiles, check_security_score, verify_unit

ROOT = Path(__file__).parent.parent
UNIT = ROOT / "systemd" / "gpunode-remediate.service"
SYSUSERS = ROOT / "systemd" / "gpunode-remediate.sysusers"
TMPFILES = ROOT / "systemd" / "gpunode-remediate.tmpfiles"
README = ROOT / "systemd" / "README.md"
ALERTMANAGER = ROOT / "alertmanager" / "alertmanager.yml"
EXPOSURE_BOUND = 1.1  # measured with systemd 252 (Debian bookworm): 1.1


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (Debian's systemd package)")
    return path


def _settings(name: str, unit: Path = UNIT) -> list[str]:
    return re.findall(rf"^{name}=(.*)$", unit.read_text(), re.M)


def _setting(name: str, unit: Path = UNIT) -> str:
    values = _settings(name, unit)
    assert len(values) == 1, f"{name}= set {len(values)} times in {unit.name}"
    return values[0]


def _readme_section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n{title}\n")
    end = text.find("\n#", start + len(title) + 2)
    return text[start:end if end >= 0 else None]


# --- the unit file ---------------------------------------------------------------------------

def test_systemd_analyze_verify(tmp_path: Path) -> None:
    verify_unit(UNIT, tmp_path)


def test_security_exposure_is_documented_and_bounded() -> None:
    check_security_score(UNIT, EXPOSURE_BOUND, _readme_section("### Security score"), "systemd/README.md")


def test_runs_as_its_own_user_with_no_capability() -> None:
    user = _setting("User")
    assert user == _setting("Group") == "gpunode-remediate"
    assert _settings("DynamicUser") == [], "a dynamic user has no stable uid for Slurm to grant rights to"
    assert _setting("CapabilityBoundingSet") == "", "the bounding set must be empty"
    assert _settings("AmbientCapabilities") == []
    assert _setting("NoNewPrivileges") == "yes"
    assert re.search(rf'^u {re.escape(user)} - ".*" - /usr/sbin/nologin$', SYSUSERS.read_text(), re.M)


def test_the_sandbox_keeps_scontrol_and_munge_working() -> None:
    """What scontrol needs: /etc/slurm readable (ProtectSystem=strict leaves it so), munged's socket
    below /run/munge neither hidden nor replaced, TCP to slurmctld, unix sockets for munged."""
    assert _setting("ProtectSystem") == "strict"
    assert _settings("PrivateNetwork") == [], "scontrol talks to slurmctld over TCP"
    assert _setting("RestrictAddressFamilies").split() == ["AF_UNIX", "AF_INET", "AF_INET6"]
    hidden = " ".join(_settings("InaccessiblePaths") + _settings("TemporaryFileSystem") + _settings("BindPaths"))
    assert not any(path in hidden for path in ("/run", "/etc/slurm", "/etc/munge")), hidden
    for name, value in (("ProtectHome", "yes"), ("PrivateTmp", "yes"), ("PrivateDevices", "yes"),
                        ("MemoryDenyWriteExecute", "yes"), ("LockPersonality", "yes"),
                        ("SystemCallArchitectures", "native")):
        assert _setting(name) == value, name
    assert "@system-service" in _settings("SystemCallFilter")
    assert (_setting("StateDirectory"), _setting("ConfigurationDirectory")) == ("gpunode-remediate",) * 2
    assert DEFAULT_STATE.parent == Path("/var/lib") / _setting("StateDirectory"), "the policy's default state_path"


def _exec_start() -> tuple[str, list[str]]:
    """The binary and its arguments, with $ARGS (EnvironmentFile=) unset: systemd then drops the word."""
    binary, *args = shlex.split(_setting("ExecStart"))
    assert args[-1] == "$ARGS", "$ARGS must come last, so that its flags override the unit's"
    return binary, args[:-1]


def test_exec_start_is_the_exporters_install_and_a_valid_command_line() -> None:
    binary, args = _exec_start()
    exporter_binary = _setting("ExecStart", EXPORTER_UNIT).split()[0]
    assert Path(binary).parent == Path(exporter_binary).parent, "not the virtualenv the exporter is installed in"
    assert Path(binary).name == "gpunode-remediate"
    parsed = build_parser().parse_args(args)
    assert parsed.command == "serve"
    assert parsed.config_file == Path("/etc") / _setting("ConfigurationDirectory") / "policy.yml"
    # Where the shipped Alertmanager example posts.
    (receiver,) = [r for r in yaml.safe_load(ALERTMANAGER.read_text())["receivers"] if r["name"] == "gpunode-remediate"]
    url = urlsplit(receiver["webhook_configs"][0]["url"])
    assert parsed.listen == f"{url.hostname}:{url.port}"
    # ARGS from /etc/default/gpunode-remediate come after the unit's flags: the last listen address wins.
    again = build_parser().parse_args([*args, "--web.listen-address=:19836", "--web.bearer-token-file=/t"])
    assert (again.listen, again.token_file) == (":19836", Path("/t"))
    assert _setting("EnvironmentFile") == "-/etc/default/gpunode-remediate"


def test_sysusers_and_tmpfiles_apply(tmp_path: Path) -> None:
    uid = apply_sysusers_and_tmpfiles(UNIT, SYSUSERS, TMPFILES, tmp_path)
    assert uid != 0  # a system user, not root
    assert (tmp_path / "etc" / _setting("ConfigurationDirectory")).is_dir()


# --- systemd/README.md -----------------------------------------------------------------------

def test_readme_installs_the_three_files_and_names_the_slurm_rights() -> None:
    blocks = [b for b in re.findall(r"```sh root\n(.*?)```", README.read_text(), re.S) if "gpunode-remediate" in b]
    install = next((b for b in blocks if "systemd-sysusers" in b), None)
    assert install, "systemd/README.md: no block installs the remediation unit"
    for source in (UNIT, SYSUSERS, TMPFILES):
        assert re.search(rf"^install .*\b{re.escape(source.name)} ", install, re.M), f"{source.name} not installed"
    assert "systemctl enable --now gpunode-remediate" in install
    user = _setting("User")
    assert f"sacctmgr add user {user} " in README.read_text()
    assert "AdminLevel=Admin" in README.read_text()
