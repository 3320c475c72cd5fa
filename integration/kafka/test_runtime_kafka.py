"""The embedded runtime with the Kafka sink: randomized task failure, output exactly once for read_committed
readers. Uses the session's broker (integration/kafka/conftest.py: KAFKA_BOOTSTRAP_SERVERS, Docker or noida-db).
"""

from __future__ import annotations

import json
import os
import random
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "tests", "runtime"))

from rt_helpers import runner, two_source_job  # noqa: E402
from integration.kafka.broker import create_topic, read_topic, unique  # noqa: E402
from sinks.kafka import KafkaSink  # noqa: E402
from twophase.runtime import FixedDelayRestart  # noqa: E402

pytestmark = pytest.mark.kafka


@pytest.fixture
def bootstrap(kafka_bootstrap):
    return kafka_bootstrap


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
