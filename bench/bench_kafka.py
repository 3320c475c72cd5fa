"""Benchmark: the same Spark job into twophase-kafka exactly-once and at-least-once on librdkafka (the
default producer), exactly-once on kafka-python (``kafkaClient=kafka-python``), and into a no-op Python sink
(what Spark -> Python costs alone), plus bare producers in one process as ceilings, in one run. Prints a
markdown table; every ratio is against the at-least-once run of the same invocation.

The job: Spark's rate-micro-batch source (``--rows`` records per micro-batch, ``--partitions`` writer
tasks), each value ~100 bytes, written to a fresh topic. Batch 0 warms up and is not counted. For the
exactly-once runs the commit phase per batch (driver: ack collection, durable decision, EndTxn per
transaction, COMMITTED record) is read from the transaction log's timestamps (COMMITTED - PENDING).

    python bench/bench_kafka.py [--bootstrap H:P] [--rows 1000000] [--batches 3] [--partitions 2] [--rounds 2]
                                [--kp-rows 200000]

The kafka-python run is ~30x slower, so it runs one round of ``--kp-rows`` records per batch.

Without --bootstrap (or KAFKA_BOOTSTRAP_SERVERS) a local Apache Kafka broker (scripts/kafka_server.sh) is started for the run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _sparkbench import register_noop  # noqa: E402


#: mode -> (label, guarantee, kafkaClient or "noop")
MODES = {
    "eo": ("exactly-once, librdkafka (default)", "exactly-once", "librdkafka"),
    "alo": ("at-least-once, librdkafka", "at-least-once", "librdkafka"),
    "noop": ("no-op Python sink (Spark -> Python alone)", "-", "noop"),
    "eo-kp": ("exactly-once, kafka-python (kafkaClient=kafka-python)", "exactly-once", "kafka-python"),
}


def run_spark(spark, bootstrap: str, mode: str, rows: int, batches: int, partitions: int, tmp: str) -> dict:
    from integration.kafka.broker import create_topic, unique
    from twophase.sinks.kafka import KafkaSink

    label, guarantee, client = MODES[mode]
    topic = create_topic(bootstrap, unique(f"bench-{mode}"), partitions)
    ck = os.path.join(tmp, unique(f"ck-{mode}"))
    options = {"kafka.bootstrap.servers": bootstrap, "topic": topic, "checkpointLocation": ck,
               "guarantee": guarantee, "prefixRegistry": os.path.join(tmp, "registry"),
               "transactionalIdPrefix": unique("bench"), "kafkaClient": client}
    df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows)
          .option("numPartitions", partitions).load()
          .selectExpr("CAST(value AS STRING) AS key",
                      "concat(CAST(value AS STRING), ':', repeat('x', 90)) AS value"))
    if client == "noop":
        w = df.writeStream.format("bench-noop").option("checkpointLocation", ck)
    else:
        w = df.writeStream.format("twophase-kafka")
        for k, v in options.items():
            w = w.option(k, v)
    w = w.trigger(processingTime="0 seconds")
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
    result = {"guarantee": label, "mode": mode, "batches": len(progress), "rows": sum(p["numInputRows"] for p in progress),
              "seconds": sum(seconds), "batch_s": statistics.median(seconds)}
    result["rate"] = result["rows"] / result["seconds"]
    result["per_batch"] = [round(x, 2) for x in seconds]
    result["add_batch"] = [round(p["durationMs"]["addBatch"] / 1000, 2) for p in progress]
    if guarantee == "exactly-once":
        options.pop("kafkaClient")
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


def run_bare(bootstrap: str, n: int, partitions: int) -> dict:
    """A ceiling: one kafka-python producer (idempotent, acks=all) sending ``n`` such records from one process."""
    from kafka import KafkaProducer
    from integration.kafka.broker import create_topic, unique

    topic = create_topic(bootstrap, unique("bench-bare"), partitions)
    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, batch_size=256 * 1024, enable_idempotence=True)
    pad = b"x" * 90
    started = time.perf_counter()
    for i in range(n):
        p.send(topic, key=str(i).encode(), value=b"%d:%s" % (i, pad))
    p.flush()
    seconds = time.perf_counter() - started
    p.close()
    return {"guarantee": "bare kafka-python producer (one process)", "batches": 1, "rows": n, "seconds": seconds,
            "batch_s": float("nan"), "rate": n / seconds}


def run_bare_rdkafka(bootstrap: str, n: int, partitions: int) -> dict:
    """The ceiling: one librdkafka producer (idempotent, acks=all, the sink's settings) sending ``n`` such
    records from one process (``produce`` + ``poll(0)`` every 5,000, no per-record callback)."""
    from confluent_kafka import Producer
    from integration.kafka.broker import create_topic, unique

    topic = create_topic(bootstrap, unique("bench-bare-rd"), partitions)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1_000_000,
                  "enable.idempotence": True, "partitioner": "murmur2_random", "enable.sparse.connections": False})
    pad = b"x" * 90
    produce, poll = p.produce, p.poll
    started = time.perf_counter()
    for start in range(0, n, 5000):
        for i in range(start, min(n, start + 5000)):
            while True:
                try:
                    produce(topic, b"%d:%s" % (i, pad), str(i).encode())
                    break
                except BufferError:  # the queue is full: serve delivery reports, retry
                    poll(0.05)
        poll(0)
    p.flush()
    seconds = time.perf_counter() - started
    return {"guarantee": "bare librdkafka producer (one process)", "batches": 1, "rows": n, "seconds": seconds,
            "batch_s": float("nan"), "rate": n / seconds}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--kp-rows", type=int, default=200_000, help="records per micro-batch of the kafka-python run")
    ap.add_argument("--batches", type=int, default=3, help="micro-batches per mode, the first is warm-up")
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
        spark = make_spark("bench-kafka", cores=args.partitions, new_session=False)
        register_noop(spark)
        started = time.time()
        try:
            # alternate the order each round: on a shared 2-core machine, load from elsewhere moves a
            # single run by +-20%, more than the protocol costs; rounds average that out
            runs: dict[str, list[dict]] = {m: [] for m in MODES}
            fast = ["eo", "alo", "noop"]
            for r in range(args.rounds):
                for m in (fast if r % 2 == 0 else fast[::-1]):
                    runs[m].append(run_spark(spark, bootstrap, m, args.rows, args.batches, args.partitions, tmp))
                    print(f"# {runs[m][-1]}", flush=True)  # progress (the table comes at the end)
            runs["eo-kp"].append(run_spark(spark, bootstrap, "eo-kp", args.kp_rows, args.batches, args.partitions, tmp))
            print(f"# {runs['eo-kp'][-1]}", flush=True)
            res = {m: merge(rs) for m, rs in runs.items()}
        finally:
            spark.stop()
        n = args.rows * (args.batches - 1)
        bare_rd = run_bare_rdkafka(bootstrap, n, args.partitions)
        bare_kp = run_bare(bootstrap, min(n, 200_000), args.partitions)
        took = time.time() - started

    eo, alo = res["eo"], res["alo"]
    print(f"\ntwophase-kafka, {args.rows:,} records per micro-batch ({args.kp_rows:,} for kafka-python), "
          f"{args.partitions} writer tasks, ~100-byte values, {eo['batches']} measured batches per mode in "
          f"{args.rounds} alternating rounds (kafka-python: 1 round), broker {bootstrap}, {took:.0f}s in all\n")
    print("| run | records/s | median batch (s) | commit phase per batch (ms) | vs at-least-once | vs bare librdkafka |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in (eo, alo, res["eo-kp"], res["noop"], bare_rd, bare_kp):
        commit = f"{r['commit_ms']:.0f} (EndTxn + COMMITTED: {r['endtxn_ms']:.0f})" if "commit_ms" in r else "-"
        batch = f"{r['batch_s']:.2f}" if r["batch_s"] == r["batch_s"] else "-"
        print(f"| {r['guarantee']} | {r['rate']:,.0f} | {batch} | {commit} | {r['rate'] / alo['rate']:.2f} | "
              f"{r['rate'] / bare_rd['rate']:.2f} |")
    print(f"\nexactly-once / at-least-once = {eo['rate'] / alo['rate']:.2f} by total time, "
          f"{alo['batch_s'] / eo['batch_s']:.2f} by median batch (goal >= 0.9); "
          f"exactly-once / bare librdkafka = {eo['rate'] / bare_rd['rate']:.2f} (goal >= 0.5); "
          f"librdkafka / kafka-python exactly-once = {eo['rate'] / res['eo-kp']['rate']:.1f}x")
    for m, r in res.items():
        print(f"{r['guarantee']}: batch seconds {r['per_batch']}, addBatch {r['add_batch']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
