"""The runtime with the Kafka sink: randomized task failure, output exactly once for read_committed readers.

Needs a Kafka broker, which the fast tests never start: it runs only with TWOPHASE_RUNTIME_KAFKA=1
(the broker comes from integration.kafka.broker: KAFKA_BOOTSTRAP_SERVERS, Docker or noida-db).
"""

from __future__ import annotations

import json
import os
import random

import pytest

from rt_helpers import runner, two_source_job

try:
    from sinks.kafka import KafkaSink
except ImportError as e:  # pragma: no cover - depends on the Kafka engineer's module
    pytest.skip(f"sinks/kafka.py is not importable ({e}); the runtime Kafka test needs it", allow_module_level=True)

if os.environ.get("TWOPHASE_RUNTIME_KAFKA") != "1":
    pytest.skip("needs a Kafka broker: run with TWOPHASE_RUNTIME_KAFKA=1 (broker from KAFKA_BOOTSTRAP_SERVERS, "
                "Docker or noida-db via integration.kafka.broker)", allow_module_level=True)

from integration.kafka.broker import create_topic, kafka_broker, read_topic, unique  # noqa: E402
from twophase.runtime import FixedDelayRestart  # noqa: E402

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def bootstrap():
    with kafka_broker() as b:
        yield b


def test_job_random_task_failure_kafka_sink_exactly_once(tmp_path, bootstrap):
    topic = create_topic(bootstrap, unique("rt-out"), partitions=2)
    rng = random.Random(3)
    fired = {"n": 0}
    k = rng.randint(500, 3000)

    def fail(v):
        if not fired["n"]:
            fired["k"] = fired.get("k", 0) + 1
            if fired["k"] >= k:
                fired["n"] += 1
                raise RuntimeError("injected failure")
        return v
    g, _, expected = two_source_job(str(tmp_path / "unused"), map_fn=fail)
    sink = KafkaSink.from_options({"kafka.bootstrap.servers": bootstrap, "topic": topic,
                                   "prefixRegistry": str(tmp_path / "registry"),
                                   "log.location": str(tmp_path / "log"),
                                   "checkpointLocation": str(tmp_path / "ck")})
    out = g.vertex("out")
    out.sink = sink
    out.to_row = lambda r: {"key": str(r["id"]), "value": json.dumps(r)}
    result = runner(g, "aligned", interval=0.05, restart=FixedDelayRestart(3, 0.0),
                    owner=str(tmp_path / "ck")).run()
    assert fired["n"] == 1 and result.attempts == 2
    values = [json.loads(m.value)["id"] for m in read_topic(bootstrap, topic)]
    assert len(values) == len(set(values)) and set(values) == expected
