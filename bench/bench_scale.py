"""Cost as history grows (issue 24): the commit phase of one batch, and the requests it makes, while the
destination already holds 1,000 to 100,000 files of earlier batches. A streaming sink runs for months; its
per-batch cost must not grow with what it wrote before. Goal: flat within 1.5x (largest/smallest size).

Sinks are driven without Spark (``run_task`` for the tasks, ``CheckpointCoordinator.complete_batch`` for the
driver, sweeping after each commit as Spark's adapter does). Measured per batch (median of ``--batches``
batches at each size), for the commit phase only (``complete_batch``: the log records, the completions,
the sweep):

- ``files`` (local file sink), ``delta`` (local Delta table, unpartitioned: the case that read every name of
  the root): the directory entries read (``os.scandir``/``os.listdir``/``os.walk`` spied) and their calls;
- ``s3`` (radosgw, ``scripts/s3_server.sh``): HTTP requests (botocore's ``Endpoint._send``), listings among them;
- ``delta-s3`` (Delta table on radosgw, partitioned): twophase's own HTTP requests (botocore: the data uploads'
  completion, the sweep's prefix listings, the log); delta-rs's Delta commit goes through its own Rust
  client and is not counted (its time is in the commit ms);
- ``azure`` (Azurite): HTTP requests (the Azure SDK's transport), List Blobs among them;
- ``kafka``, ``kafka-other-ids`` (one Apache Kafka broker, ``scripts/kafka_server.sh``, Kafka's default settings):
  the requests kafka-python sends to the broker (the driver's admin connection: FindCoordinator,
  DescribeTransactions in ``check_prepared``, EndTxn per transaction, ListTransactions in the sweep), ListTransactions
  among them, and the bytes of the responses (in the "entries" column). The sink's log is a local file (not
  counted). Also measured apart: the driver's start of each batch (Spark's ``prepare_sink``: validate, claim,
  recover). Kafka's "history" is not files: ``kafka`` grows the committed transactions already in the topic,
  made on the sink's own transactional ids (its whole id space, 10 records each); ``kafka-other-ids`` grows the
  transactional ids of other applications the cluster knows (each InitProducerId'd and one committed transaction
  of one record, in another topic), which ListTransactions walks on the broker.

The old files are made cheaply, and are the sink's own names (its token, ``part-<token>-<ckpt>-...``, of
checkpoints the bench never commits, in the partition folders the batches write): empty local files and S3
objects, 1-byte Azure blobs (a 0-byte blob with the sink's name is an abort's leftover the sweep rightly
drops). They are not in the sink's log nor in the Delta log: a reader would not see them in a Delta table,
and the listings must walk over them exactly as over real data files.

Run: ``.venv/bin/python bench/bench_scale.py [--sinks files,delta,s3,azure,kafka,kafka-other-ids]
[--sizes 1000,10000,100000] [--store-sizes 1000,10000,30000] [--other-ids 1000,10000] [--batches 5]``
(the Kafka targets start a JVM: run them under ``flock /tmp/twophase-spark.lock``). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "integration" / "s3")]

from twophase.coordinator import CheckpointCoordinator  # noqa: E402
from twophase.naming import part_file_name  # noqa: E402
from twophase.sink import TransactionContext, run_task  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string())])
TASKS = 2
ROWS = 1000
#: checkpoint ids of the old files: never committed by the bench (its batches are 1, 2, ...)
OLD_CID = 10_000_000


def rows(cid: int, task: int) -> pa.RecordBatch:
    lo = cid * 10_000 + task * ROWS
    ids = range(lo, lo + ROWS)
    return pa.record_batch({"id": pa.array(ids, pa.int64()), "p": ["even" if i % 2 == 0 else "odd" for i in ids]},
                           schema=SCHEMA)


class Counter:
    """Counts requests (or directory reads) while ``active``."""

    def __init__(self) -> None:
        self.active, self.requests, self.lists, self.entries = False, 0, 0, 0

    def reset(self) -> None:
        self.requests = self.lists = self.entries = 0


@contextlib.contextmanager
def local_spies(c: Counter) -> Iterator[None]:
    """os.scandir / os.listdir counted (calls as requests and listings, names read as entries); os.walk
    goes through os.scandir."""
    real_scandir, real_listdir = os.scandir, os.listdir

    class _Scan:
        def __init__(self, it: Any) -> None:
            self.it = it

        def __enter__(self) -> "_Scan":
            return self

        def __exit__(self, *a: Any) -> None:
            self.it.close()

        def close(self) -> None:
            self.it.close()

        def __iter__(self) -> "_Scan":
            return self

        def __next__(self) -> Any:
            e = next(self.it)
            if c.active:
                c.entries += 1
            return e

    def scandir(*a: Any, **k: Any) -> Any:
        it = real_scandir(*a, **k)
        if c.active:
            c.requests += 1
            c.lists += 1
        return _Scan(it)

    def listdir(*a: Any, **k: Any) -> list[str]:
        out = real_listdir(*a, **k)
        if c.active:
            c.requests += 1
            c.lists += 1
            c.entries += len(out)
        return out

    os.scandir, os.listdir = scandir, listdir  # type: ignore[assignment]
    try:
        yield
    finally:
        os.scandir, os.listdir = real_scandir, real_listdir  # type: ignore[assignment]


@contextlib.contextmanager
def botocore_spy(c: Counter) -> Iterator[None]:
    """Every HTTP request botocore sends (all clients of the process: the sink's and its log store's)."""
    from botocore.endpoint import Endpoint
    real = Endpoint._send

    def _send(self: Any, request: Any) -> Any:
        if c.active:
            c.requests += 1
            q = request.url.split("?", 1)[1] if "?" in request.url else ""
            if request.method == "GET" and ("uploads" in q or "list-type" in q or q == "" or "prefix=" in q):
                c.lists += 1
        return real(self, request)

    Endpoint._send = _send  # type: ignore[method-assign]
    try:
        yield
    finally:
        Endpoint._send = real  # type: ignore[method-assign]


@contextlib.contextmanager
def azure_spy(c: Counter) -> Iterator[None]:
    """Every HTTP request the Azure SDK's transport sends (the sink's clients and its log store's)."""
    from azure.core.pipeline.transport import RequestsTransport
    real = RequestsTransport.send

    def send(self: Any, request: Any, **kw: Any) -> Any:
        if c.active:
            c.requests += 1
            if "comp=list" in request.url:
                c.lists += 1
        return real(self, request, **kw)

    RequestsTransport.send = send  # type: ignore[method-assign]
    try:
        yield
    finally:
        RequestsTransport.send = real  # type: ignore[method-assign]


