"""A client of torch's own TCPStore server: the store torch's ``torchrun`` agent serves.

torch's launcher starts a store on ``MASTER_PORT`` before its workers and tells them so
(``TORCHELASTIC_USE_AGENT_STORE=True``); torch's ranks then all join it as clients, on one
host or many. pyc10d's ranks do the same through this client, which speaks torch's protocol
instead of pyc10d's (``wire``), so ``torchrun`` needs no change across hosts either. Only
the client side: pyc10d never serves this protocol.

The protocol, as torch 2.13's server reads it (little-endian, fixed widths, no framing
beyond the fields): a connection opens with VALIDATE and a 32-bit magic number; then each
request is a one-byte query type followed by its fields (a string or byte value is a
uint64 length and the bytes, a count a uint64, an amount an int64). GET, COMPARE_SET answer
a length-prefixed value; ADD, GETNUMKEYS, DELETE_KEY an int64; CHECK a byte (0: all there);
WAIT a byte once every key is there (0), and after CANCEL_WAIT, WAIT_CANCELED (1), possibly
preceded by a late 0; SET, MULTI_SET, APPEND and QUEUE_PUSH get no answer; PING echoes its
uint32. QUEUE_LEN answers an int64; QUEUE_POP an int64 count (0: empty) and, when 1, the
value; a blocking pop is a WAIT on the queue's name (a non-empty queue counts as present) and
then a QUEUE_POP, as torch's client does it. LIST_KEYS answers an int64 count and that many
keys. Every user key gets torch's "/" prefix, as in torch's own client, so both see the same
keys; the server's own keys (no prefix: ``init/``) are left out of ``list_keys``, as torch's
client leaves them.
"""

from __future__ import annotations

import os
import struct
import threading
import time
import weakref
from datetime import timedelta

from ..errors import DistStoreError
from .base import (
    Store,
    StoreTimeoutError,
    queue_empty,
    resolve_timeout,
    timeout_seconds,
    to_bytes,
    wait_timeout_error,
)
from .tcp import dial

(VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND, MULTI_GET,
 MULTI_SET, CANCEL_WAIT, PING, QUEUE_PUSH, QUEUE_POP, QUEUE_LEN, LIST_KEYS) = range(18)
_MAGIC = 0x3C85F7CE
_READY, _STOP_WAITING, _WAIT_CANCELED = 0, 0, 1
_U32, _U64, _I64 = struct.Struct("<I"), struct.Struct("<Q"), struct.Struct("<q")
_GRACE_S = 30.0  # patience for an answer the server owes at once (beyond a wait's own limit)
_MAX_VALUE = 1 << 30  # a longer announced value is a protocol error, not an allocation


