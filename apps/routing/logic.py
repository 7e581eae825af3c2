"""Proactive destination-based routing: the papers' baselines (pure logic).

``single_path`` (the papers' "TCP"): one shortest path per destination. Among
equal-cost next hops a switch at layer L picks index
``(host_index // P_L) % n``, where P_L is the product of the uplink fan-outs
of the layers below it (the two-level scheme of Al-Fares et al.): destinations
spread over all core switches, so stride patterns on a fat-tree are
non-blocking.

``ecmp``: wherever a switch has several equal-cost next hops it forwards to an
OpenFlow SELECT group hashing the 5-tuple. Open vSwitch hashes every packet
with the same function and basis at every bridge (``hash(sym_l4(0))``, measured
on OVS 3.1) and maps hash slots to buckets in order, so groups with one bucket
per next hop at two layers make the same choice twice and use only 2 of the 4
core paths of a k=4 fat-tree ("polarisation"). We therefore lay buckets out by
layer: a group at layer L lists each next hop P_L times in a row, so its choice
depends on the L-th digit of the hash, independent of the layers below.
Beyond OVS's 64-bucket dp_hash limit each next hop is repeated as often as
fits (64 // n): the digits overlap in part -- at k = 32 a host's flows reach
64 of the 256 core paths rather than all (16 with one bucket each).

ARP is routed like IP by its target address (``arp_tpa``) along the
single-path tree: requests reach only their target, no flooding, no controller
round trip. A host carrying VMs behind its NIC (its ``vm_prefix``) has the
block routed with it: masked ``ipv4_dst``/``arp_tpa`` entries beside its own
address's, the same next hops (a routed hypervisor).

With BG up-paths (``set_bg_up``: LESSOR's default BG routes,
:mod:`apps.lessor.bg_routes`), each switch of a VM's up-path sends the VM's
BG (``ipv4_src`` = its address, DSCP CS0) to the path's next switch, at
``PRIO_BG_UP``; the destinations below such a switch get their own entries
above it (``PRIO_BG_BELOW``), so only BG that must climb does.

With ``accounting`` (used by the traffic-engineering apps), edge switches
also keep a learned byte counter per TCP/UDP flow from their hosts
(``pipeline.TABLE_ACCOUNT``): IP entries resubmit there before forwarding.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from controller import ofmsg
from controller.network_view import NetworkView
from bwcommon.contract import DSCP_BG
from controller.pipeline import (APP_ROUTING, COOKIE_APP_MASK, PRIO_BG_BELOW, PRIO_BG_UP, PRIO_ROUTE, TABLE_ACCOUNT,
                                 TABLE_FORWARD, accounting_entries, cookie, pipeline_defaults, wipe_app)

MAX_SELECT_BUCKETS = 64
GROUP_ID_BASE = 1


@dataclass
class _SwitchState:
    groups: dict[tuple[int, ...], int]  # bucket port layout -> group id
    flows: dict[tuple[int, int, ofmsg.Match], ofmsg.FlowMod]
    next_gid: int = GROUP_ID_BASE


def _targets(view: NetworkView, host: str) -> list:
    """What routes to a host: its address, and its VM block as a masked
    match (``(network, netmask)``) when it carries VMs behind its NIC."""
    prefix = view.vm_prefix(host)
    if prefix is None:
        return [view.ip(host)]
    net = ipaddress.IPv4Network(prefix)
    block = str(net.network_address) if net.prefixlen == 32 else (str(net.network_address), str(net.netmask))
    return [view.ip(host), block]


class DestinationRouting:
    """Computes every switch's forwarding entries; returns OpenFlow messages."""

    def __init__(self, view: NetworkView, multipath: bool, accounting: bool = False):
        self.view = view
        self.multipath = multipath
        self.accounting = accounting
        self._radix = self._layer_radix()
        self._state: dict[str, _SwitchState] = {}
        self.bg_up: dict[str, tuple[str, ...]] = {}   # VM address -> its BG's up-path (switches from its ToR)

    def set_bg_up(self, up: dict[str, tuple[str, ...]]) -> dict[str, list[ofmsg.Message]]:
        """New BG up-paths; the updates of every connected switch, the
        highest layer first (a path's upper switches are ready before its ToR
        sends BG up it)."""
        for addr, path in up.items():
            if not isinstance(path, tuple) or len(path) < 1 or any(
                    not isinstance(sw, str) or not self.view.graph.has_node(sw) or self.view.is_host(sw)
                    for sw in path) or not all(self.view.graph.has_edge(a, b) for a, b in zip(path, path[1:])):
                raise ValueError(f"BG up-path of {addr!r}: {path!r} must be a tuple of switches")
        self.bg_up = dict(up)
        out = {}
        for sw in sorted(self._state, key=lambda s: (-self._layer(s), s)):
            msgs = self.switch_update(sw)
            if msgs:
                out[sw] = msgs
        return out

    # ---- path choice -----------------------------------------------------
    def _layer_radix(self) -> dict[int, int]:
        fanout = self.view.uplink_fanout_by_layer()
        radix, acc = {}, 1
        for layer in range(max(fanout, default=0) + 1):
            radix[layer] = acc
            acc *= max(1, fanout.get(layer, 1))
        return radix

    def _layer(self, switch: str) -> int:
        return self.view.graph.nodes[switch]["layer"]

    def single_next_hop(self, switch: str, dst: str) -> str | None:
        hops = self.view.next_hops(switch, dst)
        if not hops:
            return None
        digit = self.view.host_index(dst) // self._radix[self._layer(switch)]
        return hops[digit % len(hops)]

    def single_path(self, src: str, dst: str) -> tuple[str, ...] | None:
        """The path single_path routing installs from host src to host dst."""
        path = [src]
        node = self.view.host_switch(src)[0]
        while node != dst:
            path.append(node)
            node = self.single_next_hop(node, dst)
            if node is None:
                return None
        path.append(dst)
        return tuple(path)

    def bucket_layout(self, switch: str, ports: list[int]) -> tuple[int, ...]:
        reps = self._radix[self._layer(switch)]
        if len(ports) * reps > MAX_SELECT_BUCKETS:
            # as many repeats as fit OVS's 64 buckets: the choice still reads hash bits above most of those
            # the layer below read. One bucket per next hop (what this did before) made both layers read
            # the same bits: at k = 32 a host's inter-pod flows met 16 of the 256 cores, and ECMP carried
            # 6.2 of 41 Gb/s offered (the flow-level simulator, docs/results.md)
            reps = max(1, MAX_SELECT_BUCKETS // len(ports))
        return tuple(p for p in ports for _ in range(reps))

    # ---- messages ----------------------------------------------------------
    def _desired(self, switch: str, state: _SwitchState) -> dict[tuple[int, int, ofmsg.Match], ofmsg.FlowMod]:
        view = self.view
        ck = cookie(APP_ROUTING)
        flows: dict[tuple[int, int, ofmsg.Match], ofmsg.FlowMod] = {}
        count = self.accounting and view.graph.nodes[switch]["role"] == "edge"
        if count:
            host_ports = [view.port(switch, h) for h in view.graph.successors(switch) if view.is_host(h)]
            for fm in accounting_entries(host_ports, ck):
                flows[(fm.table_id, fm.priority, fm.match)] = fm
        below: dict[str, tuple[list, list]] = {}
        for dst in view.hosts:
            single = self.single_next_hop(switch, dst)
            if single is None:
                continue  # unreachable now: no entry, packets drop
            targets = _targets(view, dst)
            for target in targets:
                arp = ofmsg.Match.of(eth_type=ofmsg.ETH_TYPE_ARP, arp_tpa=target)
                flows[(TABLE_FORWARD, PRIO_ROUTE, arp)] = ofmsg.flow_add(
                    TABLE_FORWARD, PRIO_ROUTE, arp, [ofmsg.Output(view.port(switch, single))], cookie=ck)
            hops = view.next_hops(switch, dst)
            if self.multipath and len(hops) > 1:
                layout = self.bucket_layout(switch, [view.port(switch, h) for h in hops])
                if layout not in state.groups:
                    state.groups[layout] = state.next_gid
                    state.next_gid += 1
                action: ofmsg.Action = ofmsg.GroupAction(state.groups[layout])
            else:
                action = ofmsg.Output(view.port(switch, single))
            actions = [ofmsg.Resubmit(TABLE_ACCOUNT), action] if count else [action]
            for target in targets:
                match = ofmsg.Match.of(eth_type=ofmsg.ETH_TYPE_IP, ipv4_dst=target)
                flows[(TABLE_FORWARD, PRIO_ROUTE, match)] = ofmsg.flow_add(
                    TABLE_FORWARD, PRIO_ROUTE, match, actions, cookie=ck)
            below[dst] = (targets, actions)
        ups = {addr: path[path.index(switch) + 1] for addr, path in self.bg_up.items() if switch in path[:-1]}
        if ups:
            for addr, nxt in sorted(ups.items()):
                match = ofmsg.Match.of(eth_type=ofmsg.ETH_TYPE_IP, ipv4_src=addr, ip_dscp=DSCP_BG)
                out = ofmsg.Output(view.port(switch, nxt))
                flows[(TABLE_FORWARD, PRIO_BG_UP, match)] = ofmsg.flow_add(
                    TABLE_FORWARD, PRIO_BG_UP, match, [ofmsg.Resubmit(TABLE_ACCOUNT), out] if count else [out],
                    cookie=ck)
            for dst, (targets, actions) in below.items():
                if not view.is_below(switch, dst):
                    continue
                for target in targets:
                    match = ofmsg.Match.of(eth_type=ofmsg.ETH_TYPE_IP, ipv4_dst=target)
                    flows[(TABLE_FORWARD, PRIO_BG_BELOW, match)] = ofmsg.flow_add(
                        TABLE_FORWARD, PRIO_BG_BELOW, match, actions, cookie=ck)
        return flows

    def _used_groups(self, state: _SwitchState, flows) -> dict[int, tuple[int, ...]]:
        used = {a.group_id for fm in flows.values() for ins in fm.instructions
                if isinstance(ins, ofmsg.ApplyActions) for a in ins.actions
                if isinstance(a, ofmsg.GroupAction)}
        return {gid: layout for layout, gid in state.groups.items() if gid in used}

    def switch_connected(self, switch: str) -> list[ofmsg.Message]:
        """Full (re)install for a switch that just connected: wipe this app's
        entries and groups, then install the current state."""
        state = _SwitchState(groups={}, flows={})
        flows = self._desired(switch, state)
        used = self._used_groups(state, flows)
        state.groups = {layout: gid for gid, layout in used.items()}
        state.flows = flows
        self._state[switch] = state
        msgs: list[ofmsg.Message] = [wipe_app(APP_ROUTING), *pipeline_defaults()]
        for gid, layout in sorted(used.items()):
            msgs.append(ofmsg.group_delete(gid))
            msgs.append(ofmsg.group_select(gid, layout))
        msgs.extend(flows.values())
        return ofmsg.ordered(msgs)

    def switch_reconciled(self, switch: str, held: ofmsg.Held) -> list[ofmsg.Message]:
        """A switch that (re)connected, read back first (``held``), brought to
        the current view make-before-break -- after a controller restart or a
        lost connection its entries are still forwarding (fail-secure), and
        wiping them would drop every packet until the new ones are in.

        Its select groups are adopted by bucket layout (the group ids stay);
        the groups it lacks are added (ids above every id it holds); every
        wanted entry is (re)added -- an add over an entry with the same table,
        priority and match replaces it in place; then this app's entries the
        view no longer wants are deleted, and last the groups nothing uses.
        No wanted entry or used group is ever deleted on the way."""
        held_groups = dict(held.groups)
        state = _SwitchState(groups={}, flows={}, next_gid=max([GROUP_ID_BASE - 1, *held_groups]) + 1)
        for gid, layout in sorted(held_groups.items()):
            if layout is not None:
                state.groups.setdefault(layout, gid)
        flows = self._desired(switch, state)
        used = self._used_groups(state, flows)
        state.groups = {layout: gid for gid, layout in used.items()}
        state.flows = flows
        self._state[switch] = state
        ck = cookie(APP_ROUTING)
        msgs: list[ofmsg.Message] = [ofmsg.group_select(gid, layout) for gid, layout in sorted(used.items())
                                     if held_groups.get(gid) != layout]
        msgs.extend(pipeline_defaults())
        msgs.extend(flows.values())
        msgs.extend(ofmsg.flow_delete_strict(t, p, m, ck, COOKIE_APP_MASK)
                    for (t, p, m) in held.owned(ck) if (t, p, m) not in flows)
        msgs.extend(ofmsg.group_delete(gid) for gid in sorted(held_groups) if gid not in used)
        return msgs

    def switch_update(self, switch: str) -> list[ofmsg.Message]:
        """Bring a connected switch to the current view, make-before-break:
        new groups, then changed/new flows, then removed flows and groups."""
        state = self._state.get(switch)
        if state is None:
            return self.switch_connected(switch)
        old_flows, old_groups = state.flows, dict(state.groups)
        flows = self._desired(switch, state)
        used = self._used_groups(state, flows)
        new_groups = [ofmsg.group_select(gid, layout) for gid, layout in sorted(used.items())
                      if layout not in old_groups]
        changed = [fm for key, fm in flows.items() if old_flows.get(key) != fm]
        removed = [ofmsg.flow_delete_strict(t, p, m, cookie(APP_ROUTING), COOKIE_APP_MASK)
                   for (t, p, m) in old_flows if (t, p, m) not in flows]
        dead = [ofmsg.group_delete(gid) for layout, gid in sorted(old_groups.items(), key=lambda x: x[1])
                if gid not in used]
        state.groups = {layout: gid for gid, layout in used.items()}
        state.flows = flows
        return [*new_groups, *changed, *removed, *dead]

    def link_changed(self, switch: str, port: int, up: bool) -> dict[str, list[ofmsg.Message]]:
        """A port went up/down: update the view and every connected switch."""
        return self.links_changed([(switch, port, up)])

    def links_changed(self, changes: list[tuple[str, int, bool]]) -> dict[str, list[ofmsg.Message]]:
        """Ports that went up or down, in the order reported: the view takes
        them all, then every connected switch is brought to it once."""
        if not [c for c in [self.view.set_port_state(sw, port, up) for sw, port, up in changes] if c is not None]:
            return {}
        out = {}
        for sw in sorted(self._state):
            msgs = self.switch_update(sw)
            if msgs:
                out[sw] = msgs
        return out

    def switch_disconnected(self, switch: str) -> None:
        self._state.pop(switch, None)


def app_logic(view: NetworkView, app: str) -> DestinationRouting:
    if app not in ("single_path", "ecmp"):
        raise ValueError(f"unknown routing app {app!r}; choose single_path or ecmp")
    return DestinationRouting(view, multipath=(app == "ecmp"))