@contextlib.contextmanager
def kafka_spy(c: Counter) -> Iterator[dict[str, int]]:
    """Every request kafka-python sends (the driver's admin connection, :class:`TxnClient`, and any consumer it
    opens), counted by API (yielded dict); ListTransactions requests as "listings"; the bytes of every response
    received as "entries". The writers' librdkafka producers run before the commit phase and are not counted."""
    from kafka.net.connection import KafkaConnection
    real_send, real_recv = KafkaConnection._send_request, KafkaConnection.data_received
    by_api: dict[str, int] = {}

    def _send_request(self: Any, request: Any, *a: Any, **k: Any) -> Any:
        if c.active:
            name = type(request).__name__.split("_v")[0]
            by_api[name] = by_api.get(name, 0) + 1
            c.requests += 1
            if name.startswith("ListTransactions"):
                c.lists += 1
        return real_send(self, request, *a, **k)

    def data_received(self: Any, data: bytes) -> Any:
        if c.active:
            c.entries += len(data)
        return real_recv(self, data)

    KafkaConnection._send_request, KafkaConnection.data_received = _send_request, data_received  # type: ignore
    try:
        yield by_api
    finally:
        KafkaConnection._send_request, KafkaConnection.data_received = real_send, real_recv  # type: ignore


def old_names(sink_id: str, start: int, n: int, partitioned: bool) -> Iterator[str]:
    for i in range(start, start + n):
        name = part_file_name(sink_id, OLD_CID + i // 100, str(i % 100), uuid.uuid4().hex[:12], 0, "parquet")
        yield f"p={'even' if i % 2 else 'odd'}/{name}" if partitioned else name


def measure(sink: Any, c: Counter, grow: Callable[[int, int], None], sizes: list[int], batches: int,
            first_cid: int = 1, make_rows: Callable[[int, int], pa.RecordBatch] = rows,
            start: Optional[Callable[[], None]] = None) -> list[dict[str, float]]:
    """For each size: grow the destination to it, then run ``batches`` batches; medians per batch.
    ``start``: the driver's work before each batch (Spark's ``prepare_sink``), measured apart (``start_ms``,
    ``start_requests``), not in the commit phase."""
    log = sink.transaction_log()
    log.claim("bench")
    coord = CheckpointCoordinator(sink, log, sweep_after_commit=True)
    cid, have, out = first_cid, 0, []
    coord.complete_batch(cid, [run_task(sink, TransactionContext(sink.sink_id, cid, str(t)), [make_rows(cid, t)])
                               for t in range(TASKS)])
    for size in sizes:
        t0 = time.monotonic()
        grow(have, size - have)
        have = size
        print(f"  {size} old files made in {time.monotonic() - t0:.1f}s", file=sys.stderr)
        ms, req, lists, entries, start_ms, start_req = [], [], [], [], [], []
        for _ in range(batches):
            cid += 1
            if cid % 50 == 0:  # the periodic whole listing of the Azure sink (invariant 6) is reported apart
                cid += 1
            if start is not None:
                c.reset()
                c.active = True
                t0 = time.perf_counter()
                start()
                start_ms.append((time.perf_counter() - t0) * 1000)
                c.active = False
                start_req.append(c.requests)
            acks = [run_task(sink, TransactionContext(sink.sink_id, cid, str(t)), [make_rows(cid, t)])
                    for t in range(TASKS)]
            c.reset()
            c.active = True
            t0 = time.perf_counter()
            assert coord.complete_batch(cid, acks) == "COMMITTED"
            ms.append((time.perf_counter() - t0) * 1000)
            c.active = False
            req.append(c.requests)
            lists.append(c.lists)
            entries.append(c.entries)
        out.append({"size": size, "ms": statistics.median(ms), "requests": statistics.median(req),
                    "lists": statistics.median(lists), "entries": statistics.median(entries)})
        if start is not None:
            out[-1].update(start_ms=statistics.median(start_ms), start_requests=statistics.median(start_req))
        print(f"  {out[-1]}", file=sys.stderr)
    return out


def bench_files(sizes: list[int], batches: int) -> list[dict[str, float]]:
    from twophase.sinks.files import file_sink_from_options
    d = tempfile.mkdtemp(prefix="twophase-scale-files-")
    sink = file_sink_from_options({"path": f"{d}/out", "partitionBy": "p"}, SCHEMA)
    sink.validate_destination()

    def grow(start: int, n: int) -> None:
        for rel in old_names(sink.sink_id, start, n, True):
            p = Path(d, "out", rel)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.touch()
        os.sync()  # the old files were written long ago: their metadata is not in the next fsync's journal commit

    c = Counter()
    with local_spies(c):
        return measure(sink, c, grow, sizes, batches)


def bench_delta(sizes: list[int], batches: int) -> list[dict[str, float]]:
    from twophase.sinks.delta import DeltaSink
    d = tempfile.mkdtemp(prefix="twophase-scale-delta-")
    sink = DeltaSink.from_options({"path": f"{d}/t"}, SCHEMA)
    sink.validate_destination()

    def grow(start: int, n: int) -> None:
        for rel in old_names(sink.sink_id, start, n, False):
            Path(d, "t", rel).touch()
        os.sync()  # the old files were written long ago: their metadata is not in the next fsync's journal commit

    c = Counter()
    with local_spies(c):
        return measure(sink, c, grow, sizes, batches)


def _bench_on_s3(sink_class: Any, prefix: str, sizes: list[int], batches: int) -> list[dict[str, float]]:
    """One sink of ``sink_class`` at ``s3://<new bucket>/<prefix>`` on the project's S3 server, its old files made as
    empty objects with its own names; every botocore request of the process counted."""
    from _support import s3_server_fixture
    gen = s3_server_fixture()
    server = next(gen)
    try:
        bucket = server.new_bucket()
        sink = sink_class.from_options({"path": f"s3://{bucket}/{prefix}", "partitionBy": "p", **server.options()},
                                       SCHEMA)
        sink.validate_destination()
        client = server.client()

        def grow(start: int, n: int) -> None:
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda rel: client.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=b""),
                              old_names(sink.sink_id, start, n, True)))

        c = Counter()
        with botocore_spy(c):
            return measure(sink, c, grow, sizes, batches)
    finally:
        gen.close()


