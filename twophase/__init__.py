"""twophase: end-to-end exactly-once delivery for Spark Structured Streaming and an embedded runtime.

The core protocol lives in :mod:`twophase.states` (states and transitions), :mod:`twophase.checkpoint`
(barriers, pending and completed checkpoints), :mod:`twophase.log` (the durable transaction log),
:mod:`twophase.sink` (the connector API: ``SinkSpec`` -> ``SinkWriter`` / ``SinkCommitter``, typed
``Committable`` handles, the one ``TaskDriver``) and :mod:`twophase.coordinator`.
"""

from twophase.checkpoint import (CancelCheckpointMarker, CheckpointBarrier, CheckpointProperties, CheckpointType,
                                 CompletedCheckpoint, PendingCheckpoint, TaskAcknowledgeResult)
from twophase.coordinator import CheckpointCoordinator, RecoveryReport, TriggerPolicy
from twophase.errors import TwoPhaseError
from twophase.log import CheckpointRecord, LocalLogStore, LogStore, TransactionLog
from twophase.sink import (Ack, Committable, CommitResult, CommitStatus, Guarantee, SinkCommitter, SinkSpec, SinkWriter,
                           TaskDriver, TransactionContext, run_task)
from twophase.states import CheckpointState, TransactionState

__version__ = "0.1.0"

__all__ = [
    "Ack", "CancelCheckpointMarker", "CheckpointBarrier", "CheckpointCoordinator", "CheckpointProperties",
    "CheckpointRecord", "CheckpointState", "CheckpointType", "CommitResult", "CommitStatus", "Committable",
    "CompletedCheckpoint", "Guarantee", "LocalLogStore", "LogStore", "PendingCheckpoint", "RecoveryReport",
    "SinkCommitter", "SinkSpec", "SinkWriter", "TaskAcknowledgeResult", "TaskDriver", "TransactionContext",
    "TransactionLog", "TransactionState", "TriggerPolicy", "TwoPhaseError", "run_task",
]

from twophase.errors import SinkHookError  # noqa: E402
from twophase.user_sink import TwoPhaseCommitSink  # noqa: E402  (the base of users' own sinks)

__all__ += ["SinkHookError", "TwoPhaseCommitSink"]
