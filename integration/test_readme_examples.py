"""The README's Python examples run as written: the blocks under "Using it" are taken from README.md
itself, run one after the other in a fresh Python process (a plain ``SparkSession.builder.getOrCreate()``,
no test set-up), with ``/data`` pointing at a temporary folder; then every destination holds every row
once. A README example that stops working (a renamed option, a column the stream does not have) fails here."""

from __future__ import annotations

import os
import textwrap

import pytest

from integration.doc_blocks import python_blocks, run_as_written

pytestmark = pytest.mark.spark

CHECK = textwrap.dedent('''
    import json, time
    deadline = time.time() + 240
    for q in (query, query2):   # both streaming examples: at least three committed batches each
        while (q.lastProgress is None or q.lastProgress["batchId"] < 3) and time.time() < deadline:
            assert q.exception() is None, q.exception()
            time.sleep(0.5)
        q.stop()
    def counts(df, col):
        return [df.count(), df.select(col).distinct().count()]
    out = spark.read.parquet(DATA + "out")
    from deltalake import DeltaTable
    table = DeltaTable(DATA + "table").to_pyarrow_table()
    # a re-run of the batch write with the same writeId writes nothing
    spark.read.parquet(DATA + "history").write.format("twophase-delta").mode("append") \\
        .option("path", DATA + "table").option("writeId", "backfill-2026-11").save()
    print(json.dumps({
        "out": counts(out, "value"), "bad_bucket": out.where("bucket != value % 4").count(),
        "out2": counts(spark.read.parquet(DATA + "out2"), "value"),
        "table": [table.num_rows, len(set(table.column("id").to_pylist()))],
        "table_after_rerun": DeltaTable(DATA + "table").to_pyarrow_table().num_rows,
        "out3": counts(spark.read.parquet(DATA + "out3"), "id"),
    }))
    spark.stop()
''')


def readme_examples() -> list[str]:
    """The ```python quick-start blocks of README.md's "Using it" section (before "Write your own sink"), in order."""
    return python_blocks("README.md", "## Using it", "\n### Write your own sink")


def test_readme_has_the_three_quick_start_examples():
    blocks = readme_examples()
    assert len(blocks) == 3
    assert all("/data/" in b for b in blocks)


def test_readme_examples_run_as_written(tmp_path):
    data = str(tmp_path / "data") + "/"
    os.makedirs(data)
    script = "\n".join(b.replace("/data/", data) for b in readme_examples())
    script += f"\nDATA = {data!r}\n" + CHECK
    got = run_as_written(script, tmp_path)
    assert got["out"][0] >= 3000 and got["out"][0] == got["out"][1], got     # every row once, partitioned by bucket
    assert got["bad_bucket"] == 0, got
    assert got["out2"][0] >= 3000 and got["out2"][0] == got["out2"][1], got
    assert got["table"] == [100, 100], got
    assert got["table_after_rerun"] == 100, got
    assert got["out3"] == [100, 100], got


OWN_SINK_CHECK = textwrap.dedent('''
    import glob, json, time
    deadline = time.time() + 240
    while (query.lastProgress is None or query.lastProgress["batchId"] < 3) and time.time() < deadline:
        assert query.exception() is None, query.exception()
        time.sleep(0.5)
    query.stop()
    values = [json.loads(line)["value"] for f in glob.glob(DATA + "own/part-*.jsonl") for line in open(f)]
    staged = glob.glob(DATA + "own/.*.staged")
    print(json.dumps({"rows": len(values), "distinct": len(set(values)), "staged": len(staged)}))
    spark.stop()
''')


def test_readme_write_your_own_sink_example_runs_as_written(tmp_path):
    """The "Write your own sink" block: every row of the committed batches once, in whole files."""
    [block] = python_blocks("README.md", "### Write your own sink", "\n### ")
    data = str(tmp_path / "data") + "/"
    os.makedirs(data)
    script = block.replace("/data/", data) + f"\nDATA = {data!r}\n" + OWN_SINK_CHECK
    got = run_as_written(script, tmp_path)
    assert got["rows"] >= 300 and got["rows"] == got["distinct"], got
