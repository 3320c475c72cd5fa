"""The nemesis: one streaming job per sink on a Spark standalone cluster, faults injected from a seed.

A *target* is one sink with its own fresh destination (a directory, a bucket prefix, a Delta table on
S3, a Kafka topic) and its input (files, or a Kafka topic for Kafka -> Kafka). A *scenario* runs the job
(integration/nemesis/job.py) on the cluster, once or several times (a killed driver is restarted, as
a supervisor would), with one kind of fault; then :func:`check` reads the destination the way its
readers do and counts, against the input: duplicates, missing and unexpected records, leftovers
(staged files, multipart uploads, unreferenced Delta data files, open Kafka transactions) and log
records that are not final. Every random draw comes from ``random.Random(f"{seed}:...")``, and every
outcome names its seed: ``scripts/nemesis.sh --seed S --runs 1 --sinks X --faults Y`` replays one.

Fault kinds (:data:`FAULTS`; see :func:`run_scenario` for the moments):

=================  ==========================================================================================
``executor_jvm``   SIGKILL one executor JVM of the job while a seeded batch is in flight
``python_worker``  SIGKILL one Python worker forked by an executor's ``pyspark.daemon``
``worker``         SIGKILL a whole Spark worker (the Worker daemon, its executor JVM and Python processes);
                   the cluster is healed (the worker restarted) after the run
``fetch_failed``   an executor JVM killed from inside a sink task of a seeded batch (fault point ``write`` or
                   ``after_pre_commit``, scope ``auto``): its shuffle map output is lost, so the retried
                   task's fetch fails and Spark runs a new stage attempt while the old attempt's task on the
                   other executor may still finish (the event log counts FetchFailed and stage retries)
``speculation``    ``spark.speculation`` on, aggressive, and the first attempt of partition 0 straggles: a
                   speculative copy races it (the event log counts speculative tasks)
``driver``         SIGKILL the driver (its whole session: Python, JVM) at a random moment; restart
``protocol``       the driver killed at a seeded protocol point of a seeded batch (``TWOPHASE_FAULT``);
                   an executor point (write, after_pre_commit) kills only that executor (scope ``auto``)
``recovery``       the driver killed after a checkpoint is durable, then the restart killed inside its
                   recovery (``in_recovery`` or ``mid_commit`` of that checkpoint), then a clean restart
``pause``          the sink's server (S3 server, Kafka broker or every broker of the cluster, PostgreSQL with its backends)
                   SIGSTOPped past the client's request timeout while a batch is written, then SIGCONTed; a failed
                   query is restarted
``coordinator_kill`` (Kafka, 3-broker cluster) SIGKILL the broker that coordinates a transactional id right before
                   the driver's EndTxn(commit) of it goes out (a seeded one of the run's first three: mid-commit,
                   the decision durable); the broker is restarted after the run
``leader_kill``    (Kafka, 3-broker cluster) SIGKILL the leader of a seeded partition of the output topic while
                   the batch's tasks produce; restarted after the run
``broker_pause``   (Kafka, 3-broker cluster) one seeded broker SIGSTOPped 12-18 s while a batch is written: past
                   the client timeouts (request 4 s), past the controller's fencing (9 s: its partitions and
                   coordinators move) and past the transactions' timeout (10 s: the broker aborts the expired
                   ones), then SIGCONTed. A transaction of a decided checkpoint the broker expired must be named:
                   the run fails with DataLossError naming the checkpoint; the harness resolves it with
                   ``twophase log resolve --accept-loss`` and counts that batch's input as ``lost (named)``,
                   never as missing; any other missing record fails the run
=================  ==========================================================================================
"""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
JOB = os.path.join(ROOT, "integration", "nemesis", "job.py")
CLUSTER_SCRIPT = os.path.join(ROOT, "scripts", "spark_cluster.sh")

FAULTS = ("executor_jvm", "python_worker", "worker", "fetch_failed", "speculation", "driver", "protocol",
          "recovery", "pause", "coordinator_kill", "leader_kill", "broker_pause")
#: faults that need the Kafka target on the 3-broker cluster (campaign --kafka-brokers 3, the default)
KAFKA_CLUSTER_FAULTS = ("coordinator_kill", "leader_kill", "broker_pause")
HOOK_DIR = os.path.join(ROOT, "integration", "nemesis", "hook")
SINKS = ("files", "s3", "delta", "kafka", "azure-files", "azure-delta", "postgres")
DRIVER_POINTS = ("before_complete", "after_complete", "mid_commit", "after_commit")
EXECUTOR_POINTS = ("write", "after_pre_commit")
FILES_PER_BATCH, ROWS_PER_FILE = 2, 60
ROWS_PER_BATCH = FILES_PER_BATCH * ROWS_PER_FILE
PACE, PACE_ROWS = 0.3, 20          # 60 rows per task: 3 slices, 0.3 s before each
JOB_TIMEOUT = 300.0
SPECULATION = {"spark.speculation": "true", "spark.speculation.multiplier": "1.5",
               "spark.speculation.quantile": "0.5", "spark.speculation.minTaskRuntime": "500ms",
               "spark.speculation.interval": "200ms"}


class NemesisError(AssertionError):
    """The harness could not do what a scenario needs (a job ended early, a victim never appeared)."""


