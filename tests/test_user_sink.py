"""The user-facing TwoPhaseCommitSink (twophase.user_sink): a small JSON-lines sink a user could write, run
through the real run_task, CheckpointCoordinator and the conformance suite (no Spark)."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import pickle
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest

import twophase
from twophase import testing
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import ConfigurationError, DataLossError
from twophase.sink import CommitStatus, SinkSpec, TransactionContext, run_task, sink_token
from twophase.user_sink import PENDING_PREFIX, SinkHookError, TwoPhaseCommitSink


class JsonLinesSink(twophase.TwoPhaseCommitSink):
    """Rows buffered in memory, staged as one JSON-lines file at pre_commit, renamed into place at commit."""

    def __init__(self, root: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.root = root
        self.calls: list[tuple[str, str]] = []
        self._rows: dict[str, list] = {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_rows": {}, "calls": []}  # a fresh process: nothing in memory

    @staticmethod
    def _d(txn: Any) -> dict:
        return txn

    def _staged(self, txn: Any) -> str:
        return os.path.join(self.root, "_staging", self._d(txn)["staged"])

    def begin_transaction(self, context: TransactionContext) -> Any:
        name = f"{sink_token(self.sink_id)}-{context.checkpoint_id}-{context.task_id}-{context.attempt_uid}.jsonl"
        txn = {"staged": name, "final": f"part-{name}"}
        self._rows[name] = []
        return txn

    def write(self, txn: Any, batch: pa.RecordBatch) -> None:
        self._rows[self._d(txn)["staged"]].extend(batch.to_pylist())

    def pre_commit(self, txn: Any) -> None:
        os.makedirs(os.path.join(self.root, "_staging"), exist_ok=True)
        with open(self._staged(txn), "w") as f:
            for row in self._rows.pop(self._d(txn)["staged"]):
                f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def commit(self, txn: Any) -> None:
        t = self._d(txn)
        self.calls.append(("commit", t["final"]))
        final = os.path.join(self.root, t["final"])
        if os.path.exists(final):
            return  # idempotent
        try:
            os.rename(self._staged(txn), final)
        except FileNotFoundError:
            raise DataLossError(f"staged file {self._staged(txn)} is gone and {final} was never committed") from None

    def abort(self, txn: Any) -> None:
        t = self._d(txn)
        self.calls.append(("abort", t["final"]))
        self._rows.pop(t["staged"], None)
        try:
            os.unlink(self._staged(txn))
        except FileNotFoundError:
            pass

    def recover_and_commit(self, txn: Any) -> None:
        self.calls.append(("recover_and_commit", self._d(txn)["final"]))
        super().recover_and_commit(txn)

    def recover_and_abort(self, txn: Any) -> None:
        self.calls.append(("recover_and_abort", self._d(txn)["final"]))
        super().recover_and_abort(txn)


@dataclass
class FileTxn:
    staged: str
    final: str
    parts: list


class DataclassSink(JsonLinesSink):
    """The same sink with a dataclass handle (rebuilt at recovery from its recorded class path)."""

    @staticmethod
    def _d(txn: Any) -> dict:
        return {"staged": txn.staged, "final": txn.final}

    def begin_transaction(self, context: TransactionContext) -> Any:
        d = super().begin_transaction(context)
        return FileTxn(d["staged"], d["final"], [])

    def pre_commit(self, txn: Any) -> None:
        super().pre_commit(txn)
        txn.parts.append(txn.staged)

    def commit(self, txn: Any) -> None:
        assert isinstance(txn, FileTxn) and txn.parts == [txn.staged], f"handle not rebuilt: {txn!r}"
        super().commit(txn)


def visible(root: str) -> list[int]:
    out = []
    for p in glob.glob(os.path.join(root, "part-*.jsonl")):
        with open(p) as f:
            out += [json.loads(line)["id"] for line in f]
    return sorted(out)


def batch(lo: int, n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"id": list(range(lo, lo + n))})


def make(tmp_path: Any, cls: type = JsonLinesSink, sink_id: str = "my-sink") -> Any:
    return cls(str(tmp_path / "out"), sink_id=sink_id, log_location=str(tmp_path / "log"))


def prepare(sink: Any, cid: int, task: int = 0, lo: int = 0, n: int = 5) -> Any:
    return run_task(sink, TransactionContext(sink.sink_id, cid, str(task)), [batch(lo, n)])


def coordinator(sink: Any) -> CheckpointCoordinator:
    log = sink.transaction_log()
    log.claim("test-owner")
    return CheckpointCoordinator(sink, log)


def test_user_sink_inv1_commit_through_the_coordinator_and_again_is_idempotent(tmp_path):
    """Invariant 1: ``commit`` runs for a checkpoint the coordinator completed; completing it again (Spark
    re-calling commit) writes no second copy; nothing is visible before."""
    sink = make(tmp_path)
    assert isinstance(sink, SinkSpec)
    acks = [prepare(sink, 0, 0, 0, 5), prepare(sink, 0, 1, 5, 5)]
    assert visible(sink.root) == []
    coord = coordinator(sink)
    coord.complete_batch(0, acks)
    assert visible(sink.root) == list(range(10))
    coordinator(sink).complete_batch(0, acks)
    assert testing.commit(sink, acks[0].handle) is CommitStatus.COMMITTED  # a user commit that is a no-op
    assert visible(sink.root) == list(range(10))
    assert [c[0] for c in sink.calls] == ["commit", "commit", "commit"]
    assert sink.transaction_log().store.list(PENDING_PREFIX) == []


def test_user_sink_inv1_abort_of_a_declined_checkpoint(tmp_path):
    """Invariant 1: a declined checkpoint's handles are aborted through ``abort``: nothing visible, nothing staged."""
    sink = make(tmp_path)
    ack = prepare(sink, 0)
    coordinator(sink).abort_batch(0, [ack], "a task failed")
    assert visible(sink.root) == [] and os.listdir(os.path.join(sink.root, "_staging")) == []
    assert sink.calls[0][0] == "abort"
    assert sink.transaction_log().store.list(PENDING_PREFIX) == []


