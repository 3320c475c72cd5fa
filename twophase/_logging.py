"""Structured logging: one logger per module, events as ``event key=value`` with the fields in ``extra``."""

from __future__ import annotations

import json
import logging
from typing import Any

from twophase._redact import redact_mapping, redact_text


class EventLogger:
    """A thin wrapper that logs an event name with structured fields.

    The fields go both into the message (``key=value``, JSON-encoded values) for plain log
    handlers and into ``record.twophase`` for handlers that want structure. Both are redacted
    (:mod:`twophase._redact`): a field whose name is secret is ``***``, secrets inside values (JAAS
    passwords, ``user:password@`` in URLs, secret-named keys of nested mappings) are masked.
    """

    def __init__(self, name: str) -> None:
        self._log = logging.getLogger(name)

    def _emit(self, level: int, event: str, fields: dict[str, Any]) -> None:
        if not self._log.isEnabledFor(level):
            return
        fields = redact_mapping(fields)
        text = " ".join(f"{k}={redact_text(json.dumps(v, default=str))}" for k, v in fields.items())
        self._log.log(level, "%s %s", event, text, extra={"twophase": {"event": event, **fields}})

    def debug(self, event: str, **fields: Any) -> None:
        self._emit(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._emit(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._emit(logging.ERROR, event, fields)


def get_logger(name: str) -> EventLogger:
    """Return the structured logger for module ``name``."""
    return EventLogger(name)
