"""The outbox's errors."""

from __future__ import annotations


class OutboxError(Exception):
    """Base class of the outbox's errors."""


class OutboxFullError(OutboxError):
    """The outbox reached ``max_bytes``; the report was not written."""


class OutboxLockedError(OutboxError):
    """Another process (or Outbox object) has the outbox directory open."""


class OutboxClosedError(OutboxError):
    """The outbox was closed."""


class OutboxCorruptError(OutboxError):
    """A record went bad after the outbox was opened; reopening cuts it."""