@pytest.mark.parametrize("cls", [JsonLinesSink, DataclassSink])
def test_user_sink_inv1_recovery_in_a_fresh_object_calls_recover_and_commit(tmp_path, cls):
    """Invariant 1: a commit that failed after the checkpoint was decided is repeated at recovery by a fresh
    sink object (pickled: another process) through ``recover_and_commit``; a dataclass handle is rebuilt."""
    sink = make(tmp_path, cls)
    ack = prepare(sink, 0)
    calls = {"n": 0}
    real = sink.commit

    def failing(txn: Any) -> None:
        calls["n"] += 1
        raise ConnectionError("destination unreachable")
    sink.commit = failing
    with pytest.raises(SinkHookError, match=f"{cls.__name__}.commit of sink 'my-sink'"):
        coordinator(sink).complete_batch(0, [ack])
    assert calls["n"] == 1 and visible(sink.root) == []
    sink.commit = real
    fresh = pickle.loads(pickle.dumps(sink))
    report = CheckpointCoordinator(fresh, fresh.transaction_log()).recover()
    assert report.committed == [0]
    assert [c[0] for c in fresh.calls] == ["recover_and_commit", "commit"]  # the default delegates to commit
    assert visible(sink.root) == list(range(5))


def test_user_sink_inv1_inv5_a_lost_ack_is_recover_and_aborted_by_the_sweep(tmp_path):
    """Invariant 1 and 5: a pre-committed task whose ack never reached the driver is aborted by the sweep
    through ``recover_and_abort``; a newer checkpoint's pre-committed task is left alone."""
    sink = make(tmp_path)
    lost_ack = prepare(sink, 0, 0, 100, 3)  # noqa: F841 - its ack never reaches the driver
    newer = prepare(sink, 2, 0, 200, 3)
    coord = coordinator(sink)
    coord.complete_batch(0, [prepare(sink, 0, 0, 0, 5)])
    assert ("recover_and_abort", f"part-{sink_token('my-sink')}-0-0-{lost_ack.attempt_uid}.jsonl") in sink.calls
    assert visible(sink.root) == list(range(5))
    staged = os.listdir(os.path.join(sink.root, "_staging"))
    assert staged == [f"{sink_token('my-sink')}-2-0-{newer.attempt_uid}.jsonl"], "the newer checkpoint's work was swept"
    coord.complete_batch(2, [newer])
    assert visible(sink.root) == [*range(5), *range(200, 203)]
    assert os.listdir(os.path.join(sink.root, "_staging")) == []


