"""A store scope of its own for each forming of a group, so a dead attempt's keys are never read.

A group's transports meet through fixed keys under the group's prefix (``shm/segment``,
``shm/pid/<rank>``, ``tcp_addr/<rank>``, ``auto/host/<rank>``). A store that outlives the
processes writing to it still holds those keys when the group forms again under the same
name: torchrun's elastic agent hands every restarted attempt the very ``TCPStore`` it served
the failed one (torch shares the rendezvous store with the workers, and neither torch nor
the workers' env names the attempt consistently: ``TORCHELASTIC_RESTART_COUNT`` is counted
by each agent and stays put when membership changes). A restarted rank then read the dead
attempt's segment name (``FileNotFoundError``: it was unlinked), or its pids (the group
"died" at once), or addresses no one listens on; counting joins per generation, as the tcp
transport does, breaks as soon as the dead attempt joined only partly or had another size.

``scope`` settles the question once, before any transport reads a key: group rank 0 draws
a random token, every other rank draws a random nonce and publishes it (``hello/<rank>``),
and rank 0 admits each nonce it reads by writing the token under a key named by that nonce
(``admit/<rank>/<nonce>``). A rank waits only for the key of its own fresh nonce, which no
earlier attempt can have written, and acknowledges under the token; rank 0 re-reads the
hellos until every rank acknowledged, so a stale hello it admitted first is replaced by the
fresh one. The group's transports then run under ``<token>/``, a prefix nothing else has
used. No rank of a dead attempt can interfere: torchrun starts an attempt's workers only
once every agent stopped the previous one's.
"""

from __future__ import annotations

import secrets
import time
from datetime import timedelta

from ..errors import DistTimeoutError, with_message
from .base import Store
from .prefix import PrefixStore

#: Where the handshake's keys live, under the group's own prefix.
ROOT = "attempt"
#: Longest pause between two reads of the hellos while rank 0 waits for acknowledgements:
#: short, since every rank's group forming waits on it (a reconfigure's replacement too); each
#: read is two store round trips, and the acknowledgements come a few round trips after the
#: admissions.
_MAX_POLL = 0.005


def scope(store: Store, rank: int, size: int, timeout: timedelta, group_name: str) -> Store:
    """The store under which this forming of group ``group_name`` meets: a prefix no earlier
    forming of the group in ``store`` used. Every rank of the group calls it collectively."""
    if size <= 1:
        return store  # nobody to meet, nothing to read
    deadline = time.monotonic() + max(timeout.total_seconds(), 0.001)
    token = _admit_all(store, size, deadline, timeout, group_name) if rank == 0 else \
        _be_admitted(store, rank, deadline, timeout, group_name)
    return PrefixStore(f"{ROOT}/{token}", store)


def _left(deadline: float) -> timedelta:
    return timedelta(seconds=max(deadline - time.monotonic(), 0.001))


def _be_admitted(store: Store, rank: int, deadline: float, timeout: timedelta, group_name: str) -> str:
    nonce = secrets.token_hex(8)
    store.set(f"{ROOT}/hello/{rank}", nonce)
    admit = f"{ROOT}/admit/{rank}/{nonce}"
    try:
        store.wait([admit], _left(deadline))
    except DistTimeoutError as e:
        raise with_message(e, f"forming group {group_name!r}: rank {rank} timed out after "
                          f"{timeout.total_seconds():.0f}s waiting for rank 0 to admit it "
                          f"(key {admit}; is rank 0 of this attempt running?)") from e
    token = store.get(admit).decode()
    store.set(f"{ROOT}/ack/{token}/{rank}", b"1")
    return token


def _admit_all(store: Store, size: int, deadline: float, timeout: timedelta, group_name: str) -> str:
    token = secrets.token_hex(8)
    peers = list(range(1, size))
    hellos = [f"{ROOT}/hello/{p}" for p in peers]
    acks = [f"{ROOT}/ack/{token}/{p}" for p in peers]
    try:
        store.wait(hellos, _left(deadline))
    except DistTimeoutError as e:
        missing = [p for p, k in zip(peers, hellos) if not store.check([k])]
        raise with_message(e, f"forming group {group_name!r}: rank 0 timed out after "
                          f"{timeout.total_seconds():.0f}s waiting for ranks {missing} to arrive "
                          f"(keys {', '.join(f'{ROOT}/hello/{p}' for p in missing[:4])})") from e
    admitted: dict[int, bytes] = {}
    pause = 0.0005
    while True:
        # A hello that changed since the last read is a fresh rank's, and the one admitted
        # before it a dead attempt's (or an earlier forming's): admit the new one too.
        fresh = [(p, v) for p, v in zip(peers, store.multi_get(hellos)) if admitted.get(p) != v]
        if fresh:
            store.multi_set([f"{ROOT}/admit/{p}/{v.decode()}" for p, v in fresh], [token] * len(fresh))
            admitted.update(fresh)
        if store.check(acks):
            return token
        if time.monotonic() >= deadline:
            missing = [p for p, k in zip(peers, acks) if not store.check([k])]
            raise DistTimeoutError(f"forming group {group_name!r}: rank 0 timed out after "
                                 f"{timeout.total_seconds():.0f}s waiting for ranks {missing} to "
                                 f"acknowledge attempt {token} (they published no fresh hello)")
        time.sleep(pause)
        pause = min(pause * 2, _MAX_POLL)

