"""The Kafka benchmarks' count check: after a run, read its topic back with ``read_committed`` and verify that
what a committed reader sees is what was written. A benchmark that silently loses or duplicates records
measures nothing, so every sink run (and the source benchmark's filled topic) goes through here.

The records of the benchmarks have unique integer keys: the rate-micro-batch source's ``value`` (batch ``b`` of
``rows`` records holds keys ``b*rows .. (b+1)*rows-1``) or the fill loop's index.
"""

from __future__ import annotations

import time
from typing import Any


def committed_keys(bootstrap: str, topic: str, timeout: float = 600) -> Any:
    """The integer keys of every record of ``topic`` a ``read_committed`` reader sees, up to each partition's
    last stable offset (librdkafka's partition EOF under read_committed), as a numpy array."""
    import numpy as np
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-check-{topic}", "enable.auto.commit": False,
                  "isolation.level": "read_committed", "enable.partition.eof": True,
                  "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 8 << 20})
    try:
        parts = sorted(c.list_topics(topic, timeout=30).topics[topic].partitions)
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        keys: list[int] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(at_end) < len(parts):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} back: {len(keys):,} records, partitions at the end: {at_end}")
            for m in c.consume(10_000, timeout=1.0):
                err = m.error()
                if err is None:
                    keys.append(int(m.key()))
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(m.partition())
                else:
                    raise RuntimeError(f"reading {topic} back: {err}")
        return np.array(keys, dtype=np.int64)
    finally:
        c.close()


def check_topic(bootstrap: str, topic: str, rows: int, batches_done: int, exactly_once: bool,
                what: str) -> dict[str, Any]:
    """Verify ``topic`` against a run that completed ``batches_done`` micro-batches of ``rows`` records.

    Every key of the completed batches (``0 .. rows*batches_done-1``) must be there. Exactly-once: each key
    once and whole batches only (a batch in flight when the query stopped is either all there, committed
    before the stop, or not at all). At-least-once: duplicates are counted, not refused (a clean run has none),
    and a batch cut by the stop may be partly there. Raises AssertionError naming the run and the counts;
    returns ``{"records", "batches", "duplicates"}``.
    """
    import numpy as np

    keys = committed_keys(bootstrap, topic)
    n = int(len(keys))
    counts = np.bincount(keys) if n else np.zeros(0, dtype=np.int64)
    distinct = int(np.count_nonzero(counts))
    duplicates = n - distinct
    need = rows * batches_done
    present = int(np.count_nonzero(counts[:need]))
    problems = []
    if n and int(keys.min()) < 0:
        problems.append(f"negative key {int(keys.min())}")
    if present < need:
        problems.append(f"{need - present:,} of the {need:,} records of the {batches_done} completed batches missing")
    if exactly_once:
        if duplicates:
            problems.append(f"{duplicates:,} duplicates")
        if distinct % rows or distinct != len(counts):
            problems.append(f"{distinct:,} distinct keys (highest {len(counts) - 1:,}) are not whole batches of "
                            f"{rows:,} from key 0")
    if problems:
        raise AssertionError(f"{what}: topic {topic} read back with read_committed: {n:,} records; "
                             + "; ".join(problems))
    return {"records": n, "batches": distinct / rows if rows else 0, "duplicates": duplicates}
