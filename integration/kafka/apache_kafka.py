"""Apache Kafka itself (KRaft, combined broker + controller), started from Maven Central jars by
``scripts/kafka_server.sh`` on a free port and stopped by PID. Broker settings are Kafka's defaults
(``transaction.max.timeout.ms`` = 15 min, ...) unless a test passes ``KEY=VALUE`` overrides."""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
import tempfile
from typing import Iterator

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "kafka_server.sh"
#: the 3.x release that also runs the Kafka conformance suite and a crash chain (users are on both lines);
#: scripts/setup.sh fetches it beside the default (scripts/kafka_server.sh's KAFKA_VERSION)
KAFKA_3 = "3.9.1"


@contextlib.contextmanager
def apache_kafka_broker(*settings: str, version: str = "") -> Iterator[str]:
    """Bootstrap servers of a fresh single-node Apache Kafka; ``settings``: ``key=value`` broker overrides;
    ``version``: a release other than scripts/kafka_server.sh's default."""
    env = {**os.environ, **({"KAFKA_VERSION": version} if version else {})}
    with tempfile.TemporaryDirectory(prefix="twophase-apache-kafka-") as d:
        res = subprocess.run(["bash", str(SCRIPT), "start", d, *settings], capture_output=True, text=True, timeout=600,
                             env=env)
        if res.returncode != 0:
            raise RuntimeError(f"scripts/kafka_server.sh start failed: {res.stderr[-2000:]}")
        try:
            yield res.stdout.strip().splitlines()[-1]
        finally:
            subprocess.run(["bash", str(SCRIPT), "stop", d], capture_output=True, timeout=60, env=env)
