"""The one error hierarchy of twophase.

Every error raised on purpose by twophase derives from :class:`TwoPhaseError`.
``retriable`` tells the caller whether the same call may succeed if repeated
(a transient I/O or broker problem) or whether a person has to act.
"""

from __future__ import annotations


class TwoPhaseError(Exception):
    """Root of all twophase errors. ``retriable`` is True when repeating the call may succeed."""

    retriable: bool = False

    def __init__(self, message: str, *, retriable: bool | None = None) -> None:
        super().__init__(message)
        if retriable is not None:
            self.retriable = retriable


class ConfigurationError(TwoPhaseError, ValueError):
    """An option is missing, malformed or inconsistent; raised before any data moves. Fix the option named."""


class UnsupportedTableFeatureError(ConfigurationError):
    """A Delta table uses table features (its protocol's reader or writer features, or a protocol version)
    twophase-delta does not write correctly; refused on the driver before the query writes anything.
    ``features`` names them; the message names the table property or command that removes each."""

    def __init__(self, message: str, *, features: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.features = features


class MissingDependencyError(TwoPhaseError, ImportError):
    """An optional dependency is not installed; the message names the extra to install (``pip install twophase[x]``)."""


class InvalidTransitionError(TwoPhaseError):
    """A transaction or checkpoint was asked to move between states the protocol does not allow; a bug, not a retry."""


class FencedError(TwoPhaseError):
    """A newer writer with the same identity took over (zombie fencing); this writer must stop, its work is aborted."""


class DataLossError(TwoPhaseError):
    """A pre-committed transaction of a completed checkpoint can no longer be committed (expired, deleted).

    Never swallowed: the checkpoint named in the message has lost data and needs an operator.
    """


class ConstraintViolationError(TwoPhaseError, ValueError):
    """Rows break a requirement of the destination (a Delta table's NOT NULL column, CHECK constraint or generated
    column); the task fails before any of its rows are visible, as the destination's own writers would."""


class LogCorruptError(TwoPhaseError):
    """A transaction log record fails its checksum or cannot be parsed; the log is refused rather than guessed at."""


class ConcurrentWriterError(TwoPhaseError):
    """A second query or job tried to use a sink id that another one owns; give it its own sink id or path."""


class RecordExistsError(ConcurrentWriterError):
    """A log record this writer meant to create (a compare-and-swap against "absent") is there: another call
    created it since. The Spark commit creates a batch's record before reading it and, on this error,
    reads the record and decides on what is there (twophase.coordinator)."""


class QueryMismatchError(ConcurrentWriterError):
    """A sink's log belongs to another streaming query (e.g. the checkpoint was deleted and recreated, so batch
    ids restart at 0); nothing is committed. Give the new query its own ``sink.id``, or restore the old checkpoint."""


class OperatorRefusedError(TwoPhaseError):
    """An operator command refused to act because acting now could lose committed data or race a running query
    (e.g. ``twophase kafka abort-lingering`` while a checkpoint is COMPLETED but not committed). Nothing was
    changed; the message names what to run instead, or the flag that states the missing fact."""


class CheckpointDeclinedError(TwoPhaseError):
    """A task declined a checkpoint (or a checkpoint could not complete); it was aborted, nothing of it committed."""

    retriable = True


class CheckpointExpiredError(CheckpointDeclinedError):
    """A pending checkpoint did not collect all acks before its timeout and was aborted."""


class CommitFailedError(TwoPhaseError):
    """Committing a decided checkpoint failed transiently; the decision stands and the commit is retried on recovery."""

    retriable = True


class CommitOutcomeUnknownError(TwoPhaseError):
    """Whether a decided checkpoint's transaction was committed can no longer be proven either way (twophase-postgres:
    a gid gone from ``pg_prepared_xacts`` whose marker and log record were both removed before a sweep could keep
    what they said). Never turned into LOST or ALREADY_COMMITTED by a guess; not retried: an operator decides."""

    retriable = False


class TransientSinkError(TwoPhaseError):
    """A sink hit a transient I/O problem; the task or commit may be retried."""

    retriable = True


class JobFailedError(TwoPhaseError):
    """An embedded-runtime job failed and its restart strategy allows no more restarts; the cause is chained."""


class SinkHookError(TwoPhaseError):
    """A hook of a user's :class:`~twophase.user_sink.TwoPhaseCommitSink` raised; the message names the hook and
    the sink id, the original exception is chained (``__cause__``)."""
