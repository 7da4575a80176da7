"""Transports: how bytes move between ranks (see ``base.Transport``)."""

from .base import Mailbox, RecvHandle, Transport

__all__ = ["Mailbox", "RecvHandle", "Transport"]
