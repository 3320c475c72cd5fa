"""The invariants every object-store transaction log keeps (:class:`twophase.log_store.ObjectLogStore`,
``test_object_log_invN_*``), run on each store against its real server: S3 (radosgw, or moto) and Azure
Blob (Azurite). One test body per invariant, parametrized over the stores."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
import socket
import urllib.parse
from dataclasses import dataclass, replace
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
    #: the server's endpoint URL, and a new store on ``location`` that reaches the server through another one
    endpoint: str = ""
    store_via: Callable[[str], ObjectLogStore] = None  # type: ignore[assignment]


def _s3(server: Any) -> Backend:
    from twophase.log_s3 import S3Config, S3LogStore
    cfg = S3Config(server.endpoint, "us-east-1", server.access_key, server.secret_key)
    bucket = server.new_bucket()

    def count(store: Any) -> list:
        seen: list = []
        store.client.meta.events.register("provide-client-params.s3.GetObject", lambda params, **_: seen.append(params["Key"]))
        return seen
    return Backend("s3", f"s3://{bucket}/log", lambda: S3LogStore(f"s3://{bucket}/log", cfg),
                   lambda key, data: server.client().put_object(Bucket=bucket, Key=f"log/{key}", Body=data), count, (cfg,),
                   server.endpoint,
                   lambda endpoint: S3LogStore(f"s3://{bucket}/log", replace(cfg, endpoint=endpoint)))


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
                   count, (cfg,), cfg.endpoint,
                   lambda endpoint: AzureLogStore(location, replace(cfg, endpoint=endpoint)))


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


class LoseOneAnswer:
    """A TCP proxy in front of ``endpoint`` (an http:// URL) that loses the answer to one request: once armed
    with a marker, the next request whose first line holds it reaches the server (which applies it), and the
    connection is closed as its final answer comes back (an interim ``100 Continue`` passes). The client never hears of it and re-sends the request
    (botocore and the Azure SDK retry a closed connection), as after a network cut. Every other byte passes."""

    def __init__(self, endpoint: str) -> None:
        u = urllib.parse.urlsplit(endpoint)
        self.upstream = (u.hostname, u.port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}{u.path}"
        self.marker: bytes = b""
        self.lost = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, marker: str) -> None:
        with self._lock:
            self.marker = marker.encode()

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        server = socket.create_connection(self.upstream)
        doomed = threading.Event()

        def down() -> None:  # the server's answers to the client, but the doomed one
            try:
                while data := server.recv(65536):
                    if doomed.is_set() and not data.startswith(b"HTTP/1.1 100 "):  # the final answer, not
                        # the interim 100 Continue (botocore sends Expect: 100-continue: the body follows it)
                        with self._lock:
                            self.lost += 1
                        break
                    client.sendall(data)
            except OSError:
                pass
            for sock in (client, server):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

        threading.Thread(target=down, daemon=True).start()
        try:
            while data := client.recv(65536):
                with self._lock:
                    if self.marker and data.startswith(b"PUT ") and self.marker in data.split(b"\r\n", 1)[0]:
                        self.marker = b""
                        doomed.set()  # before the request goes out: its answer is the next bytes back
                server.sendall(data)
        except OSError:
            pass


def test_object_log_inv3_a_conditional_write_whose_answer_was_lost_is_the_writers_own(backend: Backend) -> None:
    """The answer to a conditional write (If-None-Match: * for a new record, If-Match for a transition) is lost
    after the server applied it; the client re-sends, and the server refuses the copy (412 / 409: the object
    is no longer absent, or no longer at the version read). The store recognises its own bytes there and
    reports the write as done: the log records the transition once and the query goes on, instead of
    stopping with ConcurrentWriterError over its own record. Another writer's record is still refused."""
    proxy = LoseOneAnswer(backend.endpoint)
    try:
        log = TransactionLog(backend.store_via(proxy.endpoint), "s")
        log.transition(3, C.PENDING)
        log.transition(3, C.ABORTED, reason="the store learns the endpoint's If-Match form (S3)")
        name = "checkpoints/00000000000000000004.json"
        proxy.arm(name)
        log.transition(4, C.PENDING)  # the create's answer is lost
        proxy.arm(name)
        log.transition(4, C.COMPLETED, handles={"0": {"h": "a"}})  # the compare-and-swap's answer is lost
        assert proxy.lost == 2, "the proxy lost no answer: the test did not test"
        log.transition(4, C.COMMITTED)
        assert TransactionLog(backend.store(), "s").get(4).state is C.COMMITTED
        other = TransactionLog(backend.store(), "s")
        seen = other.get_versioned(4)
        log.transition(5, C.PENDING)
        log.transition(5, C.ABORTED, reason="this driver")
        with pytest.raises(ConcurrentWriterError):  # a record another writer changed is still refused
            other.transition(5, C.PENDING, expected=(None, None))
        assert seen[0].state is C.COMMITTED
    finally:
        proxy.close()
