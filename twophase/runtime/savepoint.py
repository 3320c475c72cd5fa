"""Savepoints: a completed checkpoint's state, exported to a file and restored by operator uid.

A savepoint is triggered like a checkpoint (``CheckpointProperties.savepoint()``, forced past the
trigger policy); once complete, its state (every task's snapshot, keyed by ``<uid>#<subtask>``) is
written to a self-checking file (the transaction log's record encoding). A job restored from it
matches state to its vertices by uid.

Invariants (``test_savepoint_invN_*``):

1. The file is written atomically and read back only if its checksum holds.
2. State of a uid that the new job does not have is refused (ConfigurationError naming the uids)
   unless ``allow_non_restored_state``; then it is dropped and logged.
3. A vertex of the new job with no state in the savepoint starts empty.
4. Keyed and source state is redistributed when the parallelism changed; in-flight channel state
   (unaligned checkpoints) is not, so such a restore with another parallelism is refused.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from twophase._logging import get_logger
from twophase.errors import ConfigurationError
from twophase.log import decode_record, encode_record
from twophase.log_store import fsync_dir, makedirs_durable
from twophase.runtime.graph import JobGraph, split_task_id

_log = get_logger(__name__)


@dataclass(frozen=True)
class Savepoint:
    job: str
    checkpoint_id: int
    task_state: Mapping[str, Any]
    created_at: float = 0.0

    def write(self, path: str) -> str:
        """Write atomically to ``path`` (invariant 1); returns the absolute path."""
        path = os.path.abspath(path)
        makedirs_durable(os.path.dirname(path))
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        body = {"job": self.job, "checkpoint_id": self.checkpoint_id, "task_state": dict(self.task_state),
                "created_at": self.created_at or time.time()}
        with open(tmp, "wb") as f:
            f.write(encode_record(body))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(path))  # the rename itself survives a power loss
        return path

    @classmethod
    def read(cls, path: str) -> "Savepoint":
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise ConfigurationError(f"no savepoint at {path!r}; give the path stop_with_savepoint() returned") from None
        body = decode_record(data, path)
        return cls(body["job"], int(body["checkpoint_id"]), body["task_state"] or {}, body.get("created_at", 0.0))


def states_by_uid(task_state: Optional[Mapping[str, Any]]) -> dict[str, dict[int, Any]]:
    """``{uid: {subtask: state}}`` from a checkpoint's ``task_state``."""
    out: dict[str, dict[int, Any]] = {}
    for tid, st in (task_state or {}).items():
        uid, sub = split_task_id(tid)
        out.setdefault(uid, {})[sub] = st
    return out


def match_state(task_state: Optional[Mapping[str, Any]], graph: JobGraph, *,
                allow_non_restored_state: bool = False) -> dict[str, dict[int, Any]]:
    """Assign restored state to the graph's vertices by uid (invariants 2-4)."""
    by_uid = states_by_uid(task_state)
    uids = {v.uid for v in graph.vertices}
    unknown = sorted(set(by_uid) - uids)
    if unknown and not allow_non_restored_state:
        raise ConfigurationError(
            f"the restored state has operators {unknown} that job {graph.name!r} does not have; restore with "
            "allow_non_restored_state=True to drop their state, or keep those uids in the job")
    if unknown:
        _log.warning("state_not_restored", job=graph.name, uids=unknown)
    for v in graph.vertices:
        st = by_uid.get(v.uid)
        if st and len(st) != v.parallelism and any((s or {}).get("channels") for s in st.values()):
            raise ConfigurationError(
                f"operator {v.uid!r} has in-flight data from an unaligned checkpoint and its parallelism changed "
                f"({len(st)} -> {v.parallelism}); restore with the old parallelism, or from an aligned savepoint")
    return {uid: st for uid, st in by_uid.items() if uid in uids}
