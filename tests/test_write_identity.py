"""The identity of a batch write (:meth:`twophase.sink.SinkSpec.write_job_spec`): its sink id, token and Kafka
transactional prefix come from the sink's *log location* and the write's key, not from the destination alone.

Two pipelines writing to one destination (a topic, a path, a table) with their own ``log.location`` and the
same ``writeId`` (a run date, 'backfill-2026-11-01') are two writes: each has its own log, so each must have
its own names. With the destination's id alone they shared a token (one's sweep deleted the other's staged
files; on Delta the second commit was taken for "already committed" and its rows were never written) and
Kafka transactional ids (one fenced the other). A re-run of one write (same log location, same key) keeps its
identity: that is what makes ``writeId`` idempotent.

Driven like tests/test_write_job.py: each test plays the drivers (plan, commit) and the tasks (``run_task``)
on real local file and Delta sinks, without Spark."""

from __future__ import annotations

import os
import re

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from deltalake import DeltaTable

from twophase import sink as sink_api
from twophase.sink import TransactionContext, run_task, sink_token
from twophase.sinks.delta import DeltaSink
from twophase.sinks.files import FileSink
from twophase.write_job import WriteJob, commit_write_job, plan_write_job

WRITE_ID = "backfill-2026-11-01"
SCHEMA = pa.schema([("id", pa.int64())])


def batch(lo: int, hi: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(lo, hi), pa.int64())}, schema=SCHEMA)


def run_tasks(job: WriteJob, parts: list[tuple[int, int]]):
    return [run_task(job.spec, TransactionContext(job.spec.sink_id, job.checkpoint_id, str(i)), [batch(lo, hi)])
            for i, (lo, hi) in enumerate(parts)]


def file_ids(root: str) -> list[int]:
    d = ds.dataset(root, format="parquet")
    return sorted(d.to_table(columns=["id"]).column("id").to_pylist()) if d.files else []


def files_sink(tmp_path, log: str) -> FileSink:
    return FileSink.from_options({"path": str(tmp_path / "out"), "log.location": str(tmp_path / log)})


def kafka_sink(tmp_path, log: str, **extra: str):
    pytest.importorskip("kafka")
    from twophase.sinks.kafka import KafkaSink
    return KafkaSink.from_options({"kafka.bootstrap.servers": "localhost:9", "topic": "events",
                                   "log.location": str(tmp_path / log), **extra})


def test_write_identity_two_pipelines_with_their_own_log_get_their_own_sink_ids_and_tokens(tmp_path):
    """Same destination, same writeId, different log.location: different sink ids and tokens (file sink)."""
    a, b = files_sink(tmp_path, "logs-a"), files_sink(tmp_path, "logs-b")
    assert a.sink_id == b.sink_id  # one destination: the streaming sink id is the path's
    ja, jb = a.write_job_spec(WRITE_ID), b.write_job_spec(WRITE_ID)
    assert ja.sink_id != jb.sink_id and ja.token != jb.token
    assert ja.sink_id.startswith(f"{a.sink_id}#write:{WRITE_ID}@")


def test_write_identity_a_rerun_with_the_same_log_keeps_its_identity(tmp_path):
    """Same log location and key, planned from two sink objects (a re-run): the same sink id, token, log."""
    first = files_sink(tmp_path, "logs").write_job_spec(WRITE_ID)
    again = files_sink(tmp_path, "logs").write_job_spec(WRITE_ID)
    assert (first.sink_id, first.token, first.transaction_log().location) == \
           (again.sink_id, again.token, again.transaction_log().location)
    assert files_sink(tmp_path, "logs").write_job_spec("other").sink_id != first.sink_id


