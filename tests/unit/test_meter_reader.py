"""The meter's per-host reader (experiments.meter.READER): one shell that
stays, answering each request with nft's listing stamped just before and
after by its own clock -- run here with a stand-in ``nft`` on PATH (the
listing's JSON and how long it takes are what the stand-in decides), so the
parsing and the stamps are checked without a fabric."""

import json
import os
import subprocess
import time

import pytest

from experiments.meter import READER, _read_from

LISTING = {"nftables": [{"rule": {"comment": "tcp-h1", "expr": [{"counter": {"packets": 3, "bytes": 4500}}]}}]}


def _reader(tmp_path, body: str):
    fake = tmp_path / "nft"
    fake.write_text("#!/bin/sh\n" + body)
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    return subprocess.Popen(["bash", "-c", READER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)


def test_each_request_gets_the_listing_stamped_around_nft(tmp_path):
    """The stamp is the middle of nft's own run (0.3 s here), not of the
    request's round trip: asked at t, answered after t + 0.3 s, stamped
    at about t + 0.15 s."""
    reader = _reader(tmp_path, f"sleep 0.3; echo '{json.dumps(LISTING)}'\n")
    try:
        t0 = time.time()
        for _ in range(2):
            asked = time.time() - t0
            reader.stdin.write("\n")
            reader.stdin.flush()
            listing, when = _read_from(reader, "h1", t0)
            answered = time.time() - t0
            assert listing == LISTING
            assert asked + 0.1 < when < answered - 0.1, (asked, when, answered)
    finally:
        reader.stdin.close()
        reader.wait(5)


def test_a_failed_listing_or_a_dead_reader_is_an_error_by_host(tmp_path):
    reader = _reader(tmp_path, "echo 'Error: No such file or directory' >&2; exit 1\n")
    try:
        reader.stdin.write("\n")
        reader.stdin.flush()
        with pytest.raises(RuntimeError, match="h7: no listing"):
            _read_from(reader, "h7", time.time())
    finally:
        reader.stdin.close()
        reader.wait(5)
    with pytest.raises(RuntimeError, match="h7: the meter's reader ended"):
        _read_from(reader, "h7", time.time())
