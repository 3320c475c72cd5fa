"""The runtime's file source: replay from a byte position, torn last lines, a job through the file sink."""

from __future__ import annotations

import json

import pytest

from rt_helpers import assert_exactly_once, runner
from twophase.sinks.files import FileSink
from twophase.errors import ConfigurationError
from twophase.runtime import FileLinesSource, FixedDelayRestart, JobGraph


def write_lines(path, ids, *, torn_tail: str = "") -> None:
    with open(path, "w") as f:
        for i in ids:
            f.write(json.dumps({"id": i}) + "\n")
        f.write(torn_tail)


def drain(reader, step: int = 7) -> list:
    out = []
    while True:
        res = reader.read(step)
        out += [r["id"] for r in res.records]
        if res.finished:
            return out


def test_source_inv1_file_split_replays_from_a_byte_position(tmp_path):
    p = tmp_path / "a.json"
    write_lines(p, range(100))
    src = FileLinesSource([str(p)])
    r = src.open_reader(src.splits()[0], None)
    first = [x["id"] for x in r.read(40).records]
    pos = r.position()
    rest = drain(r)
    r.close()
    assert first + rest == list(range(100))
    again = src.open_reader(src.splits()[0], pos)
    assert drain(again) == rest  # the same records follow the recorded position
    again.close()


def test_source_inv2_a_torn_last_line_is_not_a_record_until_complete(tmp_path):
    p = tmp_path / "a.json"
    write_lines(p, range(5), torn_tail='{"id": 5')
    src = FileLinesSource([str(p)])
    r = src.open_reader(src.splits()[0], None)
    assert drain(r) == list(range(5))
    pos = r.position()
    r.close()
    with open(p, "a") as f:
        f.write('}\n')
    r = src.open_reader(src.splits()[0], pos)
    assert drain(r) == [5]
    r.close()


def test_file_source_names_missing_files():
    with pytest.raises(ConfigurationError, match="no such files"):
        FileLinesSource(["/nonexistent/input.json"])


def test_file_source_job_exactly_once_after_a_failure(tmp_path):
    paths = []
    for n in range(3):
        p = tmp_path / f"in-{n}.json"
        write_lines(p, range(n * 1000, (n + 1) * 1000))
        paths.append(str(p))
    seen = {"n": 0, "failed": False}

    def fail_once(r):
        seen["n"] += 1
        if not seen["failed"] and seen["n"] == 1500:
            seen["failed"] = True
            raise RuntimeError("injected failure")
        return r

    g = JobGraph("files-to-files")
    out = str(tmp_path / "out")
    g.source(FileLinesSource(paths), uid="files", parallelism=2).map(fail_once, uid="m") \
        .sink_to(FileSink.from_options({"path": out}), uid="sink", parallelism=2)
    result = runner(g, "aligned", interval=0.02, restart=FixedDelayRestart(3, 0.0), owner=str(tmp_path / "ck")).run()
    assert seen["failed"] and result.attempts == 2
    assert_exactly_once(out, set(range(3000)))
