#!/usr/bin/env bash
# Installs what the exporter (with --demo, the demo stack; with --test, the test suite)
# needs on a fresh Debian bookworm machine: a virtualenv in .venv with the package, and
# Debian's Prometheus, Alertmanager and node_exporter that the demo runs and the tests run
# against (with promtool, amtool, vmalert, process-exporter, iproute2 and ethtool).
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0 want_demo=0
[ "${1:-}" = "--test" ] && want_test=1 && want_demo=1
[ "${1:-}" = "--demo" ] && want_demo=1

need_apt=()
if [ "$want_demo" = 1 ]; then
  command -v prometheus >/dev/null || need_apt+=(prometheus)
  command -v prometheus-node-exporter >/dev/null || need_apt+=(prometheus-node-exporter)
  command -v prometheus-alertmanager >/dev/null || need_apt+=(prometheus-alertmanager)
fi
if [ "$want_test" = 1 ]; then
  command -v prometheus-process-exporter >/dev/null || need_apt+=(prometheus-process-exporter)
  command -v vmalert >/dev/null || need_apt+=(victoria-metrics)
  # tests/test_systemd.py: systemd-analyze verify/security, systemd-sysusers, systemd-tmpfiles.
  command -v systemd-analyze >/dev/null || need_apt+=(systemd)
  # tests/test_ethtool.py compares the exporter's SIOCETHTOOL reader with `ethtool -S`.
  command -v ethtool >/dev/null || [ -x /usr/sbin/ethtool ] || [ -x /sbin/ethtool ] || need_apt+=(ethtool)
fi
command -v ip >/dev/null || need_apt+=(iproute2)
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
[ "$want_demo" = 1 ] && extra="[demo]"
[ "$want_test" = 1 ] && extra="[test]"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extra}"
