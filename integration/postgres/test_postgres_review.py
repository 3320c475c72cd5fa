"""Adversarial review of twophase-postgres (session 12): each test reproduced a defect on a real server and fails
without its fix in sinks/postgres.py. No Spark here."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from integration.postgres.test_postgres_sink import ctx, make, no_open_transaction, rows
from twophase import testing
from twophase.errors import TwoPhaseError
from twophase.sink import CommitStatus, run_task
from twophase.sinks.postgres import PostgresSink


def test_pg_review_upsert_two_rows_with_one_key_in_a_task_the_last_wins(pg, tmp_path):
    """A change stream carries several versions of a key in one micro-batch. Before: INSERT ... ON CONFLICT DO
    UPDATE refused the batch (CardinalityViolation 'cannot affect row a second time'), non-retriable, so the query
    failed on every re-run. Now the task's last row of a key wins (as one upsert per row would); rows with a
    NULL key conflict with nothing and all go in."""
    table = pg.new_table("id bigint UNIQUE, v text")
    sink = make(pg, tmp_path, table, upsertKeys="id")
    pg.sql(f"INSERT INTO {table} VALUES (2, 'old'), (9, 'kept')")
    first = pa.RecordBatch.from_pydict({"id": [1, 2, 1, None], "v": ["a", "b", "c", "n1"]})
    second = pa.RecordBatch.from_pydict({"id": [2, 1, 3, None], "v": ["b2", "d", "e", "n2"]})
    ack = run_task(sink, ctx(sink, 0), [first, second])
    assert testing.commit(sink, ack.handle) is CommitStatus.COMMITTED
    got = pg.sql(f"SELECT id, v FROM {table} ORDER BY id NULLS LAST, v")
    assert got == [(1, "d"), (2, "b2"), (3, "e"), (9, "kept"), (None, "n1"), (None, "n2")]
    assert pg.sql("SELECT count(*) FROM pg_class WHERE relname LIKE '\\_twophase\\_stage\\_%%'") == [(0,)]
    sink.close()


def test_pg_review_odd_table_names_get_distinct_gids_and_the_sweep_keeps_the_others(pg, tmp_path):
    """Table x."y.z" and table "x.y".z are two tables; their gids carried one table digest, so one sink id's sweep
    on one rolled back the other's prepared (acked) transaction. Upper case, quotes and unicode too."""
    u = uuid.uuid4().hex[:8]
    names = [f'public."y.z{u}"', f'"public.y".z{u}', f'public."Q""uote{u}"', f'public."Ünï{u}"']
    pg.sql('CREATE SCHEMA IF NOT EXISTS "public.y"')
    for n in names:
        pg.sql(f"CREATE TABLE {n} (id bigint, v text)")
    sinks = [PostgresSink(url=pg.url, table=n, sink_id="pg-odd", log_location=str(tmp_path / f"log-{i}"))
             for i, n in enumerate(names)]
    for s in sinks:
        s.validate_destination()
    assert len({s.gid_prefix for s in sinks}) == len(sinks)
    plain = PostgresSink(url=pg.url, table="public.events", sink_id="pg-odd")
    assert plain.gid_prefix.endswith("_" + __import__("hashlib").sha256(b"public.events").hexdigest()[:8] + "_")
    acks = [run_task(s, ctx(s, 1, task=i), [rows(i * 10, 3)]) for i, s in enumerate(sinks)]
    assert testing.abort_lingering(sinks[0], 1) == 1  # its own only (before: all four, one table digest)
    assert pg.ids(names[0]) == [] and pg.prepared(sinks[0].gid_prefix) == []
    for i, (s, ack) in list(enumerate(zip(sinks, acks)))[1:]:
        assert testing.commit(s, ack.handle) is CommitStatus.COMMITTED, names[i]
        assert pg.ids(names[i]) == list(range(i * 10, i * 10 + 3))
    for s in sinks:
        s.close()