def test_write_identity_the_log_location_is_normalised(tmp_path):
    """One place, spelled several ways (a trailing '/', file://, a '..' in the path, s3a://): one identity."""
    loc = str(tmp_path / "logs")
    spellings = [loc, loc + "/", "file://" + loc, str(tmp_path / "x" / ".." / "logs")]
    assert {sink_api.write_identity(s, WRITE_ID) for s in spellings} == {sink_api.write_identity(loc, WRITE_ID)}
    assert sink_api.normalized_log_location("s3a://b/p/") == sink_api.normalized_log_location("s3://b/p") == "s3://b/p"
    assert sink_api.write_identity("s3://b/p", WRITE_ID) != sink_api.write_identity("s3://b/q", WRITE_ID)
    assert re.fullmatch(r"[A-Za-z0-9._-]{1,64}@[0-9a-f]{12}", sink_api.write_identity(loc, "k" * 64))


def test_write_identity_kafka_two_pipelines_on_one_topic_get_their_own_transactional_prefixes(tmp_path):
    """Kafka: same topic, same writeId, different log.location -> different sink ids and transactional
    prefixes (so different transactional ids: one never fences the other); a re-run keeps them; the ids stay
    within the transactional id charset and the prefix option's limits."""
    a, b = kafka_sink(tmp_path, "logs-a"), kafka_sink(tmp_path, "logs-b")
    assert a.prefix == b.prefix  # one topic, no sink.id: the same streaming prefix
    ja, jb = a.write_job_spec(WRITE_ID), b.write_job_spec(WRITE_ID)
    assert ja.sink_id != jb.sink_id and ja.prefix != jb.prefix
    again = kafka_sink(tmp_path, "logs-a").write_job_spec(WRITE_ID)
    assert (again.sink_id, again.prefix) == (ja.sink_id, ja.prefix)
    tid = ja.transactional_id("0", 3, 1)
    assert tid.startswith(ja.prefix + "-") and re.fullmatch(r"[A-Za-z0-9._\-]+", tid)
    assert ja.prefix == f"{a.prefix}.w{sink_token(sink_api.write_identity(str(tmp_path / 'logs-a'), WRITE_ID))}"
    long = kafka_sink(tmp_path, "logs-a", transactionalIdPrefix="p" * 200).write_job_spec("k" * 64)
    assert len(long.prefix) == 200 + 2 + 12  # the digest is fixed-length, whatever the key and location


def test_write_identity_files_two_pipelines_same_path_same_write_id_both_written_once(tmp_path):
    """Two pipelines append to one path, each with its own log.location and the same writeId, their runs
    overlapping: every row of both is visible exactly once (before: B's commit swept A's staged files,
    which had the same token, and A's commit lost them)."""
    a, b = files_sink(tmp_path, "logs-a"), files_sink(tmp_path, "logs-b")
    job_a = plan_write_job(a, write_id=WRITE_ID)
    acks_a = run_tasks(job_a, [(0, 50), (50, 100)])  # A pre-committed; its driver has not committed yet
    job_b = plan_write_job(b, write_id=WRITE_ID)
    assert not job_b.skip
    commit_write_job(job_b, run_tasks(job_b, [(1000, 1050), (1050, 1100)]))  # B commits (and sweeps) first
    commit_write_job(job_a, acks_a)
    assert file_ids(a.root) == list(range(100)) + list(range(1000, 1100))
    rerun_a, rerun_b = plan_write_job(a, write_id=WRITE_ID), plan_write_job(b, write_id=WRITE_ID)
    assert rerun_a.skip and rerun_b.skip  # each pipeline's re-run is still idempotent
    assert file_ids(a.root) == list(range(100)) + list(range(1000, 1100))


