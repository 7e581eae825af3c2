#!/usr/bin/env bash
# bwfabric on a Debian 12 machine, as root. Installs what it needs, then runs:
#   ./bwfabric.sh experiment [NAME] [--option K=V ...]   emulated experiment (default: the main job)
#   ./bwfabric.sh test [pytest args]                      the whole test suite (unit + root integration)
#   ./bwfabric.sh <any bwfabric subcommand>               e.g. controller, agent, check-config, topology
# Each command sets up only its role: agent (and status, tenants, reload), controller (and check-config,
# topology), or emulation (experiment, simulate, test: every role, Mininet and OVS).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")"

# What each role installs (docs/deploy.md): Debian packages, and pyproject.toml's extra (the base install
# is the agent's). An emulation/test install holds the controller's and the agent's too.
APT_AGENT=(python3-venv python3-pip iproute2 nftables clang bpftool libbpf-dev)
APT_CONTROLLER=(python3-venv python3-pip)
APT_EMULATION=("${APT_AGENT[@]}" openvswitch-switch openvswitch-common mininet iperf3 ethtool iputils-ping
               procps psmisc tcpdump mptcpd gcc libc6-dev etcd-server)

role_of() {
    case "$1" in
        agent|agent-key|status|tenants|reload) echo agent ;;
        controller|check-config|topology|config-reference) echo controller ;;
        *) echo emulation ;;          # experiment, simulate, test
    esac
}

# apt_ensure WHY PACKAGE...: installs those of the Debian packages that are missing
apt_ensure() {
    local why="$1" missing=()
    shift
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "bwfabric.sh: installing ${missing[*]}$why" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

setup() {
    local role="$1" apt extra
    if [ "$(id -u)" != 0 ]; then
        echo "bwfabric.sh: run as root (the agent, Mininet and Open vSwitch need it)" >&2
        exit 2
    fi
    case "$role" in
        agent) apt=("${APT_AGENT[@]}"); extra="" ;;
        controller) apt=("${APT_CONTROLLER[@]}"); extra="[controller]" ;;
        *) apt=("${APT_EMULATION[@]}"); extra="[test]" ;;
    esac
    apt_ensure "" "${apt[@]}"
    # Debian's python3 so that Debian's mininet package is importable in the venv.
    if [ ! -x .venv/bin/python ]; then
        /usr/bin/python3 -m venv --system-site-packages .venv
    fi
    # the versions verified here (requirements.txt) constrain what the role's extra pulls in
    local stamp=".venv/.installed-$role"
    if [ ! -f "$stamp" ] || [ requirements.txt -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        .venv/bin/pip install -q --disable-pip-version-check -c requirements.txt -e ".$extra"
        touch "$stamp"
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

# ns-3 (PyPI ns3, in a venv of its own: it is no role's dependency; docs/platform.md) for the flow-level
# simulator's packet-level check, simulate fabric-validate-ns3, only. cppyy builds CPyCppyy from source.
NS3_VERSION=3.44.post0
setup_ns3() {
    apt_ensure " (ns-3's Python bindings build with them)" g++ python3-dev cmake make
    if ! .venv-ns3/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('ns3') != '$NS3_VERSION')" \
            2>/dev/null; then
        echo "bwfabric.sh: setting up ns-3 $NS3_VERSION in .venv-ns3 (about 2 min)" >&2
        /usr/bin/python3 -m venv .venv-ns3
        .venv-ns3/bin/pip install -q --disable-pip-version-check "ns3==$NS3_VERSION"
    fi
}

cmd="${1:-experiment}"
[ $# -gt 0 ] && shift
setup "$(role_of "$cmd")"
case "$cmd" in
    test)
        # The official test command never skips the root integration tests (the real-guest one and ns-3's
        # included).
        setup_guest
        setup_ns3
        export BWFABRIC_REQUIRE_INTEGRATION=1
        exec .venv/bin/python -m pytest "$@"
        ;;
    simulate)
        [ "${1:-}" = fabric-validate-ns3 ] && setup_ns3
        exec .venv/bin/bwfabric "$cmd" "$@"
        ;;
    experiment)
        [ "${1:-}" = coupled-vm-guest ] && setup_guest
        exec .venv/bin/bwfabric "$cmd" "$@"
        ;;
    *)
        exec .venv/bin/bwfabric "$cmd" "$@"
        ;;
esac
