"""Backends: the collective engine bound to a transport (tcp; shm and threaded plug in here)."""

from .engine import Engine
from .options import Options
from .tcp import TCPBackend
from .work import CompletedWork, Work

__all__ = ["CompletedWork", "Engine", "Options", "TCPBackend", "Work"]
