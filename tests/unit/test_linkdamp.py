"""controller.linkdamp: a flapping port is held down until it stays up."""

import math

import pytest
from hypothesis import given, strategies as st

from controller import config, runtime
from controller.linkdamp import LinkDamping
from mininet_topos import builders


def test_a_down_report_is_acted_on_at_once_and_a_steady_link_never_held():
    d = LinkDamping(threshold=4, window_s=2.0, hold_s=2.0)
    assert d.report("p", False, 0.0) is False
    assert d.report("p", True, 10.0) is True
    assert d.report("p", False, 20.0) is False and d.report("p", True, 30.0) is True
    assert d.held() == [] and d.next_release() == math.inf and d.suppressed_total == 0


def test_the_fourth_change_within_the_window_holds_the_port_until_it_stays_up_for_the_hold():
    d = LinkDamping(threshold=4, window_s=2.0, hold_s=2.0)
    d.report("p", True, 0.0)
    assert [d.report("p", up, t) for up, t in ((False, 0.1), (True, 0.2), (False, 0.3))] == [False, True, False]
    assert d.report("p", True, 0.4) is False                 # the 4th change: held
    assert d.held() == ["p"] and d.next_release() == pytest.approx(2.4) and d.suppressed_total == 1
    assert d.report("q", True, 0.4) is True                  # another port is its own
    assert d.due(2.3) == []
    assert d.due(2.4) == ["p"] and d.held() == [] and d.due(5.0) == []
    assert d.report("p", False, 5.0) is False and d.report("p", True, 5.1) is True   # a fresh start


def test_changes_outside_the_window_do_not_count_and_each_change_while_held_restarts_the_hold():
    d = LinkDamping(threshold=3, window_s=1.0, hold_s=2.0)
    d.report("p", True, 0.0)
    d.report("p", False, 0.0)
    d.report("p", True, 0.7)
    assert d.report("p", False, 1.5) is False and d.held() == []   # the first change left the window
    d.report("p", True, 1.6)
    assert d.held() == ["p"] and d.next_release() == pytest.approx(3.6)
    d.report("p", False, 3.0)
    d.report("p", True, 3.1)
    assert d.next_release() == pytest.approx(5.1)
    assert d.due(5.1) == ["p"]


def test_a_port_down_when_its_hold_ends_is_not_let_back_in():
    d = LinkDamping(threshold=2, window_s=1.0, hold_s=1.0)
    d.report("p", True, 0.0)
    d.report("p", False, 0.1)
    d.report("p", True, 0.2)
    d.report("p", False, 0.3)
    assert d.due(5.0) == [] and d.held() == []


@pytest.mark.parametrize("kw", [dict(threshold=1), dict(threshold=True), dict(threshold=2.0),
                                dict(window_s=0), dict(window_s=math.nan), dict(window_s=math.inf),
                                dict(hold_s=-1), dict(hold_s=math.nan), dict(hold_s="1")])
def test_bad_settings_are_refused_by_name(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        LinkDamping(**kw)


@pytest.mark.parametrize("up,now", [(1, 0.0), (None, 0.0), (True, math.nan), (True, math.inf), (True, "0")])
def test_bad_reports_are_refused_and_change_nothing(up, now):
    d = LinkDamping()
    d.report("p", True, 0.0)
    with pytest.raises(ValueError):
        d.report("p", up, now)
    assert d.ports["p"].up is True and len(d.ports["p"].changes) == 0


@given(st.lists(st.tuples(st.booleans(), st.floats(0, 0.5)), max_size=60))
def test_any_report_sequence_acts_on_down_at_once_and_never_holds_without_enough_changes(reports):
    """Hypothesis: "down" is always acted on; "up" is acted on unless the
    port changed state threshold times within the window (or is still in its
    hold); once reports stop, the port is let back in at next_release()."""
    d = LinkDamping(threshold=4, window_s=2.0, hold_s=2.0)
    now, times, last = 0.0, [], None
    for up, dt in reports:
        now += dt
        if last is not None and up != last:
            times.append(now)
        last = up
        acted = d.report("p", up, now)
        recent = [t for t in times if t >= now - 2.0]
        if not up:
            assert acted is False
        elif len(recent) >= 4:
            assert acted is False
        elif acted is False:
            assert d.held() == ["p"]
    release = d.next_release()
    if release != math.inf:
        assert d.due(release - 1e-6) == [] if release - 1e-6 > now else True
        assert d.due(release) == (["p"] if last else [])
    assert d.held() == []


@pytest.mark.parametrize("damping,problem", [({"threshold": 1}, "threshold"), ({"threshold": 2.5}, "threshold"),
                                             ({"window_s": 0}, "window_s"), ({"window_s": float("nan")}, "window_s"),
                                             ({"hold_s": -1}, "hold_s"), ({"hold_s": float("inf")}, "hold_s"),
                                             ({"other": 1}, "other")])
def test_link_damping_settings_are_refused_by_name(app_config, damping, problem):
    path = app_config(builders.fattree(4), controller={"link_damping": damping})
    with pytest.raises(config.ConfigError, match=problem):
        config.load(path)


def test_the_apps_hold_down_ports_as_configured(app_config):
    path = app_config(builders.fattree(4), routing="lessor",
                      controller={"link_damping": {"threshold": 7, "window_s": 3.5, "hold_s": 9}})
    runtime.start(config.load(path))
    from apps.lessor.app import LessorApp
    d = LessorApp().damping
    assert (d.threshold, d.window_s, d.hold_s) == (7, 3.5, 9.0)
