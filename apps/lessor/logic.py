"""LESSOR's controller logic (pure: messages in, messages out; no os-ken).

- Defaults: ECMP SELECT groups carry every flow, short ones for good (they
  never reach PMPT), with per-flow counters learned at the ToRs
  (``DestinationRouting(accounting=True)``).
- PRE: only ToR (edge) switches are polled, for their counter table, on the
  schedule of Algorithm 1; counters feed the FlowTable (Eq. 4, short/long).
- PMPT: long flows are allocated one path each. Demand B_f: Hedera's
  natural-demand estimate times the NIC rate for long flows that move at
  least 10 % of their NIC rate (network-limited elephants); a long flow
  slower than that is application-limited (a reverse ACK stream, say) and
  its demand is its predicted rate. Installed flows keep their paths unless
  the new allocation's one-path lambda beats keeping them, and then only
  the fewest of them move that make the routing as good (every move costs
  TCP a reordering: :mod:`apps.lessor.moves`); each is installed as exact-match entries (priority above
  the ECMP defaults) on every switch of its path, with an idle timeout so
  dead flows vanish. A moved flow is installed make-before-break: entries on
  the new path go out destination-first, the ToR's entry is switched last,
  and entries only the old path used are removed after.
- BG first (:mod:`apps.lessor.bg`, given the declared tenants by
  :meth:`LessorLogic.set_bg`): long flows that travel in the guaranteed
  class carry their VM's share of its guarantee, and PMPT places them
  before everything else so that no link's BG exceeds mu x C. They are
  never pinned, and an installed routing is kept only while its BG fits.
- Receiver fairness (:mod:`apps.lessor.fairness`, without BG classes): long
  flows into a host whose link is saturated are policed at its max-min
  share by a meter on their entry at their source ToR (an intra-ToR flow
  gets an exact entry there for it). :meth:`LessorLogic.police`, every
  polling round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from apps.lessor import fairness
from apps.lessor.bg import BgPolicy
from apps.lessor.bg_routes import BgRoutes, pack
from apps.lessor.hedera import ELEPHANT_FRACTION, estimate_demands
from apps.lessor.moves import fewest_moves
from apps.lessor.paths import PathDictionary
from apps.lessor.pmpt import DEFAULT_EPSILON, Allocation, LongFlow, mrtf_key, pmpt
from apps.lessor.pre import LONG_FLOW_BYTES, AdaptivePolling, FlowTable, PollingConfig, PollSchedule
from apps.routing.logic import DestinationRouting
from bwcommon import contract
from controller import ofmsg
from controller.network_view import NetworkView
from bwcommon.validate import finite_number
from controller.pipeline import (APP_ACCOUNT, APP_LESSOR, COOKIE_APP_MASK, METER_LESSOR_BASE, METER_LESSOR_SLOTS,
                                 PRIO_EXACT_FLOW, TABLE_ACCOUNT, TABLE_FORWARD, cookie)

LONG_FLOW_IDLE_S = 10
# Busy: known long flows' predicted rates over capacity at least this. An
# installed flow whose source or destination host link is busy, or none of
# whose fabric links is busy, is limited outside the fabric: no move can
# speed it up, so it is pinned (see LessorLogic.host_limited).
FABRIC_BUSY = 0.85
# a flow that meets a saturated host link and a busy fabric link below this fraction of the
# host link's equal share is starved (LessorLogic.starved): TCP-limited flows squeezed between
# two queues ran at 0.10 of it in emulation; app-limited streams into a busy host sit higher
STARVED_FRACTION = 0.25
MOVE_LOG = 200      # moves the state file lists
# a long flow without BG moved less than this long ago is not moved again (route-flap damping): in the
# main job at guarantees 4,4 16-17 of the 17-22 WC joins each allocation moved were moved 2-5 times in
# 20 s, and each move reorders an MPTCP subflow whose connection's window then holds its BG subflow
MOVE_HOLD_S = 10.0
DEMAND_BAND = 0.10  # demands moving less than this since the last allocation do not rerun PMPT
FiveTuple = tuple[str, str, int, int, int]  # src ip, dst ip, proto, src port, dst port


@dataclass
class Installed:
    path: tuple[str, ...]
    rate: float
    bg: float = 0.0     # bits/s of BG it carries (apps.lessor.bg)


@dataclass(frozen=True)
class Policed:
    """A long flow held to its receiver's fair share (LessorLogic.police)."""
    meter_id: int
    rate_kbps: int
    path: tuple[str, ...]   # host, ..., host: its source ToR's entry carries the meter


