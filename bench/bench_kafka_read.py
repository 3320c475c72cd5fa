"""The Kafka source's read path into Arrow: the kafka-python reader, the librdkafka reader (the default), a bare ceiling.

The Kafka source reads with librdkafka by default (option kafkaClient); this measures the read path alone
(no Spark): one process reads one split ``[0, end)`` of a topic-partition with read_committed and builds
the source's Arrow batches. Rows: ``twophase.sources.kafka.KafkaSplitReader.read`` (what executors run)
with ``kafkaClient=kafka-python`` and with the default librdkafka reader, and a bare librdkafka
``consume()`` loop without Arrow as the ceiling; each with the ratio against the kafka-python reader
measured in the same run.

    python bench/bench_kafka_read.py [--records 500000] [--bootstrap H:P]

Without --bootstrap (or KAFKA_BOOTSTRAP_SERVERS) a local Apache Kafka broker (scripts/kafka_server.sh) is started for the run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fill(bootstrap: str, topic: str, records: int) -> None:
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20,
                  "queue.buffering.max.messages": 1_000_000, "enable.idempotence": True})
    value = b"x" * 100
    for i in range(records):
        while True:
            try:
                p.produce(topic, value, str(i).encode(), partition=0)
                break
            except BufferError:
                p.poll(0.05)
        if i % 10_000 == 0:
            p.poll(0)
    p.flush(60)


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
                  "max.partition.fetch.bytes": 8 << 20})
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
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    from integration.kafka.broker import create_topic, kafka_broker, unique
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap or stack.enter_context(kafka_broker())
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
