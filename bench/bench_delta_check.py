"""twophase-delta's check before the decision (``DeltaCommitter.check_prepared``, issue 24): its added
commit-phase cost. One table, batches alternating with and without the check (without: the base class's,
which finds nothing), ``bench_scale``'s rows (2 tasks x 1,000 rows, partitioned: 4 data files a batch),
spies and old files; the first two batches of each size are not counted. Prints a markdown table: median
commit ms of each mode, their ratio, and requests (local: stats of data files; S3: every botocore request).

Run: ``.venv/bin/python bench/bench_delta_check.py local,s3 [batches]`` (S3: the project's radosgw,
``scripts/s3_server.sh``, started and stopped here).
"""
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT), str(ROOT / "integration" / "s3")]
import bench_scale as b  # noqa: E402
from twophase.coordinator import CheckpointCoordinator  # noqa: E402
from twophase.sink import SinkCommitter, TransactionContext, run_task  # noqa: E402
from twophase.sinks.delta import DeltaCommitter, DeltaSink  # noqa: E402

REAL = DeltaCommitter.check_prepared


def run(sink, c, grow, sizes, n):
    log = sink.transaction_log(); log.claim("bench")
    coord = CheckpointCoordinator(sink, log, sweep_after_commit=True)
    cid, have = 0, 0
    for size in sizes:
        grow(have, size - have); have = size
        ms = {True: [], False: []}; req = {True: [], False: []}
        for k in range(n):
            cid += 1
            if cid % 50 == 0:
                cid += 1
            on = k % 2 == 0
            DeltaCommitter.check_prepared = REAL if on else SinkCommitter.check_prepared
            acks = [run_task(sink, TransactionContext(sink.sink_id, cid, str(t)), [b.rows(cid, t)]) for t in range(b.TASKS)]
            files = sum(len(a.handle["files"]) for a in acks)
            c.reset(); c.active = True
            t0 = time.perf_counter()
            assert coord.complete_batch(cid, acks) == "COMMITTED"
            dt = (time.perf_counter() - t0) * 1000
            c.active = False
            if k >= 2:
                ms[on].append(dt); req[on].append(c.requests)
        m1, m0 = statistics.median(ms[True]), statistics.median(ms[False])
        print(f"| {sink.options.uri.split(':')[0] if sink.options.on_s3 else 'local'} | {size:,} | {files} | {m0:.1f} | {m1:.1f} | "
              f"{m1 / m0:.3f}x | {statistics.median(req[False]):.0f} | {statistics.median(req[True]):.0f} |", flush=True)
    DeltaCommitter.check_prepared = REAL


def local(sizes, n, partitioned):
    d = tempfile.mkdtemp(prefix="dh-bench-delta-")
    sink = DeltaSink.from_options({"path": f"{d}/t", **({"partitionBy": "p"} if partitioned else {})}, b.SCHEMA)
    sink.validate_destination()

    def grow(start, k):
        for rel in b.old_names(sink.sink_id, start, k, partitioned):
            p = Path(d, "t", rel); p.parent.mkdir(parents=True, exist_ok=True); p.touch()
        os.sync()
    c = b.Counter()
    # local: count stats of data files (os.path.isfile) as the check's requests
    real_isfile = os.path.isfile
    def isfile(p):
        if c.active and p.endswith(".parquet"):
            c.requests += 1
        return real_isfile(p)
    os.path.isfile = isfile
    try:
        run(sink, c, grow, sizes, n)
    finally:
        os.path.isfile = real_isfile


def s3(sizes, n):
    from _support import s3_server_fixture
    from concurrent.futures import ThreadPoolExecutor
    gen = s3_server_fixture(); server = next(gen)
    try:
        bucket = server.new_bucket()
        sink = DeltaSink.from_options({"path": f"s3://{bucket}/t", "partitionBy": "p", **server.options()}, b.SCHEMA)
        sink.validate_destination()
        client = server.client()

        def grow(start, k):
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda rel: client.put_object(Bucket=bucket, Key=f"t/{rel}", Body=b""),
                              b.old_names(sink.sink_id, start, k, True)))
        c = b.Counter()
        with b.botocore_spy(c):
            run(sink, c, grow, sizes, n)
    finally:
        gen.close()


if __name__ == "__main__":
    print("| table | old files | files / batch | commit ms without check | with check | ratio | requests without | with |")
    print("|---|---|---|---|---|---|---|---|")
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 82
    what = sys.argv[1] if len(sys.argv) > 1 else "local,s3"
    if "local" in what:
        local([1000, 100000], n, partitioned=True)
    if "s3" in what:
        s3([1000, 10000], n)