class LessorLogic:
    def __init__(self, view: NetworkView, polling: PollingConfig | None = None,
                 epsilon: float = DEFAULT_EPSILON, long_flow_bytes: int = LONG_FLOW_BYTES):
        self.view = view
        self.epsilon = epsilon
        self.routing = DestinationRouting(view, multipath=True, accounting=True)
        self.paths = PathDictionary(view)
        self.table = FlowTable(long_flow_bytes)
        self.polling = AdaptivePolling(polling or PollingConfig())
        self.schedule = PollSchedule(self.polling)
        self.installed: dict[FiveTuple, Installed] = {}
        self.last_allocation: Allocation | None = None
        self.reroutes = 0  # installed long flows moved to another path
        self.allocations = self.allocations_skipped = 0
        self._last_input: tuple[int, dict] | None = None  # (view version, demands) of the last allocation
        self.edges = [sw for sw in view.switches if view.graph.nodes[sw]["role"] == "edge"]
        self.edge_set = set(self.edges)
        self.untrusted = 0        # counter entries not trusted as their source host's flow (flow_stats)
        self.unroutable: list[FiveTuple] = []   # long flows of the last allocation with no usable path
        self.uncertified = 0      # allocations PMPT ended at its phase cap without a certified gap
        self.moves_per_allocation: list[int] = []   # installed flows moved by each allocation (last 1000)
        self.pinned: set[FiveTuple] = set()          # installed flows limited outside the fabric (last look)
        self.owed: dict[FiveTuple, float] = {}      # starved flows and their shares (LessorLogic.starved)
        self.now = 0.0                               # the latest counter reply's time
        self.move_log: list[tuple[float, FiveTuple, tuple[str, ...], tuple[str, ...]]] = []  # last MOVE_LOG moves
        self.moved_at: dict[FiveTuple, float] = {}   # installed flows' last move (MOVE_HOLD_S)
        self.bg = BgPolicy()
        self.bg_routes = BgRoutes()
        self.fair_receivers = True                   # police() holds flows to their receivers' shares
        self.policed: dict[FiveTuple, Policed] = {}
        self.unpoliced = 0        # flows police() wanted held but found no free meter id for
        self.meter_changes = {"add": 0, "modify": 0, "delete": 0}   # police()'s meter messages so far
        # exact entries a switch held when it (re)connected that no flow of ours owns, kept where they send
        # their flow one hop closer to its destination: switch -> (priority, match) -> output port
        self.adopted: dict[str, dict[tuple[int, ofmsg.Match], int]] = {}
        self.adopted_deleted = 0  # held or adopted entries deleted for sending a flow elsewhere

    def set_bg(self, policy: BgPolicy) -> dict[str, list[ofmsg.Message]]:
        """The declared tenants' BG (a reload brings a new one): every VM's
        BG gets its default route at once (:mod:`apps.lessor.bg_routes`;
        returned: the connected switches' updates), and the next allocation
        places BG flows first."""
        if not isinstance(policy, BgPolicy):
            raise TypeError(f"BG policy: {type(policy).__name__} is not a BgPolicy")
        if policy == self.bg:
            return {}
        routes = pack(self.view, policy.hose_vms(), policy.mu, self.bg_routes.up)
        self.bg = policy
        self._last_input = None
        return self._set_routes(routes)

    def _set_routes(self, routes: BgRoutes) -> dict[str, list[ofmsg.Message]]:
        same = routes.up == self.bg_routes.up
        self.bg_routes = routes
        return {} if same else self.routing.set_bg_up(routes.up)

    def reconfigure(self, polling: PollingConfig, epsilon: float, long_flow_bytes: int) -> None:
        """New settings (a reload): the polling period is kept within the new bounds."""
        polling.check()
        self.epsilon = epsilon
        self.table.long_bytes = long_flow_bytes
        self.polling.config = polling
        self.polling.period_s = min(max(self.polling.period_s, polling.min_s), polling.max_s)

    # ---- switches ------------------------------------------------------------------
    def switch_connected(self, switch: str) -> list[ofmsg.Message]:
        """A switch that lost its tables (or could not be read): everything, meters before entries."""
        meters, entries = self._switch_own(switch, set())
        return [*self.routing.switch_connected(switch), *meters, *entries]

    def switch_reconciled(self, switch: str, held: ofmsg.Held) -> list[ofmsg.Message]:
        """A (re)connected switch read back first: the routes reconciled
        make-before-break (:meth:`DestinationRouting.switch_reconciled`), then
        this app's meters on it (modified where the switch holds them, added
        where not) and its long flows' entries.

        Exact entries it holds that no flow of this controller owns (after a
        controller restart: all of them) are adopted, not deleted: they keep
        their long flows on the paths an earlier allocation chose (moving
        every flow back to the routes at once disturbs them all) until the
        flow ends (idle time-out), or an allocation places it anew (an entry
        added over it), or a link it outputs to goes down -- those are
        deleted now and at every link failure (:meth:`_dead_port_entries`).
        An adopted entry must send its flow downhill: to a neighbour one hop
        nearer its destination than this switch, now and after every link
        change (:meth:`_recheck_adopted`). Every other hop -- routes and
        installed paths alike -- goes downhill, so no packet can loop; an
        entry that does not (or whose output or destination is unknown) is
        deleted and its flow falls back to the routes. (An entry a link
        failure deleted everywhere else while this switch was disconnected
        came back here, pointing at an aggregation switch whose uplinks were
        gone, which sent the flow back down: a forwarding loop, found by the
        fuzz test.)
        LESSOR meters it holds that no policed flow wants are deleted (with
        the entries that use them: those flows fall back to the routes)."""
        msgs = self.routing.switch_reconciled(switch, held)
        meters, entries = self._switch_own(switch, held.meters)
        kept = {m.meter_id for m in meters}
        dead = [ofmsg.MeterMod("delete", mid) for mid in sorted(held.meters)
                if METER_LESSOR_BASE <= mid < METER_LESSOR_BASE + METER_LESSOR_SLOTS and mid not in kept]
        self.meter_changes["delete"] += len(dead)
        down = [port for port in self._ports(switch) if not self._port_up(switch, port)]
        ours = {(e.table_id, e.priority, e.match) for e in entries}
        adopted: dict[tuple[int, ofmsg.Match], int] = {}
        uphill = []
        for key in held.owned(cookie(APP_LESSOR)):
            table, prio, match = key
            if key in ours:
                continue
            port = held.outputs.get(key)
            if table == TABLE_FORWARD and port is not None and self._downhill(switch, port, match):
                adopted[(prio, match)] = port
            elif port is None or port not in down:       # the dead ports' entries go below anyway
                uphill.append(self._delete_entry(prio, match, table))
        self.adopted[switch] = adopted
        self.adopted_deleted += len(uphill)
        return [*msgs, *self._dead_port_entries(switch, down), *uphill, *meters, *entries, *dead]

    def _downhill(self, switch: str, port: int, match: ofmsg.Match) -> bool:
        """Whether an entry of ``switch`` matching ``match`` and output to
        ``port`` sends its flow to a neighbour one hop nearer the flow's
        destination host, over a link that is up."""
        dst_ip = match.as_dict().get("ipv4_dst")
        dst = self.view.host_by_ip(dst_ip) if isinstance(dst_ip, str) else None
        peer = self.view.peer(switch, port)
        if dst is None or peer is None or not self.view.link_up(switch, peer):
            return False
        if peer == dst:
            return True
        dist = self.view.distances_to(dst)
        return switch in dist and peer in dist and dist[peer] == dist[switch] - 1

    def _recheck_adopted(self) -> dict[str, list[ofmsg.Message]]:
        """Deletes for the adopted entries that no longer send their flow
        downhill (the view changed)."""
        out: dict[str, list[ofmsg.Message]] = {}
        for sw, entries in sorted(self.adopted.items()):
            for (prio, match), port in list(entries.items()):
                if not self._downhill(sw, port, match):
                    out.setdefault(sw, []).append(self._delete_entry(prio, match))
                    del entries[(prio, match)]
                    self.adopted_deleted += 1
        return out

    def _ports(self, switch: str) -> list[int]:
        return sorted(self.view.port(switch, peer) for peer in self.view.graph.successors(switch))

    def _port_up(self, switch: str, port: int) -> bool:
        peer = self.view.peer(switch, port)
        return peer is not None and self.view.link_up(switch, peer)

    @staticmethod
    def _dead_port_entries(switch: str, ports: list[int]) -> list[ofmsg.Message]:
        """Every LESSOR entry of the switch that outputs to one of ``ports``
        (down links), whoever installed it: known flows' entries and adopted
        ones alike fall back to the routes."""
        return [ofmsg.flow_delete(cookie(APP_LESSOR), COOKIE_APP_MASK, TABLE_FORWARD, out_port=p) for p in ports]

    def _switch_own(self, switch: str, held_meters: set[int]) -> tuple[list[ofmsg.Message], list[ofmsg.Message]]:
        """This app's meters (first) and long-flow entries on one switch."""
        meters: list[ofmsg.Message] = []
        entries: list[ofmsg.Message] = []
        for key, pol in sorted(self.policed.items()):
            if pol.path[1] == switch:
                meters.append(self._meter("modify" if pol.meter_id in held_meters else "add", pol))
                if key not in self.installed:
                    entries.extend(self._entries(key, pol.path, only=switch))
        for key, inst in sorted(self.installed.items()):
            if switch in inst.path:
                entries.extend(self._entries(key, inst.path, only=switch))
        return meters, entries

    def link_changed(self, switch: str, port: int, up: bool) -> dict[str, list[ofmsg.Message]]:
        return self.links_changed([(switch, port, up)])

    def links_changed(self, changes: list[tuple[str, int, bool]]) -> dict[str, list[ofmsg.Message]]:
        """Ports that went up or down, in the order reported (one, or a
        flapping link's gathered reports). Defaults are rerouted at once;
        every LESSOR entry that outputs to a link now down goes, at both
        ends, and long flows whose path lost a link lose their exact entries
        too, so they fall back to the (already rerouted) defaults -- no
        blackhole -- until the next allocation."""
        out = self.routing.links_changed(changes)
        if self.bg_routes.up or self.bg.host:
            for sw, msgs in self._set_routes(pack(self.view, self.bg.hose_vms(), self.bg.mu,
                                                  self.bg_routes.up)).items():
                out.setdefault(sw, []).extend(msgs)
        dead: set[tuple[str, int]] = set()
        for switch, port, _ in changes:
            peer = self.view.peer(switch, port)
            if peer is None or self.view.link_up(switch, peer):
                continue
            for sw, p in ((switch, port), (peer, self.view.port(peer, switch))):
                if not self.view.is_host(sw) and (sw, p) not in dead:
                    dead.add((sw, p))
                    out.setdefault(sw, []).extend(self._dead_port_entries(sw, [p]))
        for sw, msgs in self._recheck_adopted().items():
            out.setdefault(sw, []).extend(msgs)
        if not dead:
            return out
        for key, inst in sorted(self.installed.items()):
            links = self.view.path_links(inst.path)
            if all(self.view.link_up(u, v) for u, v in links):
                continue
            for sw in inst.path[1:-1]:
                out.setdefault(sw, []).append(self._delete(key))
            del self.installed[key]
        return out

    def switch_disconnected(self, switch: str) -> None:
        self.routing.switch_disconnected(switch)
        self.adopted.pop(switch, None)      # read back again when it reconnects

    # ---- PRE: polling ------------------------------------------------------------------
    def poll(self, now: float) -> dict[str, list[ofmsg.Message]]:
        self.schedule.poll_sent(now)
        req = ofmsg.FlowStatsRequest(TABLE_ACCOUNT, cookie(APP_ACCOUNT), COOKIE_APP_MASK)
        return {sw: [req] for sw in self.edges}

    def flow_stats(self, switch: str, entries: list[tuple[dict, int]], now: float) -> float:
        """Counter entries of one ToR: (match fields, byte count). Returns
        when the next polling period is to be decided.

        A counter is trusted as host H's flow only if its source address is
        H's, H sits behind this ToR, and the counter was learned on H's port
        there. Anything else -- a spoofed source, a destination outside the
        fabric, a counter that is not a non-negative integer, a reply from a
        switch that is not a ToR -- is counted in ``untrusted`` and left
        alone: it stays on the destination-based defaults, and never reaches
        PMPT (where an unknown host has no NIC rate to estimate from)."""
        self.now = max(self.now, now) if finite_number(now) else self.now
        for match, byte_count in entries:
            key = self._trusted_key(switch, match, byte_count)
            if key is None:
                self.untrusted += 1
                continue
            dst = self.view.host_by_ip(key[1])
            self.table.update(key, switch, self.view.host_switch(dst)[0], byte_count, now)
        return self.schedule.first_reply(now)

    def _trusted_key(self, switch: str, match: dict, byte_count) -> FiveTuple | None:
        if switch not in self.edge_set or isinstance(byte_count, bool) or not isinstance(byte_count, int) \
                or not 0 <= byte_count < 2**64:
            return None
        key = five_tuple(match)
        if key is None:
            return None
        src, dst = self.view.host_by_ip(key[0]), self.view.host_by_ip(key[1])
        if src is None or dst is None or src == dst:
            return None
        tor, port = self.view.host_switch(src)
        if tor != switch or match.get("in_port", port) != port:
            return None
        return key

    def decide(self, now: float, cpu: float, rtt_s: float | None) -> float:
        """Algorithm 1's decision; returns the time of the next poll. Flows
        the ToRs stopped reporting (their counter idled out: the flow ended)
        are forgotten first."""
        self.expire(now)
        return self.schedule.decide(now, cpu, rtt_s)

    def expire(self, now: float) -> list[FiveTuple]:
        """Forget flows missing from the ToRs' replies for more than two
        polling periods; their exact entries idle out on the switches."""
        horizon = 2 * self.polling.period_s + 1.0
        gone = [k for k, st in self.table.flows.items() if st.last_t is not None and now - st.last_t > horizon]
        for key in gone:
            self.flow_expired(key)
        return gone

    # ---- PMPT ---------------------------------------------------------------------------
    def _nic(self, ip: str) -> float:
        host = self.view.host_by_ip(ip)
        return self.view.capacity(host, self.view.host_switch(host)[0])

    def long_flows(self) -> list[LongFlow]:
        """The inter-ToR long flows and their demands: Hedera's natural
        demand (max-min at the hosts' links) for elephants -- 10 % of the NIC
        or more, or starved (:meth:`starved`) -- the measured rate for the
        rest."""
        states = [s for s in self.table.long_flows() if s.src_tor != s.dst_tor]
        starved = self.starved()
        elephants = [s for s in states if s.predicted is None or s.key in starved
                     or s.predicted >= ELEPHANT_FRACTION * self._nic(s.key[0])]
        natural = dict(zip((s.key for s in elephants),
                           estimate_demands([(s.key[0], s.key[1]) for s in elephants])))
        flows = []
        for st in states:
            if st.key in natural:
                demand = natural[st.key] * self._nic(st.key[0])
            else:
                demand = st.predicted
            flows.append(LongFlow(st.key, st.src_tor, st.dst_tor, demand, self.table.remaining_bytes(st.key)))
        bg = self.bg.shares({f.key: (f.demand, f.dst_tor) for f in flows})
        return [replace(f, bg=bg[f.key][0], bundle=bg[f.key][1],
                        fixed_path=self.bg_routes.tor_path(self.view, f.key[0], f.key[1]))
                if bg.get(f.key, (0.0,))[0] > 0 else f for f in flows]

    def bg_over(self, routes: dict[FiveTuple, "Installed"]) -> list[tuple[str, str]]:
        """Switch-to-switch links whose BG (the routes' ``bg`` along their
        paths) exceeds mu x capacity."""
        load = self._link_sums((inst.path, inst.bg) for inst in routes.values() if inst.bg > 0)
        return sorted(link for link, bg in load.items()
                      if bg > self.bg.mu * self.view.capacity(*link) * (1 + 1e-9))

    def _link_sums(self, routes) -> dict[tuple[str, str], float]:
        """Per switch-to-switch link, the sum of the amounts of the (host
        path, amount) pairs that cross it."""
        sums: dict[tuple[str, str], float] = {}
        for path, amount in routes:
            for link in self.view.path_links(path[1:-1]):
                sums[link] = sums.get(link, 0.0) + amount
        return sums

    def fabric_utilisation(self) -> dict[tuple[str, str], float]:
        """Known load / capacity of every switch-to-switch link: installed
        long flows' predicted rates along their paths (only ToRs are polled;
        flows on the defaults have no known path and count nowhere)."""
        return {link: sum(rate for _, _, rate in flows) / self.view.capacity(*link)
                for link, flows in self._link_flow_rates().items() if self.view.capacity(*link) > 0}

    def _host_links(self) -> tuple[dict[str, int], dict[str, int]]:
        """The saturated directions of host links, as the known long flows'
        predicted rates add up to at least FABRIC_BUSY of the NIC: {host:
        long flows leaving it} for hosts whose sending is saturated, {host:
        long flows entering it} for those whose receiving is. A link is full
        duplex: a host sending at its NIC rate limits nothing it receives."""
        load: dict[tuple[str, str], float] = {}
        count: dict[tuple[str, str], int] = {}
        for st in self.table.flows.values():
            if not st.long or st.predicted is None:
                continue
            for way, ip in (("out", st.key[0]), ("in", st.key[1])):
                host = self.view.host_by_ip(ip)
                if host is not None:
                    load[(way, host)] = load.get((way, host), 0.0) + st.predicted
                    count[(way, host)] = count.get((way, host), 0) + 1
        busy = {k for k, rate in load.items() if rate >= FABRIC_BUSY * self._nic(self.view.ip(k[1]))}
        return ({h: count[(w, h)] for w, h in busy if w == "out"}, {h: count[(w, h)] for w, h in busy if w == "in"})

    def saturated_hosts(self) -> set[str]:
        """Hosts whose link is saturated in one direction or the other."""
        sending, receiving = self._host_links()
        return set(sending) | set(receiving)

    def _held_at_hosts(self, path: tuple[str, ...], sending: dict[str, int], receiving: dict[str, int]
                       ) -> tuple[str | None, str | None]:
        """(the source host if its sending is saturated, the destination host if its receiving is)."""
        return (path[0] if path[0] in sending else None, path[-1] if path[-1] in receiving else None)

    def starved(self) -> dict[FiveTuple, float]:
        """Installed flows the fabric starves, and the rate each is owed.
        A flow that leaves a host whose sending is saturated, or enters one
        whose receiving is, and also crosses a busy fabric link carrying a
        tenth of its capacity or more of flows that share neither, meets two
        congested queues, and TCP gives it a fraction of its share at the
        host's. Measured at less than STARVED_FRACTION of that host link's
        equal share (its capacity over the long flows that meet there in
        that direction), it is owed the equal share: its starved rate is not
        what it wants, and taken for its demand it let PMPT pack it beside
        the flow that fills the second queue -- starved for good
        (lessor-permutation seed 11: h10 -> h15 at 0.33 Mb/s of 3.3 for
        60 s, docs/results.md). The controller cannot tell such a flow from
        one its application holds that low; above the fraction a flow's
        measured rate stands. Once owed, a flow stays owed while it is
        installed and held at that host: moved off the second queue it is
        not starved by this test any more, and taken at its measured rate
        again it was moved back (53 moves in 112 allocations of a 60 s run,
        against 1 in 16). A flow from a VM with a guarantee is never starved
        here: what it sends beyond its BG is WC, which yields to BG by
        design."""
        sending, receiving = self._host_links()
        if not sending and not receiving:
            self.owed = {}
            return {}
        util = self.fabric_utilisation()
        loads = self._link_flow_rates()
        out = {}
        for key, inst in self.installed.items():
            st = self.table.flows.get(key)
            src, dst = self._held_at_hosts(inst.path, sending, receiving)
            if st is None or st.predicted is None or (src, dst) == (None, None) or key[0] in self.bg.guarantee_bps:
                continue
            share = min(([self._nic(key[0]) / sending[src]] if src is not None else [])
                        + ([self._nic(key[1]) / receiving[dst]] if dst is not None else []))
            if key in self.owed or (st.predicted < STARVED_FRACTION * share and any(
                    util.get(link, 0.0) >= FABRIC_BUSY and
                    self._foreign_load(loads[link], src, dst) >= DEMAND_BAND * self.view.capacity(*link)
                    for link in self.view.path_links(inst.path[1:-1]))):
                out[key] = share
        self.owed = out
        return dict(out)

    def host_limited(self, flows: list[LongFlow] | None = None) -> set[FiveTuple]:
        """Installed flows (of ``flows``; all if None) on working paths that
        no move can speed up: their source host's sending or their
        destination host's receiving is saturated (whatever a move gains for
        one flow there, another loses) -- unless the flow is starved
        (:meth:`starved`: a second congested queue is what holds it) -- or
        none of their fabric links is busier than FABRIC_BUSY (whatever
        limits them is not the fabric: their hosts or their application)."""
        util = self.fabric_utilisation()
        sending, receiving = self._host_links()
        owed = self.starved()
        out = set()
        for key in (sorted(self.installed) if flows is None else [f.key for f in flows]):
            inst = self.installed.get(key)
            if inst is None:
                continue
            if not all(self.view.link_up(u, v) for u, v in self.view.path_links(inst.path)):
                continue
            at_hosts = self._held_at_hosts(inst.path, sending, receiving) != (None, None)
            if at_hosts and key not in owed or \
                    all(util.get(link, 0.0) < FABRIC_BUSY for link in self.view.path_links(inst.path[1:-1])):
                out.add(key)
        return out

    def _link_flow_rates(self) -> dict[tuple[str, str], list[tuple[str, str, float]]]:
        """Per switch-to-switch link: (source host, destination host, predicted
        rate) of each installed long flow that crosses it."""
        out: dict[tuple[str, str], list[tuple[str, str, float]]] = {}
        for key, inst in self.installed.items():
            st = self.table.flows.get(key)
            rate = st.predicted if st is not None and st.predicted is not None else 0.0
            for link in self.view.path_links(inst.path[1:-1]):
                out.setdefault(link, []).append((inst.path[0], inst.path[-1], rate))
        return out

    @staticmethod
    def _foreign_load(flows: list[tuple[str, str, float]], src: str | None, dst: str | None) -> float:
        """What of a link's load belongs to flows that neither leave ``src``
        nor enter ``dst`` (None: no such host)."""
        return sum(rate for s, d, rate in flows if (src is None or s != src) and (dst is None or d != dst))

    def allocation_needed(self, flows: list[LongFlow]) -> bool:
        """False when every long flow is installed and limited outside the
        fabric (no placement can help), or when the last allocation was made
        for the same long flows, each demand within +-10 % of what it was
        then, on the same network view, every one of them still installed,
        and none held by a busy fabric link below its demand: PMPT would
        only reproduce it. Saves the controller's CPU between changes."""
        if not flows:
            return False
        # BG known now that was not when the flows were installed, or BG moved
        if any(abs(self.installed[f.key].bg - f.bg) > DEMAND_BAND * max(self.installed[f.key].bg, f.bg)
               for f in flows if f.key in self.installed) or self.bg_over(self.installed):
            return True
        free = self.host_limited(flows)
        if all(f.key in self.installed for f in flows) and free >= {f.key for f in flows}:
            return False
        last = self._last_input
        if last is None or last[0] != self.view.version:
            return True
        demands = last[1]
        if set(demands) != {f.key for f in flows} or any(k not in self.installed for k in demands):
            return True
        if any(abs(f.demand - demands[f.key]) > DEMAND_BAND * demands[f.key] for f in flows):
            return True
        # a flow the fabric holds below its demand (on a busy link): another placement may help --
        # not a starved flow's owed share, which the last allocation placed (TCP is slow to take it)
        for f in flows:
            st = self.table.flows.get(f.key)
            if f.key not in free and f.key not in self.owed and st is not None and st.predicted is not None \
                    and st.predicted < (1 - DEMAND_BAND) * f.demand:
                return True
        return False

    def allocate(self, flows: list[LongFlow]) -> Allocation:
        """The heavy part: run it off the event loop. While a flow is
        starved (:meth:`starved`), the flows no move can help
        (:meth:`host_limited`, which :meth:`install` keeps where they are)
        are placed on their paths and the others around them: a plan that
        moved them would leave the starved flow where it thought they had
        gone. Otherwise PMPT places every flow afresh and :meth:`install`
        keeps what does not pay to move."""
        if self.starved():
            pinned = self.host_limited([f for f in flows if not f.bg])
            flows = [replace(f, fixed_path=self.installed[f.key].path[1:-1]) if f.key in pinned else f
                     for f in flows]
        return pmpt(flows, self.paths, epsilon=self.epsilon, mu=self.bg.mu)

    def install(self, allocation: Allocation, flows: list[LongFlow]) -> list[tuple[str, list[ofmsg.Message]]]:
        """Messages per switch, in the order to send them (make-before-break)."""
        self.last_allocation = allocation
        self._last_input = (self.view.version, {f.key: f.demand for f in flows})
        # no path now: they stay on the defaults (which also have none until a link comes back)
        self.unroutable = sorted(allocation.unroutable)
        adds: list[tuple[str, list[ofmsg.Message]]] = []
        removals: list[tuple[str, list[ofmsg.Message]]] = []
        wanted = {}
        for f in flows:
            tor_path = allocation.flow_path.get(f.key)
            if tor_path is None:
                continue
            src, dst = self.view.host_by_ip(f.key[0]), self.view.host_by_ip(f.key[1])
            wanted[f.key] = Installed((src, *tor_path, dst), allocation.flow_rate.get(f.key, 0.0), f.bg)
        # flows limited outside the fabric stay where they are: no move can help them. BG is
        # limited at its host by design (paced at its share): its place is the BG placement's
        self.pinned = self.host_limited([f for f in flows if not f.bg])
        for key in self.pinned:
            if key in wanted:
                wanted[key] = replace(wanted[key], path=self.installed[key].path)
        kept = self._keep_current(flows, wanted)
        if kept is not None:
            wanted = kept
        moved = 0
        for key in sorted(wanted):
            new = wanted[key]
            old = self.installed.get(key)
            if old is not None and old.path == new.path:
                continue
            # destination-first: every switch downstream is ready before the ToR switches over
            for sw in reversed(new.path[1:-1]):
                adds.append((sw, self._entries(key, new.path, only=sw)))
            if old is not None:
                self.reroutes += 1
                moved += 1
                self.move_log.append((self.now, key, old.path[1:-1], new.path[1:-1]))
                self.moved_at[key] = self.now
                for sw in old.path[1:-1]:
                    if sw not in new.path:
                        removals.append((sw, [self._delete(key)]))
        self.installed.update(wanted)
        self.moved_at = {k: t for k, t in self.moved_at.items() if k in self.installed}
        self.moves_per_allocation.append(moved)
        del self.moves_per_allocation[:-1000]
        del self.move_log[:-MOVE_LOG]
        return adds + removals

    def _keep_current(self, flows: list[LongFlow], wanted: dict) -> dict | None:
        """Installed flows stay on their current (still working) paths and the
        others are fitted around them (MRTF order: a bundle's new flow on its
        kept members' path, any other on its least-congested candidate path);
        from there flows (bundles whole) move to the new allocation's paths,
        the most useful first, until the routing's one-path lambda is the
        allocation's -- both measured alike (:meth:`routing_lambda`) -- and it
        puts no more BG above mu x C, nor -- moving WC for it -- leaves a switch more capacity idle beside
        its overloaded links than the allocation does (:func:`apps.lessor.moves.fewest_moves`;
        stopping 5 % short of it left aggregates of 0.82-0.94 of the ideal in
        the main job: docs/results.md); a bundle split over
        several paths moves whole. None when nothing is installed (the new
        allocation as it is)."""
        keep = {f.key: replace(self.installed[f.key], bg=f.bg) for f in flows if f.key in self.installed
                and all(self.view.link_up(u, v) for u, v in self.view.path_links(self.installed[f.key].path))
                and (f.fixed_path is None or self.installed[f.key].path[1:-1] == f.fixed_path)}
        if not keep or all(keep.get(k) == v for k, v in wanted.items()):
            return None
        loads: dict[tuple[str, str], float] = {}
        eff = _effective_demands(flows)

        def add(path: tuple[str, ...], demand: float) -> None:
            for link in self.view.path_links(path):
                loads[link] = loads.get(link, 0.0) + demand

        for key, inst in keep.items():
            add(inst.path[1:-1], eff[key])
        mixed = dict(keep)
        bundle_path = {f.bundle: keep[f.key].path[1:-1] for f in flows if f.bundle is not None and f.key in keep}
        for f in sorted((f for f in flows if f.key not in keep and f.key in wanted), key=mrtf_key):
            candidates = self.paths.paths(f.src_tor, f.dst_tor)[0]

            def worst(path: tuple[str, ...]) -> float:
                return max((loads.get(link, 0.0) + eff[f.key]) / self.view.capacity(*link)
                           for link in self.view.path_links(path)) if len(path) > 1 else 0.0

            best = f.fixed_path if f.fixed_path is not None and f.key in wanted and \
                wanted[f.key].path[1:-1] == f.fixed_path else None
            if best is None and f.bundle is not None:
                best = bundle_path.get(f.bundle)
            if best is None:
                best = min(candidates, key=lambda p: (worst(p), candidates.index(p)))
                if f.bundle is not None:
                    bundle_path[f.bundle] = best
            add(best, eff[f.key])
            ends = wanted[f.key].path
            mixed[f.key] = Installed((ends[0], *best, ends[-1]), f.demand, f.bg)
        # towards the allocation, fewest moves first, until its lambda is the allocation's and it puts no more
        # BG on a link than mu x C where the allocation does not (apps.lessor.moves); a bundle (one VM's BG
        # to one ToR) split over several paths moves whole
        units: dict = {}
        paths_of: dict = {}
        for f in flows:
            if f.key in mixed and f.key in wanted and mixed[f.key].path != wanted[f.key].path:
                units.setdefault(("bundle", f.bundle) if f.bundle is not None else ("flow", f.key), []).append(f.key)
            if f.bundle is not None and f.key in mixed:
                paths_of.setdefault(f.bundle, set()).add(mixed[f.key].path[1:-1])
        split = [u for u in units if u[0] == "bundle" and len(paths_of.get(u[1], ())) > 1]
        lam_wanted = self.routing_lambda(wanted, flows)
        over_wanted = set(self.bg_over(wanted))
        for u in split:                           # a split bundle goes where the allocation puts it
            mixed.update({k: wanted[k] for k in units.pop(u)})
        bg = {f.key: f.bg for f in flows}
        for u in [u for u in units if u[0] == "flow" and not bg.get(u[1], 0.0) > 0
                  and self.now - self.moved_at.get(u[1], -math.inf) < MOVE_HOLD_S]:
            del units[u]                          # moved lately: held where it is (MOVE_HOLD_S)
        routed, _ = fewest_moves({k: v.path for k, v in mixed.items()}, {k: v.path for k, v in wanted.items()},
                                 list(units.values()), eff, bg, lambda link: self.view.capacity(*link),
                                 lambda path: self.view.path_links(path[1:-1]), self.bg.mu,
                                 lam_wanted * (1 - 1e-9), over_wanted, band=DEMAND_BAND)
        return {k: wanted[k] if k in wanted and routed[k] == wanted[k].path else inst for k, inst in mixed.items()}

    def routing_lambda(self, routes: dict[FiveTuple, Installed], flows: list[LongFlow]) -> float:
        """The one-path lambda of a routing of ``flows``: the least capacity /
        load over the links it uses, a BG flow counting its BG (what it sends
        in the guaranteed class, paced), any other its demand. One measure
        for keeping and moving: PMPT's own lambda is over what BG leaves of
        each link, and compared with this one it called for moving flows in
        every allocation (4-10 moves every 2 s with steady demands)."""
        eff = _effective_demands(flows)
        loads = self._link_sums((inst.path, eff.get(key, 0.0)) for key, inst in routes.items())
        return min((self.view.capacity(*link) / load for link, load in loads.items() if load > 0),
                   default=float("inf"))

    # ---- receiver fairness ----------------------------------------------------------------
    def police(self) -> dict[str, list[ofmsg.Message]]:
        """Meters that hold long flows to their receivers' max-min shares
        (:mod:`apps.lessor.fairness`), per source ToR, in the order to send
        them: a meter exists before an entry uses it, and an entry drops
        its meter before the meter goes (deleting a meter deletes the
        entries that use it). A flow is held only where LESSOR owns its
        entry at its source ToR: an installed flow's, or an intra-ToR
        flow's, which gets one for it (its path has no choice to make);
        released, that entry goes and the flow is on the defaults again.
        Nothing is held with ``fair_receivers`` off."""
        want: dict[FiveTuple, tuple[float, tuple[str, ...]]] = {}
        if self.fair_receivers:
            into: dict[str, dict[FiveTuple, float]] = {}
            for st in self.table.flows.values():
                host = self.view.host_by_ip(st.key[1])
                if st.long and st.predicted is not None and host is not None:
                    into.setdefault(host, {})[st.key] = st.predicted
            for host, rates in sorted(into.items()):
                levels = fairness.receiver_caps(rates, self._nic(self.view.ip(host)), busy=FABRIC_BUSY)
                for key, level in levels.items():
                    path = self._own_path(key)
                    if path is not None:
                        want[key] = (fairness.police_rate(level), path)
        out: dict[str, list[ofmsg.Message]] = {}
        for key in sorted(set(self.policed) - set(want)):
            pol = self.policed.pop(key)
            tor = pol.path[1]
            if key in self.installed and self.installed[key].path[1] == tor:
                out.setdefault(tor, []).extend(self._entries(key, self.installed[key].path, only=tor))
            else:
                out.setdefault(tor, []).append(self._delete(key))
            out[tor].append(self._meter("delete", pol))
        for key, (rate, path) in sorted(want.items()):
            kbps = max(1, int(rate / 1000))
            old = self.policed.get(key)
            if old is not None:
                if fairness.rate_moved(old.rate_kbps, kbps):
                    self.policed[key] = replace(old, rate_kbps=kbps)
                    out.setdefault(path[1], []).append(self._meter("modify", self.policed[key]))
                continue
            meter_id = self._free_meter(path[1])
            if meter_id is None:
                self.unpoliced += 1
                continue
            self.policed[key] = pol = Policed(meter_id, kbps, path)
            out.setdefault(path[1], []).extend([self._meter("add", pol), *self._entries(key, path, only=path[1])])
        return out

    def _own_path(self, key: FiveTuple) -> tuple[str, ...] | None:
        """The host path whose source-ToR entry LESSOR owns for ``key``, if any."""
        if key in self.installed:
            return self.installed[key].path
        src, dst = self.view.host_by_ip(key[0]), self.view.host_by_ip(key[1])
        tor = self.view.host_switch(src)[0]
        return (src, tor, dst) if tor == self.view.host_switch(dst)[0] else None

    def _free_meter(self, switch: str) -> int | None:
        used = {pol.meter_id for pol in self.policed.values() if pol.path[1] == switch}
        return next((m for m in range(METER_LESSOR_BASE, METER_LESSOR_BASE + METER_LESSOR_SLOTS) if m not in used),
                    None)

    # ---- entries --------------------------------------------------------------------------
    def _match(self, key: FiveTuple) -> ofmsg.Match:
        src, dst, proto, sport, dport = key
        l4 = "tcp" if proto == ofmsg.IPPROTO_TCP else "udp"
        return ofmsg.Match.of(eth_type=ofmsg.ETH_TYPE_IP, ip_proto=proto, ipv4_src=src, ipv4_dst=dst,
                              **{f"{l4}_src": sport, f"{l4}_dst": dport})

    def _entries(self, key: FiveTuple, path: tuple[str, ...], only: str) -> list[ofmsg.Message]:
        i = path.index(only)
        out = ofmsg.Output(self.view.port(only, path[i + 1]))
        # the source ToR keeps counting the flow, and holds it to its receiver's share if policed
        actions = [ofmsg.Resubmit(TABLE_ACCOUNT), out] if i == 1 else [out]
        entry = ofmsg.flow_add(TABLE_FORWARD, PRIO_EXACT_FLOW, self._match(key), actions,
                               cookie=cookie(APP_LESSOR), idle_timeout=LONG_FLOW_IDLE_S)
        self.adopted.get(only, {}).pop((PRIO_EXACT_FLOW, entry.match), None)   # ours now
        pol = self.policed.get(key)
        if i == 1 and pol is not None:
            entry = replace(entry, instructions=(ofmsg.MeterInstruction(pol.meter_id), *entry.instructions))
        return [entry]

    def _meter(self, command: str, pol: Policed) -> ofmsg.MeterMod:
        self.meter_changes[command] += 1
        if command == "delete":
            return ofmsg.MeterMod("delete", pol.meter_id)
        return ofmsg.MeterMod(command, pol.meter_id, pol.rate_kbps, contract.meter_burst_kbit(pol.rate_kbps))

    def _delete(self, key: FiveTuple) -> ofmsg.FlowMod:
        return self._delete_entry(PRIO_EXACT_FLOW, self._match(key))

    @staticmethod
    def _delete_entry(priority: int, match: ofmsg.Match, table: int = TABLE_FORWARD) -> ofmsg.FlowMod:
        """Delete exactly one LESSOR entry (cookie-masked: never another app's)."""
        return ofmsg.flow_delete_strict(table, priority, match, cookie(APP_LESSOR), COOKIE_APP_MASK)

    def flow_expired(self, key: FiveTuple) -> None:
        self.installed.pop(key, None)
        self.table.remove(key)

    # ---- status ----------------------------------------------------------------------------
    def state(self) -> dict:
        alloc = self.last_allocation
        return {
            "polling_period_s": self.polling.period_s,
            "polling_history": self.polling.history[-200:],
            "flows": len(self.table.flows),
            "long_flows": [{"flow": list(s.key), "rate_bps": s.predicted, "bytes": s.bytes}
                           for s in self.table.long_flows()],
            "installed": {" ".join(map(str, k)): list(v.path) for k, v in sorted(self.installed.items())},
            "reroutes": self.reroutes,
            "adopted_entries": sum(len(e) for e in self.adopted.values()),
            "adopted_deleted": self.adopted_deleted,
            # the last MOVE_LOG moves: [time of the counters they followed, flow..., from ToR path, to ToR path]
            "move_log": [[t, *key, list(a), list(b)] for t, key, a, b in self.move_log],
            "moves_per_allocation": self.moves_per_allocation[-200:],
            "pinned_host_limited": len(self.host_limited()),
            "starved": [[*key, owed] for key, owed in sorted(self.starved().items())],
            # flows held to their receivers' fair shares: [flow..., meter rate in bits/s]
            "policed": [[*key, pol.rate_kbps * 1000] for key, pol in sorted(self.policed.items())],
            "unpoliced": self.unpoliced,
            "meter_changes": dict(self.meter_changes),
            "allocations": self.allocations,
            "allocations_skipped": self.allocations_skipped,
            "lambda": None if alloc is None else alloc.lam,
            "untrusted_counters": self.untrusted,
            "unroutable": [list(k) for k in self.unroutable],
            "uncertified_allocations": self.uncertified,
            "stopped_by": None if alloc is None else alloc.stopped_by,
            "lambda_one_path": None if alloc is None else alloc.integral_lam,
            "bg_flows": {" ".join(map(str, k)): v.bg for k, v in sorted(self.installed.items()) if v.bg > 0},
            "bg_over_mu": [list(link) for link in self.bg_over(self.installed)],
            "bg_routes": self.bg_routes.state(),
        }


def _effective_demands(flows: list[LongFlow]) -> dict:
    """What each flow loads a link with, for comparing routings: its BG if it
    carries BG, else its demand."""
    return {f.key: f.bg if f.bg > 0 else f.demand for f in flows}


def five_tuple(match: dict) -> FiveTuple | None:
    proto = match.get("ip_proto")
    l4 = {ofmsg.IPPROTO_TCP: "tcp", ofmsg.IPPROTO_UDP: "udp"}.get(proto)
    if l4 is None or "ipv4_src" not in match or "ipv4_dst" not in match:
        return None
    return (match["ipv4_src"], match["ipv4_dst"], proto, match.get(f"{l4}_src", 0), match.get(f"{l4}_dst", 0))