# ---------------------------------------------------------------- processes


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def ppid(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def executor_jvms(app_id: str) -> list[int]:
    """PIDs of this application's executor JVMs (on this host), sorted."""
    return sorted(p for p in pids() if app_id in (c := cmdline(p)) and any("CoarseGrainedExecutorBackend" in a for a in c))


def descendants(root: int) -> list[int]:
    parent = {p: ppid(p) for p in pids()}
    out, frontier = [], {root}
    while frontier:
        children = [p for p, pp in parent.items() if pp in frontier]
        out += children
        frontier = set(children)
    return sorted(out)


def python_workers(executor: int) -> list[int]:
    """Python workers of one executor: forked by its ``pyspark.daemon`` (the daemon itself excluded)."""
    found = []
    for p in descendants(executor):
        parent = ppid(p)
        if parent is not None and "pyspark.daemon" in " ".join(cmdline(parent)) and \
                ("pyspark.daemon" in " ".join(cmdline(p)) or "pyspark.worker" in " ".join(cmdline(p))):
            found.append(p)
    return found


def worker_of(executor: int) -> Optional[int]:
    """The Spark Worker daemon that launched ``executor``."""
    p = ppid(executor)
    while p and p > 1:
        if any("deploy.worker.Worker" in a for a in cmdline(p)):
            return p
        p = ppid(p)
    return None


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ---------------------------------------------------------------- the cluster


@dataclass
class Cluster:
    """A standalone cluster (scripts/spark_cluster.sh) and the settings of a job on it."""

    master_url: str
    directory: str = ""  # empty: an external cluster (TWOPHASE_SPARK_MASTER): never healed

    def conf(self) -> dict[str, str]:
        return {
            "spark.executor.cores": "1", "spark.cores.max": "2", "spark.executor.memory": "1g",
            "spark.task.maxFailures": "4", "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executorEnv.PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
            "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false",
        }

    def heal(self) -> None:
        """Restart dead workers of a managed cluster (after a ``worker`` fault)."""
        if self.directory:
            subprocess.run(["bash", CLUSTER_SCRIPT, "heal", self.directory], check=True, capture_output=True,
                           timeout=180, env={**os.environ, "PYTHON": sys.executable})

    @classmethod
    def start(cls, directory: str) -> "Cluster":
        env = {**os.environ, "PYTHON": sys.executable}
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        r = subprocess.run(["bash", CLUSTER_SCRIPT, "start", directory], capture_output=True, text=True,
                           timeout=240, env=env)
        if r.returncode != 0:
            raise NemesisError(f"scripts/spark_cluster.sh start failed:\n{r.stderr[-3000:]}")
        url = [ln.split("=", 1)[1] for ln in r.stdout.splitlines() if ln.startswith("SPARK_MASTER_URL=")][-1]
        return cls(url, directory)

    def stop(self) -> None:
        if self.directory:
            subprocess.run(["bash", CLUSTER_SCRIPT, "stop", self.directory], capture_output=True, timeout=60)


# ---------------------------------------------------------------- targets


class Target:
    """One sink with a fresh destination and its input. Subclasses know how to read and inspect it."""

    name = ""
    fmt = ""
    server_kind = ""  # "s3", "kafka" or "": what ``pause`` stops (nothing for files and the Azure sinks)
    #: a batch is committed as ONE version (Delta): its mid_commit point is after that version
    one_version_commit = False

    def __init__(self, tmp: str, servers: "Servers") -> None:
        self.tmp, self.servers = tmp, servers
        self.ck = os.path.join(tmp, "ck")
        self.ids: list[int] = []
        self.batches = 0

    # input
    def add_input(self, batches: int) -> list[int]:
        raise NotImplementedError

    def source_args(self) -> list[str]:
        raise NotImplementedError

    # the sink
    def options(self) -> dict[str, str]:
        raise NotImplementedError

    def sink(self) -> Any:
        raise NotImplementedError

    def read(self) -> list[int]:
        raise NotImplementedError

    def leftovers(self) -> list[str]:
        raise NotImplementedError

    def log_states(self) -> dict[int, str]:
        return {r.checkpoint_id: r.state.value for r in self.sink().transaction_log().records()}

    def server_pid(self) -> Optional[int]:
        return None

    def pause_options(self) -> dict[str, str]:
        """Client timeouts shorter than a ``pause`` (so the pause really outlasts them)."""
        return {}

    def server_pids(self) -> list[int]:
        """What ``pause`` stops: the server process (a server of several processes gives them all)."""
        pid = self.server_pid()
        return [] if pid is None else [pid]


class FileInput:
    """JSON-lines files, FILES_PER_BATCH per micro-batch."""

    inp: str
    ids: list[int]
    batches: int

    def add_input(self, batches: int) -> list[int]:
        from integration.fileio import make_input
        new = make_input(self.inp, batches * FILES_PER_BATCH, ROWS_PER_FILE, start=len(self.ids))
        self.ids += new
        self.batches += batches
        return new

    def source_args(self) -> list[str]:
        return ["--input", self.inp, "--files-per-batch", str(FILES_PER_BATCH)]


class FilesTarget(FileInput, Target):
    name, fmt = "files", "twophase-file"

    def __init__(self, tmp: str, servers: "Servers") -> None:
        super().__init__(tmp, servers)
        self.inp, self.out = os.path.join(tmp, "in"), os.path.join(tmp, "out")

    def options(self) -> dict[str, str]:
        return {"path": self.out, "format": "parquet", "partitionBy": "grp"}

    def sink(self) -> Any:
        from twophase.sinks.files import FileSink
        return FileSink.from_options({**self.options(), "checkpointLocation": self.ck})

    def read(self) -> list[int]:
        from integration.fileio import read_ids
        return read_ids(self.out)

    def leftovers(self) -> list[str]:
        from integration.fileio import staging_leftovers
        return [f"staged {a}" for a in staging_leftovers(self.out)]


class S3Target(FileInput, Target):
    name, fmt, server_kind = "s3", "twophase-s3", "s3"

    def __init__(self, tmp: str, servers: "Servers") -> None:
        super().__init__(tmp, servers)
        self.inp = os.path.join(tmp, "in")
        self.bucket = servers.s3.new_bucket()
        self.prefix = "out"

    def options(self) -> dict[str, str]:
        return {"path": f"s3://{self.bucket}/{self.prefix}", "partitionBy": "grp", **self.servers.s3.options()}

    def sink(self) -> Any:
        from twophase.sinks.s3 import S3Sink
        return S3Sink.from_options({**self.options(), "checkpointLocation": self.ck})

    def read(self) -> list[int]:
        import pyarrow.parquet as pq
        c, ids = self.servers.s3.client(), []
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix + "/"):
            for o in page.get("Contents", ()):
                if o["Key"].endswith(".parquet") and "/_twophase/" not in o["Key"]:
                    body = c.get_object(Bucket=self.bucket, Key=o["Key"])["Body"].read()
                    ids += pq.read_table(io.BytesIO(body)).column("id").to_pylist()
        return ids

    def uploads(self, prefix: str) -> list[str]:
        ups = self.servers.s3.client().list_multipart_uploads(Bucket=self.bucket, Prefix=prefix + "/")
        return [f"upload {u['Key']}" for u in ups.get("Uploads", [])]

    def leftovers(self) -> list[str]:
        return self.uploads(self.prefix)

    def server_pid(self) -> Optional[int]:
        from integration.kafka.broker import listening_pid
        return listening_pid(self.servers.s3.endpoint.split("://", 1)[-1].rstrip("/"))

    def pause_options(self) -> dict[str, str]:
        return {"s3.connectTimeout": "2s", "s3.readTimeout": "4s"}


