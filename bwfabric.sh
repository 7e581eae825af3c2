#!/usr/bin/env bash
# bwfabric on a Debian 12 machine, as root. Installs what it needs, then runs:
#   ./bwfabric.sh experiment [NAME] [--option K=V ...]   emulated experiment (default: the main job)
#   ./bwfabric.sh test [pytest args]                      the whole test suite (unit + root integration)
#   ./bwfabric.sh <any bwfabric subcommand>               e.g. controller, check-config, topology
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")"

APT_PACKAGES=(openvswitch-switch openvswitch-common mininet iperf3 python3-venv python3-pip
              ethtool iproute2 iputils-ping procps psmisc tcpdump nftables
              clang bpftool libbpf-dev mptcpd gcc libc6-dev)

setup() {
    if [ "$(id -u)" != 0 ]; then
        echo "bwfabric.sh: run as root (Mininet and Open vSwitch need it)" >&2
        exit 2
    fi
    local missing=()
    for pkg in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "bwfabric.sh: installing ${missing[*]}" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
    # Debian's python3 so that Debian's mininet package is importable in the venv.
    if [ ! -x .venv/bin/python ]; then
        /usr/bin/python3 -m venv --system-site-packages .venv
    fi
    if [ ! -f .venv/.installed ] || [ requirements.txt -nt .venv/.installed ] || [ setup.py -nt .venv/.installed ]; then
        .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
        .venv/bin/pip install -q --disable-pip-version-check --no-deps -e .
        touch .venv/.installed
    fi
}

# The guest kernel and QEMU (from bookworm-backports) for the one experiment that runs a real guest,
# coupled-vm-guest, and its test: set up for those only, never for the controller, the agent or the main job.
setup_guest() {
    if ! .venv/bin/python -c "from experiments import vmguest; raise SystemExit(vmguest.missing() is not None)"; then
        echo "bwfabric.sh: setting up the guest kernel (QEMU from bookworm-backports)" >&2
        .venv/bin/python -m experiments.vmguest setup >/dev/null
    fi
}

cmd="${1:-experiment}"
[ $# -gt 0 ] && shift
setup
case "$cmd" in
    test)
        # The official test command never skips the root integration tests (the real-guest one included).
        setup_guest
        export BWFABRIC_REQUIRE_INTEGRATION=1
        exec .venv/bin/python -m pytest "$@"
        ;;
    experiment)
        [ "${1:-}" = coupled-vm-guest ] && setup_guest
        exec .venv/bin/bwfabric "$cmd" "$@"
        ;;
    *)
        exec .venv/bin/bwfabric "$cmd" "$@"
        ;;
esac
