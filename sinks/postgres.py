"""``twophase-postgres``: exactly-once into a PostgreSQL table, by PostgreSQL's own two-phase commit.

Built on the user-facing base :class:`twophase.TwoPhaseCommitSink` (nothing of the connector API besides a
committer subclass that adds the server-side sweep)::

    from twophase.sinks.postgres import PostgresSink
    sink = PostgresSink(url="postgresql://writer:...@db:5432/app", table="public.events", sink_id="events-pg")
    df.writeStream.foreachBatch(twophase.spark.foreach_batch(sink, owner=checkpoint)).option(
        "checkpointLocation", checkpoint).start()

Protocol, per task attempt (executor): one connection, a transaction (``lock_timeout`` set), the batch loaded
with ``COPY ... FROM STDIN`` in PostgreSQL's binary format built from the Arrow buffers with numpy, or, when a
column's type has no binary form here (numeric), as CSV (Arrow's C++ CSV writer): each chunk of ``batchSize``
rows, no per-row Python (sinks/_postgres_copy.py), the transaction's gid inserted into the sink's marker table, then
``PREPARE TRANSACTION '<gid>'``: durable, invisible, and the connection is closed. The driver commits with
``COMMIT PREPARED`` once the checkpoint is durable in the log.

The gid is ``tp_<token>_<table digest>_<checkpoint:020d>_<task>_<attempt>`` (``token`` =
:func:`twophase.sink.sink_token` of the sink id, the table digest of the target's ``schema.table``): the sweep
takes a prepared transaction of ``pg_prepared_xacts`` (in this database) only when its gid carries this sink's
token AND table digest, and its checkpoint is ``<=`` the swept one; never another sink's, never another table's
with the same sink id.

Invariants (``test_pg_invN_*`` in ``integration/postgres/``):

1. Nothing of a batch is visible before ``COMMIT PREPARED``; a row the table refuses (a constraint) fails the
   task and nothing of its transaction stays (rolled back before PREPARE).
2. A repeated commit is ALREADY_COMMITTED, a lost one LOST: the gid is gone in both cases, but a committed
   transaction left its row in the marker table (written inside the same transaction), a rolled-back one did
   not. The marker rows of checkpoints below the highest committed one are pruned by the sweep, which keeps
   beside them what the log said of those checkpoints (sinks/_postgres_proof.py): a gid without its marker whose
   checkpoint the log records COMMITTED with that gid, or whose record (removed by the log's retention since) the
   sweep read COMMITTED, is ALREADY_COMMITTED too (a zombie driver's late commit of a batch a restarted driver
   committed). A gone gid that neither proves committed nor lost is :class:`CommitOutcomeUnknownError`, never
   LOST by a guess.
3. ``abort`` is ``ROLLBACK PREPARED`` (or the open transaction's rollback); a missing gid is fine; it never
   touches committed rows (a committed gid no longer exists).
4. The handle is ``{"gid": ...}``: the driver (or a recovering process) needs only the gid and the URL.
5. The sweep rolls back this sink's own prepared transactions of checkpoints ``<= n`` (recorded ones through
   the base's pending records, the rest found in ``pg_prepared_xacts`` by token and table digest); it warns
   (``postgres_prepared_transaction_old``) when one of its own is older than ``preparedWarnAfter`` seconds:
   a prepared transaction holds its locks and holds back VACUUM until it is committed or rolled back. A driver
   statement (COMMIT / ROLLBACK PREPARED, the marker reads, the sweeps, the checks, the completion guard's fence
   locks) that waits on the server warns (``postgres_statement_waiting``) every ``WAIT_WARN_S`` seconds and is
   abandoned after ``serverWaitTimeout`` (its socket shut down: a paused server answers keepalives), a retriable
   error; an abandoned COMMIT PREPARED's gid is looked up before it is retried (sinks/_postgres_waits.py).
6. Checked on the driver before any data moves (:meth:`PostgresSink.validate_destination`,
   :meth:`PostgresSink.check_spark_schema`): the server answers with these credentials,
   ``max_prepared_transactions > 0``, the table exists, the role may write it (and the marker table), every
   column of the stream exists in the table with a type it round-trips through, NOT NULL columns without a
   default are in the stream, ``upsertKeys`` match a unique index, and the gid prefix is this log's (the first log to
   start claims it in the marker table: two logs with one sink id on one table would sweep each other's prepared
   transactions). Each error names the option or setting
   and the fix. The URL's password is never in a message, a log line or a repr (:mod:`twophase._redact`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import re
import threading
from typing import Any, Callable, Iterator, Optional, Sequence, Union

from twophase._logging import get_logger
from twophase._redact import redact_text, redact_values
from twophase.errors import (CommitOutcomeUnknownError, ConfigurationError, ConstraintViolationError, DataLossError,
                             LogCorruptError, TransientSinkError)
from twophase.sink import CommitStatus, Guarantee, TransactionContext, sink_token
from twophase.user_sink import TwoPhaseCommitSink, _UserCommitter

from twophase.sinks._postgres_checks import DestinationChecks, _psycopg, _quote_ident
from twophase.sinks._postgres_copy import binary_types, encode_binary
from twophase.sinks._postgres_attempts import (attempt_segment, completion_guard, new_run_token, rollback_aborted,
                                               rollback_dead)
from twophase.sinks._postgres_proof import prune_markers, settle_gone
from twophase.sinks._postgres_waits import WATCHER

_log = get_logger(__name__)

#: the marker table's default name (in the target table's schema)
MARKER_TABLE = "_twophase_commits"
#: (url, marker table) whose marker table this process has seen (one check per Python worker, not per task)
_MARKERS_READY: set = set()
_GID = re.compile(r"^tp_([0-9a-f]{12})_([0-9a-f]{8})_(\d{20})_(.+)_([A-Za-z0-9]+)$")
#: every character a gid of ours may hold (gid() makes no other): a gid is put into SQL as a literal
_GID_SAFE = re.compile(r"^tp_[A-Za-z0-9_.\-]{1,196}$")
_GID_UNSAFE = re.compile(r"[^A-Za-z0-9.\-]")
#: the staging table's row-order column (upsertKeys)
_STAGE_SEQ = "_twophase_row_seq"

def _parse_table(table: str) -> tuple[str, str]:
    """``schema.table`` (either part may be double-quoted) -> (schema, table); no schema: ``public``."""
    parts, cur, quoted, i = [], "", False, 0
    while i < len(table):
        ch = table[i]
        if quoted:
            if ch == '"' and table[i + 1:i + 2] == '"':
                cur += '"'; i += 1  # noqa: E702
            elif ch == '"':
                quoted = False
            else:
                cur += ch
        elif ch == '"':
            quoted = True
        elif ch == ".":
            parts.append(cur); cur = ""  # noqa: E702
        else:
            cur += ch.lower()  # unquoted identifiers fold to lower case, as PostgreSQL does
        i += 1
    parts.append(cur)
    if quoted or any(not p for p in parts) or len(parts) > 2:
        raise ConfigurationError(f"twophase-postgres: option 'table' must be 'schema.table' (parts may be "
                                 f"double-quoted), got {table!r}")
    return (parts[0], parts[1]) if len(parts) == 2 else ("public", parts[0])


def _gid_literal(gid: Any) -> str:
    """``gid`` as an SQL string literal for PREPARE / COMMIT PREPARED / ROLLBACK PREPARED (which take no
    parameters). A gid comes back from the transaction log and from pg_prepared_xacts: one that gid() cannot have
    made (a quote, a tampered or corrupt record, another program's transaction named like ours) is refused,
    never spliced into SQL."""
    if not isinstance(gid, str) or not _GID_SAFE.match(gid):
        raise LogCorruptError(f"twophase-postgres: {gid!r} is not a gid this sink makes (tp_ followed by letters, "
                              "digits, '_', '.', '-'; at most 199 characters): the transaction log's record or a "
                              "prepared transaction named like ours is not ours; nothing was run for it")
    return "'" + gid + "'"


def _digest_name(schema: str, table: str) -> str:
    """The text the table digest of the gid is taken of: ``schema.table``, or the quoted form when a part holds a
    dot or a quote (``x."y.z"`` and ``"x.y".z`` are two tables: one digest made one sink's sweep roll back the
    other's prepared transactions). Plain names keep the unquoted form, so their gids are unchanged."""
    if any(c in part for part in (schema, table) for c in '."'):
        return f"{_quote_ident(schema)}.{_quote_ident(table)}"
    return f"{schema}.{table}"


def _int_option(name: str, value: Any, low: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"twophase-postgres: option {name!r} must be a number, got {value!r}") from None
    if v < low:
        raise ConfigurationError(f"twophase-postgres: option {name!r} must be >= {low}, got {value!r}")
    return v


class PostgresSink(DestinationChecks, TwoPhaseCommitSink[dict]):
    """Exactly-once into the PostgreSQL table ``table`` at ``url`` (see the module doc).

    Options (constructor keywords; strings are accepted, as a Spark format's options are):
    ``url`` libpq URI (``postgresql://user:password@host:port/db?sslmode=...``; the password may also come from
    ``PGPASSWORD`` or ``~/.pgpass``); ``table`` ``schema.table``; ``mode`` ``append`` (the only mode);
    ``upsertKeys`` comma-separated key columns (a unique index on exactly them): rows are staged in a table of
    the attempt and merged with ``INSERT ... ON CONFLICT (keys) DO UPDATE`` inside the prepared transaction;
    ``batchSize`` rows per COPY chunk (10000); ``copyFormat`` ``auto`` (binary COPY built from the Arrow buffers
    when every column's type has a binary form, else CSV: sinks/_postgres_copy.py) or ``csv``; ``lockTimeout`` seconds a task waits for a row or table lock
    (60; a prepared transaction of the same batch holding a key another task upserts waits until its commit:
    partition upserted streams by the keys); ``preparedWarnAfter`` seconds (300); ``markerTable`` (default
    ``<schema>._twophase_commits``); ``serverWaitTimeout`` seconds a driver statement waits on a server that does
    not answer before it is abandoned with a retriable error (600).
    """

    #: the sweep also reads pg_prepared_xacts: after each commit too (a lingering prepared transaction holds locks)
    sweep_after_commit = True

    def __init__(self, url: str, table: str, *, mode: str = "append", upsertKeys: Union[str, Sequence[str], None] = None,
                 batchSize: Union[int, str] = 10000, lockTimeout: Union[float, str] = 60,
                 preparedWarnAfter: Union[float, str] = 300, markerTable: Optional[str] = None,
                 copyFormat: str = "auto", serverWaitTimeout: Union[float, str] = 600, **kw: Any) -> None:
        super().__init__(**kw)
        if not isinstance(url, str) or not url.strip():
            raise ConfigurationError("twophase-postgres: option 'url' is required: a libpq URI, "
                                     "postgresql://user:password@host:5432/database")
        self.url = url
        self.schema, self.table = _parse_table(table)
        if str(mode).strip().lower() != "append":
            raise ConfigurationError(f"twophase-postgres: option 'mode' must be 'append' (got {mode!r}); for "
                                     "updates of existing rows give upsertKeys (INSERT ... ON CONFLICT)")
        self.mode = "append"
        if isinstance(upsertKeys, str):
            keys = [k.strip() for k in upsertKeys.split(",") if k.strip()]
        else:
            keys = list(upsertKeys or [])
        self.upsert_keys = tuple(keys)
        self.batch_size = int(_int_option("batchSize", batchSize, 1))
        self.lock_timeout = _int_option("lockTimeout", lockTimeout, 0)
        self.prepared_warn_after = _int_option("preparedWarnAfter", preparedWarnAfter, 0)
        #: seconds a driver statement waits on the server before it is abandoned (sinks/_postgres_waits.py)
        self.server_wait_timeout = _int_option("serverWaitTimeout", serverWaitTimeout, 0)
        if not self.server_wait_timeout > 0:  # NaN too
            raise ConfigurationError(f"twophase-postgres: option 'serverWaitTimeout' must be a number of seconds > 0 "
                                     f"(how long a driver statement waits on a server that does not answer before it "
                                     f"is abandoned; default 600), got {serverWaitTimeout!r}")
        self.copy_format = str(copyFormat).strip().lower()
        if self.copy_format not in ("auto", "csv"):
            raise ConfigurationError(f"twophase-postgres: option 'copyFormat' must be 'auto' (binary COPY when every "
                                     f"column has a binary form, else CSV) or 'csv', got {copyFormat!r}")
        mschema, mtable = _parse_table(markerTable) if markerTable else (self.schema, MARKER_TABLE)
        self.marker_schema, self.marker_table = mschema, mtable
        digest = hashlib.sha256(_digest_name(self.schema, self.table).encode()).hexdigest()[:8]
        #: every gid of this sink on this table starts with it (the sweep's proof of ownership)
        self.gid_prefix = f"tp_{sink_token(self.sink_id)}_{digest}_"
        #: this run's token, in every gid its attempts make (sinks/_postgres_attempts.py): renewed per foreach_batch
        #: batch, per Spark format planning, per process
        self.run_token = new_run_token()
        #: a Spark format's tasks roll back dead attempts of their batch before they begin (spark_format_run)
        self.roll_back_in_tasks = False
        self._init_local()

    def _init_local(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, Any] = {}  # gid -> {"conn", "prepared", "stage", "columns"}
        self._driver: Any = None
        #: gids whose COMMIT PREPARED was sent and not answered (abandoned, or in flight): looked up before a retry
        self._abandoned: set = set()

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_open", "_driver", "_abandoned")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_local()

    def __repr__(self) -> str:
        return (f"PostgresSink(url={self.shown_url()!r}, table={self.qualified!r}, sink_id={self.sink_id!r}, "
                f"upsertKeys={list(self.upsert_keys)})")

    # ---- names

    @property
    def qualified(self) -> str:
        return f"{_quote_ident(self.schema)}.{_quote_ident(self.table)}"

    @property
    def marker(self) -> str:
        return f"{_quote_ident(self.marker_schema)}.{_quote_ident(self.marker_table)}"

    def gid(self, context: TransactionContext) -> str:
        task = _GID_UNSAFE.sub("_", context.task_id)[:80]
        attempt = re.sub(r"[^A-Za-z0-9]", "", context.attempt_uid)[:32] or "0"
        return f"{self.gid_prefix}{context.checkpoint_id:020d}_{task}_{attempt_segment(self.run_token, attempt)}"

    def own_checkpoint(self, gid: str) -> Optional[int]:
        """The checkpoint id of ``gid`` if this sink (on this table) made it, else None."""
        if not gid.startswith(self.gid_prefix):
            return None
        m = _GID.match(gid)
        return int(m.group(3)) if m else None

    # ---- connections and errors

    def _error(self, e: BaseException, doing: str) -> Exception:
        """A psycopg error as twophase's: the URL's password never in it."""
        psycopg = _psycopg()
        text = redact_values(redact_text(str(e)).strip(), [self._password()])
        where = f"twophase-postgres (sink {self.sink_id!r}, table {self.schema}.{self.table}, " \
                f"url {self.shown_url()}): {doing}"
        if isinstance(e, psycopg.errors.IntegrityError):
            return ConstraintViolationError(f"{where}: a row breaks a constraint of the table ({text}); nothing of "
                                            "this task's transaction was kept")
        if isinstance(e, psycopg.OperationalError):
            return TransientSinkError(f"{where}: {text}")
        return TransientSinkError(f"{where}: {type(e).__name__}: {text}", retriable=False)

    def _password(self) -> Optional[str]:
        try:
            from psycopg.conninfo import conninfo_to_dict
            return conninfo_to_dict(self.url).get("password")  # type: ignore[return-value]
        except Exception:
            return None

    #: TCP keepalives unless the url sets them: a silent network partition (no RST) ends a connection waiting for
    #: an answer (the driver's COMMIT PREPARED, a task's COPY) in about a minute instead of hanging it for hours
    KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}

    #: seconds a driver-side statement (COMMIT PREPARED, ROLLBACK PREPARED, the completion guard's fence locks) waits
    #: on the server before the sink warns, and again every as many seconds while it waits
    WAIT_WARN_S = 30.0

    @contextlib.contextmanager
    def waiting(self, doing: str, conn: Any = None) -> Iterator[None]:
        """Watch the block's statements on ``conn`` (default: the driver connection) by the process's one watcher
        thread (sinks/_postgres_waits.py): warn ``postgres_statement_waiting`` every :attr:`WAIT_WARN_S` seconds
        while it waits, and after option ``serverWaitTimeout`` abandon it: the connection's socket is shut down
        (a stopped or hung server's kernel answers TCP keepalives and its statement_timeout cannot fire, so nothing
        else ends such a wait), the connection discarded, and a retriable :class:`TransientSinkError` naming the
        option raised. An abandoned statement's outcome is unknown: :meth:`commit` checks the gid again first."""
        getter = (lambda: conn) if conn is not None else (lambda: self._driver)
        deadline = float(getattr(self, "server_wait_timeout", 600.0))
        with WATCHER.watch(doing, warn_s=self.WAIT_WARN_S, deadline_s=deadline, conn=getter,
                           warn=self._warn_waiting) as w:
            try:
                yield
            except Exception:
                if not w.expired:
                    raise
                self._discard(getter())
                raise TransientSinkError(
                    f"twophase-postgres (sink {self.sink_id!r}, url {self.shown_url()}): {doing}: the server did not "
                    f"answer within option 'serverWaitTimeout' ({deadline:g} s), so the statement was abandoned and "
                    "its connection closed. The server is paused, hung or cut off by a network partition; the "
                    "statement's outcome is unknown and is checked again before the next attempt acts (retried). "
                    "Raise serverWaitTimeout if the server's pauses are longer") from None
            if w.expired:  # answered just as the deadline fired: the result stands, the connection is unusable
                self._discard(getter())

    def _warn_waiting(self, doing: str, waited: float) -> None:
        _log.warning("postgres_statement_waiting", sink_id=self.sink_id, doing=doing, waited_s=round(waited, 1),
                     url=self.shown_url(), deadline_s=getattr(self, "server_wait_timeout", None),
                     consequence="the server has not answered (paused, overloaded, a network partition, or a lock "
                                 "held by a paused process); abandoned after option serverWaitTimeout")

    def _discard(self, conn: Any) -> None:
        """Close ``conn`` (abandoned: its socket was shut down); the driver connection is reopened when next used."""
        if conn is None:
            return
        with self._lock:
            if self._driver is conn:
                self._driver = None
        try:
            conn.close()
        except Exception:
            pass

    def shown_url(self) -> str:
        """Option 'url' as it may be shown: the password masked (:mod:`twophase._redact`)."""
        return redact_text(self.url)

    def connect(self, *, autocommit: bool) -> Any:
        psycopg = _psycopg()
        from psycopg.conninfo import conninfo_to_dict
        try:
            given = conninfo_to_dict(self.url)
        except Exception:  # the connect below names what is wrong with the url
            given = {}
        # the url's own connect_timeout and keepalives hold (keywords given here would override the url's)
        keepalives = {k: v for k, v in {"connect_timeout": 30, **self.KEEPALIVES}.items() if k not in given}
        try:
            # client_encoding: COPY sends UTF-8 bytes (binary and CSV alike); a connection in the database's encoding
            # (or a role's, or PGCLIENTENCODING's) took them as LATIN1 etc. and stored 'é' as 'Ã©', silently
            return psycopg.connect(self.url, autocommit=autocommit, client_encoding="UTF8",
                                   application_name=f"twophase-{sink_token(self.sink_id)}", **keepalives)
        except psycopg.Error as e:
            text = redact_values(redact_text(str(e)).strip(), [self._password()])
            if "password" in text or "authentication" in text:
                fix = ("check the user and password in option 'url' (or PGPASSWORD / ~/.pgpass) and the server's "
                       "pg_hba.conf")
            elif "timeout expired" in text:  # the TCP handshake answered (the kernel), the server did not
                fix = (f"the server did not answer within connect_timeout ({given.get('connect_timeout', 30)} s): "
                       "it is paused, overloaded or unreachable; retried")
            else:
                fix = "check host, port and database in option 'url', and that the server accepts TCP connections"
            raise ConfigurationError(f"twophase-postgres (sink {self.sink_id!r}): cannot connect to "
                                     f"{self.shown_url()}: {text}; {fix}",
                                     retriable=isinstance(e, psycopg.OperationalError) and "password" not in fix) from None

    def _driver_conn(self) -> Any:
        with self._lock:
            if self._driver is None or self._driver.closed:
                self._driver = self.connect(autocommit=True)
            return self._driver

    def close(self) -> None:
        with self._lock:
            if self._driver is not None:
                self._driver.close()
                self._driver = None

    # ---- executor hooks

    def _marker_ready(self) -> None:
        """The marker table exists (once per process): validate_destination creates it on the driver, but an
        engine that does not call it (the embedded runtime) reaches here first."""
        key = (self.url, self.marker)
        if key in _MARKERS_READY:
            return
        conn = self.connect(autocommit=True)
        try:
            self._ensure_marker(conn)
        except _psycopg().Error as e:
            raise self._error(e, "creating the marker table") from None
        finally:
            conn.close()
        _MARKERS_READY.add(key)

    def begin_transaction(self, context: TransactionContext) -> dict:
        self._marker_ready()
        gid = self.gid(context)
        conn = self.connect(autocommit=self.roll_back_in_tasks)
        try:
            if self.roll_back_in_tasks and self.guarantee is Guarantee.EXACTLY_ONCE:
                # a Spark format: this batch's dead attempts of earlier runs hold its keys (_postgres_attempts)
                rollback_dead(self, conn, lambda cid: cid >= context.checkpoint_id)
                conn.autocommit = False
            # PostgreSQL's 0 is "wait forever": a positive lockTimeout below 1 ms must not round to it
            ms = int(round(self.lock_timeout * 1000))
            conn.execute(f"SET LOCAL lock_timeout = {max(ms, 1) if self.lock_timeout > 0 else 0}")
        except Exception as e:
            conn.close()
            raise self._error(e, "opening the transaction") from None
        with self._lock:
            self._open[gid] = {"conn": conn, "prepared": False, "stage": None, "columns": None}
        return {"gid": gid}

    def _state(self, txn: dict) -> dict:
        with self._lock:
            state = self._open.get(txn["gid"])
        if state is None:
            raise TransientSinkError(f"twophase-postgres: transaction {txn['gid']} has no open connection in this "
                                     "process (its task was restarted?)")
        return state

    def write(self, txn: dict, batch: Any) -> None:
        import pyarrow as pa
        import pyarrow.csv as pacsv
        if batch.num_rows == 0:
            return
        state = self._state(txn)
        conn = state["conn"]
        psycopg = _psycopg()
        try:
            if state["columns"] is None:
                state["table_columns"] = self.columns(conn)
                self.check_arrow_schema(batch.schema, state["table_columns"])
                state["columns"] = list(batch.schema.names)
                if self.upsert_keys:
                    stage = f"_twophase_stage_{hashlib.sha256(txn['gid'].encode()).hexdigest()[:16]}"
                    cols = ", ".join(map(_quote_ident, state["columns"]))
                    conn.execute(f"CREATE UNLOGGED TABLE {_quote_ident(self.schema)}.{_quote_ident(stage)} AS "
                                 f"SELECT {cols} FROM {self.qualified} WITH NO DATA")
                    # the rows' order (COPY fills it): of two rows with one key in a task, the later one wins
                    conn.execute(f"ALTER TABLE {_quote_ident(self.schema)}.{_quote_ident(stage)} ADD COLUMN "
                                 f"{_quote_ident(_STAGE_SEQ)} bigint GENERATED ALWAYS AS IDENTITY")
                    state["stage"] = stage
            elif list(batch.schema.names) != state["columns"]:
                raise ConfigurationError(f"twophase-postgres: a batch's columns {batch.schema.names} differ from the "
                                         f"first batch's {state['columns']} in one task")
            target = (f"{_quote_ident(self.schema)}.{_quote_ident(state['stage'])}" if state["stage"]
                      else self.qualified)
            if "binary" not in state:  # binary COPY when every column has a binary form (sinks/_postgres_copy.py)
                state["binary"] = (binary_types(batch.schema, state["table_columns"]) if self.copy_format == "auto"
                                   else None)
            types = state["binary"]
            copy_sql = (f"COPY {target} ({', '.join(map(_quote_ident, state['columns']))}) FROM STDIN "
                        f"(FORMAT {'binary' if types else 'csv'})")
            with conn.cursor() as cur, cur.copy(copy_sql) as copy:
                if types:
                    for start in range(0, batch.num_rows, self.batch_size):  # one header, one trailer
                        copy.write(encode_binary(batch.slice(start, self.batch_size), types, header=start == 0,
                                                 trailer=start + self.batch_size >= batch.num_rows))
                else:
                    table = pa.Table.from_batches([_csv_ready(batch)])
                    options = pacsv.WriteOptions(include_header=False)
                    for start in range(0, table.num_rows, self.batch_size):
                        buf = io.BytesIO()
                        pacsv.write_csv(table.slice(start, self.batch_size), buf, options)
                        copy.write(buf.getbuffer())
        except ConfigurationError:
            raise
        except psycopg.Error as e:
            raise self._error(e, "loading rows with COPY") from None

    def pre_commit(self, txn: dict) -> None:
        state = self._state(txn)
        conn, gid = state["conn"], txn["gid"]
        psycopg = _psycopg()
        try:
            if state["stage"]:
                cols = state["columns"]
                stage = f"{_quote_ident(self.schema)}.{_quote_ident(state['stage'])}"
                names = ", ".join(map(_quote_ident, cols))
                rest = [c for c in cols if c not in self.upsert_keys]
                action = ("DO UPDATE SET " + ", ".join(f"{_quote_ident(c)} = EXCLUDED.{_quote_ident(c)}" for c in rest)
                          if rest else "DO NOTHING")
                keys = ", ".join(map(_quote_ident, self.upsert_keys))
                all_keys = " AND ".join(f"{_quote_ident(k)} IS NOT NULL" for k in self.upsert_keys)
                # one row per key (ON CONFLICT may not touch a row twice in one statement): the task's last; rows
                # with a NULL key conflict with nothing (a unique index's NULLs are distinct) and all go in
                conn.execute(f"INSERT INTO {self.qualified} ({names}) SELECT {names} FROM (SELECT DISTINCT ON "
                             f"({keys}) {names} FROM {stage} WHERE {all_keys} ORDER BY {keys}, "
                             f"{_quote_ident(_STAGE_SEQ)} DESC) AS last_per_key UNION ALL SELECT {names} FROM "
                             f"{stage} WHERE NOT ({all_keys}) ON CONFLICT ({keys}) {action}")
                conn.execute(f"DROP TABLE {stage}")
            conn.execute(f"INSERT INTO {self.marker} (gid, gid_prefix, checkpoint_id) VALUES (%s, %s, %s)",
                         (gid, self.gid_prefix, int(gid[len(self.gid_prefix):].split("_", 1)[0])))
            state["preparing"] = True  # from here the server may hold it prepared even if the answer is lost
            conn.execute(f"PREPARE TRANSACTION {_gid_literal(gid)}")
            state["prepared"] = True
        except psycopg.Error as e:
            raise self._error(e, "preparing the transaction (PREPARE TRANSACTION)") from None
        finally:
            if state["prepared"]:
                self._forget(gid)

    def _forget(self, gid: str) -> None:
        with self._lock:
            state = self._open.pop(gid, None)
        if state is not None:
            try:
                state["conn"].close()
            except Exception:
                pass

    # ---- driver hooks

    def commit(self, txn: dict) -> Optional[CommitStatus]:
        """``COMMIT PREPARED`` (invariant 2). A gid gone from pg_prepared_xacts is ALREADY_COMMITTED when its commit is
        proven, LOST (:class:`DataLossError`) when its loss is, else :class:`CommitOutcomeUnknownError`
        (sinks/_postgres_proof.py). After an abandoned attempt (option serverWaitTimeout) the gid is looked up
        before anything is run for it: the abandoned COMMIT PREPARED may have committed it meanwhile."""
        gid = txn["gid"]
        literal = _gid_literal(gid)
        psycopg = _psycopg()
        conn = self._driver_conn()
        with self.waiting(f"COMMIT PREPARED '{gid}'"):
            try:
                gone = gid in self._abandoned and conn.execute(  # re-check: pg_prepared_xacts, then the marker
                    "SELECT 1 FROM pg_prepared_xacts WHERE gid = %s AND database = current_database()",
                    (gid,)).fetchone() is None
                if not gone:
                    self._abandoned.add(gid)  # until the server answers: its outcome is unknown
                    conn.execute(f"COMMIT PREPARED {literal}")
                    self._abandoned.discard(gid)
                    return None
            except psycopg.errors.UndefinedObject:
                pass  # gone: committed before (proven below) or rolled back
            except psycopg.Error as e:
                if not (conn.closed or getattr(conn, "broken", False)):
                    self._abandoned.discard(gid)  # the server answered: this attempt left nothing half-done
                raise self._error(e, f"COMMIT PREPARED '{gid}'") from None
            self._abandoned.discard(gid)
            cid = self.own_checkpoint(gid)
            record = (self.transaction_log().get(cid)
                      if cid is not None and self.guarantee is Guarantee.EXACTLY_ONCE else None)
            try:
                verdict, why = settle_gone(self, conn, gid, cid if cid is not None else -1, record,
                                           has_log=self.guarantee is Guarantee.EXACTLY_ONCE)
            except psycopg.Error as e:
                raise self._error(e, f"reading the marker of {gid}") from None
        if verdict == "committed":
            _log.info("postgres_already_committed", sink_id=self.sink_id, gid=gid, proof=why)
            return CommitStatus.ALREADY_COMMITTED
        if verdict == "lost":
            raise DataLossError(
                f"prepared transaction {gid} is not in pg_prepared_xacts and its marker is not in "
                f"{self.marker_schema}.{self.marker_table} ({why}): it was rolled back (ROLLBACK PREPARED by an "
                "operator, or the server's data directory restored) and its rows are not in the table")
        raise CommitOutcomeUnknownError(
            f"twophase-postgres (sink {self.sink_id!r}, table {self.schema}.{self.table}): prepared transaction {gid} "
            f"is not in pg_prepared_xacts and neither its commit nor its loss can be proven: {why}. Nothing was run "
            f"for it. If this driver was paused (a zombie) while a restarted query went on, stop it: the restarted "
            f"query committed or recorded the batch. Otherwise check the batch's rows in {self.schema}.{self.table}")

    def abort(self, txn: dict) -> None:
        gid = txn["gid"]
        _gid_literal(gid)
        if self.own_checkpoint(gid) is None:  # another table's (a log shared by mistake): never ours to roll back
            _log.warning("postgres_foreign_transaction_kept", sink_id=self.sink_id, gid=gid,
                         table=f"{self.schema}.{self.table}")
            return
        with self._lock:
            state = self._open.get(gid)
        if state is not None and not state["prepared"]:
            self._forget(gid)  # closing the connection rolls the open transaction back
            if not state.get("preparing"):
                return
            # PREPARE was sent but its answer never came (connection cut): the server may have prepared it, and
            # this attempt's own gid is never acked once its writer aborts: roll it back now, not at the next sweep
            # (a lingering prepared transaction would hold its unique keys and block the task's retry)
        psycopg = _psycopg()
        conn = self._driver_conn()
        try:
            with self.waiting(f"ROLLBACK PREPARED '{gid}'"):
                conn.execute(f"ROLLBACK PREPARED {_gid_literal(gid)}")
        except psycopg.errors.UndefinedObject:
            pass  # never prepared, rolled back before, or committed: nothing of ours to discard
        except psycopg.Error as e:
            raise self._error(e, f"ROLLBACK PREPARED '{gid}'") from None

    def before_batch_tasks(self, checkpoint_id: int) -> int:
        """``foreach_batch``, on the driver after recovery and before any task of batch ``checkpoint_id``: a new run
        token for the batch's attempts, then the dead attempts of earlier runs of checkpoints ``>= checkpoint_id``
        rolled back (sinks/_postgres_attempts.py: never this run's, never one a completer holds or the log records
        to commit); returns how many."""
        self.run_token = new_run_token()
        if self.guarantee is not Guarantee.EXACTLY_ONCE:
            return 0
        psycopg = _psycopg()
        try:
            with self.waiting(f"rolling back dead attempts of batch {checkpoint_id}"):
                return len(rollback_dead(self, self._driver_conn(), lambda cid: cid >= checkpoint_id))
        except psycopg.Error as e:
            raise self._error(e, "rolling back prepared transactions of an earlier run of the batch") from None

    def spark_format_run(self) -> None:
        """A Spark format planned a batch with this sink object (``streamWriter``): its tasks roll back the batch's
        dead attempts of earlier runs before they begin (the driver's call cannot: it also runs in the commit worker
        right before ``commit``, where this batch's own prepared transactions wait)."""
        self.roll_back_in_tasks = True

    def completion_guard(self, checkpoint_id: int, acks: Sequence[Any]) -> Any:
        """A context manager the completers (``foreach_batch``, the Spark format's ``commit``) hold around completing
        and committing ``checkpoint_id``: the fence against a roller of another run (sinks/_postgres_attempts.py)."""
        if self.guarantee is not Guarantee.EXACTLY_ONCE:
            import contextlib
            return contextlib.nullcontext()
        return completion_guard(self, checkpoint_id, acks)

    def after_runtime_recovery(self, log: Any) -> int:
        """The embedded runtime, after its recovery and before its tasks: roll back this sink's prepared
        transactions of checkpoints the job's log recorded ABORTED; returns how many."""
        psycopg = _psycopg()
        try:
            with self.waiting("rolling back prepared transactions of aborted checkpoints"):
                return len(rollback_aborted(self, self._driver_conn(), log))
        except psycopg.Error as e:
            raise self._error(e, "rolling back prepared transactions of aborted checkpoints") from None

    def rollback_own_prepared(self, conn: Any, take: Callable[[int], bool]) -> int:
        """``ROLLBACK PREPARED`` each of this sink's own prepared transactions whose checkpoint ``take`` accepts
        (another sink's or another table's gid never: :meth:`own_checkpoint` is None for it); one gone meanwhile
        (committed or rolled back by another call) is skipped. Returns how many were rolled back."""
        psycopg = _psycopg()
        rolled = 0
        for gid in self.prepared():
            cid = self.own_checkpoint(gid)
            if cid is None or not take(cid):
                continue
            try:
                conn.execute(f"ROLLBACK PREPARED {_gid_literal(gid)}")
                rolled += 1
            except psycopg.errors.UndefinedObject:
                pass
        return rolled

    def create_committer(self) -> "_PostgresCommitter":
        self._check_init()
        return _PostgresCommitter(self)

    def prepared(self, conn: Any = None) -> list[str]:
        """The gids of this sink's prepared transactions (on its table, in its database)."""
        rows = (conn or self._driver_conn()).execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, %s) "
            "ORDER BY gid", (self.gid_prefix,)).fetchall()
        return [r[0] for r in rows if _GID_SAFE.match(r[0])]  # named like ours but not made by gid(): not ours