class DeltaTarget(S3Target):
    name, fmt = "delta", "twophase-delta"
    one_version_commit = True

    def __init__(self, tmp: str, servers: "Servers") -> None:
        super().__init__(tmp, servers)
        self.prefix = "table"
        self.uri = f"s3://{self.bucket}/{self.prefix}"

    def options(self) -> dict[str, str]:
        return {"path": self.uri, "partitionBy": "grp", **self.servers.s3.options()}

    def sink(self) -> Any:
        from twophase.sinks.delta import DeltaSink
        return DeltaSink.from_options({**self.options(), "checkpointLocation": self.ck})

    def storage(self) -> dict[str, str]:
        s = self.servers.s3
        return {"AWS_ENDPOINT_URL": s.endpoint, "AWS_ACCESS_KEY_ID": s.access_key,
                "AWS_SECRET_ACCESS_KEY": s.secret_key, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}

    def read(self) -> list[int]:
        from deltalake import DeltaTable
        if not DeltaTable.is_deltatable(self.uri, storage_options=self.storage()):
            return []
        return DeltaTable(self.uri, storage_options=self.storage()).to_pyarrow_table().column("id").to_pylist()

    def leftovers(self) -> list[str]:
        import pyarrow as pa
        from deltalake import DeltaTable
        left = self.uploads(self.prefix)
        referenced: set[str] = set()
        if DeltaTable.is_deltatable(self.uri, storage_options=self.storage()):
            dt = DeltaTable(self.uri, storage_options=self.storage())
            referenced = set(pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist())
        c = self.servers.s3.client()
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix + "/"):
            for o in page.get("Contents", ()):
                rel = o["Key"][len(self.prefix) + 1:]
                if rel.endswith(".parquet") and not rel.startswith("_") and rel not in referenced:
                    left.append(f"unreferenced {rel}")
        return left


class KafkaTarget(Target):
    name, fmt, server_kind = "kafka", "twophase-kafka", "kafka"

    def __init__(self, tmp: str, servers: "Servers") -> None:
        super().__init__(tmp, servers)
        from integration.kafka.broker import create_topic, unique
        self.bootstrap = servers.kafka
        self.cluster = servers.kafka_cluster  # integration.kafka.cluster.KafkaCluster, or None (one broker)
        if self.cluster is not None:
            self.cluster.wait_healthy()
        make = self.cluster.create_topic if self.cluster is not None else \
            (lambda topic, n: create_topic(self.bootstrap, topic, n))
        self.in_topic = make(unique("nem-in"), 2)
        self.out_topic = make(unique("nem-out"), 2)
        self.prefix = unique("nem")
        self.registry = os.path.join(tmp, "prefix-registry")

    def add_input(self, batches: int) -> list[int]:
        from integration.kafka.broker import produce
        new = list(range(len(self.ids), len(self.ids) + batches * ROWS_PER_BATCH))
        produce(self.bootstrap, self.in_topic, [str(i).encode() for i in new])
        self.ids += new
        self.batches += batches
        return new

    def source_args(self) -> list[str]:
        return ["--bootstrap", self.bootstrap, "--in-topic", self.in_topic, "--rows-per-batch", str(ROWS_PER_BATCH)]

    def options(self) -> dict[str, str]:
        return {"kafka.bootstrap.servers": self.bootstrap, "topic": self.out_topic,
                "transactionalIdPrefix": self.prefix, "prefixRegistry": self.registry}

    def sink(self) -> Any:
        from twophase.sinks.kafka import KafkaSink
        return KafkaSink.from_options({**self.options(), "checkpointLocation": self.ck})

    def read(self) -> list[int]:
        from integration.kafka.broker import read_topic
        return [int(r.value) for r in read_topic(self.bootstrap, self.out_topic)]

    def leftovers(self) -> list[str]:
        listed = self.sink()._client().list_transactions(self.prefix + "-")
        if listed is None:
            raise NemesisError("the broker cannot list transactions: open transactions were not checked")
        return [f"open transaction {t[0]}" for t in listed]

    def server_pid(self) -> Optional[int]:
        from integration.kafka.broker import listening_pid
        return listening_pid(self.bootstrap)

    def server_pids(self) -> list[int]:
        if self.cluster is None:
            return super().server_pids()
        return [p for p in (self.cluster.pid(i) for i in range(1, self.cluster.n + 1)) if p is not None]

    def pause_options(self) -> dict[str, str]:
        return {"kafka.request.timeout.ms": "4000"}

    def heal(self) -> None:
        """Every broker of the cluster alive again and both topics back to a full ISR."""
        if self.cluster is not None:
            self.cluster.wait_healthy(topics=(self.in_topic, self.out_topic))

    def batch_ids(self, checkpoint: int) -> set[int]:
        """The input ids of micro-batch ``checkpoint``: its offset range in the offset log (ids were produced
        round-robin over 2 partitions in order, so id i is partition i % 2, offset i // 2)."""
        def end(n: int) -> dict[str, int]:
            if n < 0:
                return {}
            with open(os.path.join(self.ck, "offsets", str(n))) as f:
                last = [ln for ln in f.read().splitlines() if ln.strip()][-1]
            return {str(p): int(o) for p, o in json.loads(last)[self.in_topic].items()}
        lo, hi = end(checkpoint - 1), end(checkpoint)
        return {2 * o + int(p) for p in hi for o in range(lo.get(p, 0), hi[p])}


class AzureFilesTarget(FileInput, Target):
    """twophase-file on an ``abfss://`` path (Azurite): block blobs committed at the driver's commit."""

    name, fmt = "azure-files", "twophase-file"
    prefix = "out"

    def __init__(self, tmp: str, servers: "Servers") -> None:
        super().__init__(tmp, servers)
        self.inp = os.path.join(tmp, "in")
        self.container = servers.azure.new_container()
        self.uri = servers.azure.url(self.container, self.prefix)

    def options(self) -> dict[str, str]:
        return {"path": self.uri, "partitionBy": "grp", **self.servers.azure.options()}

    def sink(self) -> Any:
        from twophase.sinks.files import file_sink_from_options
        return file_sink_from_options({**self.options(), "checkpointLocation": self.ck})

    def data_names(self) -> set[str]:
        return {n for n in self.servers.azure.blob_names(self.container, self.prefix, uncommitted=False)
                if n.endswith(".parquet") and not n.startswith(("_twophase/", "_delta_log/"))}

    def read(self) -> list[int]:
        import pyarrow.parquet as pq
        c, ids = self.servers.azure.service().get_container_client(self.container), []
        for name in self.data_names():
            ids += pq.read_table(io.BytesIO(c.download_blob(f"{self.prefix}/{name}").readall())).column("id").to_pylist()
        return ids

    def leftovers(self) -> list[str]:
        """Names with only staged blocks (an attempt's file nobody committed or dropped)."""
        az = self.servers.azure
        staged = az.blob_names(self.container, self.prefix, uncommitted=True) - \
            az.blob_names(self.container, self.prefix, uncommitted=False)
        return [f"staged blocks {n}" for n in sorted(staged) if n.rsplit("/", 1)[-1].startswith("part-")]


