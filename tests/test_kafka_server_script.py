"""scripts/kafka_server.sh's KRaft cluster ids (no JVM): never starting with '-', which Kafka's StorageTool reads as
an option (``format -t -xyz`` prints its usage and fails: 1 id in 64 did, failing a broker start)."""

from __future__ import annotations

import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_kafka_server_cluster_ids_never_start_with_a_dash():
    out = subprocess.run(["bash", str(ROOT / "scripts" / "kafka_server.sh"), "cluster-id", "5000"],
                         capture_output=True, text=True, timeout=120, check=True).stdout.split()
    assert len(out) == 5000 and len(set(out)) == 5000
    assert all(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{21}", c) for c in out), [c for c in out if c[0] == "-"]


def test_kafka_cluster_script_takes_its_cluster_id_from_kafka_server():
    text = (ROOT / "scripts" / "kafka_cluster.sh").read_text()
    assert "kafka_server.sh\" cluster-id" in text and "urlsafe_b64encode" not in text
