"""A 3-broker Apache Kafka cluster (``scripts/kafka_cluster.sh``: KRaft, replication factor 3,
``min.insync.replicas=2``, the transaction state log replicated) and the probes the fault tests wait on:
who coordinates a transactional id, who leads a partition, is the ISR full again. Every wait has a deadline."""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
import tempfile
import time
from typing import Callable, Iterator, Optional, TypeVar

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "kafka_cluster.sh"
T = TypeVar("T")


class KafkaCluster:
    """A started cluster: ``bootstrap`` (every broker), brokers by node id 1..n, killed/paused by PID."""

    def __init__(self, directory: str, bootstrap: str, n: int) -> None:
        self.dir, self.bootstrap, self.n = directory, bootstrap, n

    def _run(self, *args: str) -> str:
        res = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=300)
        if res.returncode != 0:
            raise RuntimeError(f"scripts/kafka_cluster.sh {' '.join(args)} failed: {res.stderr[-2000:]}")
        return res.stdout

    def port(self, node: int) -> int:
        return int(pathlib.Path(self.dir, f"b{node}", "port").read_text())

    def address(self, node: int) -> str:
        return f"127.0.0.1:{self.port(node)}"

    def kill(self, node: int) -> None:
        self._run("kill", self.dir, str(node))

    def restart(self, node: int) -> None:
        self._run("restart", self.dir, str(node))

    def pause(self, node: int) -> None:
        self._run("pause", self.dir, str(node))

    def resume(self, node: int) -> None:
        self._run("resume", self.dir, str(node))

    def pid(self, node: int) -> Optional[int]:
        """The PID of broker ``node``'s JVM (None once stopped)."""
        try:
            return int(pathlib.Path(self.dir, f"b{node}", "kafka.pid").read_text())
        except (OSError, ValueError):
            return None

    def alive(self, node: int) -> bool:
        pid = pathlib.Path(self.dir, f"b{node}", "kafka.pid")
        try:
            os.kill(int(pid.read_text()), 0)
            return True
        except (OSError, ValueError):
            return False

    def live_bootstrap(self) -> str:
        return ",".join(self.address(i) for i in range(1, self.n + 1) if self.alive(i))

    # ---- probes (a fresh admin client each time: no cached coordinator or metadata)

    def _admin(self):
        from kafka import KafkaAdminClient
        return KafkaAdminClient(bootstrap_servers=self.live_bootstrap(), request_timeout_ms=5000)

    def coordinator(self, transactional_id: str, timeout: float = 60.0) -> int:
        """Node id of the transaction coordinator of ``transactional_id`` (FindCoordinator; retried while the
        transaction state log is created or its partition leader moves)."""
        return wait_for(lambda: self._find_coordinator(transactional_id) + 1, timeout,
                        f"a transaction coordinator for {transactional_id!r}") - 1

    def _find_coordinator(self, transactional_id: str) -> int:
        from kafka.protocol.metadata import CoordinatorType
        admin = self._admin()
        try:
            async def go():
                return await admin._find_coordinator_id(transactional_id, CoordinatorType.TRANSACTION)
            return int(admin._manager.run(go))
        finally:
            admin.close()

    def partitions(self, topic: str) -> dict[int, tuple[int, tuple[int, ...]]]:
        """``{partition: (leader, isr)}`` from the cluster's metadata."""
        admin = self._admin()
        try:
            (desc,) = admin.describe_topics([topic])
            return {p["partition_index"]: (p["leader_id"], tuple(sorted(p["isr_nodes"]))) for p in desc["partitions"]}
        finally:
            admin.close()

    def create_topic(self, topic: str, partitions: int = 2) -> str:
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic
        admin = KafkaAdminClient(bootstrap_servers=self.live_bootstrap())
        try:
            admin.create_topics([NewTopic(topic, partitions, min(3, self.n))])
        finally:
            admin.close()
        wait_for(lambda: all(len(isr) == min(3, self.n) and leader >= 0
                             for leader, isr in self.partitions(topic).values()) or None, 60,
                 f"topic {topic}: every partition led with a full ISR")
        return topic

    def wait_healthy(self, timeout: float = 120.0, topics: tuple[str, ...] = ()) -> None:
        """Every broker alive and listening, and every partition of ``topics`` back to a full ISR."""
        for i in range(1, self.n + 1):
            if not self.alive(i):
                self.restart(i)
        for topic in topics:
            wait_for(lambda: all(len(isr) == min(3, self.n) for _, isr in self.partitions(topic).values()) or None,
                     timeout, f"topic {topic}: ISR back to {min(3, self.n)}")


def wait_for(probe: Callable[[], Optional[T]], timeout: float, what: str, interval: float = 0.5) -> T:
    """Poll ``probe`` until it returns a truthy value (errors count as not yet) or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Optional[BaseException] = None
    while time.monotonic() < deadline:
        try:
            got = probe()
            if got:
                return got
        except Exception as e:  # a broker just killed: metadata requests fail until the cluster settles
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f" (last error: {last!r})" if last else ""))


@contextlib.contextmanager
def kafka_cluster(n: int = 3) -> Iterator[KafkaCluster]:
    with tempfile.TemporaryDirectory(prefix="twophase-kafka-cluster-") as d:
        res = subprocess.run(["bash", str(SCRIPT), "start", d, str(n)], capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            subprocess.run(["bash", str(SCRIPT), "stop", d], capture_output=True, timeout=120)
            raise RuntimeError(f"scripts/kafka_cluster.sh start failed: {res.stderr[-2000:]}")
        try:
            yield KafkaCluster(d, res.stdout.strip().splitlines()[-1], n)
        finally:
            subprocess.run(["bash", str(SCRIPT), "stop", d], capture_output=True, timeout=120)
