"""The controller owns the host agents: one session per declared agent.

Each session keeps one persistent connection to its agent (the
authenticated channel of :mod:`bwcommon.channel`) and one sender thread,
so a slow or dead agent blocks nobody but itself. A session holds

- the host's **desired configuration** (full state, derived from the
  declared tenants by :mod:`controller.tenancy`) with the controller's
  generation and the configuration version it last changed in. It is
  pushed when it changes, and again on every (re)connect -- an agent that
  restarted, or a connection that broke, just gets the whole state again;
- configurations reach the agent in version order, and a newer full state
  supersedes an older one not yet sent (sending the older one first would
  only put a state in force that is already out of date);
- a **latest-value slot** for rate factors (LRC): a new value replaces one
  not yet sent, so a slow agent gets the freshest factors, never a backlog.
  While the session is idle its socket is lent to the process's rate pump
  (:mod:`controller.ratepump`), which sends the factors and reads the
  replies of every idle session from one thread; anything else the
  session must do ends the loan.

Between pushes the session asks for the agent's status every
``status_interval_s`` (what is in force, read back from the kernel; this
also keeps the connection from idling out) -- each interval drawn at random
within +-STATUS_JITTER of it, so that the agents of a fabric configured
together do not all read their kernels back at the same instant (periodic
messages synchronise: Floyd and Jacobson, 1994; in the main job 16 agents
reading back together stalled the emulated fabric for about half a second
every 15 s, docs/results.md) -- and notices at once when the
agent closes the connection (it restarted; an idle session's socket is
watched by one thread for the whole process, :mod:`controller.sockwatch`,
so that idle sessions sleep until there is something to do): it reconnects with back-off
(``retry_s`` doubling up to ``MAX_RETRY_S``, half a second: a connection
attempt costs little, and a restarted agent is found fast) and pushes.

Everything a session knows is in :meth:`Session.state` (connected, the
version in force at the agent, last error, pushes, failures, config age),
exported by the API and the metrics.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from dataclasses import asdict, dataclass, field

from bwcommon.lrc import report_problems
from controller import tenancy
from controller.config import Loaded
from bwcommon.loops import LoopGuard
from bwcommon.channel import ChannelError, host_key, load_secret
from bwcommon.agentclient import AgentClient
from bwcommon.hostconfig import CLASS_BG, CLASS_WC, CLASS_YOUNG, PAIR_CLASS_BASE, WC_PAIR_CLASS_BASE, in_pair_slots
from bwcommon.transport import FrameError
from controller.ratepump import rate_pump
from controller.sockwatch import idle_watch

log = logging.getLogger("bwfabric.agents")
MAX_RETRY_S = 0.5    # a restarted agent is found within half a second of listening
STATUS_JITTER = 0.25  # each status interval is status_interval_s x (1 +- this), uniformly at random
EXPECTED = (OSError, ConnectionError, FrameError, ChannelError)    # socket.timeout is an OSError


@dataclass
class AgentState:
    host: str
    address: str
    connected: bool = False
    desired_version: int = 0          # the configuration version of the desired state
    version_in_force: int | None = None   # what the agent last confirmed (None: nothing yet)
    generation_in_force: int | None = None
    in_force: bool | None = None      # the agent's read-back: kernel == its configuration
    differences: int = 0
    degraded: str | None = None
    last_error: str | None = None
    config_pushed_at: float | None = None   # wall clock of the last confirmed push
    pushes: int = 0
    push_failures: int = 0
    refusals: int = 0                 # pushes the agent answered with ok: false
    superseded_by: int | None = None  # a newer controller's generation configures the agent: we stop
    rate_pushes: int = 0
    connects: int = 0
    report_refusals: int = 0          # replies (status, LRC reports) refused as malformed
    status_at: float | None = None
    class_bytes: dict = field(default_factory=dict)    # HTB class -> bytes, at status_at
    bg_rate_bps: float | None = None   # BG leaving the host between the last two status replies
    wc_rate_bps: float | None = None
    vms: dict = field(default_factory=dict)   # per VM (its name at the agent): in_force, differences,
    #                                           degraded, class_bytes, bg_rate_bps, wc_rate_bps


class Session:
    def __init__(self, endpoint: tenancy.Endpoint, key: bytes | None, generation: int, timeout_s: float = 5.0,
                 retry_s: float = 0.1, status_interval_s: float = 5.0, key_error: str | None = None):
        self.endpoint = endpoint
        self.generation = generation
        self.client = AgentClient(endpoint.address, endpoint.host, key or b"\0" * 32, timeout=timeout_s)
        self.key_ok = key is not None
        self.retry_s, self.status_interval_s = retry_s, status_interval_s
        self.rng = random.Random()     # status jitter: each session its own draws
        self.cond = threading.Condition()
        self.desired: dict | None = None
        self.need_push = False
        self.rates: dict | None = None
        self.rates_token: float | None = None
        self.lrc_reply: tuple[float | None, float, dict] | None = None
        self.stopping = False
        self.st = AgentState(endpoint.host, endpoint.address, last_error=key_error)
        self.guard = LoopGuard(log)
        self.watched: object | None = None    # the socket handed to the idle watch (None: not watched)
        self.lent = False                      # the socket is with the rate pump: a rates request in flight
        self.lent_error: str | None = None     # why the pump's last request failed (the thread reconnects)
        self.waiting_on_loan = False           # the thread waits for the pump to give the socket back
        self.next_status = 0.0
        self.thread = threading.Thread(target=self._run, name=f"agent-{endpoint.host}", daemon=True)

    # ---- what the controller asks for (any thread; never blocks on the agent) -----------------
    def set_config(self, version: int, cfg: dict | None) -> None:
        with self.cond:
            self.desired, self.st.desired_version, self.need_push = cfg, version, True
            self.cond.notify()

    def push_rates(self, body: dict, token: float | None = None) -> None:
        """The latest rate factors (latest value wins). ``token`` (the LRC
        round's start, monotonic) comes back with the agent's reply in
        :attr:`lrc_reply`, so the round trip can be measured."""
        with self.cond:
            self.rates, self.rates_token = body, token
            if self.lent:
                return                         # the pump sends it as soon as the reply in flight is in
            sock = self.watched
            if sock is None or not self._loanable(sock):
                self.cond.notify()
                return
            self.watched, self.lent = None, True
        idle_watch().unwatch(sock)
        rate_pump().submit(self)

    def _loanable(self, sock) -> bool:
        """Whether the idle socket can go to the rate pump (under ``cond``):
        connected, nothing else to do before the next status read."""
        return (self.key_ok and not self.stopping and not self.need_push and sock is not None
                and self.client.sock is sock and time.monotonic() < self.next_status)

    # ---- the rate pump's side (its thread; controller.ratepump) -----------------------------------
    def take_rates(self) -> tuple[dict, float | None] | None:
        """The factors to send now, taken out of the slot; None (and the
        loan ended) if there are none or the socket is needed elsewhere."""
        with self.cond:
            if self.rates is None or not self._loanable(self.client.sock):
                self._end_loan()
                return None
            rates, self.rates = self.rates, None
            return rates, self.rates_token

    def rates_replied(self, reply: dict, token: float | None) -> bool:
        """The pump's request got its reply: taken as the thread takes one.
        Returns whether to go on (newer factors are waiting); if not, the
        loan has ended."""
        with self.cond:
            self._rates_reply(reply, token)
            if self.rates is not None and self._loanable(self.client.sock):
                return True
            self._end_loan()
            return False

    def end_loan(self, why: str, rates: dict | None = None, token: float | None = None) -> None:
        """The pump's request failed: the factors back in the slot (unless
        newer ones came), and the thread wakes to reconnect."""
        with self.cond:
            if rates is not None and self.rates is None:
                self.rates, self.rates_token = rates, token
            self.lent_error = why
            self.lent = False
            self.cond.notify()

    def _end_loan(self) -> None:
        """The socket back from the pump (under ``cond``): to the idle watch
        if there is nothing else to do, else to the woken thread."""
        self.lent = False
        sock = self.client.sock
        if (self.waiting_on_loan or sock is None or self.rates is not None
                or not self._loanable(sock)):
            self.cond.notify()
            return
        self.watched = sock
        idle_watch().watch(sock, self._peer_event)

    def lrc_report(self) -> tuple[float | None, float, dict] | None:
        """(token, monotonic time of the reply, the pairs open at the agent)
        of the last rates reply, or None."""
        with self.cond:
            return self.lrc_reply

    def start(self) -> "Session":
        self.thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify()
        self.thread.join(timeout)
        self._unwatch()
        self.client.close()

    def state(self) -> dict:
        with self.cond:
            return asdict(self.st)

    def status_interval(self) -> float:
        """The wait until the next status request: ``status_interval_s``
        give or take STATUS_JITTER of it, at random."""
        return self.status_interval_s * (1 + STATUS_JITTER * (2 * self.rng.random() - 1))

    # ---- the sender thread ----------------------------------------------------------------------
    def _has_work(self) -> bool:
        return self.need_push or self.rates is not None

    def _run(self) -> None:
        self.backoff, self.next_connect, self.next_status = self.retry_s, 0.0, 0.0
        while True:
            with self.cond:
                if self.stopping:
                    return
                if self.lent:                        # the rate pump has the socket: it wakes us when done
                    self.waiting_on_loan = True
                    self.cond.wait(1.0)
                    self.waiting_on_loan = False
                    continue
                failed, self.lent_error = self.lent_error, None
                if failed is None:
                    now = time.monotonic()
                    if not self.client.connected:        # until the next attempt, whatever is pending
                        wait = self.next_connect - now
                    elif not self._has_work():           # until the status is due, or the agent closes the socket
                        wait = self.next_status - now
                    else:
                        wait = 0.0
                    if wait > 0:
                        if self.client.connected:
                            self._watch()
                        self.cond.wait(wait)
                    if self.stopping:
                        return
                    if self.lent:
                        continue
            if failed is not None:                   # the pump's request failed: as a failure of ours
                self._disconnected(failed)
                self.next_connect = time.monotonic() + self.backoff
                continue
            self._unwatch()                          # the socket is ours again: replies are read here
            if not self.key_ok:
                with self.cond:
                    self.cond.wait(1.0)
                continue
            ok, _ = self.guard.run("session", self._step)
            if not ok:                     # a bug, logged with its traceback: start afresh after a pause
                self._disconnected(f"internal error: {self.guard.stats['session'].last_error}")
                self.next_connect = time.monotonic() + MAX_RETRY_S

    def _watch(self) -> None:
        """Hand the idle socket to the watcher (under ``cond``): it wakes
        this session if the agent closes it."""
        sock = self.client.sock
        if sock is None or self.watched is sock:
            return
        self.watched = sock
        idle_watch().watch(sock, self._peer_event)

    def _peer_event(self) -> None:
        with self.cond:
            self.watched = None
            self.cond.notify()

    def _unwatch(self) -> None:
        with self.cond:
            sock, self.watched = self.watched, None
        if sock is not None:
            idle_watch().unwatch(sock)

    def _step(self) -> None:
        """Connect if needed, then push what is pending and ask for status
        when due. Expected failures (the agent is down, restarted, timed out,
        sent garbage) end the connection and schedule a reconnect."""
        now = time.monotonic()
        if not self.client.connected or self.client.peer_closed():
            if self.st.connected:
                self._disconnected("the agent closed the connection")
            if now < self.next_connect:
                return
            try:
                self.client.connect()
            except OSError as exc:
                self.next_connect = now + self.backoff
                self.backoff = min(MAX_RETRY_S, self.backoff * 2)
                self._error(f"cannot reach {self.endpoint.address}: {exc}")
                return
            self.backoff = self.retry_s
            with self.cond:
                self.st.connected, self.st.connects = True, self.st.connects + 1
                # a reconnect is a push (unless a newer controller owns the agent)
                self.need_push = (self.need_push or self.st.desired_version > 0) and self.st.superseded_by is None
            self.next_status = 0.0
        try:
            self._round()
            if time.monotonic() >= self.next_status:
                self.next_status = time.monotonic() + self.status_interval()
                self._status()
        except EXPECTED as exc:
            self._disconnected(f"{type(exc).__name__}: {exc}")
            self.next_connect = time.monotonic() + self.backoff

    def _round(self) -> None:
        with self.cond:
            push = self.need_push
            cfg, version = self.desired, self.st.desired_version
        if push:
            body = {"generation": self.generation, "version": version, "config": cfg}
            try:
                reply = self.client.request("config", body)
            except BaseException:
                with self.cond:
                    self.st.push_failures += 1
                raise
            with self.cond:
                if self.st.desired_version == version:
                    self.need_push = False
                if reply.get("ok"):
                    self.st.pushes += 1
                    self.st.version_in_force, self.st.generation_in_force = version, self.generation
                    self.st.config_pushed_at, self.st.last_error = time.time(), None
                    self.st.in_force = None     # unknown until the agent reads its kernel back: ask now
                    self.next_status = 0.0
                else:
                    self.st.refusals += 1
                    self.st.last_error = f"agent refused version {version}: {reply.get('error')}"
                    log.error("agent %s: %s", self.endpoint.host, self.st.last_error)
                    newer = reply.get("max_generation")
                    if isinstance(newer, int) and newer > self.generation:
                        self.st.superseded_by = newer     # never push again: that controller owns the agent
        with self.cond:
            rates, self.rates, token = self.rates, None, self.rates_token
        if rates is not None:
            try:
                reply = self.client.request("rates", {"generation": self.generation, **rates})
            except BaseException:
                with self.cond:
                    if self.rates is None:      # keep the newest: a newer value may have arrived meanwhile
                        self.rates, self.rates_token = rates, token
                raise
            with self.cond:
                self._rates_reply(reply, token)

    def _rates_reply(self, reply: dict, token: float | None) -> None:
        """A rates reply, taken (under ``cond``; the thread's or the pump's)."""
        self.st.rate_pushes += 1
        if not reply.get("ok"):
            self.st.last_error = f"agent refused rates: {reply.get('error')}"
        else:
            per_vm, problems = check_vm_reports(reply, self.endpoint.host)
            if problems:
                self._refused_report(f"LRC report: {problems[0]}" + (
                    f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
            self.lrc_reply = (token, time.monotonic(), per_vm)

    def _refused_report(self, why: str) -> None:
        """A malformed reply of this agent: counted and named against its
        host; what it carried is left out, every other host goes on."""
        self.st.report_refusals += 1
        if self.st.last_error != why:
            log.warning("agent %s: reply refused: %s", self.endpoint.host, why)
        self.st.last_error = why

    def _status(self) -> None:
        reply = self.client.request("status", {})
        problems = status_problems(reply)
        with self.cond:
            if problems:
                self._refused_report(f"status: {'; '.join(problems[:3])}")
                return
            now = time.time()
            counts = reply.get("class_bytes") or {}
            if self.st.status_at is not None and counts and self.st.class_bytes:
                dt = now - self.st.status_at
                self.st.bg_rate_bps = _rate(self.st.class_bytes, counts, dt, is_bg_class)
                self.st.wc_rate_bps = _rate(self.st.class_bytes, counts, dt, is_wc_class)
            self.st.class_bytes = counts if isinstance(counts, dict) else {}
            self.st.vms = _vm_states(self.st.vms, reply.get("vms") or {}, now - (self.st.status_at or now))
            self.st.status_at = now
            self.st.in_force = reply.get("in_force")
            self.st.differences = len(reply.get("differences") or [])
            self.st.degraded = reply.get("degraded")
            if reply.get("generation") == self.generation and reply.get("version") is not None:
                self.st.version_in_force = reply.get("version")
            elif (reply.get("ok") and reply.get("generation") != self.generation and self.st.desired_version > 0
                  and self.st.superseded_by is None):
                self.need_push = True   # the agent holds another generation's config, or none (it restarted)

    def _disconnected(self, why: str | None) -> None:
        self._unwatch()
        self.client.close()
        with self.cond:
            if self.st.connected:
                log.warning("agent %s: disconnected (%s)", self.endpoint.host, why)
            self.st.connected = False
            self.st.last_error = why
            self.need_push = (self.need_push or self.st.desired_version > 0) and self.st.superseded_by is None

    def _error(self, why: str) -> None:
        with self.cond:
            if self.st.last_error != why:
                log.warning("agent %s: %s", self.endpoint.host, why)
            self.st.last_error = why


MAX_PAIRS_REPORTED = 4096
MAX_VMS_REPORTED = 256          # VMs one agent reports on (its MAX_VMS)
_IPV4 = re.compile(r"^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$")


_VM_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,31})?")


def _bounded(obj, what: str, unit: str, limit: int) -> list[str]:
    """Why ``obj`` is not an object of at most ``limit`` entries ([] = it is)."""
    if not isinstance(obj, dict):
        return [f"{what} must be an object, got {type(obj).__name__}"]
    return [f"{len(obj)} {unit}, at most {limit}"] if len(obj) > limit else []


def check_vm_reports(reply: dict, host: str) -> tuple[dict, list[str]]:
    """A rates reply's LRC reports per VM (its name at the agent -> pairs):
    ``vms`` when the agent sends it, else its flat ``pairs`` as the host's
    one VM's. Each VM's pairs as :func:`check_pair_reports` takes them; a VM
    name that is not one is left out and named."""
    vms = reply.get("vms")
    if vms is None:
        vms = {host: reply.get("pairs", {})}
    bad = _bounded(vms, "vms", "VMs", MAX_VMS_REPORTED)
    if bad:
        return {}, bad
    out, problems = {}, []
    for name, pairs in vms.items():
        if not (isinstance(name, str) and _VM_KEY.fullmatch(name)):
            problems.append(f"VM {name!r:.40}: not a VM name")
            continue
        out[name], more = check_pair_reports(pairs)
        problems += [f"VM {name}: {p}" if name != host else p for p in more]
    return out, problems


def check_pair_reports(pairs) -> tuple[dict, list[str]]:
    """An agent's LRC report (peer address -> v, limit, guarantee, weight,
    factor age) as the controller takes it: each pair whose fields are not
    finite numbers in range is left out and named; the rest is kept."""
    bad = _bounded(pairs, "pairs", "pairs", MAX_PAIRS_REPORTED)
    if bad:
        return {}, bad
    out, problems = {}, []
    for peer, rep in pairs.items():
        if not (isinstance(peer, str) and _IPV4.match(peer)):
            problems.append(f"pair {peer!r:.40}: not an IPv4 address")
            continue
        why = report_problems(rep)
        if why:
            problems.append(f"pair {peer}: {why[0]}")
            continue
        out[peer] = rep
    return out, problems


# an HTB class id as tc prints it (major:minor, hex): what a status reply's class_bytes are keyed by
_CLASS_ID = re.compile(r"[0-9a-f]{1,4}:[0-9a-f]{1,4}")


def status_problems(reply) -> list[str]:
    """Why an agent's status reply cannot be taken ([] = it can)."""
    if not isinstance(reply, dict):
        return ["not an object"]
    problems = []
    counts = reply.get("class_bytes")
    if counts is not None:
        if not isinstance(counts, dict) or len(counts) > 4 * MAX_PAIRS_REPORTED:
            problems.append("class_bytes must be an object of at most "
                            f"{4 * MAX_PAIRS_REPORTED} classes")
        else:
            problems += [f"class_bytes[{c!r:.20}] {n!r:.30}: not a byte count" for c, n in counts.items()
                         if not (isinstance(c, str) and _CLASS_ID.fullmatch(c) and isinstance(n, int)
                                 and not isinstance(n, bool) and 0 <= n < 2 ** 64)]
    for key in ("generation", "version"):
        v = reply.get(key)
        if v is not None and not (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2 ** 63):
            problems.append(f"{key} {v!r:.30}: not a counter")
    if reply.get("in_force") is not None and not isinstance(reply.get("in_force"), bool):
        problems.append("in_force: not true or false")
    if reply.get("differences") is not None and not isinstance(reply.get("differences"), list):
        problems.append("differences: not a list")
    if reply.get("degraded") is not None and not isinstance(reply.get("degraded"), str):
        problems.append("degraded: not text")
    vms = reply.get("vms")
    if vms is not None:
        if not isinstance(vms, dict) or len(vms) > MAX_VMS_REPORTED:
            problems.append(f"vms must be an object of at most {MAX_VMS_REPORTED} VMs")
        else:
            for name, one in vms.items():
                if not (isinstance(name, str) and _VM_KEY.fullmatch(name)):
                    problems.append(f"vms[{name!r:.40}]: not a VM name")
                elif not isinstance(one, dict) or "vms" in one:
                    problems.append(f"vms[{name}]: not a VM's status")
                else:
                    problems += [f"vms[{name}]: {p}" for p in status_problems(one)]
    return problems


