"""The checkpoint model: barriers, cancel markers, properties, pending and completed checkpoints.

Invariants (named in tests as ``test_checkpoint_invN_*``):

1. A :class:`PendingCheckpoint` completes only when every task in ``tasks_to_ack`` has acked once
   (at once, with no handles, when there are no tasks: an empty micro-batch).
2. An ack is counted at most once per task: a second ack of the same task is ``DUPLICATE`` and its
   handle must be aborted by the caller, never committed (unless it is the very handle already
   accepted, i.e. the same ack delivered twice).
3. An ack from a task that is not expected is ``UNKNOWN``; an ack to a disposed (completed or
   aborted) checkpoint is ``DISCARDED``. In both cases the caller aborts the handle.
4. A :class:`CompletedCheckpoint` is immutable and holds exactly one handle per expected task.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

from twophase.errors import InvalidTransitionError
from twophase.states import PendingState, check_transition

Handle = Mapping[str, Any]
"""A sink's transaction handle: a JSON-serializable mapping that lets the driver commit or abort."""


class CheckpointType(str, enum.Enum):
    """A periodic CHECKPOINT, owned by the system, or a user-triggered SAVEPOINT."""

    CHECKPOINT = "CHECKPOINT"
    SAVEPOINT = "SAVEPOINT"


@dataclass(frozen=True)
class CheckpointProperties:
    """How a checkpoint was asked for. ``forced`` ignores min-pause and max-concurrent limits."""

    type: CheckpointType = CheckpointType.CHECKPOINT
    forced: bool = False
    #: stop the job after a savepoint completes (stop-with-savepoint)
    terminate: bool = False

    @classmethod
    def checkpoint(cls) -> "CheckpointProperties":
        return cls()

    @classmethod
    def savepoint(cls, *, terminate: bool = False) -> "CheckpointProperties":
        return cls(type=CheckpointType.SAVEPOINT, forced=True, terminate=terminate)

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type.value, "forced": self.forced, "terminate": self.terminate}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "CheckpointProperties":
        return cls(CheckpointType(data.get("type", "CHECKPOINT")), bool(data.get("forced", False)),
                   bool(data.get("terminate", False)))


@dataclass(frozen=True)
class CheckpointBarrier:
    """Flows with the data; everything before it belongs to checkpoint ``checkpoint_id``."""

    checkpoint_id: int
    timestamp: float
    properties: CheckpointProperties = field(default_factory=CheckpointProperties)


@dataclass(frozen=True)
class CancelCheckpointMarker:
    """Flows with the data to tell downstream tasks that ``checkpoint_id`` was aborted."""

    checkpoint_id: int


class TaskAcknowledgeResult(str, enum.Enum):
    """Outcome of :meth:`PendingCheckpoint.acknowledge`."""

    SUCCESS = "SUCCESS"
    DUPLICATE = "DUPLICATE"
    UNKNOWN = "UNKNOWN"
    DISCARDED = "DISCARDED"


@dataclass(frozen=True)
class CompletedCheckpoint:
    """A checkpoint every task acked. Durable in the log before any of its handles is committed."""

    checkpoint_id: int
    handles: Mapping[str, Handle]
    properties: CheckpointProperties = field(default_factory=CheckpointProperties)
    triggered_at: float = 0.0
    completed_at: float = 0.0
    task_state: Optional[Mapping[str, Any]] = None

    def ordered_handles(self) -> list[Handle]:
        """Handles in task order (stable, so commits are deterministic)."""
        return [self.handles[k] for k in sorted(self.handles, key=_task_sort_key)]


def _task_sort_key(task_id: str) -> tuple[int, Any]:
    return (0, int(task_id)) if task_id.isdigit() else (1, task_id)


class PendingCheckpoint:
    """A triggered checkpoint collecting acks from ``tasks_to_ack``.

    Its :attr:`state` moves COLLECTING -> COMPLETED (finalize) or ABORTED (abort) through
    :func:`~twophase.states.check_transition` (the table :data:`~twophase.states.PENDING_CHECKPOINT_TRANSITIONS`);
    both are "disposed". Not thread-safe; the coordinator serialises access.
    """

    def __init__(self, checkpoint_id: int, tasks_to_ack: Iterable[str],
                 properties: Optional[CheckpointProperties] = None, *,
                 triggered_at: Optional[float] = None) -> None:
        self.checkpoint_id = checkpoint_id
        self.properties = properties or CheckpointProperties()
        self.triggered_at = time.time() if triggered_at is None else triggered_at
        self._not_yet_acked: set[str] = {str(t) for t in tasks_to_ack}
        self._expected: frozenset[str] = frozenset(self._not_yet_acked)
        self._handles: dict[str, Handle] = {}
        self._task_state: dict[str, Any] = {}
        self._state: Optional[PendingState] = None
        self._move(PendingState.COLLECTING)
        self.abort_reason: Optional[str] = None

    def _move(self, target: PendingState) -> None:
        check_transition(self._state, target, what=f"pending checkpoint {self.checkpoint_id}")
        self._state = target

    @property
    def state(self) -> PendingState:
        assert self._state is not None
        return self._state

    @property
    def expected_tasks(self) -> frozenset[str]:
        return self._expected

    @property
    def acked_handles(self) -> dict[str, Handle]:
        return dict(self._handles)

    @property
    def not_yet_acknowledged(self) -> frozenset[str]:
        return frozenset(self._not_yet_acked)

    @property
    def is_fully_acknowledged(self) -> bool:
        return not self._not_yet_acked and self.state is PendingState.COLLECTING

    @property
    def is_disposed(self) -> bool:
        return self.state.is_disposed

    def acknowledge(self, task_id: str, handle: Handle, task_state: Any = None) -> TaskAcknowledgeResult:
        """Record ``task_id``'s ack carrying ``handle`` (invariants 2 and 3)."""
        task_id = str(task_id)
        if self.state.is_disposed:
            return TaskAcknowledgeResult.DISCARDED
        if task_id not in self._expected:
            return TaskAcknowledgeResult.UNKNOWN
        if task_id not in self._not_yet_acked:
            return TaskAcknowledgeResult.DUPLICATE
        self._not_yet_acked.discard(task_id)
        self._handles[task_id] = handle
        if task_state is not None:
            self._task_state[task_id] = task_state
        return TaskAcknowledgeResult.SUCCESS

    def finalize(self) -> CompletedCheckpoint:
        """Turn a fully acknowledged checkpoint into a :class:`CompletedCheckpoint` (invariant 1, 4)."""
        if not self.is_fully_acknowledged:
            raise InvalidTransitionError(
                f"checkpoint {self.checkpoint_id} cannot complete: "
                f"{'disposed' if self.is_disposed else 'missing acks from ' + str(sorted(self._not_yet_acked))}")
        self._move(PendingState.COMPLETED)
        return CompletedCheckpoint(self.checkpoint_id, dict(self._handles), self.properties,
                                   self.triggered_at, time.time(), dict(self._task_state) or None)

    def abort(self, reason: str) -> dict[str, Handle]:
        """Dispose of the checkpoint; returns the handles acked so far, which the caller must abort.

        Aborting a checkpoint that is already disposed changes nothing and returns no handle: a
        COMPLETED one's handles are the decided checkpoint's (committed, never aborted), an ABORTED
        one's were returned by the first abort.
        """
        if self.state.is_disposed:
            return {}
        self._move(PendingState.ABORTED)
        self.abort_reason = reason
        return dict(self._handles)
