"""The Kafka source against Spark's own (``readStream.format("kafka")``, spark-sql-kafka-0-10) in one Spark
job each, and its read path alone (no Spark).

1. In Spark (the peer, goal twophase / Spark >= 0.8): a topic of ``--partitions`` partitions is filled with
   ``--rows x --batches`` records (~100-byte values, keyed, round-robin over the partitions); Spark's
   ``kafka`` source and twophase's ``twophase-kafka`` source read it from the earliest offsets with
   ``maxOffsetsPerTrigger=--rows`` (so the same micro-batches: one task per partition), both at
   ``read_committed`` (twophase's source always reads committed; Spark's default is read_uncommitted,
   which reads this non-transactional topic at the same cost), into Spark's JVM ``noop`` sink. Batch 0 is
   the warm-up; records/s is from the progress events of batches 1..N (``triggerExecution``). The two
   alternate run by run (``--rounds``), so load from elsewhere hits both.
2. The read path alone: one process reads one split ``[0, end)`` of one partition with read_committed and
   builds the source's Arrow batches: ``KafkaSplitReader.read`` (what executors run) with
   ``kafkaClient=kafka-python`` and with the default librdkafka reader, and a bare librdkafka
   ``consume()`` loop without Arrow as the ceiling; ratios against the kafka-python reader.

    python bench/bench_kafka_read.py [--quick] [--rows 1000000] [--batches 3] [--partitions 2] [--rounds 2]
                                     [--records 500000] [--no-spark] [--bootstrap H:P]

``bench/bench_kafka.py`` runs part 1 too, after its sink runs, in the same Spark session.

Without --bootstrap (or KAFKA_BOOTSTRAP_SERVERS) a local Apache Kafka broker (scripts/kafka_server.sh) is started for the run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _kafkacheck import check_topic  # noqa: E402


def fill(bootstrap: str, topic: str, records: int, partitions: int = 1) -> None:
    """``records`` keyed records of ~100 bytes, record i at partition ``i % partitions``."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20,
                  "queue.buffering.max.messages": 1_000_000, "enable.idempotence": True})
    value = b"x" * 100
    for i in range(records):
        while True:
            try:
                p.produce(topic, value, str(i).encode(), partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
        if i % 10_000 == 0:
            p.poll(0)
    if p.flush(120) != 0:
        raise RuntimeError(f"filling {topic}: {len(p)} records not acknowledged")


#: Spark source runs: name -> (label, format, extra options)
SPARK_SOURCES = {
    "spark": ("Spark's kafka source (JVM, spark-sql-kafka-0-10)", "kafka",
              {"kafka.isolation.level": "read_committed"}),
    "twophase": ("twophase-kafka source (librdkafka reader, Python)", "twophase-kafka", {}),
    "arrow": ("a Python source yielding ready Arrow batches of the same rows (Spark <- Python alone, ceiling)",
              "bench-kafka-arrow", {}),
}


def register_arrow_ceiling(spark: Any) -> None:
    """Register ``bench-kafka-arrow``: a Python streaming source with the Kafka source's schema whose reader
    yields one ready Arrow batch of 10,000 such records (~100-byte values) over and over, no Kafka, no
    per-record Python: what handing the source's rows from Python to Spark costs alone.
    ``maxOffsetsPerTrigger`` records per micro-batch over ``minPartitions`` (default 2) tasks."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from twophase.sources._kafka_source_options import SPARK_SCHEMA_DDL, arrow_schema

    class Range(InputPartition):
        def __init__(self, lo: int, hi: int) -> None:
            self.lo, self.hi = lo, hi

    class Reader(DataSourceStreamReader):
        def __init__(self, rows: int, parts: int) -> None:
            self.rows, self.parts = rows, parts

        def initialOffset(self) -> dict:
            return {"n": 0}

        def latestOffset(self, start: dict = None, limit: Any = None) -> dict:  # type: ignore[override]
            return {"n": (start or {"n": 0})["n"] + self.rows}

        def partitions(self, start: dict, end: dict) -> list:
            lo, hi = start["n"], end["n"]
            step = -(-(hi - lo) // self.parts)
            return [Range(a, min(hi, a + step)) for a in range(lo, hi, step)]

        def read(self, partition: Any) -> Any:
            import pyarrow as pa
            n = 10_000
            batch = pa.RecordBatch.from_pydict(
                {"key": [str(i).encode() for i in range(n)], "value": [b"%d:%s" % (i, b"x" * 90) for i in range(n)],
                 "topic": ["t"] * n, "partition": [0] * n, "offset": list(range(n)), "timestamp": [0] * n,
                 "timestampType": [0] * n}, schema=arrow_schema(False))
            left = partition.hi - partition.lo
            while left > 0:
                yield batch if left >= n else batch.slice(0, left)
                left -= n

        def commit(self, end: dict) -> None:
            pass

    class Source(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench-kafka-arrow"

        def schema(self) -> str:
            return SPARK_SCHEMA_DDL

        def streamReader(self, schema: Any) -> Any:
            return Reader(int(self.options["maxOffsetsPerTrigger"]), int(self.options.get("minPartitions", 2)))

    spark.dataSource.register(Source)


def run_spark_source(spark: Any, bootstrap: str, topic: str, mode: str, rows: int, batches: int, tmp: str,
                     timeout: float = 900, partitions: int = 2) -> dict:
    """One streaming query of source ``mode`` over ``topic`` from the earliest offsets, ``rows`` offsets per
    micro-batch, into Spark's ``noop`` sink; batches 1..``batches``-1 timed from the progress events."""
    from integration.kafka.broker import unique
    label, fmt, extra = SPARK_SOURCES[mode]
    r = (spark.readStream.format(fmt).option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", rows))
    for k, v in extra.items():
        r = r.option(k, v)
    if mode == "arrow":  # as many tasks as the topic has partitions
        r = r.option("minPartitions", partitions)
    q = (r.load().writeStream.format("noop").option("checkpointLocation", os.path.join(tmp, unique(f"ck-src-{mode}")))
         .trigger(processingTime="0 seconds").start())
    try:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if q.exception() is not None:
                raise RuntimeError(f"{label}: {q.exception()}")
            done = [p for p in q.recentProgress if p["numInputRows"] > 0]
            if len(done) >= batches:
                break
            q.awaitTermination(0.2)
        else:
            raise TimeoutError(f"{label}: {batches} batches not done in {timeout:.0f}s")
    finally:
        q.stop()
    done = [p for p in q.recentProgress if p["numInputRows"] > 0]
    if any(p["numInputRows"] != rows for p in done):  # every batch reads its maxOffsetsPerTrigger records
        raise AssertionError(f"{label}: micro-batches of {[p['numInputRows'] for p in done]} rows, not {rows}")
    progress = done[1:batches]  # batch 0 is the warm-up
    seconds = [p["durationMs"]["triggerExecution"] / 1000 for p in progress]
    out = {"label": label, "mode": mode, "rows": sum(p["numInputRows"] for p in progress),
           "seconds": sum(seconds), "per_batch": [round(x, 2) for x in seconds]}
    out["rate"] = out["rows"] / out["seconds"]
    return out


def spark_source_comparison(spark: Any, bootstrap: str, rows: int, batches: int, partitions: int, rounds: int,
                            tmp: str) -> dict[str, dict]:
    """Both sources over one topic of ``rows * batches`` records, alternating which goes first each round;
    the runs of a mode are pooled (records / seconds over all their measured batches)."""
    from integration.kafka.broker import create_topic, unique
    register_arrow_ceiling(spark)
    topic = create_topic(bootstrap, unique("bench-src"), partitions)
    fill(bootstrap, topic, rows * batches, partitions)
    check_topic(bootstrap, topic, rows * batches, 1, True, "the source benchmark's topic")  # every record once
    runs: dict[str, list[dict]] = {m: [] for m in SPARK_SOURCES}
    order = list(SPARK_SOURCES)
    for r in range(rounds):
        for m in (order if r % 2 == 0 else order[::-1]):
            runs[m].append(run_spark_source(spark, bootstrap, topic, m, rows, batches, tmp,
                                            partitions=partitions))
            print(f"# source {runs[m][-1]}", file=sys.stderr, flush=True)
    res = {}
    for m, rs in runs.items():
        res[m] = {"label": rs[0]["label"], "rows": sum(x["rows"] for x in rs), "seconds": sum(x["seconds"] for x in rs),
                  "per_batch": [b for x in rs for b in x["per_batch"]]}
        res[m]["rate"] = res[m]["rows"] / res[m]["seconds"]
        res[m]["batch_s"] = statistics.median(res[m]["per_batch"])
    return res


def print_source_table(res: dict[str, dict], rows: int, batches: int, partitions: int, rounds: int) -> None:
    base = res["spark"]["rate"]
    print(f"\nKafka source in Spark: {rows:,} offsets per micro-batch (maxOffsetsPerTrigger), {partitions} partitions "
          f"(one task each), ~100-byte values, read_committed, into Spark's noop sink; {batches - 1} measured "
          f"batches per run after a warm-up, {rounds} alternating rounds\n")
    print("| source | records/s | median batch (s) | vs Spark's kafka source |\n|---|---:|---:|---:|")
    for m in SPARK_SOURCES:
        r = res[m]
        print(f"| {r['label']} | {r['rate']:,.0f} | {r['batch_s']:.2f} | {r['rate'] / base:.2f} |")
    print(f"\ntwophase source / Spark's source = {res['twophase']['rate'] / base:.2f} (goal >= 0.8); "
          f"twophase source / the Python ceiling = {res['twophase']['rate'] / res['arrow']['rate']:.2f}")
    for m in SPARK_SOURCES:
        print(f"{res[m]['label']}: batch seconds {res[m]['per_batch']}")


def read_source(bootstrap: str, topic: str, end: int, client: str) -> int:
    """The source's executor reader (``KafkaSplitReader.read``) over one split ``[0, end)``."""
    from twophase.sources._kafka_offsets import KafkaSplit
    from twophase.sources.kafka import KafkaSource
    src = KafkaSource.from_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
                                    "startingOffsets": "earliest", "kafkaClient": client})
    try:
        return sum(b.num_rows for b in src.reader().read(KafkaSplit(topic, 0, 0, end)))
    finally:
        src.close()