class BadHandleSink(JsonLinesSink):
    bad: Any = None

    def begin_transaction(self, context: TransactionContext) -> Any:
        return {**super().begin_transaction(context), "conn": self.bad}


@dataclass
class TupleTxn:
    staged: str
    final: str
    parts: tuple


class TupleSink(DataclassSink):
    def begin_transaction(self, context: TransactionContext) -> Any:
        t = super().begin_transaction(context)
        return TupleTxn(t.staged, t.final, ())

    def pre_commit(self, txn: Any) -> None:
        JsonLinesSink.pre_commit(self, txn)


@pytest.mark.parametrize("bad,field", [(object(), r"txn\['conn'\]"), ((1, 2), r"txn\['conn'\] is a tuple"),
                                       ({1: "x"}, r"txn\['conn'\]\[1\] has a int key"),
                                       (float("nan"), r"txn\['conn'\] is nan")])
def test_user_sink_inv2_a_handle_that_is_not_json_is_refused_naming_the_field(tmp_path, bad, field):
    """Invariant 2: a non-JSON handle fails the task on pre_commit with an error naming the field; the
    transaction is aborted (nothing staged is left) and nothing is visible."""
    sink = make(tmp_path, BadHandleSink)
    sink.bad = bad
    with pytest.raises(ConfigurationError, match=field) as e:
        prepare(sink, 0)
    assert "BadHandleSink (sink 'my-sink')" in str(e.value)
    assert sink.calls[-1][0] == "abort" and os.listdir(os.path.join(sink.root, "_staging")) == []
    assert visible(sink.root) == []


def test_user_sink_inv2_dataclass_fields_and_local_classes_are_checked(tmp_path):
    """Invariant 2: a dataclass handle's fields are checked (named ``Class.field``); a dataclass that cannot be
    imported by its name at recovery (defined in a function) is refused naming the class."""
    with pytest.raises(ConfigurationError, match=r"field TupleTxn.parts is a tuple"):
        prepare(make(tmp_path, TupleSink), 0)

    @dataclass
    class Local:
        staged: str

    class LocalSink(JsonLinesSink):
        def begin_transaction(self, context: TransactionContext) -> Any:
            return Local(super().begin_transaction(context)["staged"])

        def write(self, txn: Any, b: Any) -> None:
            pass

        def pre_commit(self, txn: Any) -> None:
            pass

        def abort(self, txn: Any) -> None:
            pass
    with pytest.raises(ConfigurationError, match=r"its class .*<locals>.Local cannot be imported"):
        prepare(make(tmp_path, LocalSink), 0)


def test_user_sink_inv3_data_loss_in_commit_is_lost_with_the_operator_command(tmp_path):
    """Invariant 3: a commit hook raising DataLossError is LOST with the hook, the sink id and the command; the
    coordinator stops with DataLossError naming it."""
    sink = make(tmp_path)
    ack = prepare(sink, 0)
    staged = glob.glob(os.path.join(sink.root, "_staging", "*"))
    os.unlink(staged[0])
    result = sink.create_committer().commit(sink.create_committer().decode(ack.handle))
    assert result.status is CommitStatus.LOST
    assert "JsonLinesSink.commit (sink 'my-sink')" in result.detail and "is gone" in result.detail
    assert (f"twophase log resolve {tmp_path / 'log'} --sink-id my-sink --checkpoint 0 --accept-loss"
            in result.detail)
    with pytest.raises(DataLossError, match="--accept-loss"):
        coordinator(sink).complete_batch(0, [ack])


def test_user_sink_inv4_hook_errors_name_the_hook_and_the_sink(tmp_path):
    """Invariant 4: an error of a user hook reaches the caller naming the hook and the sink id, chained."""
    sink = make(tmp_path)

    def boom(txn: Any, b: Any) -> None:
        raise ValueError("column x is not supported")
    sink.write = boom
    with pytest.raises(SinkHookError, match=r"JsonLinesSink.write of sink 'my-sink' failed: ValueError: column x") as e:
        prepare(sink, 0)
    assert isinstance(e.value.__cause__, ValueError) and not e.value.retriable
    assert sink.calls[-1][0] == "abort"  # the open transaction was aborted

    sink = make(tmp_path, sink_id="other")
    ack = prepare(sink, 0)
    sink.abort = lambda txn: (_ for _ in ()).throw(OSError("disk gone"))
    with pytest.raises(SinkHookError, match=r"JsonLinesSink.abort of sink 'other' failed: OSError") as e:
        testing.abort(sink, ack.handle)
    assert e.value.retriable


