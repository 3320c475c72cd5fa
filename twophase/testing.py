"""Helpers for testing a sink outside the coordinator: commit, abort and sweep JSON handles directly.

The coordinator is the only production caller of a committer; tests of a sink's own invariants (and
the conformance suite) call these instead, with the JSON handle of an :class:`~twophase.sink.Ack`.

The conformance suite (:data:`CONFORMANCE_CHECKS`) is one set of checks of the sink invariants of
:mod:`twophase.sink`, run against every sink on its real server through a :class:`SinkHarness`
(``tests/test_conformance.py``: files, Delta on a local path; ``integration/test_conformance.py``:
S3, Delta on S3, Kafka). A new sink writes a harness and joins both lists.

A user's own sink (:class:`~twophase.TwoPhaseCommitSink`) runs the same suite in the user's own test suite with
:func:`conformance`, from three functions (build the sink, read what is visible, count leftovers)::

    import pytest
    import twophase.testing

    @pytest.mark.parametrize("check", twophase.testing.CONFORMANCE_CHECKS, ids=twophase.testing.check_id)
    def test_my_sink_conformance(tmp_path, check):
        twophase.testing.conformance(
            lambda sink_id, workdir: MySink(os.path.join(workdir, "out"), sink_id=sink_id),
            visible_ids=lambda workdir: read_my_ids(os.path.join(workdir, "out")),
            leftovers=lambda sink, workdir: count_my_staged(os.path.join(workdir, "out")),
            checks=[check], workdir=str(tmp_path))
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Mapping, Optional, Sequence

from twophase.errors import DataLossError
from twophase.sink import Ack, CommitStatus, SinkSpec, TransactionContext, run_task


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


# --------------------------------------------------------------------------- the conformance suite


class SinkHarness(abc.ABC):
    """What the conformance suite needs to know of one sink on its real server: how to build it on a
    fresh destination, what readers see there, and what uncommitted work of a sink is left.

    One harness object is one destination (a directory, a bucket prefix, a table, a topic); every sink
    :meth:`make_sink` builds on it shares that destination, under its own ``sink_id``.
    """

    #: a short name for test ids
    name: str = ""
    #: False when the server cannot tell an aborted transaction from a committed one (then the
    #: "commit of an aborted committable is LOST" check is skipped, with this reason)
    lost_undetectable: str = ""

    @abc.abstractmethod
    def make_sink(self, sink_id: str) -> SinkSpec[Any]:
        """A sink with id ``sink_id`` on this harness's destination (its destination validated)."""

    @abc.abstractmethod
    def visible_ids(self) -> list[int]:
        """The ``id`` of every row readers can see, sorted, duplicates kept."""

    @abc.abstractmethod
    def leftovers(self, sink: SinkSpec[Any]) -> int:
        """How many uncommitted artifacts of ``sink`` are left (staged files, open uploads, data files no
        table version references, open transactions)."""

    def batch(self, lo: int, n: int) -> Any:
        """Rows ``lo .. lo+n-1`` as a ``pyarrow.RecordBatch`` this sink can write (an ``id`` column)."""
        import pyarrow as pa
        return pa.RecordBatch.from_pydict({"id": list(range(lo, lo + n)), "v": [f"v{i}" for i in range(lo, lo + n)]})

    def context(self, sink: SinkSpec[Any], checkpoint_id: int, task: int, attempt: int = 0) -> TransactionContext:
        """The context of task ``task``'s attempt ``attempt`` of ``checkpoint_id`` (unique attempt ids, like Spark's)."""
        return TransactionContext(sink.sink_id, checkpoint_id, str(task), attempt,
                                  task_attempt_id=checkpoint_id * 1000 + task * 10 + attempt)

    def close(self) -> None:
        """Release the destination's resources."""


def _prepare(h: SinkHarness, sink: SinkSpec[Any], cid: int, task: int, lo: int, n: int, attempt: int = 0) -> Ack:
    return run_task(sink, h.context(sink, cid, task, attempt), [h.batch(lo, n)])


def _coordinator(sink: SinkSpec[Any], owner: str) -> Any:
    from twophase.coordinator import CheckpointCoordinator
    log = sink.transaction_log()
    log.claim(owner)
    return CheckpointCoordinator(sink, log, sweep_after_commit=True)


def conformance_inv1_nothing_visible_before_commit(h: SinkHarness) -> None:
    """Sink invariant 1: rows written and pre-committed are invisible until their committable is committed."""
    sink = h.make_sink("conf-a")
    ack = _prepare(h, sink, 0, 0, 0, 10)
    assert h.visible_ids() == [], "rows visible before commit"
    assert commit(sink, ack.handle) is CommitStatus.COMMITTED
    assert h.visible_ids() == list(range(10))