def bench_s3(sizes: list[int], batches: int) -> list[dict[str, float]]:
    from twophase.sinks.s3 import S3Sink
    return _bench_on_s3(S3Sink, "out", sizes, batches)


def bench_delta_s3(sizes: list[int], batches: int) -> list[dict[str, float]]:
    from twophase.sinks.delta import DeltaSink
    return _bench_on_s3(DeltaSink, "t", sizes, batches)


def bench_azure(sizes: list[int], batches: int) -> list[dict[str, float]]:
    from integration.azure.azurite import azure_server_fixture
    from twophase.sinks.files import file_sink_from_options
    gen = azure_server_fixture()
    server = next(gen)
    try:
        container = f"scale-{uuid.uuid4().hex[:8]}"
        server.service().create_container(container)
        sink = file_sink_from_options({"path": server.url(container, "out"), "partitionBy": "p", **server.options()},
                                      SCHEMA)
        sink.validate_destination()
        cc = server.service().get_container_client(container)
        control: list[float] = []

        def grow(start: int, n: int) -> None:
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda rel: cc.upload_blob(f"out/{rel}", b"x"), old_names(sink.sink_id, start, n, True)))
            # the server's own cost of one prefix listing that matches nothing (Azurite scans its whole
            # container for a prefix; Azure's index does not): a control for the commit's ms
            t0 = time.perf_counter()
            for _ in range(3):
                list(cc.list_blobs(name_starts_with="out/p=even/part-000000000000-", include=["uncommittedblobs"]))
            control.append((time.perf_counter() - t0) * 1000 / 3)

        c = Counter()
        with azure_spy(c):
            out = measure(sink, c, grow, sizes, batches)
            # the batch that lists the whole path (every FULL_SWEEP_EVERY checkpoints), at the largest size
            from twophase.sinks.azure_files import AzureBlobs
            cid = (sink.transaction_log().highest_committed() // AzureBlobs.FULL_SWEEP_EVERY + 1) * AzureBlobs.FULL_SWEEP_EVERY
            log = sink.transaction_log()
            coord = CheckpointCoordinator(sink, log, sweep_after_commit=True)
            acks = [run_task(sink, TransactionContext(sink.sink_id, cid, str(t)), [rows(cid, t)]) for t in range(TASKS)]
            c.reset()
            c.active = True
            t0 = time.perf_counter()
            coord.complete_batch(cid, acks)
            out[-1]["full_ms"] = (time.perf_counter() - t0) * 1000
            c.active = False
            out[-1]["full_requests"] = c.requests
            for r, ms in zip(out, control):
                r["server_ms"] = ms
            return out
    finally:
        gen.close()


#: records in each old committed transaction of the Kafka bench (history (a))
OLD_TXN_RECORDS = 10


def _producer(bootstrap: str, transactional_id: str) -> Any:
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 0,
                  "transaction.timeout.ms": 60000})
    p.init_transactions(60)
    return p


