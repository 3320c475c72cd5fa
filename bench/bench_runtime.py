"""Benchmark of the embedded runtime (no timed asserts; prints a markdown table).

Job: 2 sources -> key_by -> keyed map (running count) -> file sink (Parquet), measured
1. with checkpoints every 100 ms (aligned) against the same job with checkpointing off, in one run;
2. alignment time per checkpoint (from the barrier handlers);
3. time from a task failure to the first checkpoint committed after the restart.

    .venv/bin/python bench/bench_runtime.py [--records 200000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa  # noqa: E402

from twophase.sinks.files import FileSink  # noqa: E402
from twophase.runtime import CheckpointConfig, CollectionSource, FixedDelayRestart, JobGraph, JobRunner  # noqa: E402


def build(out: str, n: int, fail_at: int | None = None) -> JobGraph:
    g = JobGraph("bench", default_parallelism=2)
    half = n // 2
    a = g.source(CollectionSource({"a0": [{"id": i, "k": i % 1000} for i in range(0, half, 2)],
                                   "a1": [{"id": i, "k": i % 1000} for i in range(1, half, 2)]}), uid="a")
    b = g.source(CollectionSource({"b0": [{"id": i, "k": i % 1000} for i in range(half, n, 2)],
                                   "b1": [{"id": i, "k": i % 1000} for i in range(half + 1, n, 2)]}), uid="b")
    state = {"seen": 0, "fired": False}

    def count(v, st):
        if fail_at is not None and not state["fired"]:
            state["seen"] += 1
            if state["seen"] >= fail_at:
                state["fired"] = True
                raise RuntimeError("injected failure")
        c = st.value(0) + 1
        st.update(c)
        return {"id": v["id"], "k": v["k"], "n": c}
    a.union(b).key_by(lambda r: r["k"]).map(count, uid="count").sink_to(FileSink.from_options({"path": out}), uid="out")
    return g


def run(n: int, checkpointing: CheckpointConfig | None, fail_at: int | None = None):
    out = tempfile.mkdtemp(prefix="twophase-bench-")
    try:
        g = build(out, n, fail_at)
        runner = JobRunner(g, checkpointing=checkpointing, restart=FixedDelayRestart(3, 0.0))
        t = time.perf_counter()
        result = runner.run()
        return n / (time.perf_counter() - t), result
    finally:
        shutil.rmtree(out, ignore_errors=True)


def ms(xs: list[float]) -> str:
    if not xs:
        return "-"
    xs = sorted(xs)
    return f"{statistics.median(xs) * 1e3:.2f} / {xs[int(0.95 * (len(xs) - 1))] * 1e3:.2f} / {xs[-1] * 1e3:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    pa.RecordBatch.from_pylist([{"warm": 1}])  # pyarrow's first call is slow; keep it out of the timings
    run(10_000, None)
    off, on, align, ckpt_count, ckpt_dur = [], [], [], [], []
    for _ in range(args.repeat):  # interleaved, so both see the same machine state
        r_off, _ = run(args.records, None)
        r_on, res = run(args.records, CheckpointConfig(0.1, mode="aligned"))
        off.append(r_off)
        on.append(r_on)
        align += res.metrics.alignment_times_s
        ckpt_count.append(len(res.metrics.checkpoints_completed))
        ckpt_dur += res.metrics.checkpoint_durations_s
    _, res_f = run(args.records, CheckpointConfig(0.1, mode="aligned"), fail_at=args.records // 3)
    best_off, best_on = max(off), max(on)
    print(f"\n2 sources (2 splits each) -> key_by -> keyed count (p=2) -> file sink (p=2), "
          f"{args.records} records, best of {args.repeat}, {os.cpu_count()} cores\n")
    print("| metric | value |")
    print("|---|---|")
    print(f"| records/s, checkpointing off | {best_off:,.0f} |")
    print(f"| records/s, aligned checkpoints every 100 ms | {best_on:,.0f} |")
    print(f"| ratio on/off (goal >= 0.8) | {best_on / best_off:.2f} |")
    print(f"| checkpoints completed per run | {', '.join(map(str, ckpt_count))} |")
    print(f"| checkpoint trigger -> committed, median / p95 / max ms | {ms(ckpt_dur)} |")
    print(f"| alignment time per checkpoint and task, median / p95 / max ms | {ms(align)} |")
    print(f"| task failure -> first new committed checkpoint, ms | {ms(res_f.metrics.recovery_times_s)} |")
    print(f"| attempts in the failure run | {res_f.attempts} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
