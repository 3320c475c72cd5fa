"""A Kafka broker for the integration tests, and small read/write helpers around it.

Where the broker comes from, in order:

1. ``KAFKA_BOOTSTRAP_SERVERS`` when set (an existing cluster; nothing is started or stopped);
2. by default, Apache Kafka itself (:mod:`integration.kafka.apache_kafka`: KRaft, a combined broker and
   controller run from Maven Central jars by ``scripts/kafka_server.sh``, with Kafka's default settings,
   on a free port, stopped by PID). A green Kafka suite is green on Apache Kafka;
3. ``TWOPHASE_KAFKA=docker``: a testcontainers Kafka (for machines with a Docker engine);
4. ``TWOPHASE_KAFKA=noida``: noida-db, the lenient stand-in of earlier versions (it answers NoError to an
   EndTxn with a wrong producer id or after an abort and never expires a transaction). No test needs it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from typing import Any, Iterator, Optional

NOIDA_BIN = os.path.join(os.path.dirname(os.path.dirname(os.__file__)), "site-packages", "noida_db", "noida-db")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(host: str, port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return True
        time.sleep(0.1)
    return False


def _docker_answers() -> bool:
    if os.environ.get("TWOPHASE_KAFKA_DOCKER", "1") == "0":
        return False
    sock = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if sock.startswith("unix://") and not os.path.exists(sock[len("unix://"):]):
        return False
    try:
        import docker  # type: ignore
        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


def _noida_binary() -> Optional[str]:
    try:
        import noida_db  # type: ignore
        path = os.path.join(os.path.dirname(noida_db.__file__), "noida-db")
    except ImportError:
        path = NOIDA_BIN
    return path if os.path.exists(path) else None


@contextlib.contextmanager
def kafka_broker() -> Iterator[str]:
    """Yield a bootstrap servers string for a working broker (see module docstring)."""
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if env:
        yield env
        return
    choice = os.environ.get("TWOPHASE_KAFKA", "apache")
    if choice == "docker" and _docker_answers():
        from testcontainers.kafka import KafkaContainer  # type: ignore
        with KafkaContainer() as kc:
            yield kc.get_bootstrap_server()
        return
    if choice != "noida":
        from integration.kafka.apache_kafka import apache_kafka_broker
        with apache_kafka_broker() as bootstrap:
            yield bootstrap
        return
    binary = _noida_binary()
    if binary is None:
        import pytest
        pytest.skip("no Kafka broker: set KAFKA_BOOTSTRAP_SERVERS, run Docker, or pip install noida-db")
    data = tempfile.mkdtemp(prefix="twophase-kafka-")
    port = _free_port()
    logf = open(os.path.join(data, "broker.log"), "wb")
    proc = subprocess.Popen([binary, "start", "--data-dir", os.path.join(data, "d"), "--only", "kafka",
                             "--kafka-port", str(port)], stdout=logf, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        if not _wait_port("127.0.0.1", port, 30):
            raise RuntimeError(f"noida-db kafka did not listen on {port}; log: {data}/broker.log")
        yield f"127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:  # noida-db can take 20 s to stop on SIGTERM; its data dir is a throwaway temp dir
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        logf.close()


# ---------------------------------------------------------------- helpers


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def create_topic(bootstrap: str, topic: str, partitions: int = 2) -> str:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        admin.close()
    return topic


def produce(bootstrap: str, topic: str, values: list[bytes], *, keys: Optional[list[bytes]] = None,
            partitions: int = 2, transactional_id: Optional[str] = None, commit: bool = True) -> None:
    """Write ``values`` round-robin over ``partitions``; optionally inside one transaction (committed or aborted)."""
    from kafka import KafkaProducer
    p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id, linger_ms=5)
    try:
        if transactional_id:
            p.init_transactions()
            p.begin_transaction()
        for i, v in enumerate(values):
            p.send(topic, value=v, key=keys[i] if keys else None, partition=i % partitions)
        p.flush()
        if transactional_id:
            p.commit_transaction() if commit else p.abort_transaction()
    finally:
        p.close(timeout=5)


def read_topic(bootstrap: str, topic: str, *, isolation: str = "read_committed", timeout: float = 30.0) -> list[Any]:
    """Every record of ``topic`` visible at ``isolation``, read up to the current end offsets."""
    from kafka import KafkaConsumer, TopicPartition
    c = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False,
                      auto_offset_reset="earliest")
    try:
        parts = c.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        if not tps:
            return []
        c.assign(tps)
        c.seek_to_beginning(*tps)
        end = c.end_offsets(tps)
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while any(c.position(tp) < end[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}: positions {[c.position(tp) for tp in tps]} < ends {end}")
            for recs in c.poll(timeout_ms=500).values():
                out.extend(r for r in recs if r.offset < end[TopicPartition(r.topic, r.partition)])
        return out
    finally:
        c.close()


def end_offsets(bootstrap: str, topic: str, isolation: str = "read_uncommitted") -> dict[int, int]:
    from kafka import KafkaConsumer, TopicPartition
    c = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or ())]
        return {tp.partition: o for tp, o in c.end_offsets(tps).items()}
    finally:
        c.close()


def listening_pid(bootstrap: str) -> Optional[int]:
    """PID of the process on THIS host that listens on ``bootstrap``'s (first) port, or None.

    This is the broker server itself (the socket owner), never a wrapper script that started it:
    SIGSTOP on it really pauses the broker. None for a remote broker or one owned by another user.
    """
    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    if host not in ("127.0.0.1", "localhost", "0.0.0.0", "::1", socket.gethostname()):
        return None
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if int(cols[1].rsplit(":", 1)[1], 16) == int(port) and cols[3] == "0A":  # LISTEN
                    inodes.add(cols[9])
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{entry}/fd"):
                link = os.readlink(f"/proc/{entry}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return int(entry)
    return None


@contextlib.contextmanager
def broker_paused(bootstrap: str) -> Iterator[None]:
    """SIGSTOP the broker server for the duration of the block (SIGCONT afterwards, always)."""
    pid = listening_pid(bootstrap)
    if pid is None:
        import pytest
        pytest.skip(f"cannot pause the broker at {bootstrap}: no local process of ours listens on it")
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


#: the sink's input columns in the Kafka sink tests
SINK_SCHEMA_FIELDS = (("key", "binary"), ("value", "binary"))
WRITE_TASK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "write_task.py")


def key_value_batch(tag: str, n: int) -> Any:
    """``n`` rows ``(k<i>, <tag>-<i>)`` of the Kafka sink's key/value columns."""
    import pyarrow as pa
    schema = pa.schema([(name, getattr(pa, kind)()) for name, kind in SINK_SCHEMA_FIELDS])
    return pa.RecordBatch.from_pydict({"key": [f"k{i}".encode() for i in range(n)],
                                       "value": [f"{tag}-{i}".encode() for i in range(n)]}, schema=schema)


def committed_values(bootstrap: str, topic: str) -> list[bytes]:
    """The values a read_committed reader sees in ``topic``, sorted."""
    return sorted(r.value for r in read_topic(bootstrap, topic))


def write_in_another_process(raw: dict, ckpt: int, task: str, attempt: int, n: int, tag: str) -> Any:
    """A writer process (``write_task.py``) that pre-commits ``n`` rows and exits without committing, aborting
    or closing anything; returns its ack."""
    import json
    import subprocess
    import sys
    from twophase.sink import Ack
    out = subprocess.run([sys.executable, WRITE_TASK, json.dumps(raw), str(ckpt), task, str(attempt), str(n), tag],
                         capture_output=True, text=True, timeout=120, check=True)
    a = json.loads(out.stdout.strip().splitlines()[-1])
    return Ack(a["checkpoint_id"], a["task_id"], a["attempt_uid"], a["handle"], a["records"])
