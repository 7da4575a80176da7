"""The TCPStore server under malformed input: it closes only the offending connection (with a
logged reason), keeps serving good clients and keeps its memory bounded.

``test_fuzz_server`` throws a seeded stream of malformed frames at a live server. Each fuzz
connection carries some well-framed nonsense (wrong part counts, non-numbers: answered with an
error, connection kept) and usually ends in a frame that breaks the framing (random bytes, a
frame cut short, a huge length or part count, an unknown op, half a header, a good header and
then garbage), which must close it. ``PYC10D_FUZZ_FRAMES`` sets the number of frames (``make
fuzz`` runs 100,000; ``make test`` a short run).
"""

from __future__ import annotations

import logging
import random
import socket
import struct
import threading
import time
from datetime import timedelta

import pytest

from pyc10d import settings
from pyc10d.store import TCPStore, wire
from pyc10d.store import tcp as store_tcp


@pytest.fixture(autouse=True)
def _no_auth_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests speak the unauthenticated wire (tests/test_auth.py covers the token)."""
    monkeypatch.delenv("PYC10D_AUTH_TOKEN", raising=False)


HEAD, LEN = struct.Struct("!BI"), struct.Struct("!I")
OPS = sorted(wire.SHAPES)
UNKNOWN_OPS = [c for c in range(256) if c not in wire.SHAPES]
SET, MGET, ADD, WAIT, MSET = 1, 2, 3, 5, 9
OK, ERROR = 0, 2
FRAMES = settings.FUZZ_FRAMES.get()
# Peak RSS may grow this much over the fuzz run (server threads, buffers in flight).
RSS_LIMIT_MB = 64


def frame(code: int, parts: list[bytes]) -> bytes:
    return HEAD.pack(code, len(parts)) + b"".join(LEN.pack(len(p)) + p for p in parts)


def nonsense(rng: random.Random) -> bytes:
    """A well-framed request the server must answer with an error (and keep the connection)."""
    k = rng.randrange(6)
    if k == 0:
        return frame(SET, [b"/k"] * rng.choice([0, 1, 3]))
    if k == 1:
        return frame(ADD, [b"/fuzz-not-a-number", b"x" * rng.randrange(1, 30)])
    if k == 2:
        return frame(WAIT, [b"soon", b"/k"])  # a wait limit that is not a number
    if k == 3:
        return frame(MSET, [b"/a", b"1", b"/b"])  # keys and values do not pair up
    if k == 4:
        return frame(MGET, [])
    return frame(rng.choice([7, 8]), [b"x"] * 2) if rng.random() < 0.5 else frame(4, [b"/k"])


def breaker(rng: random.Random, max_bytes: int) -> tuple[str, bytes]:
    """A frame that breaks the framing; the name says which kind."""
    kind = rng.choice(["random", "cut", "huge_len", "huge_count", "bad_op", "half_head",
                       "garbage", "announced"])
    if kind == "random":
        return kind, rng.randbytes(rng.randrange(1, 64))
    if kind == "cut":
        whole = frame(SET, [b"/cut", rng.randbytes(rng.randrange(1, 200))])
        return kind, whole[: rng.randrange(1, len(whole))]
    if kind == "huge_len":
        return kind, HEAD.pack(SET, 2) + LEN.pack(rng.randrange(max_bytes + 1, 1 << 32))
    if kind == "huge_count":
        return kind, HEAD.pack(rng.choice(OPS), rng.randrange(store_tcp.MAX_PARTS + 1, 1 << 32))
    if kind == "bad_op":
        return kind, HEAD.pack(rng.choice(UNKNOWN_OPS), rng.randrange(0, 4))
    if kind == "half_head":
        return kind, HEAD.pack(SET, 2)[: rng.randrange(1, HEAD.size)]
    if kind == "garbage":
        return kind, HEAD.pack(rng.choice(OPS), rng.randrange(1, 5)) + rng.randbytes(rng.randrange(1, 64))
    # A length under the limit that never comes: must cost what arrived, not what was announced.
    return kind, HEAD.pack(SET, 2) + LEN.pack(rng.randrange(1 << 20, max_bytes)) + rng.randbytes(4096)


def parse_replies(data: bytes) -> list[int]:
    """Statuses of the whole reply frames in ``data``."""
    statuses, pos = [], 0
    while pos + HEAD.size <= len(data):
        status, n = HEAD.unpack_from(data, pos)
        pos += HEAD.size
        for _ in range(n):
            if pos + LEN.size > len(data):
                return statuses
            (length,) = LEN.unpack_from(data, pos)
            pos += LEN.size + length
        if pos > len(data):
            break
        statuses.append(status)
    return statuses


def fuzz_connection(port: int, rng: random.Random, max_bytes: int) -> tuple[int, int, str]:
    """One connection: some nonsense, then (mostly) a breaker; the server's answers checked.

    Returns (nonsense frames, breaking frames, kind of the breaker or "clean").
    """
    soft = [nonsense(rng) for _ in range(rng.randrange(0, 8))]
    kind, tail = breaker(rng, max_bytes) if rng.random() < 0.95 else ("clean", b"")
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    reply = bytearray()
    try:
        try:
            sock.sendall(b"".join(soft) + tail)
            sock.shutdown(socket.SHUT_WR)
            while chunk := sock.recv(65536):
                reply += chunk
        except ConnectionResetError:
            # The server closed with bytes of ours unread (garbage after a bad header): the
            # kernel resets the connection, and replies still in flight may be lost.
            assert kind in ("random", "garbage"), kind
    finally:
        sock.close()
    statuses = parse_replies(bytes(reply))
    if kind in ("random", "garbage"):
        # Random bytes may happen to read as requests; every answer must still be a frame.
        assert all(s in (OK, 1, ERROR) for s in statuses), statuses
    else:
        assert statuses == [ERROR] * len(soft), (kind, statuses, len(soft))
    return len(soft), int(bool(tail)), kind


def vm_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/self/status")


def reset_peak_rss() -> None:
    """Start VmHWM afresh at the current RSS, so the peak measured is this test's alone."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class Counter(logging.Handler):
    """Counts the server's warnings without keeping them (100,000 records would be memory)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.samples: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if len(self.samples) < 5:
            self.samples.append(record.getMessage())


def good_client(store: TCPStore, stop: threading.Event, out: dict) -> None:
    """set/get/add with checked answers until ``stop``; records how many ops it did."""
    rng = random.Random(7)
    ops, total = 0, 0
    try:
        while not stop.is_set():
            key, value = f"good/{rng.randrange(50)}", rng.randbytes(rng.randrange(0, 2000))
            store.set(key, value)
            assert store.get(key) == value
            step = rng.randrange(1, 100)
            total += step
            assert store.add("good/counter", step) == total
            ops += 3
    except BaseException as e:  # noqa: BLE001 - reported by the test
        out["error"] = e
    out["ops"] = ops


@pytest.mark.timeout(590 if FRAMES > 20000 else 50)
def test_fuzz_server() -> None:
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=timedelta(seconds=30))
    port, max_bytes = master.port, store_tcp.max_part_bytes()
    client = TCPStore("127.0.0.1", port, timeout=timedelta(seconds=30))
    logger = logging.getLogger("pyc10d")
    counter, propagate = Counter(), logger.propagate
    logger.addHandler(counter)
    logger.propagate = False
    stalled = []
    stop, good = threading.Event(), {}
    worker = threading.Thread(target=good_client, args=(client, stop, good))
    try:
        reset_peak_rss()
        rss0 = vm_kib("VmRSS")
        start = time.monotonic()
        worker.start()
        # Connections that stop halfway and stay open hold a server thread, nothing more.
        for i in range(8):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(HEAD.pack(SET, 2)[: 1 + i % 4] if i % 2 else HEAD.pack(SET, 2) + LEN.pack(1 << 29))
            stalled.append(s)
        rngs = [random.Random(1000 + t) for t in range(4)]
        totals = [[0, 0, 0, {}] for _ in rngs]

        def fuzz(t: int) -> None:
            tot = totals[t]
            while tot[0] + tot[1] < FRAMES // len(rngs):
                soft, hard, kind = fuzz_connection(port, rngs[t], max_bytes)
                tot[0] += soft
                tot[1] += hard
                tot[2] += 1
                tot[3][kind] = tot[3].get(kind, 0) + 1

        fuzzers = [threading.Thread(target=fuzz, args=(t,)) for t in range(len(rngs))]
        for f in fuzzers:
            f.start()
        for f in fuzzers:
            f.join()
        elapsed = time.monotonic() - start
        # The server still serves a client that arrives after all of it.
        late = TCPStore("127.0.0.1", port, timeout=timedelta(seconds=10))
        late.set("late", "yes")
        assert master.get("late") == b"yes"
    finally:
        stop.set()
        worker.join(30)
        logger.removeHandler(counter)
        logger.propagate = propagate
        for s in stalled:
            s.close()
    peak_mb = (vm_kib("VmHWM") - rss0) / 1024
    soft = sum(t[0] for t in totals)
    hard = sum(t[1] for t in totals)
    conns = sum(t[2] for t in totals)
    kinds: dict[str, int] = {}
    for t in totals:
        for k, v in t[3].items():
            kinds[k] = kinds.get(k, 0) + v
    print(f"\nstore fuzz: {soft + hard} malformed frames ({hard} breaking the framing, {soft} "
          f"well-framed nonsense) over {conns} connections in {elapsed:.1f}s; good client did "
          f"{good.get('ops')} checked ops meanwhile; peak RSS grew {peak_mb:.1f} MiB "
          f"(limit {RSS_LIMIT_MB}); {counter.count} warnings logged; breakers: {kinds}")
    assert "error" not in good, good.get("error")
    assert good["ops"] >= 30, good
    assert soft + hard >= FRAMES - 50
    # Every breaker that is not random bytes must be logged (random bytes usually are too).
    assert hard - kinds.get("random", 0) <= counter.count <= hard, counter.samples
    assert peak_mb < RSS_LIMIT_MB


def read_reply(sock: socket.socket) -> tuple[int, list[bytes]]:
    f = sock.makefile("rb")
    try:
        got = store_tcp._read_frame(f, 1 << 20, store_tcp._STATUSES)
    finally:
        f.close()
    assert got is not None, "the server closed the connection"
    return got


@pytest.mark.timeout(20)
@pytest.mark.parametrize("bad, reason", [
    (HEAD.pack(77, 1), "unknown code 77"),
    (HEAD.pack(SET, store_tcp.MAX_PARTS + 1), "parts announced"),
    (HEAD.pack(SET, 2) + LEN.pack(4097), "a part of 4097 bytes announced, at most 4096"),
    (HEAD.pack(SET, 2) + LEN.pack(2) + b"/k" + LEN.pack(100) + b"abc", "cut short: 100 bytes"),
    (HEAD.pack(SET, 2)[:3], "cut short inside its header"),
])
def test_breaking_frame_closes_that_connection_only(monkeypatch, caplog, bad: bytes,
                                                    reason: str) -> None:
    monkeypatch.setenv("PYC10D_STORE_MAX_BYTES", "4096")
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=timedelta(seconds=10))
    other = TCPStore("127.0.0.1", master.port, timeout=timedelta(seconds=10))
    other.set("before", "1")
    with caplog.at_level(logging.WARNING, logger="pyc10d"):
        s = socket.create_connection(("127.0.0.1", master.port), timeout=10)
        # A good request first: the connection works until the bad frame.
        s.sendall(frame(SET, [b"/mine", b"v"]))
        assert read_reply(s)[0] == OK
        s.sendall(bad)
        s.shutdown(socket.SHUT_WR)
        assert s.recv(1) == b""  # closed by the server, nothing sent back
        s.close()
        # The other client is unaffected.
        other.set("after", "2")
        assert other.get("mine") == b"v" and other.get("before") == b"1"
    # The server logs before it closes, so the record is there once recv saw the end.
    assert reason in caplog.text
    assert "closed the connection from" in caplog.text


@pytest.mark.timeout(20)
def test_nonsense_request_gets_error_and_keeps_connection() -> None:
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=timedelta(seconds=10))
    s = socket.create_connection(("127.0.0.1", master.port), timeout=10)
    try:
        for bad, words in [
            (frame(SET, [b"/k"]), b"takes 2 parts, got 1"),
            (frame(MSET, [b"/a", b"1", b"/b"]), b"in pairs"),
            (frame(WAIT, [b"9" * 5000, b"/k"]), b"bad request"),  # too many digits to parse
            (frame(WAIT, [b"99999999999999999999", b"/k"]), None),  # absurd limit: clamped
        ]:
            if words is None:
                master.set("k", "present")  # the wait then returns at once
            s.sendall(bad)
            status, parts = read_reply(s)
            if words is None:
                assert status == OK
            else:
                assert status == ERROR and words in parts[0], parts
        s.sendall(frame(SET, [b"/k", b"fine"]))
        assert read_reply(s)[0] == OK
        assert master.get("k") == b"fine"
    finally:
        s.close()
