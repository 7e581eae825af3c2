"""Run a piece of the agent's work inside a VM's network namespace.

A host with several VMs gives each its own network namespace (as a
container host does; issue #32 §4). What the agent does for a VM -- tc on
its interface, its sysctls, its MPTCP endpoints and nftables tables, ``ss``
and conntrack -- happens in that namespace: :func:`entered` moves the
calling *thread* there (``setns(2)`` changes the calling thread only; the
processes it starts and the netlink sockets and /proc/sys files it opens
belong to the namespace it is in), and back afterwards.

pyroute2's ``pushns``/``popns`` are not used: they keep one stack for the
whole process and save ``/proc/self/ns/net`` (the main thread's namespace),
which is wrong for the agent's worker threads. Its ``setns`` (the syscall
through libc) is.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from pathlib import Path

from bwcommon.hostconfig import NETNS_NAME as NAME_PATTERN   # an `ip netns` name (the config's and the agent's)

NETNS_RUN_DIR = Path("/run/netns")          # where ``ip netns add`` names namespaces
NAME_RE = re.compile(NAME_PATTERN)


class NetnsError(OSError):
    pass


def path_of(name: str) -> Path:
    if not NAME_RE.match(name or ""):
        raise NetnsError(f"network namespace {name!r}: not a name (letters, digits, _ . -; at most 64)")
    return NETNS_RUN_DIR / name


def exists(name: str) -> bool:
    return path_of(name).exists()


@contextmanager
def entered(name: str | None):
    """The calling thread in network namespace ``name`` (None: where it
    is) for the block. A namespace that does not exist is refused by name;
    a thread that cannot go back ends the process (it would go on working
    in a VM's namespace)."""
    if name is None:
        yield
        return
    from pyroute2.netns import setns
    try:
        target = os.open(path_of(name), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NetnsError(f"network namespace {name!r} does not exist ({NETNS_RUN_DIR / name})") from None
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns(target, flags=0)
        try:
            yield
        finally:
            try:
                setns(own, flags=0)
            except OSError:             # pragma: no cover - the kernel refused to go back
                os._exit(70)
    finally:
        os.close(target)
        os.close(own)


def current_inode() -> int:
    """The calling thread's network namespace (its inode)."""
    return os.stat("/proc/thread-self/ns/net").st_ino