def test_user_sink_inv6_sink_id_is_required_and_the_log_has_a_home(tmp_path):
    """Invariant 6: sink_id is required and validated; with no log_location the log lives under the bound
    owner (the query's checkpoint location), else a ConfigurationError names both ways."""
    for bad in ("", "  ", None, " x", "a\nb", "x" * 300):
        with pytest.raises(ConfigurationError, match="sink_id"):
            JsonLinesSink(str(tmp_path), sink_id=bad)
    with pytest.raises(TypeError):
        JsonLinesSink(str(tmp_path))  # sink_id is required
    with pytest.raises(ConfigurationError, match="guarantee"):
        JsonLinesSink(str(tmp_path), sink_id="a", guarantee="twice")
    sink = JsonLinesSink(str(tmp_path / "out"), sink_id="a")
    with pytest.raises(ConfigurationError, match=r"log_location=.*sink.bind_owner\('<checkpointLocation>'\)"):
        sink.transaction_log()
    ck = str(tmp_path / "ck")
    assert sink.bind_owner(ck) is sink
    assert sink.transaction_log().location == os.path.join(ck, "twophase-sink", sink_token("a"))
    assert sink.bind_owner("file:" + ck).resolved_log_location() == os.path.join(ck, "twophase-sink", sink_token("a"))

    class Forgot(JsonLinesSink):
        def __init__(self) -> None:  # no super().__init__
            self.root = "x"
    with pytest.raises(ConfigurationError, match=r"super\(\).__init__"):
        Forgot().create_writer(TransactionContext("a", 0, "0"))


def test_user_sink_inv1_at_least_once_commits_at_task_end(tmp_path):
    """Invariant 1 (at-least-once): no coordinator runs, so the task commits its own transaction after pre_commit."""
    sink = JsonLinesSink(str(tmp_path / "out"), sink_id="a", guarantee="at-least-once")
    prepare(sink, 0)
    assert visible(sink.root) == list(range(5))


def test_user_sink_runs_in_the_embedded_runtime(tmp_path):
    """``stream.sink_to(MySink(...))``: every record once."""
    from twophase.runtime import CheckpointConfig, CollectionSource, JobGraph, JobRunner
    g = JobGraph("user-sink")
    sink = make(tmp_path)
    g.source(CollectionSource([[{"id": i} for i in range(25)], [{"id": i} for i in range(25, 50)]]), uid="src", parallelism=1).sink_to(
        sink, uid="sink", parallelism=2)
    JobRunner(g, checkpointing=CheckpointConfig(0.02), owner=str(tmp_path / "ck")).run()
    assert visible(sink.root) == list(range(50))


# --------------------------------------------------------------------------- the conformance suite


class JsonLinesHarness(testing.SinkHarness):
    """One output directory; every sink built on it shares it under its own sink id (and its own log)."""

    name = "user-jsonl"

    def __init__(self, root: str) -> None:
        self.root = root

    def make_sink(self, sink_id: str) -> SinkSpec[Any]:
        return JsonLinesSink(os.path.join(self.root, "out"), sink_id=sink_id,
                             log_location=os.path.join(self.root, "logs", sink_token(sink_id)))

    def visible_ids(self) -> list[int]:
        return visible(os.path.join(self.root, "out"))

    def leftovers(self, sink: SinkSpec[Any]) -> int:
        return len(glob.glob(os.path.join(self.root, "out", "_staging", f"{sink_token(sink.sink_id)}-*")))


@pytest.mark.parametrize("check", testing.CONFORMANCE_CHECKS, ids=lambda c: c.__name__.removeprefix("conformance_"))
def test_user_sink_conformance(tmp_path, check):
    """The conformance suite of every sink, against a user's TwoPhaseCommitSink."""
    check(JsonLinesHarness(str(tmp_path)))


@dataclass
class GeneratedIdTxn:
    staged: str
    final: str
    txn_id: str = dataclasses.field(init=False, default_factory=lambda: os.urandom(4).hex())


