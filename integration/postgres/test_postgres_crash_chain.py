"""The crash chain of twophase-postgres on real Spark and a real PostgreSQL (integration/crash_chain.py): one
foreach_batch query over one input file per batch (2 tasks each), SIGKILLed (whole session) at each point of
the chain in turn (after_pre_commit: prepared transactions of a PENDING checkpoint; mid_commit: one task's
COMMIT PREPARED done, the other's not; after_commit: COMMITTED, Spark re-runs the batch; every protocol point
with TWOPHASE_FULL_MATRIX=1), each restart recovering the previous crash, then a clean run. After each crash:
no duplicate, nothing unexpected, every earlier batch whole, the crashed one absent, partly (mid_commit) or
whole (after_commit), prepared transactions only of the crashed checkpoint; at the end every row once, no
prepared transaction of the sink, every log record final.

Four Spark launches (~45 s on a loaded 2-core machine); ``TWOPHASE_PG_CRASH=0`` skips them."""

from __future__ import annotations

import os
import sys
from collections import Counter

import pytest

from integration.crash_chain import CrashChain, chain_points
from integration.fileio import check_exactly_once, make_input
from twophase.sinks.postgres import PostgresSink

pytestmark = [pytest.mark.spark, pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("TWOPHASE_PG_CRASH") == "0", reason="TWOPHASE_PG_CRASH=0")]

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pg_job.py")
_LAST = "before_complete" if "before_complete" in chain_points() else "after_pre_commit"
CHAIN = tuple(p for p in chain_points() if p != _LAST) + (_LAST,)
FILES, ROWS = 1 + len(CHAIN), 60
SINK_ID = "pg-crash"


@pytest.fixture(scope="module")
def chain(pg, tmp_path_factory) -> CrashChain:
    from integration.jobrun import job_env, run_in_own_session
    work = tmp_path_factory.mktemp("pg-chain")
    inp, ck = str(work / "in"), str(work / "ck")
    table = pg.new_table("id bigint NOT NULL, grp text, payload text", "crash")
    ids = make_input(inp, FILES, ROWS)
    sink = PostgresSink(url=pg.url, table=table, sink_id=SINK_ID).bind_owner(ck)

    def run(fault, marker, log_path) -> int:
        cmd = [sys.executable, JOB, inp, ck, pg.url, table, SINK_ID]
        return run_in_own_session(cmd, env=job_env(fault, marker), timeout=300, log_path=log_path).returncode

    def prepared_checkpoints() -> list[int]:
        return [sink.own_checkpoint(g) for g in pg.prepared(sink.gid_prefix)]

    def check_crashed(point: str, cid: int) -> None:
        got = pg.ids(table)
        report = check_exactly_once(ids, got)
        per_file = Counter(i // ROWS for i in set(got))
        whole = sorted(f for f, n in per_file.items() if n == ROWS)
        partial = {f: n for f, n in per_file.items() if n < ROWS}
        unfinished = [r.checkpoint_id for r in sink.transaction_log().unfinished()]
        state = (f"after the crash at {point}@{cid}: {report.line()}; whole batches {whole}, partial {partial}, "
                 f"prepared of checkpoints {prepared_checkpoints()}, unfinished {unfinished}")
        assert report.duplicated == 0 and report.unexpected == 0, state
        assert len(whole) == (cid + 1 if point == "after_commit" else cid), state
        assert (len(partial) == 1) if point == "mid_commit" else not partial, state
        assert set(prepared_checkpoints()) <= {cid}, f"a prepared transaction of an earlier checkpoint survived; {state}"
        assert set(unfinished) <= {cid}, state

    def check_final() -> None:
        report = check_exactly_once(ids, pg.ids(table))
        assert report.ok, report.line()
        assert prepared_checkpoints() == [], "prepared transactions of the sink left after the clean run"
        assert sink.transaction_log().unfinished() == [], "a checkpoint was left PENDING or COMPLETED"

    yield CrashChain(CHAIN, run, check_crashed, check_final, str(work))
    sink.close()


@pytest.mark.parametrize("point", CHAIN)
def test_crash_matrix_postgres_sink(chain: CrashChain, point: str) -> None:
    chain.crash(point)


def test_crash_matrix_postgres_sink_final_restart(chain: CrashChain) -> None:
    chain.finish()