class AzureDeltaTarget(AzureFilesTarget):
    """twophase-delta on an ``abfss://`` table (Azurite)."""

    name, fmt = "azure-delta", "twophase-delta"
    prefix = "table"
    one_version_commit = True

    def sink(self) -> Any:
        from twophase.sinks.delta import DeltaSink
        return DeltaSink.from_options({**self.options(), "checkpointLocation": self.ck})

    def _table(self) -> Any:
        from deltalake import DeltaTable
        so = self.servers.azure.storage_options()
        return DeltaTable(self.uri, storage_options=so) if DeltaTable.is_deltatable(self.uri, storage_options=so) else None

    def read(self) -> list[int]:
        dt = self._table()
        return [] if dt is None else dt.to_pyarrow_table().column("id").to_pylist()

    def leftovers(self) -> list[str]:
        import pyarrow as pa
        import urllib.parse
        dt = self._table()
        referenced = set() if dt is None else {
            urllib.parse.unquote(p) for p in pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist()}
        return super().leftovers() + [f"unreferenced {n}" for n in sorted(self.data_names() - referenced)]


class PostgresTarget(FileInput, Target):
    """twophase-postgres (a TwoPhaseCommitSink as a registered Spark format, ``twophase.spark.data_source``) into a
    fresh table of the campaign's PostgreSQL server. ``pause`` stops the postmaster and every backend."""

    name, fmt, server_kind = "postgres", "twophase-postgres", "postgres"

    def __init__(self, tmp: str, servers: "Servers") -> None:
        super().__init__(tmp, servers)
        self.inp = os.path.join(tmp, "in")
        self.table = servers.postgres.new_table("id bigint NOT NULL, grp text, payload text", prefix="nem")
        self.sink_id = f"nem-pg-{uuid.uuid4().hex[:6]}"

    def options(self) -> dict[str, str]:
        return {"url": self.servers.postgres.url, "table": self.table, "sink_id": self.sink_id, "lockTimeout": "20"}

    def sink(self) -> Any:
        from twophase.sinks.postgres import PostgresSink
        return PostgresSink(**self.options()).bind_owner(self.ck)

    def read(self) -> list[int]:
        return [r[0] for r in self.servers.postgres.sql(f"SELECT id FROM {self.table}")]

    def leftovers(self) -> list[str]:
        sink = self.sink()
        return [f"prepared transaction {g}" for g in self.servers.postgres.prepared(sink.gid_prefix)]

    def server_pid(self) -> Optional[int]:
        d = self.servers.postgres.directory
        try:
            with open(os.path.join(d, "data", "postmaster.pid")) as f:
                return int(f.readline())
        except (OSError, ValueError, TypeError):
            return None

    def server_pids(self) -> list[int]:
        pid = self.server_pid()
        return [] if pid is None else [pid] + descendants(pid)  # the backends are processes of their own

    def pause_options(self) -> dict[str, str]:
        # the pause (8-12 s) outlasts both: a statement in flight (a task's COPY or PREPARE, the driver's COMMIT
        # PREPARED) is cancelled 4 s in, a task's transaction idle between its writes is ended 6 s in (its task fails
        # and is retried); keepalives cannot fire (the kernel answers for a stopped server)
        return {"url": self.servers.postgres.url + "?options=-c%20statement_timeout%3D4000%20-c%20"
                                                   "idle_in_transaction_session_timeout%3D6000"}


TARGETS: dict[str, type[Target]] = {"files": FilesTarget, "s3": S3Target, "delta": DeltaTarget, "kafka": KafkaTarget,
                                    "azure-files": AzureFilesTarget, "azure-delta": AzureDeltaTarget,
                                    "postgres": PostgresTarget}


@dataclass
class Servers:
    """What the targets need: an S3 server (``integration.s3._support.S3Server``) and a Kafka bootstrap."""

    cluster: Cluster
    s3: Any = None
    kafka: Optional[str] = None
    kafka_cluster: Any = None  # integration.kafka.cluster.KafkaCluster when kafka is the 3-broker cluster
    azure: Any = None  # integration.azure.azurite.AzureServer
    postgres: Any = None  # integration.postgres.server.PgServer

    def available(self, sink: str) -> bool:
        return sink == "files" or (sink in ("s3", "delta") and self.s3 is not None) or \
            (sink == "kafka" and self.kafka is not None) or (sink.startswith("azure-") and self.azure is not None) or \
            (sink == "postgres" and self.postgres is not None)


# ---------------------------------------------------------------- one scenario


@dataclass
class Outcome:
    """One scenario's result: the report line of the summary table, and what happened."""

    sink: str
    fault: str
    seed: str
    records: int = 0
    found: int = 0
    duplicates: int = 0
    missing: int = 0
    unexpected: int = 0
    leftovers: list[str] = field(default_factory=list)
    unfinished: dict[int, str] = field(default_factory=dict)
    faults_injected: int = 0
    launches: int = 0
    seconds: float = 0.0
    events: list[str] = field(default_factory=list)
    evidence: dict[str, int] = field(default_factory=dict)
    error: str = ""
    #: checkpoints a DataLossError named (``broker_pause``: a decided transaction the broker expired), resolved
    #: with --accept-loss; their input records missing from the output are counted in ``lost_named``
    named_losses: list[int] = field(default_factory=list)
    lost_named: int = 0

    @property
    def ok(self) -> bool:
        return not (self.duplicates or self.missing or self.unexpected or self.leftovers or self.unfinished
                    or self.error) and self.found + self.lost_named == self.records

    def line(self) -> str:
        return (f"{self.sink}/{self.fault} seed={self.seed}: records={self.records} found={self.found} "
                f"duplicates={self.duplicates} missing={self.missing} unexpected={self.unexpected} "
                f"leftovers={len(self.leftovers)} unfinished={len(self.unfinished)} faults={self.faults_injected} "
                f"launches={self.launches} {self.seconds:.0f}s {'OK' if self.ok else 'FAILED'}"
                + (f" lost_named={self.lost_named} (checkpoints {self.named_losses})" if self.named_losses else "")
                + (f" error={self.error}" if self.error else "")
                + (f" evidence={self.evidence}" if self.evidence else ""))