def conformance_inv2_commit_and_recovery_are_idempotent(h: SinkHarness) -> None:
    """Sink invariant 2: a second commit, and a commit at recovery by a fresh sink object (another
    process), write no second copy; an aborted committable is LOST, never committed silently."""
    import pickle
    sink = h.make_sink("conf-a")
    ack = _prepare(h, sink, 0, 0, 0, 10)
    commit(sink, ack.handle)
    # a server may accept completing a completed upload again (radosgw, moto): COMMITTED is allowed
    # there, a second copy never is
    assert commit(sink, ack.handle) in (CommitStatus.ALREADY_COMMITTED, CommitStatus.COMMITTED)
    fresh = pickle.loads(pickle.dumps(sink))
    assert commit(fresh, ack.handle, recovering=True) in (CommitStatus.ALREADY_COMMITTED, CommitStatus.COMMITTED)
    assert h.visible_ids() == list(range(10)), "a second commit wrote a second copy"
    if h.lost_undetectable:
        return
    gone = _prepare(h, sink, 1, 0, 100, 5)
    abort(sink, gone.handle)
    try:
        commit(sink, gone.handle)
    except DataLossError:
        pass
    else:
        raise AssertionError("an aborted committable was committed without a DataLossError")
    assert h.visible_ids() == list(range(10))


def conformance_inv3_abort_is_idempotent_and_never_touches_committed_data(h: SinkHarness) -> None:
    """Sink invariant 3: aborting a committed committable (twice, at recovery too) keeps its rows;
    aborting an uncommitted one twice is fine and leaves nothing of it."""
    sink = h.make_sink("conf-a")
    ack = _prepare(h, sink, 0, 0, 0, 10)
    commit(sink, ack.handle)
    for _ in range(2):
        abort(sink, ack.handle)
        abort(sink, ack.handle, recovering=True)
    other = _prepare(h, sink, 1, 0, 100, 5)
    abort(sink, other.handle)
    abort(sink, other.handle, recovering=True)
    assert h.visible_ids() == list(range(10))
    assert h.leftovers(sink) == 0, "an aborted committable left work behind"


def conformance_inv4_committable_is_json_and_self_sufficient(h: SinkHarness) -> None:
    """Sink invariant 4: the committable survives JSON and its typed form, and a fresh sink object
    (another process; the writer gone) commits it."""
    import json
    import pickle
    sink = h.make_sink("conf-a")
    ack = _prepare(h, sink, 0, 0, 0, 10)
    handle = json.loads(json.dumps(ack.handle))
    committer = sink.create_committer()
    typed = committer.decode(handle)
    assert json.loads(json.dumps(typed.to_json())) == handle, "to_json(from_json(h)) != h"
    assert typed.checkpoint_id == 0 and typed.task_id == "0" and typed.records == 10
    assert commit(pickle.loads(pickle.dumps(sink)), handle) is CommitStatus.COMMITTED
    assert h.visible_ids() == list(range(10))


def conformance_inv5_lingering_work_of_a_committed_checkpoint_is_swept(h: SinkHarness) -> None:
    """Sink invariant 5: a checkpoint's losing attempts (one died while writing, one pre-committed but
    its ack never reached the driver) leave nothing once the checkpoint is committed and swept, and
    only the winners' rows are visible."""
    sink = h.make_sink("conf-a")
    coord = _coordinator(sink, "conformance-a")
    coord.complete_batch(0, [_prepare(h, sink, 0, 0, 0, 5)])
    crashed = sink.create_writer(h.context(sink, 1, 0, 0))
    crashed.write(h.batch(5, 5))  # the task dies here: no prepare_commit, no abort
    _prepare(h, sink, 1, 0, 5, 5, attempt=1)  # pre-committed, ack lost
    won = _prepare(h, sink, 1, 0, 5, 5, attempt=2)
    coord.complete_batch(1, [won])
    assert h.visible_ids() == list(range(10))
    assert h.leftovers(sink) == 0, "a losing attempt of a committed checkpoint was left behind"


def conformance_inv5_only_its_own_work_is_swept(h: SinkHarness) -> None:
    """Sink invariant 5: a sink's sweep never touches another sink's pre-committed work on the same
    destination; that sink commits it afterwards, whole."""
    a, b = h.make_sink("conf-a"), h.make_sink("conf-b")
    coord_a, coord_b = _coordinator(a, "conformance-a"), _coordinator(b, "conformance-b")
    b_ack = _prepare(h, b, 0, 0, 100, 5)  # B's checkpoint 0, pre-committed, not yet committed
    coord_a.complete_batch(0, [_prepare(h, a, 0, 0, 0, 5)])
    coord_a.complete_batch(3, [_prepare(h, a, 3, 0, 5, 5)])  # A commits and sweeps <= 3
    assert coord_a.committer.abort_lingering(5, 3) >= 0
    coord_b.complete_batch(0, [b_ack])
    assert h.visible_ids() == [*range(10), *range(100, 105)], "another sink's pre-committed work was swept"


