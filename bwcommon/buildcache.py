"""Where bwfabric compiles what it builds on the machine it runs on (the BPF
objects the agent loads, the emulator's delay line): ``build/<what>`` of a
source checkout (a directory with ``pyproject.toml`` above the packages), else
``/var/cache/bwfabric/<what>`` -- an installed package never writes into
site-packages. ``BWFABRIC_BUILD_DIR`` overrides both."""

from __future__ import annotations

import os
from pathlib import Path

ENV = "BWFABRIC_BUILD_DIR"
SYSTEM = Path("/var/cache/bwfabric")
_TREE = Path(__file__).resolve().parents[1]      # the directory holding the packages


def build_dir(what: str, env: dict | None = None, tree: Path = _TREE) -> Path:
    """The directory ``what`` is built in (not created here)."""
    env = os.environ if env is None else env
    if not what or "/" in what or what in (".", ".."):
        raise ValueError(f"build directory name {what!r}: one path component")
    if env.get(ENV):
        return Path(env[ENV]) / what
    if (tree / "pyproject.toml").is_file():
        return tree / "build" / what
    return SYSTEM / what