class GeneratedIdSink(DataclassSink):
    def begin_transaction(self, context: TransactionContext) -> Any:
        t = super().begin_transaction(context)
        return GeneratedIdTxn(t.staged, t.final)

    def pre_commit(self, txn: Any) -> None:
        JsonLinesSink.pre_commit(self, txn)


def test_user_sink_inv2_a_dataclass_field_the_driver_would_make_anew_is_refused(tmp_path):
    """Invariant 2 (found by review): an ``init=False`` field (an id from a default_factory) was left out of the
    handle and made anew on the driver, whose commit then committed a transaction that does not exist (0 of the
    rows visible, COMMITTED). It is refused before the ack, naming the field."""
    with pytest.raises(ConfigurationError, match=r"field GeneratedIdTxn.txn_id is declared init=False"):
        prepare(make(tmp_path, GeneratedIdSink), 0)


@pytest.mark.parametrize("owner", ["dbfs:/checkpoints/q1", "hdfs:/user/me/ck"])
def test_user_sink_inv6_a_checkpoint_url_without_slashes_is_not_taken_for_a_local_path(tmp_path, owner):
    """Invariant 6 (found by review): ``dbfs:/…`` put the log on each host's local disk (executors' pending
    records never seen by the driver; the log lost with the driver node). It is refused, naming log_location."""
    sink = JsonLinesSink(str(tmp_path / "out"), sink_id="s").bind_owner(owner)
    with pytest.raises(ConfigurationError, match="log_location="):
        sink.resolved_log_location()


def test_user_sink_inv6_foreach_batch_binds_a_copy_so_one_sink_object_in_two_queries_keeps_two_logs(tmp_path):
    """Invariant 6 (found by review): foreach_batch(sink, owner=ck2) moved query 1's log under ck2."""
    from twophase.spark.foreach_batch import foreach_batch
    sink = JsonLinesSink(str(tmp_path / "out"), sink_id="s")
    foreach_batch(sink, owner=str(tmp_path / "ck1"))
    foreach_batch(sink, owner=str(tmp_path / "ck2"))
    assert sink.owner is None


def test_user_sink_inv1_a_commit_hook_may_report_already_committed(tmp_path):
    """Invariant 1: a commit hook that can tell a repeated commit returns CommitStatus.ALREADY_COMMITTED (also
    through the default recover_and_commit); its pending record is removed all the same; None is COMMITTED."""

    class Repeats(JsonLinesSink):
        def commit(self, txn: Any) -> Any:
            done = os.path.exists(os.path.join(self.root, self._d(txn)["final"]))
            super().commit(txn)
            return CommitStatus.ALREADY_COMMITTED if done else None

        def recover_and_commit(self, txn: Any) -> Any:
            return TwoPhaseCommitSink.recover_and_commit(self, txn)  # the default: commit(txn), its outcome

    sink = make(tmp_path, Repeats)
    ack = prepare(sink, 0)
    assert testing.commit(sink, ack.handle) is CommitStatus.COMMITTED
    assert testing.commit(sink, ack.handle) is CommitStatus.ALREADY_COMMITTED
    assert testing.commit(sink, ack.handle, recovering=True) is CommitStatus.ALREADY_COMMITTED
    assert visible(sink.root) == list(range(5))
    assert sink.transaction_log().store.list(PENDING_PREFIX) == []


# --------------------------------------------------------------------------- review findings (session 12)


def test_user_sink_inv5_one_failing_abort_does_not_block_the_sweep(tmp_path, caplog):
    """F-U1: a pending record whose abort raises is logged (sink id and record), kept, and the sweep goes on with
    the others; the next sweep retries it."""
    import logging
    sink = make(tmp_path)
    a, b = prepare(sink, 0, 0, 0, 3), prepare(sink, 0, 1, 3, 3)  # neither ack reaches the driver
    bad = f"part-{sink_token('my-sink')}-0-0-{a.attempt_uid}.jsonl"
    real = sink.abort

    def abort(txn: Any) -> None:
        if txn["final"] == bad:
            raise ConnectionError("destination unreachable")
        real(txn)
    sink.abort = abort
    with caplog.at_level(logging.WARNING):
        assert testing.abort_lingering(sink, 0) == 1
    store = sink.transaction_log().store
    assert [n.rsplit("/", 1)[-1] for n in store.list(PENDING_PREFIX)] == [sink._pending_name(
        sink.create_committer().decode(a.handle)).rsplit("/", 1)[-1]]
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "lingering_abort_failed" in text and "my-sink" in text and a.attempt_uid in text
    assert "ConnectionError" in text
    staged = os.listdir(os.path.join(sink.root, "_staging"))
    assert staged == [f"{sink_token('my-sink')}-0-0-{a.attempt_uid}.jsonl"]  # b's staged file aborted
    sink.abort = real
    assert testing.abort_lingering(sink, 0) == 1
    assert store.list(PENDING_PREFIX) == [] and os.listdir(os.path.join(sink.root, "_staging")) == []
    del b


