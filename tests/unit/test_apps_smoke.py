"""Fire every os-ken handler of the routing apps once, with real os-ken event
and parser classes and a recording datapath (no switch)."""

import pytest
from os_ken.controller import ofp_event
from os_ken.ofproto import ofproto_protocol, ofproto_v1_3, ofproto_v1_3_parser as parser

from apps.routing.ecmp import EcmpApp
from apps.routing.logic import app_logic
from apps.routing.single_path import SinglePathApp
from bwtesting.readback import Msg, connect
from controller import ofmsg
from controller.network_view import NetworkView
from mininet_topos import builders


class RecordingDatapath(ofproto_protocol.ProtocolDesc):
    def __init__(self, dpid):
        super().__init__(ofproto_v1_3.OFP_VERSION)
        self.id = dpid
        self.sent = []
        self.xid = 0

    def set_xid(self, msg):       # as os-ken's Datapath numbers requests
        self.xid += 1
        msg.set_xid(self.xid)
        return self.xid

    def send_msg(self, msg):
        if msg.xid is None:
            self.set_xid(msg)
        msg.serialize()  # must be valid on the wire
        self.sent.append(msg)


def _port(no, up=True):
    state = 0 if up else ofproto_v1_3.OFPPS_LINK_DOWN
    return parser.OFPPort(no, "00:00:00:00:00:01", f"p{no}", 0, state, 0, 0, 0, 0, 0, 0)


@pytest.fixture
def topo_env(tmp_path, monkeypatch):
    topo = builders.fattree(4)
    path = tmp_path / "t.json"
    topo.save(path)
    monkeypatch.setenv("BWFABRIC_TOPOLOGY", str(path))
    return NetworkView(topo)


@pytest.mark.parametrize("cls,app", [(SinglePathApp, "single_path"), (EcmpApp, "ecmp")])
def test_every_handler_once(topo_env, cls, app):
    view = topo_env
    inst = cls()
    dps = {sw: RecordingDatapath(view.dpid(sw)) for sw in view.switches}
    for sw, dp in dps.items():
        sent = connect(inst, dp)
        # read back first (groups, meters, entries), its ports asked for last; then the reconciliation
        assert [type(m).__name__ for m in dp.sent[:4]] == [
            "OFPGroupDescStatsRequest", "OFPMeterConfigStatsRequest", "OFPFlowStatsRequest",
            "OFPPortDescStatsRequest"]
        assert dp.sent[2].table_id == ofproto_v1_3.OFPTT_ALL and dp.sent[2].cookie_mask == 0
        expected = app_logic(view, app).switch_reconciled(sw, ofmsg.Held())
        assert len(sent) == len(expected) and sw not in inst.readings
    # all ports up: nothing changes
    e00 = dps["e0_0"]
    before = {sw: len(dp.sent) for sw, dp in dps.items()}
    inst._port_desc(ofp_event.EventOFPPortDescStatsReply(Msg(e00, body=[_port(1), _port(3)])))
    assert {sw: len(dp.sent) for sw, dp in dps.items()} == before
    # an uplink goes down: switches get updates and the view drops the link
    port = view.port("e0_0", "a0_0")
    inst._port_status(ofp_event.EventOFPPortStatus(
        Msg(e00, reason=ofproto_v1_3.OFPPR_MODIFY, desc=_port(port, up=False))))
    if inst.pending_links:                    # within the hold of the port description's flush
        assert inst.pending_links == {("e0_0", port): False} and inst.link_flush_at is not None
        inst.flush_links()
    assert not inst.view.link_up("e0_0", "a0_0")
    assert sum(len(dp.sent) for dp in dps.values()) > sum(before.values())
    # unknown datapath is ignored, disconnect forgets the switch
    stranger = RecordingDatapath(999)
    connect(inst, stranger)
    assert stranger.sent == []
    inst._disconnected(ofp_event.EventOFPStateChange(e00))
    assert "e0_0" not in inst.datapaths


def test_app_without_configuration_fails_clearly(monkeypatch):
    from controller import runtime
    runtime.stop()
    monkeypatch.delenv("BWFABRIC_TOPOLOGY", raising=False)
    monkeypatch.delenv("BWFABRIC_CONFIG", raising=False)
    with pytest.raises(RuntimeError, match="BWFABRIC_CONFIG"):
        EcmpApp()


