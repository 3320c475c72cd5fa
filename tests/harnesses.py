"""Conformance harnesses (:class:`twophase.testing.SinkHarness`) of the built-in sinks.

``tests/test_conformance.py`` runs the suite on files and Delta (local path); ``integration/test_conformance.py``
on S3, Delta on S3 and Kafka, with the servers of the integration fixtures.
"""

from __future__ import annotations

import os
import urllib.parse
from typing import Any, Optional

import pyarrow as pa
import pyarrow.dataset as ds

from twophase.naming import own_part_checkpoint
from twophase.testing import SinkHarness


class FileHarness(SinkHarness):
    name = "files"

    def __init__(self, root: str) -> None:
        self.root = root

    def make_sink(self, sink_id: str) -> Any:
        from twophase.sinks.files import FileSink
        s = FileSink.from_options({"path": self.root, "sink.id": sink_id})
        s.validate_destination()
        return s

    def visible_ids(self) -> list[int]:
        d = ds.dataset(self.root, format="parquet", partitioning="hive", exclude_invalid_files=False,
                       ignore_prefixes=["_", "."])
        return sorted(d.to_table(columns=["id"]).column("id").to_pylist()) if d.files else []

    def leftovers(self, sink: Any) -> int:
        return sum(len(files) for _, _, files in os.walk(sink.staging))


class DeltaHarness(SinkHarness):
    """Delta on a local path, or on S3 / Azure with ``options`` (the sink's ``s3.*`` / ``azure.*``) and
    ``storage`` (delta-rs'). Leftovers on Azure include names with only staged blocks (``list_data``)."""

    name = "delta"

    def __init__(self, uri: str, options: Optional[dict[str, str]] = None,
                 storage: Optional[dict[str, str]] = None) -> None:
        self.uri, self.options, self.storage = uri, dict(options or {}), storage

    def make_sink(self, sink_id: str) -> Any:
        from twophase.sinks.delta import DeltaSink
        s = DeltaSink.from_options({"path": self.uri, "sink.id": sink_id, **self.options}, self.batch(0, 1).schema)
        s.validate_destination()
        return s

    def visible_ids(self) -> list[int]:
        from deltalake import DeltaTable
        t = DeltaTable(self.uri, storage_options=self.storage).to_pyarrow_table(columns=["id"])
        return sorted(t.column("id").to_pylist())

    def leftovers(self, sink: Any) -> int:
        from deltalake import DeltaTable
        dt = DeltaTable(self.uri, storage_options=self.storage)
        versions = range(0, dt.version() + 1)
        added: set[str] = set()
        for v in versions:  # every file any version added (history keeps them)
            t = DeltaTable(self.uri, version=v, storage_options=self.storage)
            added |= {urllib.parse.unquote(p) for p in pa.table(t.get_add_actions(flatten=True)).column("path").to_pylist()}
        own = [rel for rel in sink.files.list_data() if own_part_checkpoint(rel.rsplit("/", 1)[-1], sink.sink_id) is not None]
        return len([rel for rel in own if rel not in added])




class S3Harness(SinkHarness):
    """twophase-s3 on a bucket prefix of a real S3 server (``options``: the sink's ``s3.*`` options)."""

    name = "s3"

    def __init__(self, bucket: str, prefix: str, options: dict[str, str], client: Any) -> None:
        self.bucket, self.prefix, self.options, self.client = bucket, prefix, options, client

    def make_sink(self, sink_id: str) -> Any:
        from twophase.sinks.s3 import S3Sink
        s = S3Sink.from_options({"path": f"s3://{self.bucket}/{self.prefix}", "partSize": "5m", "sink.id": sink_id,
                                 **self.options})
        s.validate_destination()
        return s

    def visible_ids(self) -> list[int]:
        import io

        import pyarrow.parquet as pq
        out: list[int] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=f"{self.prefix}/"):
            for o in page.get("Contents", ()):
                rel = o["Key"][len(self.prefix) + 1:]
                if rel.split("/")[-1].startswith(("_", ".")) or any(p.startswith("_") for p in rel.split("/")[:-1]):
                    continue
                body = self.client.get_object(Bucket=self.bucket, Key=o["Key"])["Body"].read()
                out += pq.read_table(io.BytesIO(body)).column("id").to_pylist()
        return sorted(out)

    def leftovers(self, sink: Any) -> int:
        ups = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=f"{self.prefix}/").get("Uploads", ())
        return len([u for u in ups if own_part_checkpoint(u["Key"].rsplit("/", 1)[-1], sink.sink_id) is not None])


