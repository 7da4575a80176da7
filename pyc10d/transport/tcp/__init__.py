"""The tcp transport, multi-host: one connection per peer pair, frames of raw tensor bytes.

* ``transport.py``: ``TCPTransport``: joining through the store, the dial/accept race,
  the receiver threads, the data path, heartbeats and shutdown;
* ``listener.py``: the accepting side (TLS, the auth token, the hello), ``links.py``: more
  connections per pair over several addresses, large frames striped over them;
* ``direct.py``: a synchronous caller reading and writing its peers' sockets itself (the
  lean lane), ``owner.py``: who reads a socket now, and how long a caller spins;
* ``heartbeat.py``: silent-peer detection, ``netif.py``: which address a rank advertises.
"""

from .transport import TCPTransport

__all__ = ["TCPTransport"]