class DiesInWrite(JsonLinesSink):
    """Stages each batch at once (like an upload); a task that dies in write leaves a staged file."""

    def write(self, txn: Any, batch: pa.RecordBatch) -> None:
        os.makedirs(os.path.join(self.root, "_staging"), exist_ok=True)
        with open(self._staged(txn), "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in batch.to_pylist())

    def pre_commit(self, txn: Any) -> None:
        pass


def test_user_sink_inv5_a_task_that_dies_in_write_leaves_a_record_the_sweep_aborts(tmp_path):
    """F-U3: the pending record is written right after begin_transaction, so a task that dies during write (no
    abort runs: the process is gone) leaves a handle the sweep aborts through recover_and_abort."""
    sink = make(tmp_path, DiesInWrite)
    w = sink.create_writer(TransactionContext(sink.sink_id, 0, "0"))
    w.write(batch(0, 3))  # ... and the process dies here (no prepare_commit, no abort)
    assert len(os.listdir(os.path.join(sink.root, "_staging"))) == 1
    fresh = pickle.loads(pickle.dumps(sink))
    coordinator(fresh).complete_batch(0, [prepare(fresh, 0, 1, 10, 2)])
    assert ("recover_and_abort", w.txn["final"]) in fresh.calls
    assert os.listdir(os.path.join(sink.root, "_staging")) == []
    assert fresh.transaction_log().store.list(PENDING_PREFIX) == []
    assert visible(sink.root) == [10, 11]


def test_user_sink_inv5_a_writer_abort_removes_its_early_record(tmp_path):
    """F-U3: a task that fails in write is aborted by its writer, which also removes the early record."""
    sink = make(tmp_path)
    sink.write = lambda txn, b: (_ for _ in ()).throw(ValueError("bad row"))
    with pytest.raises(SinkHookError):
        prepare(sink, 0)
    assert sink.transaction_log().store.list(PENDING_PREFIX) == []


class LazyClientSink(JsonLinesSink):
    """Makes a client (here an unpicklable lock) on first use in a hook, as a database sink makes its connection."""

    def __init__(self, root: str, **kw: Any) -> None:
        super().__init__(root, **kw)
        self._conn: Any = None

    def __getstate__(self) -> dict:
        return TwoPhaseCommitSink.__getstate__(self)  # the base's rule, not JsonLinesSink's

    def commit(self, txn: Any) -> None:
        import threading
        if self._conn is None:
            self._conn = threading.Lock()
        super().commit(txn)


def test_user_sink_inv7_a_client_made_lazily_travels_as_none(tmp_path):
    """F-U4: a client a hook made after the sink was bound (the driver's first commit) broke the pickling of the
    sink for the next batch; it travels as None and is made again where the copy runs."""
    sink = make(tmp_path, LazyClientSink)
    coordinator(sink).complete_batch(0, [prepare(sink, 0)])
    assert sink._conn is not None
    copy_ = pickle.loads(pickle.dumps(sink))
    assert copy_._conn is None and copy_.root == sink.root and copy_.sink_id == "my-sink"
    coordinator(copy_).complete_batch(1, [prepare(copy_, 1, 0, 5, 5)])
    assert visible(sink.root) == list(range(10))


def test_user_sink_inv7_an_unpicklable_constructor_attribute_is_refused_at_bind_naming_it(tmp_path):
    """F-U4: what the constructor sets must pickle: refused when the sink is first used, naming the attribute."""
    import threading
    sink = make(tmp_path, LazyClientSink)
    sink._conn = threading.Lock()  # as if __init__ connected eagerly
    with pytest.raises(ConfigurationError, match=r"attribute '_conn' \(lock\) cannot be pickled.*lazily"):
        sink.bind_owner(str(tmp_path / "ck"))


def test_user_sink_inv2_a_dataclass_of_main_gets_the_right_advice(tmp_path):
    """F-U7: a module-level dataclass of the script (``__main__``) that another process cannot import was refused
    with 'defined inside a function?'; the message now says what is wrong and what to do."""

    @dataclass
    class MainTxn:
        staged: str
    MainTxn.__module__ = "__main__"
    MainTxn.__qualname__ = "MainTxn"  # as in a script's module level, seen from a process whose __main__ differs
    with pytest.raises(ConfigurationError, match=r"__main__:MainTxn is defined in the script run as __main__.*"
                                                 r"module of its own") as e:
        twophase.user_sink.encode_txn(make(tmp_path), MainTxn("x"))
    assert "inside a function" not in str(e.value)


# --------------------------------------------------------------------------- twophase.testing.conformance (users)


def _readme_sink_class() -> type:
    """The README's "Write your own sink" class, as written (the block up to its Spark part), in a module of its own
    (the suite pickles the sink: another process)."""
    import pathlib
    import re
    import sys
    import types
    text = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    text = text[text.index("### Write your own sink"):]
    block = re.findall(r"```python\n(.*?)```", text[:text.index("\n### ", 5)], re.S)[0]
    module = types.ModuleType("twophase_readme_own_sink")
    sys.modules[module.__name__] = module
    exec(compile(block[:block.index("\nspark = ")], "README.md", "exec"), module.__dict__)
    return module.JsonLinesSink


def _readme_ids(directory: str) -> list[int]:
    return [json.loads(line)["id"] for p in glob.glob(os.path.join(directory, "part-*.jsonl"))
            for line in open(p)]


@pytest.mark.parametrize("check", testing.CONFORMANCE_CHECKS, ids=testing.check_id)
def test_user_sink_conformance_of_the_readme_example_through_twophase_testing(tmp_path, check):
    """``twophase.testing.conformance``, as a user runs it in their own suite, on the README's example sink (its
    log under the work directory, as under a query's checkpoint location)."""
    cls = _readme_sink_class()
    testing.conformance(lambda sink_id, workdir: cls(os.path.join(workdir, "out"), sink_id=sink_id),
                        visible_ids=lambda workdir: _readme_ids(os.path.join(workdir, "out")),
                        leftovers=lambda sink, workdir: len(glob.glob(os.path.join(workdir, "out", ".*.staged"))),
                        checks=[check], workdir=str(tmp_path))


def test_user_sink_conformance_names_every_failing_check(tmp_path):
    """A sink that breaks invariants fails ``conformance`` with an AssertionError naming each failing check (all
    run); a temporary work directory is removed."""

    class Eager(JsonLinesSink):  # visible at pre_commit: breaks "nothing visible before commit"
        def pre_commit(self, txn: Any) -> None:
            super().pre_commit(txn)
            os.replace(self._staged(txn), os.path.join(self.root, txn["final"]))

    with pytest.raises(AssertionError) as e:
        testing.conformance(lambda sink_id, workdir: Eager(os.path.join(workdir, "out"), sink_id=sink_id),
                            visible_ids=lambda workdir: visible(os.path.join(workdir, "out")),
                            leftovers=lambda sink, workdir: 0)
    assert "conformance_inv1_nothing_visible_before_commit: AssertionError: rows visible before commit" in str(e.value)
    assert "conformance check(s) failed for user" in str(e.value)


# --------------------------------------------------------------------------- the embedded runtime, SIGKILLed

RT_CRASH_JOB = '''
import sys, time
sys.path[:0] = [{root!r}, {tests!r}]
from test_user_sink import JsonLinesSink
from twophase.runtime import CheckpointConfig, CollectionSource, JobGraph, JobRunner

def pause(_split, _pos):  # before each read of 256 records: several checkpoints while the input lasts
    time.sleep(0.08)
    return False

g = JobGraph("user-sink-crash")
sink = JsonLinesSink({out!r}, sink_id="user-rt", log_location={log!r})
g.source(CollectionSource({{"s0": [{{"id": i}} for i in range({n})]}}, pause=pause), uid="src").sink_to(
    sink, uid="sink", parallelism=2)
JobRunner(g, checkpointing=CheckpointConfig(0.03), owner={ck!r}).run()
print("FINISHED")
'''


@pytest.mark.parametrize("point", ["after_pre_commit@2", "after_complete@2"])
def test_user_sink_runtime_sigkill_between_pre_commit_and_commit_then_restart_every_record_once(tmp_path, point):
    """``stream.sink_to(MySink(...))`` in the embedded runtime: the job process SIGKILLed after a pre_commit (the
    checkpoint undecided: aborted at restart) or after the checkpoint is decided and before its commit (committed
    by the restart's recovery); the restarted job finishes with every record once and nothing staged or pending."""
    import signal
    import subprocess
    import sys
    n = 2500
    out, log, marker = str(tmp_path / "out"), str(tmp_path / "log"), str(tmp_path / "marker")
    script = tmp_path / "job.py"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script.write_text(RT_CRASH_JOB.format(root=root, tests=os.path.join(root, "tests"), out=out, log=log,
                                          ck=str(tmp_path / "ck"), n=n))
    env = dict(os.environ, TWOPHASE_FAULT=point, TWOPHASE_FAULT_MARKER=marker)
    p = subprocess.run([sys.executable, str(script)], env=env, start_new_session=True, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stdout + p.stderr[-3000:]
    assert open(marker).read().startswith(point.split("@")[0]), "the crash really happened"
    got = visible(out)
    assert len(got) == len(set(got)), "a duplicate after the crash"
    env.pop("TWOPHASE_FAULT")
    p = subprocess.run([sys.executable, str(script)], env=env, start_new_session=True, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and "FINISHED" in p.stdout, p.stderr[-3000:]
    assert visible(out) == list(range(n))
    assert os.listdir(os.path.join(out, "_staging")) == []
    assert JsonLinesSink(out, sink_id="user-rt", log_location=log).transaction_log().store.list(PENDING_PREFIX) == []


class PrefixSink(JsonLinesSink):
    """Derives a name prefix from its sink id in the constructor (as twophase-postgres derives its gid prefix)."""

    def __init__(self, root: str, **kw: Any) -> None:
        super().__init__(root, **kw)
        self.prefix = f"tp_{sink_token(self.sink_id)}_"


def test_user_sink_batch_write_spec_is_built_again_by_the_constructor(tmp_path):
    """A batch write's sink (write_job_spec) is built by the constructor from the format's options with the write's
    own sink id and log, so what the constructor derives from the sink id (a prefix the sweep proves ownership by) is
    the write's, never the streaming sink's; a sink not built from a format's options is refused naming the way."""
    from twophase.spark._user_format import sink_from_options
    sink = sink_from_options(PrefixSink, "prefix-sink", {"root": str(tmp_path / "out"), "sinkId": "s",
                                                         "log_location": str(tmp_path / "log")})
    spec = sink.write_job_spec("w1")
    assert spec.sink_id.startswith("s#write:w1@") and spec.log_location == f"{tmp_path / 'log'}/write-jobs/w1"
    assert spec.prefix == f"tp_{sink_token(spec.sink_id)}_" != sink.prefix
    assert spec.root == sink.root and spec.write_job_spec("w2").sink_id.startswith(f"{spec.sink_id}#write:w2@")
    with pytest.raises(ConfigurationError, match=r"twophase.spark.data_source\(JsonLinesSink"):
        make(tmp_path).write_job_spec("w1")


def test_user_sink_inv7_a_subclass_getstate_is_its_own_rule_at_bind(tmp_path):
    """Invariant 7: a sink whose own __getstate__ leaves its lock out (twophase-postgres) is not refused at bind."""
    import threading

    class OwnRule(JsonLinesSink):
        def __init__(self, root: str, **kw: Any) -> None:
            super().__init__(root, **kw)
            self._lock = threading.Lock()

        def __getstate__(self) -> dict:
            return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    OwnRule(str(tmp_path / "out"), sink_id="s", log_location=str(tmp_path / "log")).bind_owner(str(tmp_path / "ck"))
    from twophase.sinks.postgres import PostgresSink
    pg = PostgresSink("postgresql://u:secret@localhost:1/db", "public.t", sink_id="pg", log_location=str(tmp_path / "l"))
    pg.bind_owner(str(tmp_path / "ck")).create_committer()