def _field(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


def _key(key: str) -> bytes:
    return _field(b"/" + key.encode())


def _keys(keys: list[str]) -> bytes:
    """A count, then the keys: how WAIT, CHECK and MULTI_GET carry theirs."""
    return _U64.pack(len(keys)) + b"".join(_key(k) for k in keys)


class TorchTCPStore(Store):
    """A connection to a torch ``TCPStore`` server, with pyc10d's ``Store`` interface."""

    def __init__(self, host_name: str, port: int, world_size: int | None = None,
                 timeout: timedelta = timedelta(seconds=300)) -> None:
        super().__init__(timeout)
        self._host, self._port = host_name, port
        self._lock = threading.Lock()
        self._broken: str | None = None
        self._sock = dial(host_name, port, timeout_seconds(timeout))
        weakref.finalize(self, self._sock.close)
        try:
            self._send(bytes([VALIDATE]) + _U32.pack(_MAGIC))
            nonce = os.getpid() & 0xFFFFFFFF
            with self._lock:  # an answer proves a torch store listens there, not something else
                self._send(bytes([PING]) + _U32.pack(nonce))
                if _U32.unpack(self._recv(4, _GRACE_S))[0] != nonce:
                    raise DistStoreError(f"the server at {host_name}:{port} is not a torch TCPStore "
                                         f"(it answered a ping with another number)")
            if world_size is not None:  # counted as torch's clients count themselves
                self.add_raw(b"init/", 1)
        except BaseException:
            self._sock.close()
            raise

    # -- the connection -------------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        try:
            self._sock.settimeout(_GRACE_S)
            self._sock.sendall(data)
        except OSError as e:
            raise self._lost(e) from e

    def _recv(self, n: int, secs: float | None) -> bytes:
        """Exactly ``n`` bytes; ``TimeoutError`` when ``secs`` pass before the first byte."""
        self._sock.settimeout(secs)
        parts, got = [], 0
        while got < n:
            try:
                part = self._sock.recv(n - got)
            except TimeoutError:
                if got:  # half an answer: the stream can no longer be trusted
                    raise self._lost(TimeoutError("the server stopped in mid-answer")) from None
                raise
            except OSError as e:
                raise self._lost(e) from e
            if not part:
                raise self._lost(ConnectionResetError("connection closed by the server"))
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    def _lost(self, error: BaseException) -> DistStoreError:
        self._broken = (f"TorchTCPStore lost its connection to the torch store at {self._host}:"
                        f"{self._port} ({type(error).__name__}: {error})")
        self._sock.close()
        return DistStoreError(self._broken)

    def _exchange(self, data: bytes, kind: str | None, n: int = 1,
                  wait: tuple[list[str], timedelta] | None = None) -> list[bytes | int]:
        """Under the lock: first WAIT for ``wait``'s keys if given, then send ``data`` and read
        ``n`` answers of ``kind`` ('value', 'int', 'byte'; None: the server sends none)."""
        with self._lock:
            if self._broken is not None:
                raise DistStoreError(self._broken)
            if wait is not None:
                self._wait(*wait)
            if not data:
                return []
            self._send(data)
            if kind is None:
                return []
            try:
                return [self._answer(kind) for _ in range(n)]
            except TimeoutError:
                raise self._lost(TimeoutError(f"no answer within {_GRACE_S:g} s")) from None

    def _answer(self, kind: str) -> bytes | int:
        if kind == "byte":
            return self._recv(1, _GRACE_S)[0]
        if kind == "int":
            return _I64.unpack(self._recv(8, _GRACE_S))[0]
        (n,) = _U64.unpack(self._recv(8, _GRACE_S))
        if n > _MAX_VALUE:
            raise self._lost(ValueError(f"a value of {n} bytes announced"))
        return self._recv(n, _GRACE_S)

    def _wait(self, keys: list[str], timeout: timedelta) -> None:
        """WAIT for ``keys`` under the lock; on timeout cancel it as torch's client does."""
        secs = timeout_seconds(timeout)
        self._send(bytes([WAIT]) + _keys(keys))
        try:
            got = self._recv(1, secs)[0]
        except TimeoutError:
            self._send(bytes([CANCEL_WAIT]))
            try:
                got = self._recv(1, _GRACE_S)[0]
                if got == _STOP_WAITING:  # the keys came just before the cancel did
                    got = self._recv(1, _GRACE_S)[0]
            except TimeoutError:
                raise self._lost(TimeoutError("no answer to a cancelled wait")) from None
            if got != _WAIT_CANCELED:
                raise self._lost(ValueError(f"answer {got} to a cancelled wait")) from None
            raise wait_timeout_error(["/" + k for k in keys], timeout) from None
        if got != _STOP_WAITING:
            raise self._lost(ValueError(f"answer {got} to a wait"))

    # -- the Store interface ----------------------------------------------------------------
    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        return self._port

    def set(self, key: str, value: str | bytes) -> None:
        self._exchange(bytes([SET]) + _key(key) + _field(to_bytes(value)), None)

    def get(self, key: str) -> bytes:
        return self._exchange(bytes([GET]) + _key(key), "value", wait=([key], self._timeout))[0]  # type: ignore[return-value]

    def add(self, key: str, amount: int) -> int:
        return self.add_raw(b"/" + key.encode(), amount)

    def add_raw(self, key: bytes, amount: int) -> int:
        """ADD on a key as the server spells it (no "/" prefix)."""
        return self._exchange(bytes([ADD]) + _field(key) + _I64.pack(int(amount)), "int")[0]  # type: ignore[return-value]

    def compare_set(self, key: str, expected_value: str | bytes, desired_value: str | bytes) -> bytes:
        data = bytes([COMPARE_SET]) + _key(key) + _field(to_bytes(expected_value)) + _field(to_bytes(desired_value))
        return self._exchange(data, "value")[0]  # type: ignore[return-value]

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._exchange(b"", None, wait=(list(keys), resolve_timeout(self._timeout, timeout)))

    def check(self, keys: list[str]) -> bool:
        return self._exchange(bytes([CHECK]) + _keys(list(keys)), "byte")[0] == _READY

    def delete_key(self, key: str) -> bool:
        return self._exchange(bytes([DELETE_KEY]) + _key(key), "int")[0] == 1

    def num_keys(self) -> int:
        return self._exchange(bytes([GETNUMKEYS]), "int")[0]  # type: ignore[return-value]

    def multi_get(self, keys: list[str]) -> list[bytes]:
        keys = list(keys)
        return self._exchange(bytes([MULTI_GET]) + _keys(keys), "value", len(keys),  # type: ignore[return-value]
                              wait=(keys, self._timeout))

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        if len(keys) != len(values):
            raise ValueError("multi_set: keys and values differ in length")
        body = b"".join(_key(k) + _field(to_bytes(v)) for k, v in zip(keys, values))
        self._exchange(bytes([MULTI_SET]) + _I64.pack(len(keys)) + body, None)

    def append(self, key: str, value: str | bytes) -> None:
        self._exchange(bytes([APPEND]) + _key(key) + _field(to_bytes(value)), None)

    def has_extended_api(self) -> bool:
        return True

    def list_keys(self) -> list[str]:
        with self._lock:
            if self._broken is not None:
                raise DistStoreError(self._broken)
            self._send(bytes([LIST_KEYS]))
            try:
                count = self._answer("int")
                keys = [self._answer("value") for _ in range(int(count))]
            except TimeoutError:
                raise self._lost(TimeoutError(f"no answer within {_GRACE_S:g} s")) from None
        return [k[1:].decode() for k in keys if isinstance(k, bytes) and k.startswith(b"/")]

    def queue_push(self, key: str, value: str | bytes) -> None:
        self._exchange(bytes([QUEUE_PUSH]) + _key(key) + _field(to_bytes(value)), None)

    def queue_len(self, key: str) -> int:
        return self._exchange(bytes([QUEUE_LEN]) + _key(key), "int")[0]  # type: ignore[return-value]

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        deadline = time.monotonic() + timeout_seconds(self._timeout)
        while True:
            with self._lock:
                if self._broken is not None:
                    raise DistStoreError(self._broken)
                if block:  # until the queue has a value (or the store's timeout passes)
                    left = max(deadline - time.monotonic(), 0.001)
                    self._wait([key], timedelta(seconds=left))
                self._send(bytes([QUEUE_POP]) + _key(key))
                try:
                    if self._answer("int"):
                        return self._answer("value")  # type: ignore[return-value]
                except TimeoutError:
                    raise self._lost(TimeoutError(f"no answer within {_GRACE_S:g} s")) from None
            if not block:
                raise queue_empty()
            # another client popped the value between our wait and our pop: wait again

    def clone(self) -> TorchTCPStore:
        """A new connection to the same server."""
        return TorchTCPStore(self._host, self._port, timeout=self._timeout)

    def __repr__(self) -> str:
        return f"TorchTCPStore({self._host}:{self._port})"


__all__ = ["StoreTimeoutError", "TorchTCPStore"]
