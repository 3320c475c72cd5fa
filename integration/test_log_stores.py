"""The invariants every object-store transaction log keeps (:class:`twophase.log_store.ObjectLogStore`,
``test_object_log_invN_*``), run on each store against its real server: S3 (radosgw, or moto) and Azure
Blob (Azurite). One test body per invariant, parametrized over the stores."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from twophase.errors import ConcurrentWriterError
from twophase.log import TransactionLog, encode_record, CheckpointRecord
from twophase.log_store import ObjectLogStore, open_store
from twophase.states import CheckpointState as C


@dataclass
class Backend:
    """One object store under test: ``location`` (fresh per test), ``store()`` (a new store object on it:
    no shared flock, no shared cache), ``raw_put`` (another writer, around the store), ``count_reads``
    (the network reads a store makes from now on) and ``configs`` (what a sink would hand open_store)."""

    name: str
    location: str
    store: Callable[[], ObjectLogStore]
    raw_put: Callable[[str, bytes], None]
    count_reads: Callable[[ObjectLogStore], list]
    configs: tuple


def _s3(server: Any) -> Backend:
    from twophase.log_s3 import S3Config, S3LogStore
    cfg = S3Config(server.endpoint, "us-east-1", server.access_key, server.secret_key)
    bucket = server.new_bucket()

    def count(store: Any) -> list:
        seen: list = []
        store.client.meta.events.register("provide-client-params.s3.GetObject", lambda params, **_: seen.append(params["Key"]))
        return seen
    return Backend("s3", f"s3://{bucket}/log", lambda: S3LogStore(f"s3://{bucket}/log", cfg),
                   lambda key, data: server.client().put_object(Bucket=bucket, Key=f"log/{key}", Body=data), count, (cfg,))


def _azure(server: Any) -> Backend:
    from twophase.log_azure import AzureLogStore
    cfg = server.config()
    container = server.new_container()
    location = server.url(container, "log")

    def count(store: Any) -> list:
        seen: list = []
        download = store._download
        store._download = lambda key: (seen.append(key), download(key))[1]
        return seen
    return Backend("azure", location, lambda: AzureLogStore(location, cfg),
                   lambda key, data: server.service().get_blob_client(container, f"log/{key}").upload_blob(data, overwrite=True),
                   count, (cfg,))


@pytest.fixture(params=["s3", "azure"])
def backend(request) -> Backend:
    if request.param == "s3":
        request.applymarker(pytest.mark.s3)
        return _s3(request.getfixturevalue("s3_server"))
    request.applymarker(pytest.mark.azure)
    return _azure(request.getfixturevalue("azure_server"))


def test_object_log_inv1_inv2_put_replaces_and_put_if_absent_has_one_winner(backend: Backend) -> None:
    store = backend.store()
    assert store.get("a") is None
    store.put("a", b"1")
    store.put("a", b"2")
    assert store.get("a") == b"2"
    wins = []
    barrier = threading.Barrier(8)

    def race(i: int) -> None:
        s = backend.store()  # each racer its own client, as separate drivers would be
        barrier.wait()
        wins.append(s.put_if_absent("owner.json", str(i).encode()))
    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wins.count(True) == 1 and len(wins) == 8
    assert store.list("") == ["a", "owner.json"]
    store.delete("a")
    store.delete("a")
    assert store.get("a") is None


def test_object_log_inv3_transitions_are_compare_and_swap_on_the_server(backend: Backend) -> None:
    """Two drivers (two stores: no shared flock) read the same PENDING record; the server refuses the
    second COMPLETED (If-Match), so one checkpoint never has two decisions (log invariant 7); of six
    drivers creating one record, exactly one wins (If-None-Match)."""
    a, b = TransactionLog(backend.store(), "s"), TransactionLog(backend.store(), "s")
    a.transition(3, C.PENDING)
    seen_a, seen_b = a.get_versioned(3), b.get_versioned(3)
    a.transition(3, C.COMPLETED, handles={"0": {"h": "a"}}, expected=seen_a)
    with pytest.raises(ConcurrentWriterError):
        b.transition(3, C.COMPLETED, handles={"0": {"h": "b"}}, expected=seen_b)
    assert b.get(3).handles == {"0": {"h": "a"}}
    assert backend.store().put_if_version("checkpoints/gone.json", b"x", seen_a[1]) is None  # If-Match on nothing
    wins: list[bool] = []
    barrier = threading.Barrier(6)

    def create(i: int) -> None:
        log = TransactionLog(backend.store(), "s")
        barrier.wait()
        try:
            log.transition(7, C.PENDING, expected=(None, None), reason=str(i))
            wins.append(True)
        except ConcurrentWriterError:
            wins.append(False)
    threads = [threading.Thread(target=create, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wins.count(True) == 1 and len(wins) == 6


def test_object_log_inv4_lock_is_exclusive_between_stores_of_one_location(backend: Backend) -> None:
    a, b = backend.store(), backend.store()
    order: list[str] = []

    def other() -> None:
        with b.lock():
            order.append("b")
    with a.lock():
        with a.lock():  # re-entrant
            t = threading.Thread(target=other)
            t.start()
            time.sleep(0.3)
            order.append("a released")
    t.join(10)
    assert order == ["a released", "b"]


def test_object_log_inv5_listed_versions_spare_reads_of_records_already_held(backend: Backend) -> None:
    """The listing reports the version the put returned, so a record this process wrote is never read
    back (log invariant 9); a record another writer changed has another version and is read again."""
    log = TransactionLog(backend.store(), "s")
    log.transition(1, C.PENDING)
    log.transition(1, C.COMPLETED, handles={})
    log.transition(1, C.COMMITTED)
    log.transition(2, C.PENDING)
    reads = backend.count_reads(log.store)
    with log.locked():
        assert log.view().highest_committed == 1 and log.get(2).state is C.PENDING and log.get(3) is None
    assert reads == []
    other = CheckpointRecord(2, C.ABORTED, timestamps={"ABORTED": 1.0}, reason="another driver")
    backend.raw_put("checkpoints/00000000000000000002.json", encode_record({"sink_id": "s", "record": other.to_json()}))
    assert [r.reason for r in log.view().newer] == ["another driver"]
    assert reads == ["log/checkpoints/00000000000000000002.json"]


def test_object_log_opened_by_url_refuses_a_second_owner(backend: Backend) -> None:
    """``log.location`` URLs open the store of their scheme (open_store, with the configs a sink has)."""
    log = TransactionLog(open_store(backend.location, *backend.configs), "sink")
    assert type(log.store).__name__ == {"s3": "S3LogStore", "azure": "AzureLogStore"}[backend.name]
    log.claim("query-a")
    log.claim("query-a")
    with pytest.raises(ConcurrentWriterError):
        TransactionLog(open_store(backend.location, *backend.configs), "sink").claim(f"query-{uuid.uuid4().hex[:4]}")
