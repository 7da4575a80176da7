"""The shared-memory transport, one host: rings for messages, an arena for collectives.

* ``transport.py``: ``ShmTransport``: a ring per peer pair in a shared segment, messages
  framed as tcp's are, peers' deaths seen through their pids;
* ``arena.py``: the per-group arena the shm algorithms exchange phases through;
* ``segment.py``: shared segments in /dev/shm (created, mapped, unlinked, watched);
* ``futex.py``: waits and wakes on a word of shared memory.
"""

from .transport import ShmTransport

__all__ = ["ShmTransport"]