def read_bare_librdkafka(bootstrap: str, topic: str, end: int, batch_rows: int = 10_000) -> int:
    """The ceiling: a bare librdkafka consume() loop, messages only, no Arrow."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-read", "enable.auto.commit": False,
                  "isolation.level": "read_committed", "fetch.max.bytes": 64 << 20,
                  "max.partition.fetch.bytes": 8 << 20, "queued.min.messages": 1_000_000})  # as the source
    c.assign([TopicPartition(topic, 0, 0)])
    n, pos = 0, 0
    try:
        while pos < end:
            msgs = [m for m in c.consume(batch_rows, timeout=1.0) if m.error() is None]
            if msgs:
                n += sum(1 for m in msgs if m.offset() < end)
                pos = msgs[-1].offset() + 1
    finally:
        c.close()
    return n


READERS = {
    "source, kafkaClient=kafka-python": lambda b, t, e: read_source(b, t, e, "kafka-python"),
    "source, kafkaClient=librdkafka (default)": lambda b, t, e: read_source(b, t, e, "librdkafka"),
    "bare librdkafka consume(), no Arrow (ceiling)": read_bare_librdkafka,
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    ap.add_argument("--quick", action="store_true", help="a small run (100,000 offsets per batch, 50,000 records)")
    ap.add_argument("--rows", type=int, default=1_000_000, help="offsets per micro-batch of the Spark runs")
    ap.add_argument("--batches", type=int, default=3, help="micro-batches per Spark run, the first is warm-up")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--records", type=int, default=500_000, help="records of the read-path-alone runs")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-spark", action="store_true", help="only the read path alone")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.records, args.rounds = 100_000, 50_000, 1
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from integration.kafka.broker import create_topic, kafka_broker, unique
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap or stack.enter_context(kafka_broker())
        if not args.no_spark:
            from integration.kafka.spark_kafka import spark_with_kafka_connector
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-kafka-read-"))
            spark = spark_with_kafka_connector("bench-kafka-read", cores=args.partitions,
                                               conf={"spark.ui.showConsoleProgress": "false"})
            try:
                res = spark_source_comparison(spark, bootstrap, args.rows, args.batches, args.partitions,
                                              args.rounds, tmp)
            finally:
                spark.stop()
            print_source_table(res, args.rows, args.batches, args.partitions, args.rounds)
            print()
        topic = create_topic(bootstrap, unique("readbench"), 1)
        fill(bootstrap, topic, args.records)
        best: dict[str, float] = {}
        for r in range(args.rounds):
            for name, fn in READERS.items():
                t = time.perf_counter()
                got = fn(bootstrap, topic, args.records)
                dt = time.perf_counter() - t
                assert got == args.records, f"{name} read {got} of {args.records}"
                best[name] = min(best.get(name, dt), dt)
                print(f"round {r}: {name} {args.records / dt:,.0f} records/s", file=sys.stderr)
        base = args.records / best["source, kafkaClient=kafka-python"]
        print(f"Kafka read path into Arrow: {args.records:,} records of ~100 B, one partition, read_committed, "
              f"best of {args.rounds}\n")
        print("| reader | records/s | ratio vs kafka-python |\n|---|---:|---:|")
        for name in READERS:
            rate = args.records / best[name]
            print(f"| {name} | {rate:,.0f} | {rate / base:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
