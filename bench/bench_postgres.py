"""Benchmark: twophase-postgres (exactly-once, PREPARE TRANSACTION / COMMIT PREPARED) against a plain psycopg COPY
of the same rows in one ordinary transaction per task, on one PostgreSQL server, in one run. Prints a markdown
table; every ratio is against the plain COPY measured in the same invocation (rounds interleaved, so load on
the machine hits both alike). Never asserted in tests.

What runs (no Spark: what Spark costs is the same for both and would hide the difference):

- ``plain COPY``: per task, a connection, ``COPY ... FROM STDIN (FORMAT csv)`` of the task's Arrow batch
  (Arrow's CSV writer, as the sink does), ``COMMIT``. The baseline, at-least-once (a crash between COMMIT and the
  checkpoint writes the batch again).
- ``twophase-postgres`` (binary COPY, the default ``copyFormat=auto``) and the same with ``copyFormat=csv`` (what
  the sink sent before binary COPY): per task ``run_task`` (connection, COPY, marker row, ``PREPARE TRANSACTION``, the
  pending record in the local log), then per checkpoint the coordinator's ``complete_batch`` (log records,
  ``COMMIT PREPARED`` per task, the sweep of pg_prepared_xacts and the marker table).
- ``psycopg write_row``: per task, COPY with ``Copy.write_row`` per row (what hand-written psycopg code often
  does), for information.

    python bench/bench_postgres.py [--url postgresql://...] [--rows 100000] [--tasks 4] [--checkpoints 4] [--rounds 3]
                                   [--spark] [--spark-rows 200000] [--spark-batches 4]

``--spark`` adds one Spark run per writer (rounds alternated): rate-micro-batch (``--spark-rows`` rows a batch, 4
partitions) into the same table shape through ``foreachBatch``, twophase-postgres (``twophase.spark.foreach_batch``)
against Spark's own JDBC writer (``df.write.jdbc``, at-least-once; PostgreSQL's JDBC driver 42.7.14, fetched by
``scripts/pg_server.sh fetch-jdbc`` through mvn). Batch 0 warms up and is not counted.

Without --url (or TWOPHASE_PG_URL) a private server is started with scripts/pg_server.sh for the run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_batch(lo: int, n: int):
    import pyarrow as pa
    ids = pa.array(range(lo, lo + n), pa.int64())
    return pa.RecordBatch.from_arrays(
        [ids, pa.array([f"g{i % 7}" for i in range(lo, lo + n)]),
         pa.array([f"payload-{i:012d}-" + "x" * 60 for i in range(lo, lo + n)]),
         pa.array([i * 0.5 for i in range(lo, lo + n)], pa.float64())],
        names=["id", "grp", "payload", "score"])


DDL = "id bigint NOT NULL, grp text, payload text, score double precision"


def plain_copy(url: str, table: str, batches: list) -> None:
    import psycopg
    import pyarrow as pa
    import pyarrow.csv as pacsv
    for b in batches:  # one transaction per task
        with psycopg.connect(url) as conn:
            buf = io.BytesIO()
            pacsv.write_csv(pa.Table.from_batches([b]), buf, pacsv.WriteOptions(include_header=False))
            with conn.cursor() as cur, cur.copy(f"COPY {table} (id, grp, payload, score) FROM STDIN (FORMAT csv)") as cp:
                cp.write(buf.getbuffer())
            conn.commit()


def write_row_copy(url: str, table: str, batches: list) -> None:
    import psycopg
    for b in batches:
        with psycopg.connect(url) as conn:
            with conn.cursor() as cur, cur.copy(f"COPY {table} (id, grp, payload, score) FROM STDIN") as cp:
                for row in zip(*(c.to_pylist() for c in b.columns)):
                    cp.write_row(row)
            conn.commit()


def twophase_checkpoint(sink, coord, cid: int, batches: list) -> None:
    from twophase.sink import TransactionContext, run_task
    acks = [run_task(sink, TransactionContext(sink.sink_id, cid, str(t)), [b]) for t, b in enumerate(batches)]
    coord.complete_batch(cid, acks)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default=os.environ.get("TWOPHASE_PG_URL"))
    ap.add_argument("--rows", type=int, default=100_000, help="rows per checkpoint (split over --tasks)")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--checkpoints", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--write-row-rows", type=int, default=20_000, help="rows per checkpoint of the write_row run")
    ap.add_argument("--spark", action="store_true", help="also Spark: twophase-postgres vs Spark's JDBC writer")
    ap.add_argument("--spark-rows", type=int, default=200_000)
    ap.add_argument("--spark-batches", type=int, default=4)
    ap.add_argument("--spark-rounds", type=int, default=2)
    args = ap.parse_args()

    from integration.postgres.server import PgServer, pg_server
    with contextlib.ExitStack() as stack:
        server = PgServer(args.url) if args.url else stack.enter_context(pg_server())
        run(server, args)
        if args.spark:
            run_spark(server, args)


def run(server, args) -> None:
    from twophase.coordinator import CheckpointCoordinator
    from twophase.sinks.postgres import PostgresSink

    per_task = args.rows // args.tasks
    cps = [[make_batch(c * args.rows + t * per_task, per_task) for t in range(args.tasks)]
           for c in range(args.checkpoints + 1)]  # checkpoint 0 warms up
    small = [[b.slice(0, args.write_row_rows // args.tasks) for b in cp] for cp in cps]
    tmp = tempfile.mkdtemp(prefix="bench-pg-")
    times: dict[str, list[float]] = {"plain": [], "twophase": [], "twophase_csv": [], "write_row": []}
    for r in range(args.rounds):
        plain_t, wr_t = server.new_table(DDL, f"bench_plain{r}"), server.new_table(DDL, f"bench_wr{r}")
        sinks = {}
        for kind, fmt in (("twophase", "auto"), ("twophase_csv", "csv")):  # binary COPY (auto) and CSV COPY
            table = server.new_table(DDL, f"bench_{kind}{r}")
            sink = PostgresSink(url=server.url, table=table, sink_id=f"bench-{kind}-{r}",
                                log_location=f"{tmp}/log-{kind}-{r}", copyFormat=fmt)
            sink.validate_destination()
            log = sink.transaction_log()
            log.claim(f"bench-{kind}-{r}")
            sinks[kind] = (sink, CheckpointCoordinator(sink, log, sweep_after_commit=True), table)
        plain_copy(server.url, plain_t, cps[0])
        for sink, coord, _ in sinks.values():
            twophase_checkpoint(sink, coord, 0, cps[0])
        spent = {k: 0.0 for k in times}
        for c in range(1, args.checkpoints + 1):  # interleaved (order alternated): the machine's load hits all alike
            order = ["plain", "twophase", "twophase_csv", "write_row"]
            for kind in (order if c % 2 else order[::-1]):
                t0 = time.perf_counter()
                if kind == "plain":
                    plain_copy(server.url, plain_t, cps[c])
                elif kind == "write_row":
                    write_row_copy(server.url, wr_t, small[c])
                else:
                    twophase_checkpoint(sinks[kind][0], sinks[kind][1], c, cps[c])
                spent[kind] += time.perf_counter() - t0
        n = args.rows * args.checkpoints
        for kind, (sink, _, table) in sinks.items():
            assert server.sql(f"SELECT count(*) FROM {table}") == [(n + args.rows,)], f"{kind} lost or doubled rows"
            sink.close()
        for kind in ("plain", "twophase", "twophase_csv"):
            times[kind].append(n / spent[kind])
        times["write_row"].append(args.write_row_rows * args.checkpoints / spent["write_row"])
        print(f"# round {r}: " + ", ".join(f"{k} {v[-1]:,.0f} rows/s" for k, v in times.items()), file=sys.stderr)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = [tp / pl for tp, pl in zip(times["twophase"], times["plain"])]
    ratios_csv = [tp / pl for tp, pl in zip(times["twophase_csv"], times["plain"])]
    print()
    print(f"PostgreSQL {server.sql('SHOW server_version')[0][0]}, {args.checkpoints} checkpoints x {args.tasks} tasks x "
          f"{per_task:,} rows (4 columns, ~100 bytes a row), {args.rounds} rounds interleaved; median rows/s")
    print()
    print("| writer | rows/s | ratio vs plain COPY |")
    print("|---|---:|---:|")
    print(f"| plain psycopg COPY, one transaction per task (baseline, at-least-once) | {med['plain']:,.0f} | 1.00 |")
    print(f"| twophase-postgres, exactly-once (PREPARE / COMMIT PREPARED), binary COPY | {med['twophase']:,.0f} | "
          f"{statistics.median(ratios):.2f} (per round: {', '.join(f'{x:.2f}' for x in ratios)}) |")
    print(f"| twophase-postgres, exactly-once, CSV COPY (copyFormat=csv; before binary COPY) | "
          f"{med['twophase_csv']:,.0f} | {statistics.median(ratios_csv):.2f} "
          f"(per round: {', '.join(f'{x:.2f}' for x in ratios_csv)}) |")
    print(f"| psycopg COPY with write_row per row (information) | {med['write_row']:,.0f} | "
          f"{med['write_row'] / med['plain']:.2f} |")


def _jdbc_jar() -> str:
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(["bash", os.path.join(root, "scripts", "pg_server.sh"), "fetch-jdbc"], capture_output=True,
                         text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def spark_query(spark, server, mode: str, table: str, ck: str, rows: int, batches: int):
    from psycopg.conninfo import conninfo_to_dict

    import twophase.spark
    from twophase.sinks.postgres import PostgresSink
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _sparkbench import time_batches

    df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows).option("numPartitions", 4).load()
          .selectExpr("value AS id", "concat('g', CAST(value % 7 AS STRING)) AS grp",
                      "concat('payload-', lpad(CAST(value AS STRING), 12, '0'), '-', repeat('x', 60)) AS payload",
                      "CAST(value AS DOUBLE) * 0.5 AS score"))
    if mode in ("twophase", "twophase_csv"):
        fmt = "csv" if mode == "twophase_csv" else "auto"
        fn = twophase.spark.foreach_batch(PostgresSink(url=server.url, table=table, sink_id=f"bench-{table}",
                                                       copyFormat=fmt), owner=ck)
    else:
        c = conninfo_to_dict(server.url)
        jdbc = f"jdbc:postgresql://{c['host']}:{c['port']}/{c['dbname']}"
        props = {"user": c["user"], "password": c["password"], "driver": "org.postgresql.Driver"}

        def fn(batch_df, batch_id):  # Spark's JDBC writer: a transaction per partition, at-least-once
            batch_df.write.jdbc(jdbc, table, mode="append", properties=props)
    q = df.writeStream.foreachBatch(fn).option("checkpointLocation", ck).trigger(processingTime="0 seconds").start()
    return time_batches(q, batches, 900)


def run_spark(server, args) -> None:
    from pyspark.sql import SparkSession
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the workers import twophase from this venv
    jar = _jdbc_jar()
    spark = (SparkSession.builder.master("local[4]").appName("bench-postgres").config("spark.jars", jar)
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    tmp = tempfile.mkdtemp(prefix="bench-pg-spark-")
    rates: dict[str, list[float]] = {"jdbc": [], "twophase": [], "twophase_csv": []}
    for r in range(args.spark_rounds):
        modes = ("jdbc", "twophase", "twophase_csv")
        for mode in (modes if r % 2 == 0 else modes[::-1]):
            table = server.new_table(DDL, f"bench_spark_{mode}{r}")
            res = spark_query(spark, server, mode, table, f"{tmp}/ck-{mode}-{r}", args.spark_rows, args.spark_batches)
            rates[mode].append(res["rows"] / res["seconds"])
            print(f"# spark round {r} {mode}: {res['rows']} rows in {res['seconds']:.2f}s "
                  f"(median batch {res['batch_ms']:.0f} ms)", file=sys.stderr)
    spark.stop()
    med = {k: statistics.median(v) for k, v in rates.items()}
    print()
    print(f"Spark local[4], rate-micro-batch, {args.spark_batches} batches x {args.spark_rows:,} rows (4 partitions) "
          f"per run, {args.spark_rounds} runs per writer alternated; median rows/s over runs")
    print()
    print("| writer (inside foreachBatch) | rows/s | ratio vs Spark JDBC |")
    print("|---|---:|---:|")
    print(f"| Spark's JDBC writer, df.write.jdbc (baseline, at-least-once) | {med['jdbc']:,.0f} | 1.00 |")
    print(f"| twophase-postgres, twophase.spark.foreach_batch (exactly-once), binary COPY | {med['twophase']:,.0f} | "
          f"{med['twophase'] / med['jdbc']:.2f} |")
    print(f"| twophase-postgres, foreach_batch, CSV COPY (copyFormat=csv; before binary COPY) | "
          f"{med['twophase_csv']:,.0f} | {med['twophase_csv'] / med['jdbc']:.2f} |")


if __name__ == "__main__":
    main()
