"""Backends: the collective engine bound to a transport (tcp; shm and threaded plug in here)."""

from .base import Engine, Options
from .tcp import Backend, TCPBackend
from .work import CompletedWork, Work

__all__ = ["Backend", "CompletedWork", "Engine", "Options", "TCPBackend", "Work"]
