"""Reruns of a peer's own test that a harness here allows, noted so a summary can count them.

Two of torchft's tests, run unchanged against pyc10d (``torchft_suite``), have races of their
own that a rerun gets past: ``test_ddp_skip_init_sync`` (its replicas share torch's global
generator) and ``test_quorum_timeout`` (torch's TCPStore stalls on a reverse lookup). A rerun
that passes must not pass for a clean run: each is noted here, and the suite's conftest counts
them in pytest's closing line ("N documented reruns"). Nothing in pyc10d itself reruns anything.
"""

from __future__ import annotations

#: ``"<test id>: <why>"``, one per rerun, in this process.
RERUNS: list[str] = []


def note(test_id: str, why: str) -> None:
    """Record that ``test_id`` was run again because of ``why`` (its documented race)."""
    RERUNS.append(f"{test_id}: {why}")