#: every check of the suite, in order; a test module parametrizes over these and its harnesses
CONFORMANCE_CHECKS: tuple[Callable[[SinkHarness], None], ...] = (
    conformance_inv1_nothing_visible_before_commit,
    conformance_inv2_commit_and_recovery_are_idempotent,
    conformance_inv3_abort_is_idempotent_and_never_touches_committed_data,
    conformance_inv4_committable_is_json_and_self_sufficient,
    conformance_inv5_lingering_work_of_a_committed_checkpoint_is_swept,
    conformance_inv5_only_its_own_work_is_swept,
)


# --------------------------------------------------------------------------- for users: their own TwoPhaseCommitSink


class _CallableHarness(SinkHarness):
    """A :class:`SinkHarness` from three functions of a fresh work directory (see :func:`conformance`)."""

    def __init__(self, workdir: str, sink_factory: Callable[[str, str], SinkSpec[Any]],
                 visible_ids: Callable[[str], list[int]], leftovers: Callable[[SinkSpec[Any], str], int],
                 lost_undetectable: str, name: str) -> None:
        self.workdir, self.name, self.lost_undetectable = workdir, name, lost_undetectable
        self._make, self._visible, self._leftovers = sink_factory, visible_ids, leftovers

    def make_sink(self, sink_id: str) -> SinkSpec[Any]:
        import os
        sink = self._make(sink_id, self.workdir)
        if getattr(sink, "log_location", "") is None and getattr(sink, "owner", "") is None:
            sink.bind_owner(os.path.join(self.workdir, "_checkpoint"))  # type: ignore[attr-defined]
        return sink

    def visible_ids(self) -> list[int]:
        return sorted(self._visible(self.workdir))

    def leftovers(self, sink: SinkSpec[Any]) -> int:
        return int(self._leftovers(sink, self.workdir))


def check_id(check: Callable[..., Any]) -> str:
    """A short test id of a conformance check (for ``pytest.mark.parametrize(..., ids=check_id)``)."""
    return check.__name__.removeprefix("conformance_")


def conformance(sink_factory: Callable[[str, str], SinkSpec[Any]], *, visible_ids: Callable[[str], list[int]],
                leftovers: Callable[[SinkSpec[Any], str], int],
                checks: Optional[Sequence[Callable[[SinkHarness], None]]] = None, lost_undetectable: str = "",
                workdir: Optional[str] = None, name: str = "user") -> None:
    """Run the conformance suite (:data:`CONFORMANCE_CHECKS`, or ``checks``) against your own sink, e.g. a
    :class:`~twophase.TwoPhaseCommitSink`, in your own test suite. Each check gets a fresh, empty work directory
    (under ``workdir``, else a temporary one, removed afterwards) and calls:

    - ``sink_factory(sink_id, workdir)``: a sink with id ``sink_id`` writing to a destination of that work directory
      (a directory in it, or a table or prefix named after it); every sink of one check shares it. A sink with no
      ``log_location`` gets its log under ``<workdir>/_checkpoint`` (as under a query's checkpoint location);
    - ``visible_ids(workdir)``: the ``id`` of every row a reader sees there, duplicates kept (the rows written have
      an ``id`` int64 and a ``v`` string column);
    - ``leftovers(sink, workdir)``: how many uncommitted artifacts of ``sink`` are left (staged files, open
      transactions).

    ``lost_undetectable``: a reason, if your destination cannot tell an aborted transaction from a committed one
    (the check that committing an aborted handle raises DataLossError is then skipped). Every check runs; an
    AssertionError names each one that failed, with its error."""
    import os
    import shutil
    import tempfile
    import traceback
    failed = []
    base = workdir or tempfile.mkdtemp(prefix="twophase-conformance-")
    try:
        for check in (CONFORMANCE_CHECKS if checks is None else tuple(checks)):
            where = os.path.join(base, check_id(check))
            os.makedirs(where)
            h = _CallableHarness(where, sink_factory, visible_ids, leftovers, lost_undetectable, name)
            try:
                check(h)
            except Exception as e:
                failed.append(f"{check.__name__}: {type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}")
            finally:
                h.close()
    finally:
        if workdir is None:
            shutil.rmtree(base, ignore_errors=True)
    if failed:
        raise AssertionError(f"{len(failed)} conformance check(s) failed for {name}:\n" + "\n".join(failed))
