"""Benchmark: the same Spark job into twophase-kafka exactly-once and at-least-once, and a bare kafka-python
producer as the ceiling, in one run. Prints a markdown table.

The job: Spark's rate-micro-batch source (``--rows`` records per micro-batch, ``--partitions`` writer
tasks), each value ~100 bytes, written to a fresh topic. Batch 0 warms up and is not counted. For the
exactly-once run the commit phase per batch (driver: ack collection, durable decision, EndTxn per
transaction, COMMITTED record) is read from the transaction log's timestamps (COMMITTED - PENDING).

    python bench/bench_kafka.py [--bootstrap H:P] [--rows 100000] [--batches 4] [--partitions 2] [--rounds 2]

Without --bootstrap (or KAFKA_BOOTSTRAP_SERVERS) a local noida-db broker is started for the run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_spark(spark, bootstrap: str, guarantee: str, rows: int, batches: int, partitions: int, tmp: str) -> dict:
    from integration.kafka.broker import create_topic, unique
    from twophase.sinks.kafka import KafkaSink

    topic = create_topic(bootstrap, unique(f"bench-{guarantee}"), partitions)
    ck = os.path.join(tmp, f"ck-{guarantee}")
    options = {"kafka.bootstrap.servers": bootstrap, "topic": topic, "checkpointLocation": ck,
               "guarantee": guarantee, "prefixRegistry": os.path.join(tmp, "registry"),
               "transactionalIdPrefix": unique("bench")}
    df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows)
          .option("numPartitions", partitions).load()
          .selectExpr("CAST(value AS STRING) AS key",
                      "concat(CAST(value AS STRING), ':', repeat('x', 90)) AS value"))
    w = df.writeStream.format("twophase-kafka").trigger(processingTime="0 seconds")
    for k, v in options.items():
        w = w.option(k, v)
    q = w.start()
    try:
        deadline = time.time() + 900
        while len(q.recentProgress) < batches and time.time() < deadline:
            if q.exception() is not None:
                raise RuntimeError(str(q.exception()))
            time.sleep(0.2)
    finally:
        q.stop()
    progress = [p for p in q.recentProgress if p["numInputRows"] > 0][1:batches]  # skip warm-up batch 0
    seconds = [p["durationMs"]["triggerExecution"] / 1000 for p in progress]
    result = {"guarantee": guarantee, "batches": len(progress), "rows": sum(p["numInputRows"] for p in progress),
              "seconds": sum(seconds), "batch_s": statistics.median(seconds)}
    result["rate"] = result["rows"] / result["seconds"]
    result["per_batch"] = [round(x, 2) for x in seconds]
    result["add_batch"] = [round(p["durationMs"]["addBatch"] / 1000, 2) for p in progress]
    if guarantee == "exactly-once":
        log = KafkaSink.from_options(options).transaction_log()
        ids = {p["batchId"] for p in progress}
        commit = [r.timestamps["COMMITTED"] - r.timestamps["PENDING"] for r in log.records()
                  if r.checkpoint_id in ids and "COMMITTED" in r.timestamps]
        endtxn = [r.timestamps["COMMITTED"] - r.timestamps["COMPLETED"] for r in log.records()
                  if r.checkpoint_id in ids and "COMMITTED" in r.timestamps]
        result["commit_ms"] = statistics.median(commit) * 1000 if commit else float("nan")
        result["endtxn_ms"] = statistics.median(endtxn) * 1000 if endtxn else float("nan")
    return result


def merge(results: list[dict]) -> dict:
    """Pool the measured batches of several runs of one mode."""
    out = dict(results[0])
    out["per_batch"] = [x for r in results for x in r["per_batch"]]
    out["add_batch"] = [x for r in results for x in r["add_batch"]]
    out["batches"] = len(out["per_batch"])
    out["rows"] = sum(r["rows"] for r in results)
    out["seconds"] = sum(r["seconds"] for r in results)
    out["rate"] = out["rows"] / out["seconds"]
    out["batch_s"] = statistics.median(out["per_batch"])
    for key in ("commit_ms", "endtxn_ms"):
        if key in out:
            out[key] = statistics.median(r[key] for r in results)
    return out


def run_bare(bootstrap: str, rows: int, batches: int, partitions: int) -> dict:
    """The ceiling: one kafka-python producer (idempotent, acks=all) sending the same records from one process."""
    from kafka import KafkaProducer
    from integration.kafka.broker import create_topic, unique

    topic = create_topic(bootstrap, unique("bench-bare"), partitions)
    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, batch_size=256 * 1024, enable_idempotence=True)
    pad = b"x" * 90
    n = rows * (batches - 1)
    started = time.perf_counter()
    for i in range(n):
        p.send(topic, key=str(i).encode(), value=b"%d:%s" % (i, pad))
    p.flush()
    seconds = time.perf_counter() - started
    p.close()
    return {"guarantee": "bare kafka-python producer", "batches": batches - 1, "rows": n, "seconds": seconds,
            "batch_s": seconds / (batches - 1), "rate": n / seconds}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--batches", type=int, default=4, help="micro-batches per mode, the first is warm-up")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="runs per mode, alternating which mode goes first")
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import contextlib
    from integration.kafka.broker import kafka_broker
    from integration.spark_session import make_spark

    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap or stack.enter_context(kafka_broker())
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-kafka-"))
        os.environ["TWOPHASE_STATE_DIR"] = tmp
        spark = make_spark("bench-kafka", cores=args.partitions)
        try:
            # alternate the order each round: on a shared 2-core machine, load from elsewhere moves a
            # single run by +-20%, more than the protocol costs; rounds average that out
            runs: dict[str, list[dict]] = {"exactly-once": [], "at-least-once": []}
            for r in range(args.rounds):
                order = ["exactly-once", "at-least-once"] if r % 2 == 0 else ["at-least-once", "exactly-once"]
                for g in order:
                    runs[g].append(run_spark(spark, bootstrap, g, args.rows, args.batches, args.partitions, tmp))
            eo, alo = merge(runs["exactly-once"]), merge(runs["at-least-once"])
        finally:
            spark.stop()
        bare = run_bare(bootstrap, args.rows, args.batches, args.partitions)

    print(f"\ntwophase-kafka, {args.rows:,} records per micro-batch, {args.partitions} writer tasks, "
          f"~100-byte values, {eo['batches']} measured batches per mode in {args.rounds} alternating rounds (broker {bootstrap})\n")
    print("| run | records/s | median batch (s) | commit phase per batch (ms) | vs at-least-once |")
    print("|---|---:|---:|---:|---:|")
    for r in (eo, alo, bare):
        commit = f"{r['commit_ms']:.0f} (EndTxn + COMMITTED: {r['endtxn_ms']:.0f})" if "commit_ms" in r else "-"
        print(f"| {r['guarantee']} | {r['rate']:,.0f} | {r['batch_s']:.2f} | {commit} | {r['rate'] / alo['rate']:.2f} |")
    print(f"\nexactly-once / at-least-once = {eo['rate'] / alo['rate']:.2f} by total time, "
          f"{alo['batch_s'] / eo['batch_s']:.2f} by median batch (goal >= 0.9)")
    for r in (eo, alo):
        print(f"{r['guarantee']}: batch seconds {r['per_batch']}, addBatch {r['add_batch']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