def is_bg_class(classid: str) -> bool:
    """The hose class and the per-destination (pipe, LRC) classes carry BG."""
    return classid == CLASS_BG or in_pair_slots(classid, PAIR_CLASS_BASE)


def is_wc_class(classid: str) -> bool:
    """The WC classes (young flows' and the rest) and LRC's per-pair WC ceilings."""
    return classid in (CLASS_WC, CLASS_YOUNG) or in_pair_slots(classid, WC_PAIR_CLASS_BASE)


def _vm_states(before: dict, vms: dict, dt: float) -> dict:
    """Each VM's state from a (checked) status reply, its class rates
    against the previous reply's counts."""
    out = {}
    for name, one in sorted(vms.items()):
        counts = one.get("class_bytes") or {}
        old = before.get(name, {}).get("class_bytes") or {}
        out[name] = {"in_force": one.get("in_force"), "differences": len(one.get("differences") or []),
                     "degraded": one.get("degraded"), "class_bytes": counts,
                     "bg_rate_bps": _rate(old, counts, dt, is_bg_class) if old and counts else None,
                     "wc_rate_bps": _rate(old, counts, dt, is_wc_class) if old and counts else None}
    return out


def _rate(before: dict, after: dict, dt: float, which) -> float | None:
    """bits/s through the classes ``which`` selects; None over a reset or no time."""
    if dt <= 0:
        return None
    total = 0
    for cls, n in after.items():
        if which(cls) and isinstance(n, int):
            prev = before.get(cls, 0)
            if not isinstance(prev, int) or n < prev:
                return None            # counters restarted (the class was rebuilt)
            total += n - prev
    return total * 8 / dt