def _csv_ready(batch: Any) -> Any:
    """``batch`` with binary columns as PostgreSQL's bytea hex text (Arrow's CSV writer has no bytea form)."""
    import pyarrow as pa
    if not any(pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type) for f in batch.schema):
        return batch
    arrays = []
    for f, col in zip(batch.schema, batch.columns):
        if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type):
            col = pa.array([None if v is None else "\\x" + v.hex() for v in col.to_pylist()], pa.string())
        arrays.append(col)
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


class _PostgresCommitter(_UserCommitter):
    """The base's committer, plus the server-side sweep (invariant 5) and the marker table's pruning."""

    sink: PostgresSink

    def abort_lingering(self, up_to_checkpoint: int, highest_committed: Optional[int]) -> int:
        aborted = super().abort_lingering(up_to_checkpoint, highest_committed)
        sink = self.sink
        psycopg = _psycopg()
        try:
            with sink.waiting(f"the sweep of prepared transactions of checkpoints <= {up_to_checkpoint}"):
                conn = sink._driver_conn()
                # a newer checkpoint's may still be acked
                aborted += sink.rollback_own_prepared(conn, lambda cid: cid <= up_to_checkpoint)
                if highest_committed is not None:  # with what the log says of them (sinks/_postgres_proof.py)
                    prune_markers(sink, conn, highest_committed,
                                  sink.transaction_log() if sink.guarantee is Guarantee.EXACTLY_ONCE else None)
                sink.warn_old_prepared(conn)
        except psycopg.Error as e:
            raise sink._error(e, "sweeping lingering prepared transactions") from None
        if aborted:
            _log.info("postgres_lingering_rolled_back", sink_id=sink.sink_id, up_to=up_to_checkpoint,
                      transactions=aborted)
        return aborted

    def close(self) -> None:
        pass  # the driver connection belongs to the sink (closed by PostgresSink.close)


__all__ = ["MARKER_TABLE", "CommitOutcomeUnknownError", "PostgresSink"]