def test_pg_review_a_prepare_whose_answer_was_lost_is_rolled_back_by_the_writers_abort(pg, tmp_path, monkeypatch):
    """The connection breaks while PREPARE TRANSACTION's answer is on its way: the server holds the transaction
    prepared, the client sees an error, the task fails and the writer aborts (removing its pending record). Before:
    the abort only closed the connection, so the prepared transaction lingered until a later checkpoint's sweep,
    holding its unique keys: every retry of the task waited lockTimeout and failed, and the batch never
    passed. Now the writer's abort rolls its own gid back."""
    table = pg.new_table("id bigint PRIMARY KEY, v text")
    sink = make(pg, tmp_path, table, lockTimeout=2)
    real_connect = sink.connect

    def connect_losing_prepare_answer(*, autocommit: bool) -> Any:
        conn = real_connect(autocommit=autocommit)
        if not autocommit:
            real_execute = conn.execute

            def execute(query: Any, *a: Any, **kw: Any) -> Any:
                out = real_execute(query, *a, **kw)
                if str(query).startswith("PREPARE TRANSACTION"):
                    raise psycopg.OperationalError("server closed the connection unexpectedly")
                return out
            conn.execute = execute
        return conn

    monkeypatch.setattr(sink, "connect", connect_losing_prepare_answer)
    with pytest.raises(TwoPhaseError, match="server closed the connection"):
        run_task(sink, ctx(sink, 0), [rows(0, 5)])
    monkeypatch.setattr(sink, "connect", real_connect)
    assert pg.prepared(sink.gid_prefix) == []  # before the fix: the lost attempt's gid, prepared
    ack = run_task(sink, ctx(sink, 0, attempt=1), [rows(0, 5)])  # the retry of the task is not blocked
    assert testing.commit(sink, ack.handle) is CommitStatus.COMMITTED
    assert pg.ids(table) == list(range(5)) and no_open_transaction(pg)
    sink.close()


def test_pg_review_a_gid_that_gid_cannot_make_is_never_spliced_into_sql(pg, tmp_path):
    """PREPARE / COMMIT PREPARED / ROLLBACK PREPARED take no parameters, so the gid is a literal in the SQL text.
    A prepared transaction of another program named with this sink's prefix and a quote made every sweep fail
    with a syntax error (the recovery sweep too: the query could not start), and a log record's gid with a quote
    went into SQL as it was. Now such a gid is not ours to sweep, and a handle carrying one is refused."""
    table = pg.new_table()
    sink = make(pg, tmp_path, table)
    foreign = sink.gid_prefix + "00000000000000000001_0_x'; SELECT 1; --"
    with pg.connect() as c:
        c.autocommit = False
        c.execute(f"INSERT INTO {table} VALUES (1, 'foreign')")
        c.execute("PREPARE TRANSACTION '" + foreign.replace("'", "''") + "'")
    try:
        assert testing.abort_lingering(sink, 5) == 0
        assert foreign in pg.prepared(sink.gid_prefix)
        handle = run_task(sink, ctx(sink, 1), [rows(0, 2)]).handle
        bad = {**handle, "txn": {"gid": foreign}}
        for call in (lambda: testing.commit(sink, bad), lambda: testing.abort(sink, bad)):
            with pytest.raises(TwoPhaseError, match="is not a gid this sink makes"):
                call()
        assert foreign in pg.prepared(sink.gid_prefix) and pg.ids(table) == []
    finally:
        pg.sql("ROLLBACK PREPARED '" + foreign.replace("'", "''") + "'")
    sink.close()


def test_pg_review_a_positive_lock_timeout_below_a_millisecond_is_not_wait_forever(pg, tmp_path):
    """lockTimeout=0.0004 (seconds) was sent as lock_timeout = 0, which PostgreSQL reads as no limit: a task
    blocked by a prepared transaction waited forever instead of failing."""
    table = pg.new_table()
    sink = make(pg, tmp_path, table, lockTimeout="0.0004")
    txn = sink.begin_transaction(ctx(sink, 0))
    assert sink._open[txn["gid"]]["conn"].execute("SHOW lock_timeout").fetchone()[0] == "1ms"
    sink.abort(txn)
    forever = make(pg, tmp_path, table, "pg-b", lockTimeout=0)
    txn = forever.begin_transaction(ctx(forever, 0))
    assert forever._open[txn["gid"]]["conn"].execute("SHOW lock_timeout").fetchone()[0] == "0"
    forever.abort(txn)
    assert no_open_transaction(pg)
    sink.close()
    forever.close()


def test_pg_review_connections_have_tcp_keepalives_unless_the_url_sets_them(pg, tmp_path):
    """Review finding 7: with no keepalives, a silent network partition (no RST) hangs the driver's COMMIT PREPARED
    (or a task's COPY) for hours. Every connection the sink makes asks for keepalives; a url that sets them wins."""
    table = pg.new_table("id bigint, v text")
    sink = make(pg, tmp_path, table)
    conn = sink.connect(autocommit=True)
    opts = {o.keyword.decode(): (o.val or b"").decode() for o in conn.pgconn.info}
    assert (opts["keepalives"], opts["keepalives_idle"], opts["keepalives_count"]) == ("1", "30", "3")
    conn.close()
    sep = "&" if "?" in pg.url else "?"
    own = PostgresSink(url=pg.url + f"{sep}keepalives_idle=7", table=table, sink_id="pg-ka",
                       log_location=str(tmp_path / "log-ka"))
    conn = own.connect(autocommit=True)
    assert {o.keyword.decode(): (o.val or b"").decode() for o in conn.pgconn.info}["keepalives_idle"] == "7"
    conn.close()
    sink.close()
