"""Shared set-up of the S3 and Delta benchmarks: an S3 endpoint and deterministic batches."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Optional

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]


def endpoint() -> tuple[str, Optional[str]]:
    """``TWOPHASE_S3_ENDPOINT`` or a radosgw (``scripts/s3_server.sh start``); returns (endpoint, dir to stop)."""
    if os.environ.get("TWOPHASE_S3_ENDPOINT"):
        return os.environ["TWOPHASE_S3_ENDPOINT"], None
    d = "/tmp/twophase-s3-bench"
    out = subprocess.run(["bash", str(ROOT / "scripts" / "s3_server.sh"), "start", d], capture_output=True, text=True,
                         check=True).stdout
    env = dict(kv.split("=", 1) for kv in shlex.split(out.strip().splitlines()[-1]))
    return env["TWOPHASE_S3_ENDPOINT"], d


def stop(d: Optional[str]) -> None:
    if d:
        subprocess.run(["bash", str(ROOT / "scripts" / "s3_server.sh"), "stop", d], capture_output=True)


def make_batch(seed: int, rows: int) -> pa.RecordBatch:
    """~40 bytes/row of mixed columns, deterministic per seed."""
    import numpy as np
    rng = np.random.default_rng(seed)
    s = pa.array(rng.integers(0, 1 << 40, rows).astype(str))
    if isinstance(s, pa.ChunkedArray):  # large numpy string arrays convert in chunks
        s = s.combine_chunks()
    return pa.record_batch({
        "id": pa.array(np.arange(seed * rows, (seed + 1) * rows, dtype=np.int64)),
        "k": pa.array(rng.integers(0, 1000, rows, dtype=np.int32)),
        "x": pa.array(rng.random(rows)),
        "s": s,
    })