def test_a_flapping_port_costs_one_recomputation_per_hold(topo_env):
    """Flap damping (controller.app_base.LINK_HOLD_S): the first change after
    a quiet hold is acted on at once; changes within the hold are gathered,
    each port's last state kept in the order of its last report, and acted
    on together -- a down-up flap inside a hold changes nothing."""
    from controller import app_base
    from controller.linkdamp import LinkDamping
    view = topo_env
    inst = EcmpApp()
    inst.damping = LinkDamping(threshold=100)               # gathering alone (held-down ports: next test)
    dps = {sw: RecordingDatapath(view.dpid(sw)) for sw in view.switches}
    for dp in dps.values():
        connect(inst, dp)
    calls = []
    real = inst.logic.links_changed
    inst.logic.links_changed = lambda changes: calls.append(list(changes)) or real(changes)
    e00, port = dps["e0_0"], view.port("e0_0", "a0_0")
    status = lambda up: inst._port_status(ofp_event.EventOFPPortStatus(  # noqa: E731
        Msg(e00, reason=ofproto_v1_3.OFPPR_MODIFY, desc=_port(port, up=up))))
    status(False)                                          # quiet before: at once
    assert calls == [[("e0_0", port, False)]] and not inst.view.link_up("e0_0", "a0_0")
    for up in (True, False, True, False, True):            # a storm inside the hold
        status(up)
    other = view.port("e0_0", "a0_1")
    inst._port_status(ofp_event.EventOFPPortStatus(Msg(e00, reason=ofproto_v1_3.OFPPR_MODIFY,
                                                       desc=_port(other, up=False))))
    status(True)
    assert len(calls) == 1 and inst.pending_links == {("e0_0", other): False, ("e0_0", port): True}
    assert inst.link_flush_at == inst.last_link_flush + app_base.LINK_HOLD_S
    inst.flush_links()
    assert calls[1] == [("e0_0", other, False), ("e0_0", port, True)]
    assert inst.view.link_up("e0_0", "a0_0") and not inst.view.link_up("e0_0", "a0_1")
    assert inst.link_events == {"received": 8, "recomputed": 2, "coalesced": 1, "held_down": 0, "released": 0}
    inst.flush_links()                                     # nothing gathered: nothing done
    assert len(calls) == 2
    inst.last_link_flush -= app_base.LINK_HOLD_S           # quiet again: at once
    status(False)
    assert len(calls) == 3 and inst.link_flush_at is None


def test_a_port_that_keeps_flapping_is_held_down_until_it_stays_up(topo_env):
    """controller.linkdamp through the adapter: after four changes within
    2 s the port's "up" reports are not acted on -- the view keeps the link
    down, so routes and groups leave it -- until it has stayed up for the
    hold; then it is let back in by itself."""
    view = topo_env
    inst = EcmpApp()
    dps = {sw: RecordingDatapath(view.dpid(sw)) for sw in view.switches}
    for dp in dps.values():
        connect(inst, dp)
    e00, port = dps["e0_0"], view.port("e0_0", "a0_0")
    for up in (False, True, False, True, False, True):
        inst._port_status(ofp_event.EventOFPPortStatus(Msg(e00, reason=ofproto_v1_3.OFPPR_MODIFY,
                                                           desc=_port(port, up=up))))
    inst.flush_links()
    assert not inst.view.link_up("e0_0", "a0_0")             # reported up last, held down
    assert inst.link_events["held_down"] >= 1 and inst.damping.held() == [("e0_0", port)]
    assert inst.release_at is not None
    inst.release_links()                                     # too early: still held
    inst.flush_links()
    assert not inst.view.link_up("e0_0", "a0_0")
    inst.damping.ports[("e0_0", port)].held_until -= 10      # its hold has passed
    sent = sum(len(dp.sent) for dp in dps.values())
    inst.release_links()
    inst.flush_links()
    assert inst.view.link_up("e0_0", "a0_0") and inst.link_events["released"] == 1
    assert sum(len(dp.sent) for dp in dps.values()) > sent and inst.damping.held() == []