class Scenario:
    """Runs the job on the cluster for one target and injects faults; see :func:`run_scenario`."""

    def __init__(self, target: Target, cluster: Cluster, rng: random.Random, outcome: Outcome,
                 log: Callable[[str], None] = print) -> None:
        self.t, self.cluster, self.rng, self.o, self.say = target, cluster, rng, outcome, log
        self.n = 0
        self.event_dir = os.path.join(target.tmp, "events")

    # -- the job
    def log_path(self, n: int) -> str:
        return os.path.join(self.t.tmp, f"run{n}.log")

    def tail(self, n: Optional[int] = None) -> str:
        try:
            with open(self.log_path(n or self.n)) as f:
                return f.read()[-3000:]
        except OSError:
            return "(no log)"

    def start(self, *, fault: Optional[str] = None, pace: float = PACE, straggle: float = 0.0,
              extra_conf: Optional[dict[str, str]] = None,
              extra_options: Optional[dict[str, str]] = None,
              extra_env: Optional[dict[str, str]] = None) -> tuple[subprocess.Popen, str]:
        self.n += 1
        self.o.launches += 1
        app_id_file = os.path.join(self.t.tmp, f"app-id-{self.n}")
        conf = {**self.cluster.conf(), **(extra_conf or {})}
        env = {k: v for k, v in os.environ.items() if not k.startswith("TWOPHASE_FAULT")}
        env["PYSPARK_PYTHON"] = os.environ.get("PYSPARK_PYTHON", sys.executable)
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        for k, v in (extra_env or {}).items():
            env[k] = v + os.pathsep + env[k] if k == "PYTHONPATH" else v
        if fault:
            marker = os.path.join(self.t.tmp, f"marker-{self.n}")
            fault_env = {"TWOPHASE_FAULT": fault, "TWOPHASE_FAULT_MARKER": marker, "TWOPHASE_FAULT_SCOPE": "auto"}
            env.update(fault_env)
            conf.update({f"spark.executorEnv.{k}": v for k, v in fault_env.items()})
        cmd = [sys.executable, JOB, "--sink", self.t.fmt,
               "--options", json.dumps({**self.t.options(), **(extra_options or {})}),
               "--checkpoint", self.t.ck, *self.t.source_args(), "--partitions", "2",
               "--master", self.cluster.master_url, "--app-name", f"nemesis-{self.t.name}-{self.n}",
               "--app-id-file", app_id_file, "--event-log", self.event_dir, "--pace", str(pace),
               "--pace-rows", str(PACE_ROWS), "--straggle", str(straggle), "--timeout", str(JOB_TIMEOUT - 30)]
        for k, v in conf.items():
            cmd += ["--conf", f"{k}={v}"]
        with open(self.log_path(self.n), "ab") as logf:
            p = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        return p, app_id_file

    def wait(self, p: subprocess.Popen, timeout: float = JOB_TIMEOUT) -> int:
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            raise NemesisError(f"job {self.n} did not finish within {timeout}s; log:\n{self.tail()}") from None
        if rc != 0:
            self.resolve_named_loss()
        return rc

    def resolve_named_loss(self) -> None:
        """A run that stopped on a DataLossError naming a checkpoint (the only allowed loss: a decided transaction
        the broker expired): record it, and resolve it as an operator would (``twophase log resolve
        --accept-loss``), so the next run goes on. Only ``broker_pause`` may lose data; elsewhere it is an error."""
        import re
        try:
            with open(self.log_path(self.n), errors="replace") as f:
                text = f.read()
        except OSError:
            return
        named = sorted({int(c) for c in re.findall(r"--checkpoint (\d+) --accept-loss", text)}
                       - set(self.o.named_losses)) if "DataLossError" in text else []
        for cid in named:
            self.o.named_losses.append(cid)
            self.o.events.append(f"run {self.n}: DataLossError named checkpoint {cid}; resolved with --accept-loss")
            if self.o.fault != "broker_pause":
                self.o.error = f"data loss (checkpoint {cid}) under {self.o.fault}: only broker_pause may expire"
            sink = self.t.sink()
            r = subprocess.run([sys.executable, "-m", "twophase.cli", "log", "resolve", sink.transaction_log().location,
                                "--sink-id", sink.sink_id, "--checkpoint", str(cid), "--accept-loss",
                                "--reason", f"nemesis {self.o.fault} seed {self.o.seed}"],
                               capture_output=True, text=True, timeout=120, cwd=ROOT)
            if r.returncode != 0:
                raise NemesisError(f"twophase log resolve --checkpoint {cid} failed: {r.stderr[-2000:]}")

    def wait_for(self, what: str, cond: Callable[[], Any], p: subprocess.Popen, timeout: float = 120.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = cond()
            if got:
                return got
            if p.poll() is not None:
                return None
            time.sleep(0.05)
        raise NemesisError(f"timed out after {timeout}s waiting for {what}; log:\n{self.tail()}")

    def app_id(self, path: str, p: subprocess.Popen) -> str:
        def read() -> Optional[str]:
            try:
                with open(path) as f:
                    return f.read().strip() or None
            except FileNotFoundError:
                return None
        got = self.wait_for("the application id", read, p)
        if not got:
            raise NemesisError(f"job {self.n} ended (rc={p.returncode}) before it started; log:\n{self.tail()}")
        return got

    def in_flight(self, batch: int) -> bool:
        return os.path.exists(os.path.join(self.t.ck, "offsets", str(batch))) and \
            not os.path.exists(os.path.join(self.t.ck, "commits", str(batch)))

    def committed_batches(self) -> int:
        d = os.path.join(self.t.ck, "commits")
        return len([f for f in os.listdir(d) if f.isdigit()]) if os.path.isdir(d) else 0

    def run_clean(self, *, attempts: int = 3) -> None:
        """Run the job without faults until it finishes (a supervisor restarting a failed query)."""
        for _ in range(attempts):
            p, _ = self.start(pace=0)
            rc = self.wait(p)
            if rc == 0:
                return
            self.o.events.append(f"clean run {self.n} failed rc={rc}")
        raise NemesisError(f"the job did not finish cleanly in {attempts} runs; log:\n{self.tail()}")

    def first_batch(self) -> int:
        """The id of the first batch this run will plan (batch ids continue across runs)."""
        d = os.path.join(self.t.ck, "offsets")
        return len([f for f in os.listdir(d) if f.isdigit()]) if os.path.isdir(d) else 0

    def check_after_crash(self, what: str) -> None:
        """After a driver kill: no record twice, and whole batches only, except where a commit is under
        way: files, S3 objects and Kafka transactions are committed one by one (a crash at ``mid_commit``,
        or a kill at a random moment, may show part of a batch until recovery commits the rest); a Delta
        batch is one table version (never partial)."""
        got = self.t.read()
        dup = sum(c - 1 for c in Counter(got).values() if c > 1)
        if dup:
            self.o.duplicates = max(self.o.duplicates, dup)
            self.o.events.append(f"{dup} duplicates visible after {what}")
        may_be_partial = self.t.name != "delta" and ("mid_commit" in what or what == "the driver kill")
        if len(got) % ROWS_PER_BATCH and not may_be_partial:
            self.o.error = f"a partial batch is visible after {what}: {len(got)} records"

    # -- kinds
    def victim(self, kind: str, app_id: str) -> Optional[tuple[int, str]]:
        jvms = executor_jvms(app_id)
        if not jvms:
            return None
        if kind == "executor_jvm":
            v = self.rng.choice(jvms)
            return v, f"executor JVM {v} (of {jvms})"
        if kind == "worker":
            v = self.rng.choice(jvms)
            w = worker_of(v)
            return (w, f"worker {w} with executor {v}") if w else None
        found = sorted(w for e in jvms for w in python_workers(e))
        if not found:
            return None
        v = self.rng.choice(found)
        return v, f"Python worker {v} (of {found})"

    def fetch_failed(self) -> None:
        """An executor JVM killed by the ``write`` fault point (scope ``auto``) while a sink task of a
        seeded batch runs: the shuffle map output on that executor is lost, so the task's retry fails to
        fetch it (FetchFailed), Spark re-runs the map stage and a new attempt of the sink stage, while the
        old attempt's task on the other executor may still finish and pre-commit."""
        batches = self.rng.randrange(2, 4)
        self.t.add_input(batches)
        batch = self.first_batch() + self.rng.randrange(batches)
        point = self.rng.choice(EXECUTOR_POINTS)
        rc, _ = self.faulted_run(f"{point}@{batch}", pace=PACE, note=" (scope auto: one executor JVM)")
        self.supervise(rc)

    def process_fault(self, kind: str) -> None:
        batches = self.rng.randrange(2, 4)
        self.t.add_input(batches)
        first = self.first_batch()
        batch = first + self.rng.randrange(batches)
        p, app_file = self.start()
        app_id = self.app_id(app_file, p)
        if not self.wait_for(f"batch {batch}", lambda: self.in_flight(batch), p):
            raise NemesisError(f"job ended before batch {batch}; log:\n{self.tail()}")
        delay = self.rng.uniform(0.3, 1.8)
        time.sleep(delay)
        got = self.wait_for(f"a {kind} victim", lambda: self.victim(kind, app_id), p, timeout=30)
        if not got:
            raise NemesisError(f"job ended before a {kind} victim appeared; log:\n{self.tail()}")
        victim, what = got
        if kind == "worker":
            for d in descendants(victim):
                kill(d)
        kill(victim)
        self.o.faults_injected += 1
        self.o.events.append(f"batch {batch} +{delay:.1f}s: SIGKILL {what}")
        rc = self.wait(p)
        if kind == "worker":
            self.cluster.heal()
        self.supervise(rc)

    def driver_fault(self) -> None:
        batches = self.rng.randrange(2, 4)
        self.t.add_input(batches)
        batch = self.first_batch() + self.rng.randrange(batches)
        p, app_file = self.start()
        self.app_id(app_file, p)
        if self.wait_for(f"batch {batch}", lambda: self.in_flight(batch), p):
            delay = self.rng.uniform(0.0, 2.5)
            time.sleep(delay)
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                self.o.faults_injected += 1
                self.o.events.append(f"batch {batch} +{delay:.1f}s: SIGKILL the driver's session")
        self.wait(p)
        self.check_after_crash("the driver kill")
        self.run_clean()

    def protocol_fault(self) -> None:
        batches = self.rng.randrange(2, 4)
        self.t.add_input(batches)
        batch = self.first_batch() + self.rng.randrange(batches)
        point = self.rng.choice(DRIVER_POINTS + EXECUTOR_POINTS)
        rc, _ = self.faulted_run(f"{point}@{batch}")
        if point in DRIVER_POINTS:
            if rc != -signal.SIGKILL:
                raise NemesisError(f"the driver was not killed at {point}@{batch} (rc={rc}); log:\n{self.tail()}")
            self.check_after_crash(f"{point}@{batch}")
            self.run_clean()
        else:
            self.supervise(rc)

    def recovery_fault(self) -> None:
        self.t.add_input(2)
        batch = self.first_batch()
        first = self.rng.choice(("after_complete", "mid_commit"))
        second = self.rng.choice(("in_recovery", "mid_commit"))
        if first == "mid_commit" and self.t.one_version_commit:
            # Delta's mid_commit point comes after the batch's one table version: the restart finds the version
            # (ALREADY_COMMITTED) and never reaches mid_commit again, so only in_recovery can kill it there
            second = "in_recovery"
        for fault in (f"{first}@{batch}", f"{second}@{batch}"):
            rc, _ = self.faulted_run(fault)
            if rc != -signal.SIGKILL:
                raise NemesisError(f"run {self.n} was not killed at {fault} (rc={rc}); log:\n{self.tail()}")
            self.check_after_crash(fault)
        self.run_clean()

    def speculation(self) -> None:
        self.t.add_input(self.rng.randrange(2, 4))
        straggle = self.rng.uniform(3.0, 5.0)
        p, _ = self.start(pace=0.1, straggle=straggle, extra_conf=SPECULATION)
        self.o.faults_injected += 1
        self.o.events.append(f"speculation on; partition 0 straggles {straggle:.1f}s in its first attempt")
        rc = self.wait(p)
        self.supervise(rc)

    def pause(self) -> None:
        pid = self.t.server_pid()
        if pid is None:
            raise NemesisError(f"no local server process of {self.t.name} to pause")
        batches = self.rng.randrange(2, 4)
        self.t.add_input(batches)
        batch = self.first_batch() + self.rng.randrange(batches)
        p, app_file = self.start(extra_options=self.t.pause_options())
        self.app_id(app_file, p)
        if self.wait_for(f"batch {batch}", lambda: self.in_flight(batch), p):
            time.sleep(self.rng.uniform(0.0, 1.5))
            seconds = self.rng.uniform(8.0, 12.0)
            stopped = self.t.server_pids() or [pid]
            for sp in stopped:
                os.kill(sp, signal.SIGSTOP)
            try:
                time.sleep(seconds)
            finally:
                for sp in stopped:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(sp, signal.SIGCONT)
            self.o.faults_injected += 1
            self.o.events.append(f"batch {batch}: {self.t.server_kind} server {pid} paused {seconds:.1f}s")
        rc = self.wait(p)
        self.supervise(rc, " after the pause")

    def broker_fault(self, kind: str) -> None:
        """A Kafka broker of the 3-broker cluster killed or paused (``coordinator_kill``, ``leader_kill``,
        ``broker_pause``; see the module docstring); the cluster is healed (every broker up, ISR full) after the
        faulted run, then a failed query is restarted as a supervisor would."""
        cluster = self.t.cluster
        batches = self.rng.randrange(2, 4)
        self.t.add_input(batches)
        batch = self.first_batch() + self.rng.randrange(batches)
        try:
            if kind == "coordinator_kill":
                k = self.rng.randrange(1, 4)
                hook = os.path.join(self.t.tmp, f"commit-hook-{self.n + 1}")
                p, app_file = self.start(extra_env={"PYTHONPATH": HOOK_DIR,
                                                    "TWOPHASE_NEMESIS_COMMIT_HOOK": f"{hook}:{k}"})
                self.app_id(app_file, p)
                if not self.wait_for(f"commit EndTxn #{k}", lambda: os.path.exists(hook + ".ready"), p, timeout=180):
                    raise NemesisError(f"the job ended before its EndTxn(commit) #{k}; log:\n{self.tail()}")
                with open(hook + ".ready") as f:
                    tid = f.read().strip()
                victim = cluster.coordinator(tid, timeout=30)
                cluster.kill(victim)
                with open(hook + ".go", "w"):
                    pass
                what = f"SIGKILL broker {victim}, the coordinator of {tid}, before EndTxn(commit) #{k}"
            else:
                # broker_pause: transactions time out (10 s) within the pause; the faulted run only (a batch slower
                # than half of it raises the age alarm, invariant 7, which the restarts' default timeout clears)
                p, app_file = self.start(extra_options={**self.t.pause_options(), "kafka.transaction.timeout.ms": "10000"}
                                         if kind == "broker_pause" else None)
                self.app_id(app_file, p)
                if not self.wait_for(f"batch {batch}", lambda: self.in_flight(batch), p):
                    raise NemesisError(f"job ended before batch {batch}; log:\n{self.tail()}")
                delay = self.rng.uniform(0.2, 1.5)
                time.sleep(delay)
                if kind == "leader_kill":
                    part = self.rng.randrange(2)
                    victim = cluster.partitions(self.t.out_topic)[part][0]
                    cluster.kill(victim)
                    what = f"batch {batch} +{delay:.1f}s: SIGKILL broker {victim}, leader of {self.t.out_topic}[{part}]"
                else:
                    victim = self.rng.randrange(1, cluster.n + 1)
                    seconds = self.rng.uniform(12.0, 18.0)
                    cluster.pause(victim)
                    try:
                        time.sleep(seconds)
                    finally:
                        cluster.resume(victim)
                    what = f"batch {batch} +{delay:.1f}s: broker {victim} paused {seconds:.1f}s"
            self.o.faults_injected += 1
            self.o.events.append(what)
            rc = self.wait(p)
        finally:
            self.t.heal()
        self.supervise(rc)

    def matrix(self) -> None:
        """Every protocol point once, on the cluster, in one chain of runs (each restart recovers the
        previous crash): executor points kill one executor (the job goes on), driver points the driver.

        ======  ======================================================  =================================
        run     TWOPHASE_FAULT (batch ids relative to the first)        ends
        ======  ======================================================  =================================
        1       write@0, after_pre_commit@1, before_complete@2          driver killed (batch 2 PENDING)
        2       after_complete@2                                        killed (2 COMPLETED)
        3       in_recovery@2                                           killed in recovery (2 committed)
        4       mid_commit@3                                            killed (3 partly committed)
        5       after_commit@4                                          killed (4 committed, not Spark's)
        6       none                                                    done: batches 4 (again) and 5
        ======  ======================================================  =================================
        """
        self.t.add_input(6)
        b = self.first_batch()
        chain = [(f"write@{b},after_pre_commit@{b + 1},before_complete@{b + 2}", 3),
                 (f"after_complete@{b + 2}", 1), (f"in_recovery@{b + 2}", 1), (f"mid_commit@{b + 3}", 1),
                 (f"after_commit@{b + 4}", 1)]
        for fault, points in chain:
            rc, fired = self.faulted_run(fault)
            if rc != -signal.SIGKILL or len(fired) != points:
                raise NemesisError(f"run {self.n} ({fault}): expected the driver killed after {points} fault(s), "
                                   f"got rc={rc}, fired {fired}; log:\n{self.tail()}")
            self.check_after_crash(fault)
        self.run_clean()

    def supervise(self, rc: int, after: str = "") -> None:
        """What a supervisor does with a run's exit code: a failed query is restarted until it finishes."""
        if rc != 0:
            self.o.events.append(f"run {self.n} rc={rc}{after}; restarting")
            self.run_clean()

    def faulted_run(self, fault: str, *, pace: float = 0.0, note: str = "") -> tuple[int, list[str]]:
        """One run with ``TWOPHASE_FAULT=fault`` (scope ``auto``): its exit code and the points that fired
        (counted as injected faults and recorded as an event)."""
        p, _ = self.start(fault=fault, pace=pace)
        rc = self.wait(p)
        fired = self.fired(self.n)
        self.o.faults_injected += len(fired)
        self.o.events.append(f"TWOPHASE_FAULT={fault}{note}: fired {fired or 'never'}, rc={rc}")
        return rc, fired

    def fired(self, n: int) -> list[str]:
        try:
            with open(os.path.join(self.t.tmp, f"marker-{n}")) as f:
                return [" ".join(line.split()[:2]) for line in f if line.strip()]
        except FileNotFoundError:
            return []


def event_evidence(event_dir: str) -> dict[str, int]:
    """What Spark's event logs of the scenario show: stage retries, speculation, fetch failures, lost executors."""
    ev = Counter()
    for path in glob.glob(os.path.join(event_dir, "*")):
        with open(path, errors="replace") as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                kind = e.get("Event", "")
                if kind == "SparkListenerStageSubmitted" and e["Stage Info"].get("Stage Attempt ID", 0) > 0:
                    ev["stage_retries"] += 1
                elif kind == "SparkListenerTaskStart" and e["Task Info"].get("Speculative"):
                    ev["speculative_tasks"] += 1
                elif kind == "SparkListenerTaskEnd":
                    reason = (e.get("Task End Reason") or {}).get("Reason", "")
                    if reason == "FetchFailed":
                        ev["fetch_failed"] += 1
                    elif reason not in ("Success", ""):
                        ev["failed_or_killed_tasks"] += 1
                elif kind == "SparkListenerExecutorRemoved":
                    ev["executors_lost"] += 1
    return dict(ev)


def check(t: Target, o: Outcome) -> None:
    """Fill ``o`` with the exactly-once count, the leftovers and the unfinished log records of ``t``."""
    got = t.read()
    want, seen = Counter(t.ids), Counter(got)
    o.records, o.found = len(t.ids), len(got)
    o.duplicates = max(o.duplicates, sum(c - 1 for i, c in seen.items() if c > 1 and i in want))
    named: set[int] = set()
    for cid in o.named_losses:  # a loss a DataLossError named and an operator accepted (see resolve_named_loss)
        named |= t.batch_ids(cid)
    o.missing = sum(1 for i in want if i not in seen and i not in named)
    o.lost_named = sum(1 for i in want if i not in seen and i in named)
    o.unexpected = sum(c for i, c in seen.items() if i not in want)
    o.leftovers = t.leftovers()
    o.unfinished = {c: s for c, s in t.log_states().items()
                    if s not in ("COMMITTED", "ABORTED") and not (s == "LOST" and c in o.named_losses)}


def run_scenario(sink: str, fault: str, seed: str, servers: Servers, tmp: str,
                 log: Callable[[str], None] = print) -> Outcome:
    """One fresh target of ``sink`` under one ``fault``; never raises (errors land in the outcome)."""
    rng = random.Random(f"{seed}:{sink}:{fault}")
    o = Outcome(sink, fault, seed)
    started = time.monotonic()
    os.makedirs(tmp, exist_ok=True)
    t: Optional[Target] = None
    try:
        t = TARGETS[sink](tmp, servers)
        sc = Scenario(t, servers.cluster, rng, o, log)
        if fault in ("executor_jvm", "python_worker", "worker"):
            sc.process_fault(fault)
        elif fault == "fetch_failed":
            sc.fetch_failed()
        elif fault == "driver":
            sc.driver_fault()
        elif fault == "protocol":
            sc.protocol_fault()
        elif fault == "recovery":
            sc.recovery_fault()
        elif fault == "speculation":
            sc.speculation()
        elif fault == "pause":
            sc.pause()
        elif fault == "matrix":
            sc.matrix()
        elif fault in KAFKA_CLUSTER_FAULTS:
            if getattr(t, "cluster", None) is None:
                raise NemesisError(f"{fault} needs the Kafka target on the 3-broker cluster (campaign --kafka-brokers 3)")
            sc.broker_fault(fault)
        else:
            raise NemesisError(f"unknown fault kind {fault!r}; one of {', '.join(FAULTS)}, matrix")
        o.evidence = event_evidence(sc.event_dir)
    except Exception as e:  # noqa: BLE001 - the outcome reports it
        o.error = f"{type(e).__name__}: {e}"[:4000]
    finally:
        if t is not None:
            try:
                check(t, o)
            except Exception as e:  # noqa: BLE001
                o.error = (o.error + f"; check failed: {type(e).__name__}: {e}")[:4000]
        o.seconds = time.monotonic() - started
    log(o.line())
    for ev in o.events:
        log(f"    {ev}")
    return o


def faults_for(sink: str) -> tuple[str, ...]:
    """``pause`` stops the sink's server past its client timeouts: S3 and Kafka (the Azure sinks' client has
    no timeout option yet, so a pause would only wait out the SDK's; local files have no server)."""
    if sink == "kafka":
        return FAULTS
    return tuple(f for f in FAULTS if f not in KAFKA_CLUSTER_FAULTS
                 and (f != "pause" or sink in ("s3", "delta", "postgres")))


def summary(outcomes: list[Outcome]) -> str:
    """A markdown table per sink and fault kind: runs, faults injected, records, duplicates, missing, leftovers."""
    rows: dict[tuple[str, str], list[Outcome]] = {}
    for o in outcomes:
        rows.setdefault((o.sink, o.fault), []).append(o)
    lines = ["| sink | fault | runs | faults injected | records | duplicates | missing | leftovers | "
             "unfinished | lost (named) | failed runs | Spark saw |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for (sink, fault), os_ in sorted(rows.items()):
        ev = Counter()
        for o in os_:
            ev.update(o.evidence)
        lines.append(f"| {sink} | {fault} | {len(os_)} | {sum(o.faults_injected for o in os_)} | "
                     f"{sum(o.records for o in os_)} | {sum(o.duplicates for o in os_)} | "
                     f"{sum(o.missing for o in os_)} | {sum(len(o.leftovers) for o in os_)} | "
                     f"{sum(len(o.unfinished) for o in os_)} | {sum(o.lost_named for o in os_)} | "
                     f"{sum(not o.ok for o in os_)} | "
                     + ", ".join(f"{k} {v}" for k, v in sorted(ev.items())) + " |")
    total = outcomes
    lines.append(f"| **all** | | {len(total)} | {sum(o.faults_injected for o in total)} | "
                 f"{sum(o.records for o in total)} | {sum(o.duplicates for o in total)} | "
                 f"{sum(o.missing for o in total)} | {sum(len(o.leftovers) for o in total)} | "
                 f"{sum(len(o.unfinished) for o in total)} | {sum(o.lost_named for o in total)} | "
                 f"{sum(not o.ok for o in total)} | |")
    return "\n".join(lines)


def new_tmp(base: str, sink: str, fault: str) -> str:
    return os.path.join(base, f"{sink}-{fault}-{uuid.uuid4().hex[:6]}")