def _keys(loaded: Loaded, endpoints: dict[str, tenancy.Endpoint]) -> dict[str, tuple[bytes | None, str | None]]:
    master, master_error = None, None
    master_file = tenancy.master_key_file(loaded)
    if master_file and any(e.key_file is None for e in endpoints.values()):
        try:
            master = load_secret(master_file, private=True)
        except (OSError, ChannelError) as exc:
            master_error = f"master key {master_file}: {exc}"
    out = {}
    for host, e in endpoints.items():
        if e.key_file is not None:
            try:
                out[host] = (load_secret(e.key_file, private=True), None)
            except (OSError, ChannelError) as exc:
                out[host] = (None, f"key {e.key_file}: {exc}")
        elif master is not None:
            out[host] = (host_key(master, host), None)
        else:
            out[host] = (None, master_error or "no key: set agents.master_key_file or a key_file")
    return out


class AgentSessions:
    """Every declared agent's session; follows configuration changes with
    the difference only (new hosts, removed hosts, changed host configs)."""

    def __init__(self, generation: int, **session_options):
        self.generation = generation
        self.options = session_options
        self.sessions: dict[str, Session] = {}
        self.configs: dict[str, dict] = {}
        self.lock = threading.Lock()

    def _options(self, loaded: Loaded) -> dict:
        a = loaded.cfg.agents
        return {"timeout_s": a.request_timeout_s, "retry_s": a.retry_s, "status_interval_s": a.status_interval_s,
                **self.options}

    def start(self, loaded: Loaded, version: int) -> "AgentSessions":
        self.update(None, loaded, version)
        return self

    def update(self, old: Loaded | None, new: Loaded, version: int) -> dict[str, str]:
        """Bring the sessions to ``new``; returns host -> what happened."""
        endpoints = tenancy.agent_endpoints(new)
        wanted = {h: tenancy.wire(c) for h, c in tenancy.host_configs(new).items()}
        changed: dict[str, str] = {}
        with self.lock:
            for host in sorted(set(self.sessions) - set(endpoints)):
                session = self.sessions.pop(host)
                session.set_config(version, None)     # the agent removes what it put in force...
                threading.Thread(target=_drain_and_stop, args=(session,), daemon=True).start()
                self.configs.pop(host, None)
                changed[host] = "removed"
            keys = None
            for host, e in endpoints.items():
                s = self.sessions.get(host)
                if s is not None and s.endpoint != e:       # moved or re-keyed: a new session
                    self.sessions.pop(host).stop()
                    s = None
                if s is None:
                    keys = keys or _keys(new, endpoints)
                    key, err = keys[host]
                    s = self.sessions[host] = Session(e, key, self.generation, key_error=err,
                                                      **self._options(new)).start()
                    changed[host] = "added"
                if self.configs.get(host) != wanted.get(host):
                    self.configs[host] = wanted.get(host)
                    s.set_config(version, wanted.get(host))
                    changed.setdefault(host, "changed")
        return changed

    def states(self) -> list[dict]:
        with self.lock:
            sessions = list(self.sessions.values())
        return [s.state() for s in sessions]

    def samples(self, loaded: Loaded):
        """Metrics of every session and of the rate pump (see controller.metrics)."""
        now = time.time()
        vms = loaded.host_vms()
        pump = rate_pump()
        yield "bwfabric_rate_pump_failures", {}, pump.failures
        yield "bwfabric_rate_pump_errors", {}, pump.errors
        for st in self.states():
            h = {"host": st["host"]}
            yield "bwfabric_agent_connected", h, int(st["connected"])
            yield "bwfabric_agent_in_force", h, int(bool(st["in_force"]))
            if st["config_pushed_at"] is not None:
                yield "bwfabric_agent_config_age_seconds", h, now - st["config_pushed_at"]
            if st["version_in_force"] is not None:
                yield "bwfabric_agent_config_version", h, st["version_in_force"]
            for key, name in (("pushes", "bwfabric_agent_pushes"), ("push_failures", "bwfabric_agent_push_failures"),
                              ("refusals", "bwfabric_agent_refusals"), ("connects", "bwfabric_agent_connects"),
                              ("report_refusals", "bwfabric_agent_report_refusals"),
                              ("rate_pushes", "bwfabric_agent_rate_pushes")):
                yield name, h, st[key]
            for cls, n in sorted(st["class_bytes"].items()):
                yield "bwfabric_agent_class_bytes", {**h, "class": cls}, n
            for p in vms.get(st["host"], []):
                one = st["vms"].get(p.id if p.netns else p.host)
                if one is None and not p.netns:              # an agent before issue #32 §4: its flat fields
                    one = st
                if one is None:
                    continue
                labels = {"tenant": p.tenant, "vm": p.name, "host": st["host"]}
                if p.netns:
                    yield "bwfabric_vm_in_force", labels, int(bool(one["in_force"]))
                if one["bg_rate_bps"] is not None:
                    yield "bwfabric_tenant_bg_rate_bytes_per_second", labels, one["bg_rate_bps"] / 8
                if one["wc_rate_bps"] is not None:
                    yield "bwfabric_tenant_wc_rate_bytes_per_second", labels, one["wc_rate_bps"] / 8

    def lead(self, generation: int, loaded: Loaded, version: int) -> None:
        """This process leads now (controller.ha) with ``generation``: every
        session anew under it (agents refuse anything lower), full pushes."""
        self._stop_behind()
        with self.lock:
            self.generation = generation
        self.update(None, loaded, version)

    def follow(self) -> None:
        """A standby pushes nothing: every session stops."""
        self._stop_behind()

    def _stop_behind(self) -> None:
        """Forget every session now and let them stop on a thread of their
        own: the caller (the election, on the event loop) never waits for a
        session's request to time out."""
        with self.lock:
            sessions, self.sessions, self.configs = list(self.sessions.values()), {}, {}
        if sessions:
            threading.Thread(target=lambda: [s.stop() for s in sessions], name="sessions-stop",
                             daemon=True).start()

    def session(self, host: str) -> Session | None:
        with self.lock:
            return self.sessions.get(host)

    def stop(self) -> None:
        with self.lock:
            sessions, self.sessions = list(self.sessions.values()), {}
        for s in sessions:
            s.stop()


def _drain_and_stop(session: Session, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with session.cond:
            if not session.need_push:
                break
        time.sleep(0.05)
    session.stop()


