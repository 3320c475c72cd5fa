"""The durable transaction log (:mod:`twophase.log`); tests are named after its numbered invariants."""

from __future__ import annotations

import os
import pickle
import random
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from twophase.checkpoint import CheckpointProperties
from twophase.errors import (ConcurrentWriterError, ConfigurationError, InvalidTransitionError, LogCorruptError,
                             TransientSinkError)
from twophase.log import (CheckpointRecord, LocalLogStore, TransactionLog, decode_record, encode_record,
                          open_store)
from twophase.states import CheckpointState

C = CheckpointState
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def record_path(log: TransactionLog, cid: int) -> str:
    return os.path.join(log.location, "checkpoints", f"{cid:020d}.json")


def committed(log: TransactionLog, cid: int, handles=None) -> None:
    log.transition(cid, C.PENDING)
    log.transition(cid, C.COMPLETED, handles=handles or {"0": {"txn": f"{cid}-0"}})
    log.transition(cid, C.COMMITTED)


def aborted(log: TransactionLog, cid: int) -> None:
    log.transition(cid, C.PENDING)
    log.transition(cid, C.ABORTED, reason="declined")


# ---- round trip


def test_record_round_trip_through_json():
    rec = CheckpointRecord(7, C.COMPLETED, {"0": {"txn": "a", "n": [1, 2]}, "1": {"txn": "b"}},
                           CheckpointProperties.savepoint(terminate=True), attempt=3,
                           timestamps={"PENDING": 1.5, "COMPLETED": 2.5}, reason=None,
                           task_state={"0": {"count": 4}})
    assert CheckpointRecord.from_json(rec.to_json()) == rec
    body = {"sink_id": "s", "record": rec.to_json()}
    assert decode_record(encode_record(body), "here") == body


def test_record_round_trip_through_the_log(txlog):
    txlog.transition(1, C.PENDING, properties=CheckpointProperties.savepoint())
    rec = txlog.transition(1, C.COMPLETED, handles={"1": {"txn": "b"}, "0": {"txn": "a"}},
                           task_state={"0": {"k": 1}})
    again = txlog.get(1)
    assert again == rec
    assert again.state is C.COMPLETED
    assert again.properties == CheckpointProperties.savepoint()
    assert set(again.timestamps) == {"PENDING", "COMPLETED"}
    completed = again.to_completed()
    assert completed.ordered_handles() == [{"txn": "a"}, {"txn": "b"}]
    assert completed.task_state == {"0": {"k": 1}}
    # a fresh log object on the same directory reads the same
    fresh = TransactionLog(LocalLogStore(txlog.location), "fake")
    assert fresh.get(1) == rec
    assert fresh.get(2) is None


def test_records_are_in_checkpoint_id_order(txlog):
    for cid in (10, 2, 30, 1):
        txlog.transition(cid, C.PENDING)
    assert [r.checkpoint_id for r in txlog.records()] == [1, 2, 10, 30]
    assert txlog.checkpoint_ids() == [1, 2, 10, 30]
    assert [r.checkpoint_id for r in txlog.unfinished()] == [1, 2, 10, 30]


def test_record_of_another_sink_is_refused(tmp_path):
    store = LocalLogStore(str(tmp_path / "log"))
    TransactionLog(store, "a").transition(1, C.PENDING)
    with pytest.raises(LogCorruptError, match="belongs to sink"):
        TransactionLog(store, "b").get(1)


def test_store_pickles_to_its_location(tmp_path):
    store = LocalLogStore(str(tmp_path / "log"))
    store.put("checkpoints/x", b"data")
    copy = pickle.loads(pickle.dumps(store))
    assert copy.location == store.location
    assert copy.get("checkpoints/x") == b"data"


def test_put_if_absent_is_exclusive(tmp_path):
    store = LocalLogStore(str(tmp_path / "log"))
    assert store.put_if_absent("owner.json", b"first")
    assert not store.put_if_absent("owner.json", b"second")
    assert store.get("owner.json") == b"first"
    assert not [n for n in os.listdir(store.root) if n.startswith(".tmp-")]


