#!/usr/bin/env bash
# Set-up for a fresh Debian/Ubuntu machine, run as root. Safe to run twice: it installs only what
# is missing (apt packages, the virtual environment .venv, the package) and builds the NFQUEUE
# delay element. `scripts/setup.sh --test` adds what the tests need (pytest, vagrant).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "setup needs root (apt, network namespaces): run it with sudo" >&2
  exit 1
fi
# mininet (and bridge-utils, ethtool) for --backend mininet: Debian builds it for the system Python,
# so the virtual environment sees the system's site packages; openssh-server stands in for remote
# machines in the tests of --backend remote; qemu, qemu-utils and debootstrap build and boot the VM test box
# (tests/support/vm.py: the netem path on a stock kernel)
packages="iproute2 iptables iperf3 iputils-ping util-linux gcc libc6-dev libnetfilter-queue-dev python3 python3-venv
  mininet bridge-utils ethtool python3-yaml"
extras=""
if [ "${1:-}" = "--test" ]; then
  packages="$packages vagrant openssh-server qemu-system-x86 qemu-utils debootstrap"
  extras="[test]"
fi
missing=""
for p in $packages; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "installing:$missing"
  apt-get update -qq
  # the tests start their own sshd instances inside namespaces: installing openssh-server must not
  # leave a system sshd listening (policy-rc.d(8) stops the package from starting its service)
  policy=""
  case "$missing" in *openssh-server*)
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && policy=1
    fi;;
  esac
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  if [ -n "$policy" ]; then
    rm -f /usr/sbin/policy-rc.d
    if [ -d /run/systemd/system ]; then systemctl disable -q ssh.service ssh.socket 2>/dev/null || true; fi
  fi
fi
if [ ! -x .venv/bin/python ]; then
  /usr/bin/python3 -m venv --system-site-packages .venv
elif grep -q "include-system-site-packages = false" .venv/pyvenv.cfg; then
  # an environment made before the mininet backend: let it see the system's mininet package
  sed -i "s/include-system-site-packages = false/include-system-site-packages = true/" .venv/pyvenv.cfg
fi
stamp=".venv/.installed-$(cat setup.cfg pyproject.toml | sha256sum | cut -c1-12)${extras:+-test}"
if [ ! -f "$stamp" ]; then
  echo "installing the package and its Python dependencies${extras:+ with the test extras} into .venv (a minute or two into a new .venv, seconds into one that has most of them)"
  .venv/bin/pip install -q --disable-pip-version-check -e ".$extras"
  touch "$stamp"
fi
.venv/bin/python -c "from testbed.net.delay_element import build_helper; build_helper()"