def _close(p: Any) -> None:
    p.flush(30)
    if hasattr(p, "close"):
        p.close()


def _kafka_sink(bootstrap: str, d: str, name: str) -> Any:
    from integration.kafka.broker import create_topic
    from twophase.sinks.kafka import KafkaSink
    topic = create_topic(bootstrap, f"scale-{name}-{uuid.uuid4().hex[:8]}", partitions=2)
    sink = KafkaSink.from_options({"kafka.bootstrap.servers": bootstrap, "topic": topic,
                                   "checkpointLocation": f"{d}/{name}/ck", "prefixRegistry": f"{d}/registry",
                                   "transactionalIdPrefix": f"scale-{name}"})
    sink.validate_destination()
    return sink


def _kafka_start(sink: Any) -> Callable[[], None]:
    """What Spark's adapter does on the driver before each micro-batch (``prepare_sink``: validate, claim, recover;
    recover sweeps only when the last commit did not)."""
    def start() -> None:
        sink.validate_destination()
        log = sink.transaction_log()
        log.claim("bench")
        CheckpointCoordinator(sink, log).recover()
    return start


def bench_kafka(sizes: list[int], batches: int) -> list[dict[str, float]]:
    """History (a): ``size`` committed transactions of :data:`OLD_TXN_RECORDS` records each in the sink's topic,
    made on the sink's own transactional ids (its whole id space, tasks x 2 generations x slots, as its earlier
    batches would), by librdkafka producers in parallel."""
    from integration.kafka.apache_kafka import apache_kafka_broker
    from integration.kafka.broker import key_value_batch
    with apache_kafka_broker() as bootstrap, tempfile.TemporaryDirectory(prefix="twophase-scale-kafka-") as d:
        sink = _kafka_sink(bootstrap, d, "own")
        ids = [sink.transactional_id(str(t), g, s) for t in range(TASKS) for g in (0, 1)
               for s in range(sink.options.attempt_slots)]

        def grow(start: int, n: int) -> None:
            def run(k: int) -> None:
                p = _producer(bootstrap, ids[k])
                try:
                    for i in range(n // len(ids) + (1 if k < n % len(ids) else 0)):
                        p.begin_transaction()
                        for r in range(OLD_TXN_RECORDS):
                            p.produce(sink.options.topic, key=f"old{r}".encode(), value=b"old", partition=(i + r) % 2)
                        p.commit_transaction(60)
                finally:
                    _close(p)
            with ThreadPoolExecutor(len(ids)) as pool:
                list(pool.map(run, range(len(ids))))

        c = Counter()
        with kafka_spy(c) as by_api:
            out = measure(sink, c, grow, sizes, batches, make_rows=lambda cid, t: key_value_batch(f"c{cid}t{t}", ROWS),
                          start=_kafka_start(sink))
        print(f"  kafka requests by API (all batches, commit + start): {by_api}", file=sys.stderr)
        return out


#: how many producers make other applications' transactional ids at once (history (b))
OTHER_IDS_PARALLEL = 16


def bench_kafka_other_ids(sizes: list[int], batches: int) -> list[dict[str, float]]:
    """History (b): ``size`` transactional ids of other applications known to the cluster, each made by a
    producer of its own (InitProducerId, then one committed transaction of one record in another topic), in
    parallel: they are CompleteCommit, kept by the broker for ``transactional.id.expiration.ms`` (7 days)."""
    from integration.kafka.apache_kafka import apache_kafka_broker
    from integration.kafka.broker import create_topic, key_value_batch
    with apache_kafka_broker() as bootstrap, tempfile.TemporaryDirectory(prefix="twophase-scale-kafka-") as d:
        sink = _kafka_sink(bootstrap, d, "app")
        other = create_topic(bootstrap, f"other-{uuid.uuid4().hex[:8]}", partitions=2)

        def grow(start: int, n: int) -> None:
            def run(i: int) -> None:
                p = _producer(bootstrap, f"other-app-{i}")
                try:
                    p.begin_transaction()
                    p.produce(other, value=b"x", partition=i % 2)
                    p.commit_transaction(60)
                finally:
                    _close(p)
            with ThreadPoolExecutor(OTHER_IDS_PARALLEL) as pool:
                list(pool.map(run, range(start, start + n)))

        c = Counter()
        with kafka_spy(c) as by_api:
            out = measure(sink, c, grow, sizes, batches, make_rows=lambda cid, t: key_value_batch(f"c{cid}t{t}", ROWS),
                          start=_kafka_start(sink))
        print(f"  kafka requests by API (all batches, commit + start): {by_api}", file=sys.stderr)
        return out


BENCHES = {"files": bench_files, "delta": bench_delta, "s3": bench_s3, "azure": bench_azure, "delta-s3": bench_delta_s3,
           "kafka": bench_kafka, "kafka-other-ids": bench_kafka_other_ids}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sinks", default="files,delta,s3,azure")
    ap.add_argument("--sizes", default="1000,10000,100000", help="old files, local sinks")
    ap.add_argument("--store-sizes", default="1000,10000,30000", help="old files, S3 and Azure")
    ap.add_argument("--other-ids", default="1000,10000", help="other applications' transactional ids, kafka-other-ids")
    ap.add_argument("--batches", type=int, default=5)
    a = ap.parse_args()
    rows_out = []
    for name in a.sinks.split(","):
        given = a.other_ids if name == "kafka-other-ids" else a.store_sizes if name in ("s3", "azure", "delta-s3") \
            else a.sizes
        sizes = [int(x) for x in given.split(",")]
        print(f"{name}: sizes {sizes}", file=sys.stderr)
        rows_out.append((name, BENCHES[name](sizes, a.batches)))
    print("| sink | old files | commit ms / batch | requests / batch (listings) | dir entries read | ratio ms largest/smallest | ratio requests |")
    print("|---|---|---|---|---|---|---|")
    for name, res in rows_out:
        lo, hi = res[0], res[-1]
        for r in res:
            last = r is hi
            print(f"| {name} | {r['size']:,} | {r['ms']:.1f} | {r['requests']:.0f} ({r['lists']:.0f}) | {r['entries']:.0f} | "
                  f"{hi['ms'] / lo['ms']:.2f}x | {hi['requests'] / max(lo['requests'], 1):.2f}x |" if last else
                  f"| {name} | {r['size']:,} | {r['ms']:.1f} | {r['requests']:.0f} ({r['lists']:.0f}) | {r['entries']:.0f} | | |")
        if "server_ms" in hi:
            print(f"| {name}, control: the server's time for one List Blobs matching nothing | "
                  + " / ".join(f"{r['size']:,}: {r['server_ms']:.1f} ms" for r in res) + " | | | | | |")
        if "full_requests" in hi:
            print(f"| {name}, the batch with the whole listing (1 in 50) | {hi['size']:,} | {hi['full_ms']:.1f} | "
                  f"{hi['full_requests']:.0f} | | | |")
        if "start_requests" in hi:
            print(f"| {name}, the driver's start of each batch (prepare_sink) | "
                  + " / ".join(f"{r['size']:,}: {r['start_ms']:.1f} ms, {r['start_requests']:.0f} requests" for r in res)
                  + f" | | | | {hi['start_ms'] / lo['start_ms']:.2f}x | "
                  f"{hi['start_requests'] / max(lo['start_requests'], 1):.2f}x |")
    print(f"\n(requests: HTTP requests for s3 and azure, directory reads for files and delta, kafka-python requests to "
          f"the broker for kafka (listings: ListTransactions; 'dir entries read': bytes of the responses); median of {a.batches} batches of {TASKS} tasks x {ROWS} rows at each size)")


if __name__ == "__main__":
    main()