# ---- invariant 1: atomic writes


def test_log_inv1_leftover_temp_file_is_ignored(txlog):
    """A writer killed between writing its temp file and the rename leaves the old record in force."""
    txlog.transition(1, C.PENDING)
    newer = encode_record({"sink_id": "fake", "record": CheckpointRecord(1, C.COMPLETED).to_json()})
    folder = os.path.join(txlog.location, "checkpoints")
    for name, data in ((f".tmp-dead-{1:020d}.json", newer[: len(newer) // 2]),
                       (f".tmp-beef-{2:020d}.json", newer)):
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    assert txlog.get(1).state is C.PENDING
    assert txlog.get(2) is None
    assert txlog.checkpoint_ids() == [1]
    assert [r.state for r in txlog.records()] == [C.PENDING]
    txlog.transition(1, C.COMPLETED, handles={"0": {"txn": "x"}})  # the log goes on over the debris
    assert txlog.store.clean_temporaries(older_than_s=3600) == 0
    assert txlog.store.clean_temporaries(older_than_s=-1) == 2
    assert not [n for n in os.listdir(folder) if n.startswith(".tmp-")]


def test_log_inv1_failed_rename_keeps_the_old_record(txlog, monkeypatch):
    txlog.transition(1, C.PENDING)
    before = open(record_path(txlog, 1), "rb").read()

    def no_rename(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_rename)
    with pytest.raises(TransientSinkError) as err:
        txlog.transition(1, C.COMPLETED, handles={"0": {"txn": "x"}})
    assert err.value.retriable
    monkeypatch.undo()
    assert open(record_path(txlog, 1), "rb").read() == before
    assert txlog.get(1).state is C.PENDING
    assert not [n for n in os.listdir(os.path.dirname(record_path(txlog, 1))) if n.startswith(".tmp-")]


# ---- invariant 2: corrupt records are refused, never half-applied


def _truncations(data: bytes) -> list[int]:
    header = data.index(b"\n")
    return [0, 1, header, header + 1, header + 2, len(data) // 2, len(data) - 1]


def test_log_inv2_truncated_record_is_refused(txlog):
    txlog.transition(1, C.PENDING)
    txlog.transition(1, C.COMPLETED, handles={"0": {"txn": "x"}})
    path = record_path(txlog, 1)
    whole = open(path, "rb").read()
    for length in _truncations(whole):
        with open(path, "wb") as f:
            f.write(whole[:length])
        with pytest.raises(LogCorruptError):
            txlog.get(1)
        with pytest.raises(LogCorruptError):
            txlog.records()
        with pytest.raises(LogCorruptError):
            txlog.highest_committed()
        # never half-applied: a transition over a corrupt record fails and leaves it as it is
        with pytest.raises(LogCorruptError):
            txlog.transition(1, C.COMMITTED)
        assert open(path, "rb").read() == whole[:length]


def test_log_inv2_every_flipped_bit_is_detected():
    data = encode_record({"sink_id": "fake", "record": CheckpointRecord(
        3, C.COMPLETED, {"0": {"txn": "abc"}}, timestamps={"PENDING": 1.25}).to_json()})
    assert decode_record(data, "x")["record"]["checkpoint_id"] == 3
    for pos in range(len(data)):
        for mask in (0x01, 0x20, 0x80):
            bad = bytearray(data)
            bad[pos] ^= mask
            with pytest.raises(LogCorruptError):
                decode_record(bytes(bad), f"byte {pos} ^ {mask:#x}")


def test_log_inv2_flipped_byte_in_a_record_file_is_refused(txlog):
    txlog.transition(1, C.PENDING)
    path = record_path(txlog, 1)
    data = bytearray(open(path, "rb").read())
    data[len(data) - 5] ^= 0x04
    with open(path, "wb") as f:
        f.write(data)
    with pytest.raises(LogCorruptError, match="checksum"):
        txlog.get(1)
    with pytest.raises(LogCorruptError):
        txlog.transition(1, C.ABORTED)
    assert open(path, "rb").read() == bytes(data)


@pytest.mark.parametrize("data", [b"", b"{}", b"twophase-log 1 abc 2\n{}", b"twophase-log 2 x 0\n",
                                  b"not a record\n" + b"x" * 10])
def test_log_inv2_garbage_is_refused(data):
    with pytest.raises(LogCorruptError):
        decode_record(data, "garbage")


def test_log_inv2_valid_checksum_but_not_json_is_refused():
    import hashlib
    payload = b"{not json"
    data = f"twophase-log 1 {hashlib.sha256(payload).hexdigest()} {len(payload)}\n".encode() + payload
    with pytest.raises(LogCorruptError, match="does not parse"):
        decode_record(data, "x")


def test_log_inv2_corrupt_owner_is_refused(txlog):
    txlog.claim("q1")
    with open(os.path.join(txlog.location, "owner.json"), "r+b") as f:
        f.truncate(10)
    with pytest.raises(LogCorruptError):
        txlog.owner()
    with pytest.raises(LogCorruptError):
        txlog.claim("q1")


# ---- invariant 3: every change is checked


def test_log_inv3_invalid_transition_is_refused_and_nothing_written(txlog):
    with pytest.raises(InvalidTransitionError):
        txlog.transition(1, C.COMPLETED)
    assert txlog.get(1) is None
    txlog.transition(1, C.PENDING)
    txlog.transition(1, C.COMPLETED, handles={"0": {"txn": "x"}})
    before = open(record_path(txlog, 1), "rb").read()
    for target in (C.ABORTED, C.PENDING, C.COMPLETED):
        with pytest.raises(InvalidTransitionError, match="checkpoint 1"):
            txlog.transition(1, target)
    assert open(record_path(txlog, 1), "rb").read() == before
    txlog.transition(1, C.COMMITTED)
    for target in C:
        with pytest.raises(InvalidTransitionError):
            txlog.transition(1, target)
    assert txlog.get(1).handles == {"0": {"txn": "x"}}


def test_log_inv3_rerun_after_abort_is_a_new_attempt(txlog):
    aborted(txlog, 4)
    assert txlog.get(4).attempt == 1
    assert txlog.get(4).reason == "declined"
    rec = txlog.transition(4, C.PENDING)
    assert rec.attempt == 2
    assert rec.reason is None
    assert set(rec.timestamps) == {"PENDING"}
    rec = txlog.transition(4, C.COMPLETED, handles={"0": {"txn": "y"}})
    assert rec.attempt == 2


def test_log_inv3_completed_keeps_handles_through_commit(txlog):
    committed(txlog, 2, handles={"0": {"txn": "a"}, "1": {"txn": "b"}})
    rec = txlog.get(2)
    assert rec.state is C.COMMITTED
    assert rec.handles == {"0": {"txn": "a"}, "1": {"txn": "b"}}
    assert set(rec.timestamps) == {"PENDING", "COMPLETED", "COMMITTED"}


# ---- invariant 4: retention


def test_log_inv4_retention_keeps_newest_n_and_the_highest_committed(tmp_path):
    log = TransactionLog(LocalLogStore(str(tmp_path / "log")), "fake", retain=3)
    for cid in range(1, 5):
        committed(log, cid)
    for cid in range(5, 8):
        aborted(log, cid)
    log.transition(8, C.PENDING)
    log.transition(9, C.PENDING)
    log.transition(9, C.COMPLETED, handles={"0": {"txn": "z"}})
    assert log.prune() == 3
    assert log.checkpoint_ids() == [4, 5, 6, 7, 8, 9]
    assert log.highest_committed() == 4
    assert [r.state for r in log.unfinished()] == [C.PENDING, C.COMPLETED]
    assert log.prune() == 0


def test_log_inv4_retention_of_committed_only(tmp_path):
    log = TransactionLog(LocalLogStore(str(tmp_path / "log")), "fake", retain=2)
    for cid in range(1, 6):
        committed(log, cid)
        log.prune()
    assert log.checkpoint_ids() == [4, 5]
    assert log.highest_committed() == 5


def test_log_inv4_nothing_pruned_under_the_limit(txlog):
    committed(txlog, 1)
    aborted(txlog, 2)
    assert txlog.prune() == 0
    assert txlog.checkpoint_ids() == [1, 2]


def test_log_inv4_non_final_records_are_never_pruned(tmp_path):
    log = TransactionLog(LocalLogStore(str(tmp_path / "log")), "fake", retain=2)
    log.transition(1, C.PENDING)
    log.transition(2, C.PENDING)
    log.transition(2, C.COMPLETED, handles={})
    for cid in range(3, 8):
        aborted(log, cid)
    log.prune()
    assert log.checkpoint_ids() == [1, 2, 6, 7]
    assert log.highest_committed() is None


@pytest.mark.parametrize("retain", [-1, 0, 1])
def test_log_inv4_retain_below_two_is_a_configuration_error(tmp_path, retain):
    with pytest.raises(ConfigurationError, match="log.retain"):
        TransactionLog(LocalLogStore(str(tmp_path / "log")), "fake", retain=retain)


# ---- invariant 5: one owner


def test_log_inv5_second_owner_is_refused(txlog):
    txlog.claim("checkpoints/query-1")
    other = TransactionLog(LocalLogStore(txlog.location), "fake")
    with pytest.raises(ConcurrentWriterError, match="query-1") as err:
        other.claim("checkpoints/query-2")
    assert "sink.id" in str(err.value)
    assert not err.value.retriable
    assert txlog.owner()["owner"] == "checkpoints/query-1"


def test_log_inv5_same_owner_may_claim_again(txlog):
    txlog.claim("q1")
    txlog.claim("q1")
    TransactionLog(LocalLogStore(txlog.location), "fake").claim("q1")  # e.g. after a restart
    assert txlog.owner()["sink_id"] == "fake"


def test_log_inv5_same_owner_other_sink_id_is_refused(txlog):
    txlog.claim("q1")
    with pytest.raises(ConcurrentWriterError):
        TransactionLog(LocalLogStore(txlog.location), "another-sink").claim("q1")


def test_log_inv5_no_owner_until_claimed(txlog):
    assert txlog.owner() is None


# ---- configuration


def test_unwritable_path_is_a_configuration_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigurationError, match="writable path") as err:
        LocalLogStore(str(blocker / "log"))
    assert isinstance(err.value, ValueError)
    with pytest.raises(ConfigurationError):
        TransactionLog.open(str(blocker), "fake")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write to a read-only directory")
def test_read_only_directory_is_a_configuration_error(tmp_path):
    root = tmp_path / "ro"
    (root / "checkpoints").mkdir(parents=True)
    root.chmod(0o500)
    try:
        with pytest.raises(ConfigurationError, match="not writable"):
            LocalLogStore(str(root))
    finally:
        root.chmod(0o700)


def test_unknown_scheme_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="nosuch://"):
        open_store("nosuch://bucket/log")


def test_file_url_opens_a_local_store(tmp_path):
    store = open_store(f"file://{tmp_path}/log")
    assert isinstance(store, LocalLogStore)
    assert store.location == str(tmp_path / "log")


# ---- a real crash: SIGKILL a writer at random moments

CRASH_CHILD = textwrap.dedent("""
    import sys
    from twophase.log import LocalLogStore, TransactionLog
    from twophase.states import CheckpointState as C

    log = TransactionLog(LocalLogStore(sys.argv[1]), "crash", retain=3)
    for rec in log.unfinished():  # finish what the previous (killed) writer left, as recovery does
        if rec.state is C.COMPLETED:
            log.transition(rec.checkpoint_id, C.COMMITTED)
        else:
            log.transition(rec.checkpoint_id, C.ABORTED, reason="killed")
    ids = log.checkpoint_ids()
    cid = ids[-1] + 1 if ids else 1
    print("ready", flush=True)
    while True:
        handles = {str(t): {"txn": f"{cid}-{t}", "pad": "x" * 4000} for t in range(4)}
        log.transition(cid, C.PENDING)
        if cid % 3 == 0:  # a declined attempt, then the re-run
            log.transition(cid, C.ABORTED, reason="declined")
            log.transition(cid, C.PENDING)
        log.transition(cid, C.COMPLETED, handles=handles)
        log.transition(cid, C.COMMITTED)
        if cid % 4 == 0:
            log.prune()
        cid += 1
""")


def _wait_ready(proc: subprocess.Popen, timeout: float) -> None:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else b""
    assert line.strip() == b"ready", f"crash child did not start: {line!r} {proc.stderr.read() if proc.poll() else ''}"


def test_log_inv1_inv2_survive_sigkill_of_the_writer(tmp_path):
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    root = str(tmp_path / "log")
    script = tmp_path / "writer.py"
    script.write_text(CRASH_CHILD)
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    log = TransactionLog(LocalLogStore(root), "crash", retain=3)
    progress = []
    for kill in range(6):
        proc = subprocess.Popen([sys.executable, str(script), root], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, start_new_session=True)
        try:
            _wait_ready(proc, 10.0)
            time.sleep(rng.uniform(0.02, 0.2))
            proc.send_signal(signal.SIGKILL)
            proc.wait(5)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()
        assert proc.returncode == -signal.SIGKILL, (
            f"seed {seed}: the writer was not killed, it exited with {proc.returncode}")
        # every record decodes (no LogCorruptError) and is in a valid state
        names = log.store.list("checkpoints/")
        assert all(not n.rsplit("/", 1)[-1].startswith(".tmp-") for n in names)
        records = log.records()
        assert len(records) == len(names), f"seed {seed}: stray files {names}"
        assert all(isinstance(r.state, CheckpointState) for r in records)
        for r in records[:-1]:  # the writer is sequential: only the newest record can be unfinished
            assert r.state.is_final, f"seed {seed}: {r}"
        for r in records:
            if r.state in (C.COMPLETED, C.COMMITTED):
                assert sorted(r.handles) == ["0", "1", "2", "3"], f"seed {seed}: {r}"
            if r.state is C.COMMITTED:
                assert r.attempt == (2 if r.checkpoint_id % 3 == 0 else 1), f"seed {seed}: {r}"
        progress.append(log.checkpoint_ids()[-1] if records else 0)
    assert progress[-1] > 1, f"seed {seed}: the writer made no progress: {progress}"
    assert progress == sorted(progress), f"seed {seed}: {progress}"
    assert log.highest_committed() is not None


class CountingStore(LocalLogStore):
    """A local store that counts reads, to show how many records a question costs."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.gets = 0

    def get(self, name: str):
        self.gets += 1
        return super().get(name)


def test_log_inv6_recovery_questions_read_only_the_newest_records(tmp_path):
    store = CountingStore(str(tmp_path / "log"))
    log = TransactionLog(store, "fake", retain=100)
    for cid in range(1, 51):
        committed(log, cid)
    log.transition(51, C.PENDING)
    store.gets = 0
    v = log.view()
    assert (v.highest_committed, [r.checkpoint_id for r in v.unfinished]) == (50, [51])
    assert store.gets == 2, "the view must stop at the first COMMITTED record from the top"
    store.gets = 0
    assert log.prune() == 0 and store.gets == 2


def test_log_inv6_latest_completed_prefers_a_newer_completed_record(txlog):
    committed(txlog, 1)
    txlog.transition(2, C.PENDING)
    assert txlog.latest_completed().checkpoint_id == 1
    txlog.transition(2, C.COMPLETED, handles={})
    assert txlog.latest_completed().checkpoint_id == 2
    txlog.transition(3, C.PENDING)
    assert txlog.latest_completed().checkpoint_id == 2


def test_record_written_with_the_removed_source_offsets_field_still_reads():
    """Records of older versions carry ``source_offsets`` (never read by anything, removed): they still
    decode, and the field is dropped when the record is next written."""
    old = CheckpointRecord(3, C.COMPLETED, {"0": {"txn": "a"}}).to_json()
    old["source_offsets"] = {"topic": {"0": 12}}
    rec = CheckpointRecord.from_json(old)
    assert rec == CheckpointRecord(3, C.COMPLETED, {"0": {"txn": "a"}})
    assert "source_offsets" not in rec.to_json()


class VersionListingStore(CountingStore):
    """A local store whose listing reports versions, as S3's does (ETags): what invariant 9 builds on."""

    lists_versions = True

    def put_if_version(self, name: str, data: bytes, version):
        gets = self.gets  # the local compare-and-swap reads to compare: not a read of the log's
        try:
            return super().put_if_version(name, data, version)
        finally:
            self.gets = gets

    def list_versioned(self, prefix: str):
        return [(name, self.get_versioned_uncounted(name)) for name in self.list(prefix)]

    def get_versioned_uncounted(self, name: str):
        with open(self._path(name), "rb") as f:
            import hashlib
            return hashlib.sha256(f.read()).hexdigest()


def test_log_inv9_a_record_this_process_wrote_or_read_is_not_read_again_at_the_same_version(tmp_path):
    store = VersionListingStore(str(tmp_path / "log"))
    log = TransactionLog(store, "fake")
    committed(log, 1)
    log.transition(2, C.PENDING)
    store.gets = 0
    with log.locked():
        assert log.view().highest_committed == 1 and log.get(2).state is C.PENDING
        assert log.get(3) is None  # not listed: absent, no read
        log.transition(2, C.COMPLETED, handles={"0": {"txn": "a"}})
        assert log.highest_committed(fresh=True) == 1 and log.get(2).state is C.COMPLETED
    again = TransactionLog(VersionListingStore(str(tmp_path / "log")), "fake")  # a new log object, same process
    assert again.view().unfinished[0].state is C.COMPLETED
    assert store.gets == 0 and again.store.gets == 0


def test_log_inv9_a_record_changed_by_another_writer_is_read_again(tmp_path):
    """Another host changes record 2 behind this process's back (a raw put, no shared memory): its
    listed version differs from the one held, so the log reads it and decides on what is there now."""
    store = VersionListingStore(str(tmp_path / "log"))
    log = TransactionLog(store, "fake")
    committed(log, 1)
    held = log.transition(2, C.PENDING)
    other = CheckpointRecord(2, C.ABORTED, timestamps={"ABORTED": 1.0}, reason="the other driver")
    store.put("checkpoints/00000000000000000002.json", encode_record({"sink_id": "fake", "record": other.to_json()}))
    store.gets = 0
    assert [r.state for r in log.view().newer] == [C.ABORTED] and store.gets == 1
    with pytest.raises(ConcurrentWriterError):  # a decision on the held PENDING could not be written anyway
        log.transition(2, C.COMPLETED, handles={}, expected=(held, "stale"))


def test_log_inv9_a_record_created_after_the_listing_is_never_replaced(tmp_path):
    """Absent from this lock span's listing means absent to this process; another host creating the
    record meanwhile makes this process's create fail its compare-and-swap (invariant 7)."""
    store = VersionListingStore(str(tmp_path / "log"))
    log = TransactionLog(store, "fake")
    committed(log, 1)
    with log.locked():
        assert log.view().highest_committed == 1
        theirs = CheckpointRecord(2, C.PENDING, timestamps={"PENDING": 1.0}, reason="theirs")
        assert store.put_if_absent("checkpoints/00000000000000000002.json",
                                   encode_record({"sink_id": "fake", "record": theirs.to_json()}))
        assert log.get(2) is None  # the span's listing did not have it
        with pytest.raises(ConcurrentWriterError):
            log.transition(2, C.PENDING)
    assert log.get(2).reason == "theirs"
