"""The meter's per-host reader (experiments.meter.READER, ``nft -j -i``):
one nft that stays, answering each ``list table`` line with a JSON listing
line -- run here with a stand-in ``nft`` on PATH (what it answers and how
long it takes are what the stand-in decides), so the parsing and the stamps
are checked without a fabric. The real nft's interactive mode is what the
meter's integration runs use (tests/integration: the main job's meter)."""

import json
import os
import subprocess
import time

import pytest

from experiments.meter import LIST, READER, _read_from

LISTING = {"nftables": [{"rule": {"comment": "tcp-h1", "expr": [{"counter": {"packets": 3, "bytes": 4500}}]}}]}


def _reader(tmp_path, body: str):
    """A stand-in nft: for every line read, ``body`` (a shell snippet; $line is the command)."""
    fake = tmp_path / "nft"
    fake.write_text("#!/bin/bash\nwhile read -r line; do\n" + body + "\ndone\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    return subprocess.Popen(READER, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1, env=env)


def test_each_request_is_the_list_command_and_gets_the_listing_stamped_at_its_middle(tmp_path):
    """Asked at t, answered 0.3 s later: stamped at t + 0.15 s (the middle),
    and what the reader was asked is the meter's list command."""
    log = tmp_path / "asked"
    reader = _reader(tmp_path, f"echo \"$line\" >> {log}; sleep 0.3; echo '{json.dumps(LISTING)}'")
    try:
        t0 = time.time()
        for _ in range(2):
            asked = time.time() - t0
            listing, when = _read_from(reader, "h1", t0)
            answered = time.time() - t0
            assert listing == LISTING
            assert asked + 0.1 < when < answered - 0.1, (asked, when, answered)
            assert abs(when - (asked + answered) / 2) < 0.05
    finally:
        reader.stdin.close()
        reader.wait(5)
    assert log.read_text().splitlines() == [LIST.strip()] * 2


@pytest.mark.parametrize("answer", ["Error: No such file or directory", "{\"other\": 1}", "[1, 2]"])
def test_an_answer_that_is_not_a_listing_is_an_error_by_host(tmp_path, answer):
    reader = _reader(tmp_path, f"echo '{answer}'")
    try:
        with pytest.raises(RuntimeError, match="h7: no listing"):
            _read_from(reader, "h7", time.time())
    finally:
        reader.stdin.close()
        reader.wait(5)


def test_a_dead_reader_is_an_error_by_host(tmp_path):
    reader = _reader(tmp_path, "exit 1")
    with pytest.raises(RuntimeError, match="h7: the meter's reader ended"):
        _read_from(reader, "h7", time.time())
    reader.wait(5)
    with pytest.raises(RuntimeError, match="h7: the meter's reader ended"):
        _read_from(reader, "h7", time.time())


def test_the_real_nft_answers_a_line_per_command_with_fresh_counters(tmp_path):
    """nft's interactive mode, as the meter runs it: a JSON line per list
    command, the counters read again each time (not a cache)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (nftables)")
    name = f"bwfmetertest{os.getpid()}"
    subprocess.run(["nft", "-f", "-"], check=True, text=True, input=(
        f"table ip {name} {{\n chain c {{ type filter hook output priority 0; policy accept;\n"
        f"  ip daddr 127.0.0.42 counter comment \"x\"\n }}\n}}\n"))
    nft = subprocess.Popen(READER, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, bufsize=1)
    try:
        def count():
            nft.stdin.write(f"list table ip {name}\n")
            nft.stdin.flush()
            data = json.loads(nft.stdout.readline())
            return next(e["counter"]["packets"] for i in data["nftables"] if "rule" in i
                        for e in i["rule"]["expr"] if "counter" in e)
        before = count()
        subprocess.run(["ping", "-c", "3", "-i", "0.05", "-W", "1", "127.0.0.42"], capture_output=True)
        assert count() == before + 3
    finally:
        nft.stdin.close()
        nft.wait(5)
        subprocess.run(["nft", "delete", "table", "ip", name], capture_output=True)
