"""Key-value stores used for rendezvous: in-process, file-backed, TCP, and prefixed views."""

from .base import Store, StoreTimeoutError
from .file import FileStore
from .hash import HashStore
from .prefix import PrefixStore
from .tcp import TCPStore

__all__ = ["FileStore", "HashStore", "PrefixStore", "Store", "StoreTimeoutError", "TCPStore"]
