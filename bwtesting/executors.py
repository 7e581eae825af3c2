"""Executors that record what the agent would do to a kernel instead of
doing it (the agent's rounds, its channel, the controller's sessions, in
tests and benchmarks): ``RecordingExecutor`` keeps the plans applied;
``KernelModel`` keeps what a kernel would have after each call, so that
LRC's fast paths, which change part of an applied plan, can be checked.
The kernel side itself has its own root tests (tests/integration)."""

from __future__ import annotations

import threading


class RecordingExecutor:
    def __init__(self):
        self.applied: list = []
        self.torn_down = 0
        self.lock = threading.Lock()
        self.delay_s = 0.0

    def apply(self, plan) -> int:
        if self.delay_s:
            import time
            time.sleep(self.delay_s)
        with self.lock:
            self.applied.append(plan)
        return len(plan.steps)

    def differences(self, plan) -> list[str]:
        return []

    def clean_differences(self) -> list[str]:
        return []

    def teardown(self) -> None:
        self.torn_down += 1

    def pair_slots(self, dev: str) -> dict:
        return {}

    def class_bytes(self, dev: str) -> dict:
        return {}


class KernelModel(RecordingExecutor):
    """An executor that keeps what the kernel would have after each call --
    HTB classes and filters from the last whole apply, bwf_mark's buckets,
    the BPF maps -- so that the agent's rounds (LRC's fast paths, which
    change part of what an apply put in force) can be checked against it.
    ``change_rates`` of a class that is not there and ``set_buckets``
    removing a bucket that is not there fail as the real ones do
    (ExecError); ``fail_next`` makes the next call of that name fail."""

    def __init__(self):
        super().__init__()
        self.classes: dict = {}      # classid -> TcClass
        self.slots: dict = {}        # destination -> pair slot (from the pair filters)
        self.buckets: dict = {}      # (src, dst) -> BgBucket
        self.bpf: dict = {}          # (map, key) -> value
        self.calls: list = []        # (method, argument) in order
        self.fail_next: set = set()
        self.in_force = None         # the last plan applied (differences() compares against it)
        self.leftovers: list = []    # what clean_differences reports after a teardown

    def _failing(self, name: str) -> None:
        from hostagent.executor import ExecError
        if name in self.fail_next:
            self.fail_next.discard(name)
            raise ExecError(f"{name}: RTNETLINK answers: No such file or directory")

    def apply(self, plan) -> int:
        from hostagent.plan import PAIR_PREF_BASE, BgBucket, BpfMapSet, TcClass, TcFilter
        self.calls.append(("apply", plan))
        self._failing("apply")
        self.classes = {s.classid: s for s in plan.of(TcClass)}
        self.slots = {f.dst: f.pref - PAIR_PREF_BASE for f in plan.of(TcFilter)
                      if f.dst is not None and f.pref < PAIR_PREF_BASE + 512}
        self.buckets = {(b.src, b.dst): b for b in plan.of(BgBucket)}
        self.bpf.update({(s.map, s.key_ipv4): s.value for s in plan.of(BpfMapSet)})
        self.in_force = plan
        return super().apply(plan)

    def differences(self, plan) -> list[str]:
        """The steps of ``plan`` that the last apply did not put in force."""
        have = set(self.in_force.steps) if self.in_force is not None else set()
        return [f"missing {s}" for s in plan.steps if s not in have]

    def teardown(self) -> None:
        self.calls.append(("teardown", None))
        self._failing("teardown")
        self.in_force, self.classes, self.slots, self.buckets = None, {}, {}, {}
        super().teardown()

    def clean_differences(self) -> list[str]:
        return list(self.leftovers)

    def pair_slots(self, dev: str) -> dict:
        self.calls.append(("pair_slots", dev))
        return dict(self.slots)

    def change_rates(self, classes) -> int:
        from hostagent.executor import ExecError
        self.calls.append(("change_rates", list(classes)))
        self._failing("change_rates")
        missing = [c.classid for c in classes if c.classid not in self.classes]
        if missing:
            raise ExecError(f"tc: class {missing[0]} not found")
        self.classes.update({c.classid: c for c in classes})
        return len(classes)

    def set_buckets(self, buckets, remove=()) -> None:
        from hostagent.executor import ExecError
        self.calls.append(("set_buckets", (list(buckets), list(remove))))
        self._failing("set_buckets")
        self.buckets.update({(b.src, b.dst): b for b in buckets})
        gone = [k for k in remove if k not in self.buckets]
        for k in remove:
            self.buckets.pop(k, None)
        if gone:
            raise ExecError(f"bpf: no bucket {gone[0]}")

    def apply_bpf(self, step) -> None:
        self.calls.append(("apply_bpf", step))
        self._failing("apply_bpf")
        self.bpf[(step.map, step.key_ipv4)] = step.value

    def made(self, method: str) -> list:
        return [arg for name, arg in self.calls if name == method]
