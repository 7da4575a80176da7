"""Linux futexes on 32-bit words in shared memory, through ``ctypes`` (no C extension).

``wait(addr, expected, timeout)`` sleeps while ``*addr == expected`` (the kernel compares and
queues atomically, so a ``wake`` after the word changed is never lost); ``wake(addr)`` wakes
every sleeper on the word. The futexes are shared (no ``FUTEX_PRIVATE_FLAG``): they work
across processes that map the same file. ``ctypes`` releases the GIL around the syscall, so
a sleeping thread never blocks the others of its process.

Why a word store followed by ``wake`` is enough for the shm transport: every shared word
has one writer, x86-64 keeps stores in program order (the payload is visible before the
word that publishes it), and the syscall itself orders the word's store before the wake.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

# x86-64 only: the store-ordering argument above does not hold on weaker memory models.
_SYS_FUTEX = {"x86_64": 202, "amd64": 202}.get(platform.machine().lower())
_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
_INT_MAX = 0x7FFFFFFF


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def available() -> bool:
    """True on Linux x86-64 (futex syscall number known, stores ordered)."""
    return _SYS_FUTEX is not None and os.name == "posix" and platform.system() == "Linux"


def wait(addr: int, expected: int, timeout: float) -> None:
    """Sleep until woken, the word at ``addr`` differs from ``expected``, or ``timeout`` s.

    Returns in every case (spurious wake-ups included); the caller re-reads the word.
    """
    secs = max(timeout, 0.0)
    ts = _Timespec(int(secs), int((secs - int(secs)) * 1e9))
    _syscall(
        ctypes.c_long(_SYS_FUTEX), ctypes.c_void_p(addr), ctypes.c_int(_FUTEX_WAIT),
        ctypes.c_uint32(expected & 0xFFFFFFFF), ctypes.byref(ts), None, ctypes.c_int(0),
    )


SEQ_CST = 5  # __ATOMIC_SEQ_CST, the memory order ``exchange`` is called with


def _load_exchange():
    """``exchange(addr, value, SEQ_CST)``: an atomic 32-bit store that is also a full memory
    barrier (x86 ``xchg``), libatomic's ``__atomic_exchange_4`` itself (no Python wrapper; a
    value over 32 bits is truncated by ctypes); None where libatomic is missing."""
    for name in (ctypes.util.find_library("atomic"), "libatomic.so.1"):
        if not name:
            continue
        try:
            # PyDLL: the call keeps the GIL. One instruction never blocks, and releasing and
            # retaking the GIL around it cost more than the call. (The shm arena calls it when a
            # rank goes to sleep on a peer's counter; a post stores plainly: arena.py.)
            fn = ctypes.PyDLL(name).__atomic_exchange_4
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int]
        fn.restype = ctypes.c_uint32
        return fn
    return None


#: Store-with-full-barrier, or None (the shm arena's sleepers announce themselves with it).
exchange = _load_exchange()


def wake(addr: int) -> None:
    """Wake every thread sleeping on the word at ``addr`` (in any process)."""
    _syscall(
        ctypes.c_long(_SYS_FUTEX), ctypes.c_void_p(addr), ctypes.c_int(_FUTEX_WAKE),
        ctypes.c_int(_INT_MAX), None, None, ctypes.c_int(0),
    )