def test_write_identity_delta_two_pipelines_same_table_same_write_id_both_committed(tmp_path):
    """Two pipelines append to one Delta table, each with its own log.location and the same writeId: both
    are committed, each once (before: both had one txnAppId, and B's commit was taken for "already committed"
    by A's, silently: B's rows were never written)."""
    def delta(log: str) -> DeltaSink:
        s = DeltaSink.from_options({"path": str(tmp_path / "t"), "log.location": str(tmp_path / log)}, SCHEMA)
        return s

    a, b = delta("logs-a"), delta("logs-b")
    job_a = plan_write_job(a, write_id=WRITE_ID)
    commit_write_job(job_a, run_tasks(job_a, [(0, 50), (50, 100)]))
    job_b = plan_write_job(b, write_id=WRITE_ID)
    assert not job_b.skip
    commit_write_job(job_b, run_tasks(job_b, [(1000, 1050)]))
    ids = sorted(DeltaTable(str(tmp_path / "t")).to_pyarrow_table(columns=["id"]).column("id").to_pylist())
    assert ids == list(range(100)) + list(range(1000, 1050))
    for sink in (a, b):  # a re-run of either writes nothing
        rerun = plan_write_job(sink, write_id=WRITE_ID)
        assert rerun.skip
    ids = sorted(DeltaTable(str(tmp_path / "t")).to_pyarrow_table(columns=["id"]).column("id").to_pylist())
    assert ids == list(range(100)) + list(range(1000, 1050))
    assert os.path.isdir(tmp_path / "logs-a" / "write-jobs" / WRITE_ID)


class _Broker:
    """The two admin calls a Kafka sweep makes (ListTransactions, fence by InitProducerId), recorded."""

    def __init__(self, ids):
        self.ids, self.fenced = list(ids), []

    def list_transactions(self, prefix, states=("Ongoing",)):
        return [(t, 1, "Ongoing") for t in self.ids if t.startswith(prefix)]

    def fence(self, tid, timeout_ms):
        self.fenced.append(tid)
        return 1, 1


def test_write_identity_kafka_a_batch_writes_sweep_fences_only_runs_up_to_its_own(tmp_path, monkeypatch):
    """A batch write's transactional ids carry the run (not run mod 2), so the sweep of run n (a taken-over
    zombie's abort) fences runs <= n and never run n + 2 in flight; the streaming sink's ids keep generations."""
    base = kafka_sink(tmp_path, "logs", **{"kafka.transaction.timeout.ms": "900000"})
    spec = base.write_job_spec(WRITE_ID)
    ids = {run: [spec.transactional_id(t, run, 0) for t in ("0", "1")] for run in range(4)}
    assert ids[0] != ids[2] and all(spec._parse_id(t)[1] == run for run, ts in ids.items() for t in ts)
    assert base.transactional_id("0", 2, 0) == base.transactional_id("0", 0, 0)  # streaming: generations
    assert all(base._parse_id(t) is None for ts in ids.values() for t in ts)  # the write's ids are not the stream's
    broker = _Broker([t for ts in ids.values() for t in ts] + [base.transactional_id("0", 0, 0)])
    committer = spec.create_committer()
    monkeypatch.setattr(spec, "_client", lambda: broker)
    assert committer.abort_lingering(0, None) == 2
    assert sorted(broker.fenced) == sorted(ids[0])
    broker.fenced.clear()
    assert committer.abort_lingering(1, None) == 4 and sorted(broker.fenced) == sorted(ids[0] + ids[1])


def test_write_identity_one_log_reached_through_a_symlink_is_one_write(tmp_path):
    """Review R5: the same log directory reached by two spellings that ``abspath`` cannot tell apart (a symlink,
    a bind mount seen through a link) is one log, so one identity: a re-run through the other spelling is a
    skip, and every row is written once (before: two identities, two tokens, two logs' worth of names over one
    log directory: the re-run wrote every row again)."""
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    assert sink_api.write_identity(str(tmp_path / "link" / "logs"), WRITE_ID) == \
        sink_api.write_identity(str(tmp_path / "real" / "logs"), WRITE_ID)

    def sink(via: str) -> FileSink:
        return FileSink.from_options({"path": str(tmp_path / "out"), "log.location": str(tmp_path / via / "logs")})
    job = plan_write_job(sink("real"), write_id=WRITE_ID)
    commit_write_job(job, run_tasks(job, [(0, 50), (50, 100)]))
    rerun = plan_write_job(sink("link"), write_id=WRITE_ID)
    assert rerun.skip
    assert file_ids(str(tmp_path / "out")) == list(range(100))
