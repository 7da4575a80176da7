"""Reruns of a peer's own test that a harness here allows, and peers' runs reported beside
pyc10d's, noted so a summary can count and name them.

Two of torchft's tests, run unchanged against pyc10d (``torchft_suite``), have races of their
own that a rerun gets past: ``test_ddp_skip_init_sync`` (its replicas share torch's global
generator) and ``test_quorum_timeout`` (torch's TCPStore stalls on a reverse lookup). A rerun
that passes must not pass for a clean run: each is noted here, and the suite's conftest counts
them in pytest's closing line ("N documented reruns"). Nothing in pyc10d itself reruns anything.

A peer run beside pyc10d's (the Gloo reference of the Slurm tests) is reported, never asserted:
its crash is the peer's own (torch's Gloo aborts at exit now and then, "terminate called without
an active exception"), and must not fail pyc10d's target. Each such run's outcome is a line here
(``beside``); the conftest prints them under "peers beside" and counts a peer's abort in the
closing line ("N peer aborts").
"""

from __future__ import annotations

#: ``"<test id>: <why>"``, one per rerun, in this process.
RERUNS: list[str] = []


def note(test_id: str, why: str) -> None:
    """Record that ``test_id`` was run again because of ``why`` (its documented race)."""
    RERUNS.append(f"{test_id}: {why}")


#: ``(what, outcome, aborted)``, one per peer run reported beside pyc10d's, in this process.
BESIDE: list[tuple[str, str, bool]] = []


def beside(what: str, outcome: str, aborted: bool = False) -> None:
    """Report a peer's run ``what`` (its ``outcome`` in words; ``aborted`` when the peer
    crashed, at exit or before) beside pyc10d's, without failing the test that ran it."""
    BESIDE.append((what, outcome, aborted))
