"""The host agent's executor on a real network namespace: tc (pyroute2),
nftables, MPTCP endpoints and sysctls put in force, re-applied without
change, rates changed in place, and everything removed on teardown."""

import json
import re
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.root

SCRIPT = textwrap.dedent('''
    import json, subprocess, sys
    from hostagent import plan as P
    from hostagent.executor import Executor
    args = json.loads(sys.argv[1])
    cfg = P.HostConfig.from_dict(args["cfg"])
    plan = P.Plan(tuple(s for s in P.host_plan(cfg).steps if not isinstance(s, P.BpfMapSet)))
    ex = Executor(state_file=args["state"])
    rmem_before = open("/proc/sys/net/ipv4/tcp_rmem").read()
    rto_max_before = open("/proc/sys/net/ipv4/tcp_rto_max_ms").read()
    limits_before = subprocess.run(["ip", "mptcp", "limits", "show"], capture_output=True, text=True).stdout
    out = {"rmem_before": rmem_before, "limits_before": limits_before, "first": ex.apply(plan), "again": ex.apply(plan)}
    def sh(*c):
        return subprocess.run(c, capture_output=True, text=True).stdout
    out["classes"] = sh("tc", "class", "show", "dev", cfg.interface)
    out["filters"] = sh("tc", "filter", "show", "dev", cfg.interface)
    out["nft"] = sh("nft", "list", "table", "ip", P.NFT_TABLE)
    out["endpoints"] = sh("ip", "mptcp", "endpoint", "show")
    out["limits"] = sh("ip", "mptcp", "limits", "show")
    out["rmem"] = open("/proc/sys/net/ipv4/tcp_rmem").read()
    out["rto_max"], out["rto_max_before"] = open("/proc/sys/net/ipv4/tcp_rto_max_ms").read(), rto_max_before
    moved = P.HostConfig.from_dict({**args["cfg"], "guarantee_mbps": 20})
    out["moved"] = ex.apply(P.Plan(tuple(s for s in P.host_plan(moved).steps if not isinstance(s, P.BpfMapSet))))
    out["classes_moved"] = sh("tc", "class", "show", "dev", cfg.interface)
    ex.teardown()
    out["after"] = {"qdisc": sh("tc", "qdisc", "show", "dev", cfg.interface),
                    "nft": sh("nft", "list", "tables"), "endpoints": sh("ip", "mptcp", "endpoint", "show"),
                    "rmem": open("/proc/sys/net/ipv4/tcp_rmem").read(),
                    "rto_max": open("/proc/sys/net/ipv4/tcp_rto_max_ms").read(),
                    "limits": sh("ip", "mptcp", "limits", "show"), "clean": ex.clean_differences()}
    print(json.dumps(out))
''')


def _rates(tc_text):
    return {m[0]: (m[1], m[2]) for m in re.findall(r"class htb (\S+) .*?rate (\S+) ceil (\S+)", tc_text)}



def test_executor_applies_idempotently_changes_rates_in_place_and_tears_down(netns, tmp_path):
    # BG held by its HTB class alone (the marker's path: test_bg_marker.py)
    cfg = dict(host="s1", interface="ag0", address="10.9.0.1", nic_mbps=100, guarantee_mbps=35,
               wc_subflows=2, demote_bg=False, rto_max_ms=1000)
    res = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", SCRIPT,
                          json.dumps({"cfg": cfg, "state": str(tmp_path / "ex.json")})],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["first"] > 5 and out["again"] == 0           # second apply changes nothing
    rates = _rates(out["classes"])
    assert rates["1:10"] == ("35Mbit", "35Mbit") and rates["1:1"] == ("100Mbit", "100Mbit")
    assert rates["1:20"][1] == "100Mbit"
    assert "match 00000000/fc000000 at 1" in out["filters"] and "flowid 1:10" in out["filters"]
    assert "protocol ip" in out["filters"]
    assert "ct mark set 0x00000020" in out["nft"] and "ip dscp set cs1" in out["nft"]
    assert out["endpoints"].count("signal") == 2 and "port 10101" in out["endpoints"]
    assert "subflows 2" in out["limits"] and "add_addr_accepted 2" in out["limits"]
    assert int(out["rmem"].split()[2]) >= 128 * 1024
    assert out["moved"] == 2                  # only the BG and WC class rates changed, in place
    assert _rates(out["classes_moved"])["1:10"] == ("20Mbit", "20Mbit")
    after = out["after"]
    assert "htb" not in after["qdisc"] and "bwfabric" not in after["nft"] and "signal" not in after["endpoints"]
    assert after["rmem"] == out["rmem_before"] != out["rmem"]          # restored
    assert out["rto_max"].strip() == "1000" and after["rto_max"] == out["rto_max_before"] != out["rto_max"]
    # issue #31: teardown left `ip mptcp limits` changed while the status said clean
    assert after["limits"] == out["limits_before"] != out["limits"] and after["clean"] == []
