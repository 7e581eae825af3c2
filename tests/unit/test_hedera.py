import numpy as np
import pytest

from apps.lessor.hedera import ELEPHANT_FRACTION, estimate_demands, global_first_fit


@pytest.mark.parametrize("flows,expected", [
    ([("A", "B")], [1.0]),
    ([("A", "B"), ("A", "C")], [0.5, 0.5]),                          # sender-limited
    ([("A", "C"), ("B", "C"), ("D", "C")], [1 / 3] * 3),             # receiver-limited
    ([("A", "X"), ("A", "Y"), ("B", "Y")], [0.5, 0.5, 0.5]),
    # C caps its three senders at 1/3; A's other flow takes what A has left
    ([("A", "B"), ("A", "C"), ("D", "C"), ("E", "C")], [2 / 3, 1 / 3, 1 / 3, 1 / 3]),
    # a sender-limited flow (1/2) frees room at the receiver for the other one
    ([("A", "X"), ("A", "Y"), ("B", "Y")] * 1 + [("B", "Z")], [0.5, 0.5, 0.5, 0.5]),
    ([("A", "B"), ("A", "B")], [0.5, 0.5]),                          # duplicates are separate flows
])
def test_natural_demands(flows, expected):
    assert estimate_demands(flows) == pytest.approx(expected)


def test_demands_are_max_min_fair_under_nic_limits():
    rng = np.random.default_rng(3)
    hosts = list("ABCDEFGH")
    flows = [tuple(rng.choice(hosts, 2, replace=False)) for _ in range(30)]
    d = estimate_demands(flows)
    for h in hosts:
        assert sum(x for x, (s, _) in zip(d, flows) if s == h) <= 1 + 1e-9
        assert sum(x for x, (_, t) in zip(d, flows) if t == h) <= 1 + 1e-9


def test_global_first_fit():
    cap = np.array([10.0, 10.0, 20.0])
    paths = np.array([[0, 2], [1, 2]])
    choice = global_first_fit([6, 5, 0.5, 4, 9], [paths] * 5, cap, nic_bps=10)
    # 6 -> path 0; 5 no longer fits link 0 -> path 1; 0.5 is a mouse (< 10 % of
    # the NIC); 4 fits path 0 exactly; 9 fits neither link 0 (10) nor link 1 (5)
    assert choice == [0, 1, None, 0, None]
    assert ELEPHANT_FRACTION == 0.10


def test_the_worked_example_of_the_hedera_paper():
    """The four hosts and ten flows of the Hedera paper's demand-estimation
    example (Al-Fares et al., NSDI 2010, Fig. 4). Worked by hand:
    senders first give A 1/3, 1/3, 1/3; B 1/3 x 3; C 1/2 x 2; D 1/2 x 2.
    Receiver A (B, B, C: 7/6 > 1) caps its three at 1/3; receiver B (A 1/3,
    D 1/2, D 1/2: 4/3 > 1) caps its three at 1/3. The senders then hand what
    is left to their unconverged flows: C's flow to D gets 2/3, the rest
    stay at 1/3; no receiver is over 1 after that."""
    flows = [("A", "B"), ("A", "C"), ("A", "D"), ("B", "A"), ("B", "A"), ("B", "C"),
             ("C", "A"), ("C", "D"), ("D", "B"), ("D", "B")]
    third = 1 / 3
    assert estimate_demands(flows) == pytest.approx([third] * 7 + [2 / 3] + [third] * 2)
