#!/usr/bin/env bash
# Installs what the exporter (with --demo, the demo stack; with --test, the test suite) needs on
# a fresh Debian bookworm machine, a minimal one included (git, make and python3 alone): a
# virtualenv in .venv with the package, and from Debian's archive every program the demo, the
# tests and the documented commands call that the machine lacks.
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0 want_demo=0 want_rules=0
[ "${1:-}" = "--test" ] && want_test=1 && want_demo=1
[ "${1:-}" = "--demo" ] && want_demo=1
[ "${1:-}" = "--rules" ] && want_rules=1

# "command:package": the package is installed when the command is missing. README.md names these
# packages; tests/test_docs.py holds that it does, and that every program a test or a documented
# command runs is here or in what a minimal Debian has.
node_tools="ip:iproute2"
# Debian's Prometheus, node_exporter and Alertmanager run the demo; curl is in the docs' commands;
# Slurm's own controller and node daemons, with munge, are what the remediation service drains.
demo_tools="prometheus:prometheus promtool:prometheus prometheus-node-exporter:prometheus-node-exporter
  prometheus-alertmanager:prometheus-alertmanager amtool:prometheus-alertmanager curl:curl
  slurmctld:slurmctld slurmd:slurmd scontrol:slurm-client sinfo:slurm-client sbatch:slurm-client
  scancel:slurm-client squeue:slurm-client munged:munge"
# The unit is checked with systemd's own tools, and run under systemd-nspawn in a Debian that
# mmdebstrap builds; the image is built and run with podman (runc: crun refuses hybrid cgroups);
# VictoriaMetrics runs the rule pack beside Prometheus; `ethtool -S` and process-exporter are the
# tests' second opinions.
test_tools="victoria-metrics:victoria-metrics vmalert:victoria-metrics vmagent:victoria-metrics
  systemd-analyze:systemd systemd-sysusers:systemd systemd-tmpfiles:systemd ethtool:ethtool
  prometheus-process-exporter:prometheus-process-exporter systemd-nspawn:systemd-container
  mmdebstrap:mmdebstrap podman:podman runc:runc"

have() {  # on PATH, or in an sbin directory a non-root PATH leaves out
  command -v "$1" >/dev/null || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]
}

tools="$node_tools"
[ "$want_demo" = 1 ] && tools="$tools $demo_tools"
[ "$want_test" = 1 ] && tools="$tools $test_tools"
need_apt=()
for pair in $tools; do
  package="${pair#*:}"
  [[ " ${need_apt[*]} " == *" $package "* ]] || have "${pair%%:*}" || need_apt+=("$package")
done
# Debian splits venv's pip bootstrap out of python3: a minimal system cannot make a venv without it.
python3 -c 'import ensurepip' 2>/dev/null || need_apt+=(python3-venv)

if [ "${#need_apt[@]}" -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "install-deps: need root to apt-get install ${need_apt[*]}" >&2
    exit 1
  fi
  echo "install-deps: apt-get install ${need_apt[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

python3 -m venv .venv
extra=""
[ "$want_rules" = 1 ] && extra="[rules]"
[ "$want_demo" = 1 ] && extra="[demo]"
[ "$want_test" = 1 ] && extra="[test]"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extra}"
