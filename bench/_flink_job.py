"""The Flink side of ``bench/bench_flink.py``; runs under the PyFlink virtualenv's Python, never the project's.

One invocation starts one JVM (PyFlink's gateway) and runs the configurations given, one local
mini-cluster job each, in order, then prints one JSON line per job on stdout. The job is the one of
``bench/bench_runtime.py``: 2 sources -> union -> key_by(id % 1000) -> keyed running count -> FileSink,
exactly-once, aligned checkpoints every 100 ms, parallelism 2.

Configurations (``--configs``, comma separated):

``udf-row`` / ``udf-bulk`` (``udf-row-thread`` / ``udf-bulk-thread``)
    Java ``NumberSequenceSource`` sources; the key selector and the keyed count (a
    ``KeyedProcessFunction`` with a ``ValueState``) are Python UDFs run by PyFlink's Python workers
    (``python.execution-mode=process``: Beam's fn harness, a worker process per operator and subtask,
    records and state requests over gRPC; ``-thread``: the same functions embedded in the JVM with pemja);
    FileSink in row format (``SimpleStringEncoder``) or bulk format (``CsvBulkWriters``).
``sql-row`` / ``sql-bulk``
    Java sources, and the keyed count in Java: ``COUNT(*) OVER (PARTITION BY k ORDER BY proctime)``
    (Flink's keyed over-aggregation operator, a ValueState/MapState per key), turned back into a
    ``DataStream<Row>`` and written by the same FileSinks. No Python runs per record.

Checkpoint times come from Flink's own log (``CheckpointCoordinator``: "Triggering checkpoint N ... @ ts"
and "Completed checkpoint N ... checkpointDuration=D ms"), written to ``$FLINK_LOG_DIR``, which the
caller sets. The commit (the FileSink committer renaming pending files on notifyCheckpointComplete)
is not in those lines: the caller dates it by the files' ctime.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import time


def build_and_run(cfg: str, records: int, out: str, interval_ms: int, python_mode: str, parallelism: int,
                  extra_conf: list[str]) -> dict:
    from pyflink.common import Configuration, Encoder, Row, Types, WatermarkStrategy
    from pyflink.datastream import CheckpointingMode, StreamExecutionEnvironment
    from pyflink.datastream.connectors.file_system import BucketAssigner, FileSink, OutputFileConfig, RollingPolicy
    from pyflink.datastream.connectors.number_seq import NumberSequenceSource
    from pyflink.datastream.formats.csv import CsvBulkWriters, CsvSchema
    from pyflink.datastream.functions import KeyedProcessFunction, RuntimeContext
    from pyflink.datastream.state import ValueStateDescriptor
    from pyflink.table import DataTypes, Schema, StreamTableEnvironment

    kind, fmt, *mode = cfg.split("-")
    python_mode = mode[0] if mode else python_mode
    conf = Configuration()
    conf.set_string("python.execution-mode", python_mode)
    conf.set_string("python.executable", sys.executable)  # the Python worker: this venv's, which has pyflink
    conf.set_string("python.client.executable", sys.executable)
    conf.set_string("restart-strategy.type", "none")  # a failure fails the run instead of restarting forever
    if kind == "udf" and python_mode == "process":
        # Flink 2.3's defaults (1,000 and 1,000) make each keyed-state access that misses the Python worker's
        # cache a gRPC round trip to the JVM; here the key changes with every record (id % 1000 over sequential
        # ids). With these, the measured udf-row run went from ~2,500 to ~9,600 records/s; --conf overrides.
        conf.set_string("python.state.cache-size", "100000")
        conf.set_string("python.fn-execution.bundle.size", "100000")
    for kv in extra_conf:
        k, _, v = kv.partition("=")
        conf.set_string(k, v)
    conf.set_string("execution.checkpointing.dir", "file://" + os.path.join(out + "-ckpt"))
    conf.set_string("execution.checkpointing.storage", "filesystem")
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_parallelism(parallelism)
    env.enable_checkpointing(interval_ms, CheckpointingMode.EXACTLY_ONCE)
    half = records // 2
    ws = WatermarkStrategy.no_watermarks()
    a = env.from_source(NumberSequenceSource(0, half - 1), ws, "seq-a")
    b = env.from_source(NumberSequenceSource(half, records - 1), ws, "seq-b")
    row_type = Types.ROW_NAMED(["id", "k", "n"], [Types.LONG(), Types.LONG(), Types.LONG()])

    if kind == "udf":
        class Count(KeyedProcessFunction):
            def open(self, ctx: RuntimeContext) -> None:
                self.n = ctx.get_state(ValueStateDescriptor("n", Types.LONG()))

            def process_element(self, v, ctx):
                c = (self.n.value() or 0) + 1
                self.n.update(c)
                yield (f"{v},{v % 1000},{c}" if fmt == "row" else Row(v, v % 1000, c))

        counted = a.union(b).key_by(lambda v: v % 1000, key_type=Types.LONG()) \
            .process(Count(), output_type=Types.STRING() if fmt == "row" else row_type)
    elif kind == "sql":
        t_env = StreamTableEnvironment.create(env)
        schema = Schema.new_builder().column("f0", DataTypes.BIGINT()).column_by_expression("pt", "PROCTIME()").build()
        t_env.create_temporary_view("a", t_env.from_data_stream(a, schema))
        t_env.create_temporary_view("b", t_env.from_data_stream(b, schema))
        table = t_env.sql_query(
            "SELECT id, k, COUNT(*) OVER (PARTITION BY k ORDER BY pt ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)"
            " AS n FROM (SELECT f0 AS id, CAST(f0 % 1000 AS BIGINT) AS k, pt FROM a UNION ALL SELECT f0 AS id, CAST(f0 % 1000 AS BIGINT) AS k, pt FROM b)")
        counted = t_env.to_data_stream(table)  # DataStream<Row>, Java; rows print as +I[id, k, n]
    else:
        raise SystemExit(f"unknown configuration {cfg!r}")

    files = OutputFileConfig.builder().with_part_prefix("part").with_part_suffix(".csv").build()
    if fmt == "row":
        sink = FileSink.for_row_format(out, Encoder.simple_string_encoder()) \
            .with_rolling_policy(RollingPolicy.on_checkpoint_rolling_policy()).with_output_file_config(files) \
            .with_bucket_assigner(BucketAssigner.base_path_bucket_assigner()).build()
    else:
        csv = CsvSchema.builder().add_number_column("id", DataTypes.BIGINT()).add_number_column("k", DataTypes.BIGINT()) \
            .add_number_column("n", DataTypes.BIGINT()).set_use_header(False).build()
        sink = FileSink.for_bulk_format(out, CsvBulkWriters.for_schema(csv)).with_output_file_config(files) \
            .with_bucket_assigner(BucketAssigner.base_path_bucket_assigner()).build()  # bulk: rolls on every checkpoint
    counted.sink_to(sink).name("file-sink")

    t0 = time.time()
    result = env.execute(f"bench-{cfg}")
    wall = time.time() - t0
    net_ms = result.get_net_runtime()
    return {"config": cfg, "python_mode": python_mode, "records": records, "out": out, "wall_s": wall,
            "net_runtime_s": net_ms / 1e3, "job_id": str(result.get_job_id())}


_TRIGGER = re.compile(r"Triggering checkpoint (\d+) .*@ (\d+) for job (\w+)")
_DONE = re.compile(r"Completed checkpoint (\d+) for job (\w+) .*checkpointDuration=(\d+) ms")
_DECLINED = re.compile(r"Decline checkpoint (\d+) by task \S+ of job (\w+)")


def checkpoints_from_log(log_dir: str, job_id: str) -> tuple[list[dict], list[int]]:
    """([{id, trigger_ms, duration_ms}] of the completed checkpoints of ``job_id``, [ids declined by a task]),
    from Flink's log."""
    trig: dict[int, int] = {}
    done: list[dict] = []
    declined: set[int] = set()
    for path in glob.glob(os.path.join(log_dir, "*.log")):
        with open(path, errors="replace") as f:
            for line in f:
                m = _TRIGGER.search(line)
                if m and m.group(3) == job_id:
                    trig[int(m.group(1))] = int(m.group(2))
                    continue
                m = _DECLINED.search(line)
                if m and m.group(2) == job_id:
                    declined.add(int(m.group(1)))
                    continue
                m = _DONE.search(line)
                if m and m.group(2) == job_id:
                    done.append({"id": int(m.group(1)), "duration_ms": int(m.group(3))})
    for d in done:
        d["trigger_ms"] = trig.get(d["id"])
    return sorted(done, key=lambda d: d["id"]), sorted(declined)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="udf-row,udf-bulk,sql-row,sql-bulk")
    ap.add_argument("--records", type=int, required=True)
    ap.add_argument("--out", required=True, help="a directory; one sub-directory per job")
    ap.add_argument("--interval-ms", type=int, default=100)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--python-mode", default="process", choices=("process", "thread"))
    ap.add_argument("--conf", action="append", default=[], help="KEY=VALUE, a Flink option (repeatable)")
    ap.add_argument("--warmup", type=int, default=0, help="records of an untimed first job of each configuration")
    args = ap.parse_args()
    log_dir = os.environ.get("FLINK_LOG_DIR")
    if not log_dir:
        raise SystemExit("set FLINK_LOG_DIR (bench_flink.py does): checkpoint times are read from Flink's log")
    import site
    import pyflink
    # thread mode embeds CPython in the JVM (pemja), which does not know this venv: give it its site-packages
    os.environ["PYTHONPATH"] = os.pathsep.join(site.getsitepackages())
    for i, cfg in enumerate(c for c in args.configs.split(",") if c):
        if args.warmup:
            build_and_run(cfg, args.warmup, os.path.join(args.out, f"warmup-{i}-{cfg}"), args.interval_ms,
                          args.python_mode, args.parallelism, args.conf)
        r = build_and_run(cfg, args.records, os.path.join(args.out, f"{i}-{cfg}"), args.interval_ms,
                          args.python_mode, args.parallelism, args.conf)
        r["checkpoints"], r["declined"] = checkpoints_from_log(log_dir, r["job_id"])
        r["flink_version"] = getattr(pyflink, "__version__", None) or _version()
        print("RESULT " + json.dumps(r), flush=True)
    return 0


def _version() -> str:
    from importlib.metadata import version
    return version("apache-flink")


if __name__ == "__main__":
    sys.exit(main())