class AzureFilesHarness(SinkHarness):
    """twophase-file on an Azure path (the Azure file sink) in a container of a real Blob server (Azurite);
    ``service`` is a BlobServiceClient. Leftovers: this sink's names with staged blocks only."""

    name = "files-azure"

    def __init__(self, url: str, options: dict[str, str], service: Any, container: str, prefix: str) -> None:
        self.url, self.options, self.service, self.container, self.prefix = url, options, service, container, prefix

    def make_sink(self, sink_id: str) -> Any:
        from twophase.sinks.files import file_sink_from_options
        s = file_sink_from_options({"path": self.url, "sink.id": sink_id, **self.options})
        s.validate_destination()
        return s

    def _names(self, uncommitted: bool) -> set[str]:
        c = self.service.get_container_client(self.container)
        return {b.name for b in c.list_blobs(name_starts_with=f"{self.prefix}/",
                                             include=["uncommittedblobs"] if uncommitted else None)
                if not any(p.startswith(("_", ".")) for p in b.name[len(self.prefix) + 1:].split("/"))}

    def visible_ids(self) -> list[int]:
        import io

        import pyarrow.parquet as pq
        c = self.service.get_container_client(self.container)
        out: list[int] = []
        for name in self._names(False):
            out += pq.read_table(io.BytesIO(c.get_blob_client(name).download_blob().readall())).column("id").to_pylist()
        return sorted(out)

    def leftovers(self, sink: Any) -> int:
        staged = self._names(True) - self._names(False)
        return len([n for n in staged if own_part_checkpoint(n.rsplit("/", 1)[-1], sink.sink_id) is not None])


class KafkaHarness(SinkHarness):
    """twophase-kafka on a fresh topic of a real broker; rows are ``key``/``value`` with the id in the value.

    On Apache Kafka (the tests' default broker) every check runs, "commit of an aborted committable is
    LOST" included. noida-db (``TWOPHASE_KAFKA=noida``) answers NoError to an EndTxn after an abort while the
    records stay invisible, so that one check is skipped there (a read_committed reader still checks them)."""

    name = "kafka"

    def __init__(self, bootstrap: str, topic: str, work_dir: str) -> None:
        self.bootstrap, self.topic, self.work_dir = bootstrap, topic, work_dir
        if os.environ.get("TWOPHASE_KAFKA") == "noida" and not os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
            self.lost_undetectable = "noida-db answers NoError to an EndTxn(commit) after an abort"
        self._sinks: list[Any] = []

    def make_sink(self, sink_id: str) -> Any:
        import uuid

        from twophase.sinks.kafka import KafkaSink
        raw = {"kafka.bootstrap.servers": self.bootstrap, "topic": self.topic, "sink.id": sink_id,
               "checkpointLocation": os.path.join(self.work_dir, f"ck-{sink_id}"),
               "prefixRegistry": os.path.join(self.work_dir, "registry"),
               "transactionalIdPrefix": f"{sink_id}-{uuid.uuid4().hex[:8]}"}
        s = KafkaSink.from_options(raw, self.batch(0, 1).schema)
        s.validate_destination()
        self._sinks.append(s)
        return s

    def batch(self, lo: int, n: int) -> Any:
        return pa.RecordBatch.from_pydict({"key": [b"k%d" % i for i in range(lo, lo + n)],
                                           "value": [b"%d" % i for i in range(lo, lo + n)]},
                                          schema=pa.schema([("key", pa.binary()), ("value", pa.binary())]))

    def visible_ids(self) -> list[int]:
        from kafka import KafkaConsumer, TopicPartition
        c = KafkaConsumer(bootstrap_servers=self.bootstrap, isolation_level="read_committed",
                          enable_auto_commit=False, auto_offset_reset="earliest")
        try:
            tps = [TopicPartition(self.topic, p) for p in sorted(c.partitions_for_topic(self.topic) or ())]
            c.assign(tps)
            c.seek_to_beginning(*tps)
            end = c.end_offsets(tps)
            out: list[int] = []
            while any(c.position(tp) < end[tp] for tp in tps):
                for recs in c.poll(timeout_ms=500).values():
                    out += [int(r.value) for r in recs if r.offset < end[TopicPartition(r.topic, r.partition)]]
            return sorted(out)
        finally:
            c.close()

    def leftovers(self, sink: Any) -> int:
        """Open (Ongoing) transactions of this sink's transactional-id prefix: they hold back every
        read_committed reader until aborted."""
        return len(sink._client().list_transactions(sink.prefix + "-") or ())

    def close(self) -> None:
        for s in self._sinks:
            s.close()
