"""Helpers for testing a sink outside the coordinator: commit, abort and sweep JSON handles directly.

The coordinator is the only production caller of a committer; tests of a sink's own invariants (and
the conformance suite) call these instead, with the JSON handle of an :class:`~twophase.sink.Ack`.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from twophase.errors import DataLossError
from twophase.sink import CommitStatus, SinkSpec


def commit(spec: SinkSpec[Any], handle: Mapping[str, Any], *, recovering: bool = False) -> CommitStatus:
    """Commit one JSON handle with a fresh committer of ``spec``; a LOST outcome raises DataLossError
    (as the coordinator does). Returns COMMITTED or ALREADY_COMMITTED."""
    c = spec.create_committer()
    try:
        result = c.commit(c.decode(handle), recovering=recovering)
    finally:
        c.close()
    if result.status is CommitStatus.LOST:
        raise DataLossError(result.detail)
    return result.status


def abort(spec: SinkSpec[Any], handle: Mapping[str, Any], *, recovering: bool = False) -> None:
    """Abort one JSON handle with a fresh committer of ``spec``."""
    c = spec.create_committer()
    try:
        c.abort(c.decode(handle), recovering=recovering)
    finally:
        c.close()


def abort_lingering(spec: SinkSpec[Any], up_to_checkpoint: int, highest_committed: Optional[int] = None) -> int:
    """Run ``spec``'s sweep of checkpoints ``<= up_to_checkpoint``; returns how many it aborted."""
    c = spec.create_committer()
    try:
        return c.abort_lingering(up_to_checkpoint, up_to_checkpoint if highest_committed is None else highest_committed)
    finally:
        c.close()
