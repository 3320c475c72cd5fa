"""Benchmark: twophase-kafka against Spark's own Kafka sink (``writeStream.format("kafka")``, spark-sql-kafka-0-10,
at-least-once, in the JVM), the peer, in one run on one broker; then the sources (bench/bench_kafka_read.py).

The same Spark job into each sink: Spark's rate-micro-batch source (``--rows`` records per micro-batch,
``--partitions`` writer tasks), key ``CAST(value AS STRING)``, value ~100 bytes, each run into a fresh topic of
``--partitions`` partitions (the key decides the partition in both: murmur2). Rows of the table:

- Spark's kafka sink with its defaults (kafka-clients' producer: idempotent, acks=all, linger.ms=0,
  batch.size=16384): the baseline of every ratio;
- Spark's kafka sink with twophase's producer settings (``kafka.linger.ms=5``, ``kafka.batch.size=1000000``);
- twophase-kafka exactly-once on librdkafka (the default), with its commit phase per batch: the driver's
  ack collection, durable decision, one EndTxn per transaction and the COMMITTED record, read from the
  transaction log's timestamps (COMMITTED - PENDING; EndTxn + COMMITTED alone: COMMITTED - COMPLETED);
- the breakdown of what bounds the Python path: twophase-kafka at-least-once (no transaction), a no-op
  Python sink (what Spark -> Python as Arrow costs alone), exactly-once on kafka-python
  (``kafkaClient=kafka-python``, one round of ``--kp-rows``), and bare producers in one process
  (librdkafka, kafka-python) sending the same records, as ceilings of the per-record produce calls.

Batch 0 of each query warms up and is not counted; records/s is records over the ``triggerExecution`` time of
the measured batches. The modes alternate run by run and the order flips each round (``--rounds``), so load
from elsewhere on a shared machine hits baseline and candidate alike.

    python bench/bench_kafka.py [--quick] [--bootstrap H:P] [--rows 1000000] [--batches 3] [--partitions 2]
                                [--rounds 2] [--kp-rows 200000] [--no-source] [--source-rows 1000000]

``--quick``: 100,000 records per batch, one round, no kafka-python run, a small source comparison.
Without --bootstrap (or KAFKA_BOOTSTRAP_SERVERS) a local Apache Kafka broker (scripts/kafka_server.sh) is
started for the run. Spark's connector jars come from scripts/spark_kafka.sh (``.venv/jvm/spark-kafka``), given
to a Spark context of its own with ``spark.jars`` (integration/kafka/spark_kafka.py).
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

from _kafkacheck import check_topic  # noqa: E402
from _sparkbench import register_noop  # noqa: E402


#: mode -> (label, guarantee, kafkaClient, or "noop" / "spark")
MODES = {
    "spark": ("Spark's kafka sink (at-least-once, JVM), defaults", "at-least-once", "spark"),
    "spark-tuned": ("Spark's kafka sink, linger.ms=5 batch.size=1000000 (twophase's settings)", "at-least-once",
                    "spark"),
    "eo": ("twophase-kafka exactly-once, librdkafka (default)", "exactly-once", "librdkafka"),
    "alo": ("twophase-kafka at-least-once, librdkafka", "at-least-once", "librdkafka"),
    "noop": ("no-op Python sink (Spark -> Python alone)", "-", "noop"),
    "eo-kp": ("twophase-kafka exactly-once, kafka-python", "exactly-once", "kafka-python"),
}
#: Spark's kafka sink options per mode (its producer is configured with ``kafka.``-prefixed options)
SPARK_SINK_OPTIONS = {"spark": {}, "spark-tuned": {"kafka.linger.ms": "5", "kafka.batch.size": "1000000"}}


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
    elif client == "spark":
        w = (df.writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
             .option("checkpointLocation", ck))
        for k, v in SPARK_SINK_OPTIONS[mode].items():
            w = w.option(k, v)
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
    done = [p for p in q.recentProgress if p["numInputRows"] > 0]
    if len(done) < batches:
        raise TimeoutError(f"{label}: {batches} batches not done in 900s")
    if any(p["numInputRows"] != rows for p in done):
        raise AssertionError(f"{label}: micro-batches of {[p['numInputRows'] for p in done]} rows, not {rows}")
    progress = done[1:batches]  # skip warm-up batch 0
    seconds = [p["durationMs"]["triggerExecution"] / 1000 for p in progress]
    result = {"guarantee": label, "mode": mode, "batches": len(progress), "rows": sum(p["numInputRows"] for p in progress),
              "seconds": sum(seconds), "batch_s": statistics.median(seconds)}
    result["rate"] = result["rows"] / result["seconds"]
    result["per_batch"] = [round(x, 2) for x in seconds]
    result["add_batch"] = [round(p["durationMs"]["addBatch"] / 1000, 2) for p in progress]
    if guarantee == "exactly-once" and client != "spark":
        options.pop("kafkaClient")
        log = KafkaSink.from_options(options).transaction_log()
        ids = {p["batchId"] for p in progress}
        commit = [r.timestamps["COMMITTED"] - r.timestamps["PENDING"] for r in log.records()
                  if r.checkpoint_id in ids and "COMMITTED" in r.timestamps]
        endtxn = [r.timestamps["COMMITTED"] - r.timestamps["COMPLETED"] for r in log.records()
                  if r.checkpoint_id in ids and "COMMITTED" in r.timestamps]
        result["commit_ms"] = statistics.median(commit) * 1000 if commit else float("nan")
        result["endtxn_ms"] = statistics.median(endtxn) * 1000 if endtxn else float("nan")
    if client != "noop":  # what a read_committed reader sees is what the completed batches wrote
        result["check"] = check_topic(bootstrap, topic, rows, len(done), guarantee == "exactly-once", label)
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
    if "check" in out:
        out["check"] = {k: sum(r["check"][k] for r in results) for k in ("records", "duplicates")}
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
    label = "bare kafka-python producer (one process)"
    return {"guarantee": label, "batches": 1, "rows": n, "seconds": seconds, "batch_s": float("nan"),
            "rate": n / seconds, "check": check_topic(bootstrap, topic, n, 1, True, label)}


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
    left = p.flush(120)
    seconds = time.perf_counter() - started
    label = "bare librdkafka producer (one process)"
    if left:
        raise AssertionError(f"{label}: {left} records not acknowledged")
    return {"guarantee": label, "batches": 1, "rows": n, "seconds": seconds, "batch_s": float("nan"),
            "rate": n / seconds, "check": check_topic(bootstrap, topic, n, 1, True, label)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    ap.add_argument("--quick", action="store_true",
                    help="a small run: 100,000 records per batch, one round, no kafka-python run, small source runs")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--kp-rows", type=int, default=200_000, help="records per micro-batch of the kafka-python run")
    ap.add_argument("--batches", type=int, default=3, help="micro-batches per mode, the first is warm-up")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="runs per mode, alternating which mode goes first")
    ap.add_argument("--no-source", action="store_true", help="skip the source comparison (bench_kafka_read.py)")
    ap.add_argument("--source-rows", type=int, default=1_000_000, help="offsets per micro-batch of the source runs")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.rounds, args.kp_rows, args.source_rows = 100_000, 1, 0, 100_000
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import contextlib
    from integration.kafka.broker import kafka_broker
    from integration.kafka.spark_kafka import connector_version, spark_with_kafka_connector
    import bench_kafka_read

    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap or stack.enter_context(kafka_broker())
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-kafka-"))
        os.environ["TWOPHASE_STATE_DIR"] = tmp
        spark = spark_with_kafka_connector("bench-kafka", cores=args.partitions,
                                           conf={"spark.ui.showConsoleProgress": "false"})
        register_noop(spark)
        started = time.time()
        try:
            # alternate the order each round: on a shared 2-core machine, load from elsewhere moves a
            # single run by +-20%, more than the protocol costs; rounds average that out
            runs: dict[str, list[dict]] = {m: [] for m in MODES}
            fast = ["spark", "eo", "spark-tuned", "alo", "noop"]
            for r in range(args.rounds):
                for m in (fast if r % 2 == 0 else fast[::-1]):
                    runs[m].append(run_spark(spark, bootstrap, m, args.rows, args.batches, args.partitions, tmp))
                    print(f"# {runs[m][-1]}", file=sys.stderr, flush=True)  # progress (the tables come at the end)
            if args.kp_rows:
                runs["eo-kp"].append(run_spark(spark, bootstrap, "eo-kp", args.kp_rows, args.batches,
                                               args.partitions, tmp))
                print(f"# {runs['eo-kp'][-1]}", file=sys.stderr, flush=True)
            res = {m: merge(rs) for m, rs in runs.items() if rs}
            source = None if args.no_source else bench_kafka_read.spark_source_comparison(
                spark, bootstrap, args.source_rows, args.batches, args.partitions, args.rounds, tmp)
        finally:
            spark.stop()
        n = args.rows * (args.batches - 1)
        bare_rd = run_bare_rdkafka(bootstrap, n, args.partitions)
        bare_kp = run_bare(bootstrap, min(n, 200_000), args.partitions)
        took = time.time() - started

    import confluent_kafka
    import kafka
    import pyspark
    base, eo = res["spark"], res["eo"]
    print(f"\ntwophase-kafka against Spark's kafka sink: {args.rows:,} records per micro-batch"
          f"{f' ({args.kp_rows:,} for kafka-python)' if args.kp_rows else ''}, {args.partitions} writer tasks and "
          f"topic partitions, ~100-byte values, {base['batches']} measured batches per mode in {args.rounds} "
          f"alternating rounds, broker {bootstrap}, {took:.0f}s in all. PySpark {pyspark.__version__}, "
          f"spark-sql-kafka-0-10 {connector_version()}, confluent-kafka {confluent_kafka.__version__} (librdkafka "
          f"{confluent_kafka.libversion()[0]}), kafka-python {kafka.__version__}\n")
    print("| run | records/s | median batch (s) | commit phase per batch (ms) | read back (read_committed) | "
          "vs Spark's kafka sink |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in [res[m] for m in ("spark", "spark-tuned", "eo", "alo", "eo-kp", "noop") if m in res] + [bare_rd, bare_kp]:
        commit = f"{r['commit_ms']:.0f} (EndTxn + COMMITTED: {r['endtxn_ms']:.0f})" if "commit_ms" in r else "-"
        batch = f"{r['batch_s']:.2f}" if r["batch_s"] == r["batch_s"] else "-"
        check = f"{r['check']['records']:,}, {r['check']['duplicates']} dup." if "check" in r else "-"
        print(f"| {r['guarantee']} | {r['rate']:,.0f} | {batch} | {commit} | {check} | "
              f"{r['rate'] / base['rate']:.2f} |")
    print("\nread back: every record a read_committed reader sees in the runs' topics (all batches, the warm-up "
          "and any batch done before the stop included), each checked against the completed batches' keys")
    print(f"\ntwophase-kafka exactly-once / Spark's kafka sink = {eo['rate'] / base['rate']:.2f} (goal >= 0.8; "
          f"{eo['rate'] / res['spark-tuned']['rate']:.2f} against Spark's sink with twophase's producer settings); "
          f"exactly-once / at-least-once = {eo['rate'] / res['alo']['rate']:.2f}; "
          f"exactly-once / bare librdkafka = {eo['rate'] / bare_rd['rate']:.2f}; "
          f"no-op Python sink / Spark's sink = {res['noop']['rate'] / base['rate']:.2f}")
    for m, r in res.items():
        print(f"{r['guarantee']}: batch seconds {r['per_batch']}, addBatch {r['add_batch']}")
    if source is not None:
        bench_kafka_read.print_source_table(source, args.source_rows, args.batches, args.partitions, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
