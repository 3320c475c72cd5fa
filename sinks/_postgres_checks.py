"""twophase-postgres: what the driver checks before any data moves (invariant 6 of sinks/postgres.py): the server
answers with these credentials, ``max_prepared_transactions > 0``, the table exists and the role may write it (and
the marker table), every column of the stream round-trips through its column, NOT NULL columns without a default are
in the stream, ``upsertKeys`` match a unique index. A mixin of :class:`~twophase.sinks.postgres.PostgresSink`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from twophase._logging import get_logger
from twophase.errors import ConfigurationError, MissingDependencyError

_log = get_logger("twophase.sinks.postgres")

#: Arrow type -> the PostgreSQL types (pg_type.typname) a column of it round-trips through
_INTS = {8: ("int2", "int4", "int8", "numeric"), 16: ("int2", "int4", "int8", "numeric"),
         32: ("int4", "int8", "numeric"), 64: ("int8", "numeric")}


def _psycopg() -> Any:
    try:
        from twophase._versions import require
        require("psycopg", what="twophase-postgres")
        import psycopg
    except ImportError as e:
        raise MissingDependencyError("twophase-postgres needs psycopg 3: pip install 'twophase[postgres]'") from e
    return psycopg


def _pg_types_for(t: Any) -> Optional[tuple[str, ...]]:
    """The PostgreSQL column types an Arrow type round-trips through, or None (refused)."""
    import pyarrow as pa
    if pa.types.is_boolean(t):
        return ("bool",)
    if pa.types.is_signed_integer(t):
        return _INTS[t.bit_width]
    if pa.types.is_float32(t):
        return ("float4", "float8")
    if pa.types.is_float64(t):
        return ("float8",)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return ("text", "varchar")
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return ("bytea",)
    if pa.types.is_date32(t):
        return ("date",)
    if pa.types.is_timestamp(t):
        return ("timestamptz",) if t.tz else ("timestamp",)
    if pa.types.is_decimal(t):
        return ("numeric",)
    return None


_FIX_TYPES = ("map it to a column type that round-trips (boolean, smallint/integer/bigint, real/double "
              "precision, text/varchar, bytea, date, timestamp (timestamp_ntz), timestamptz (timestamp), numeric), "
              "or cast it in the query (e.g. to_json(col) into a text column)")


@dataclass(frozen=True)
class _Column:
    name: str
    typname: str
    typmod: int
    not_null: bool
    has_default: bool


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class DestinationChecks:
    """The driver-side checks of :class:`~twophase.sinks.postgres.PostgresSink` (its attributes: ``schema``,
    ``table``, ``qualified``, ``marker``, ``upsert_keys``, ``gid_prefix``, ``prepared_warn_after``, ``sink_id``)."""

    def columns(self, conn: Any) -> dict[str, _Column]:
        rows = conn.execute(
            "SELECT a.attname, t.typname, a.atttypmod, a.attnotnull, a.atthasdef OR a.attidentity <> '' "
            "OR a.attgenerated <> '' FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
            "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (self.qualified,)).fetchall()
        return {r[0]: _Column(r[0], r[1], r[2], r[3], r[4]) for r in rows}

    def validate_destination(self) -> None:
        with self.waiting("checking the destination"):
            self._validate_destination()

    def _validate_destination(self) -> None:
        conn = self._driver_conn()
        where = f"twophase-postgres (sink {self.sink_id!r})"
        try:
            mpt = int(conn.execute("SHOW max_prepared_transactions").fetchone()[0])
            if mpt <= 0:
                raise ConfigurationError(
                    f"{where}: the server's max_prepared_transactions is {mpt} (PostgreSQL's default), so PREPARE "
                    "TRANSACTION is refused and no exactly-once write can work. Set it to at least the number of "
                    "tasks of a batch, e.g. ALTER SYSTEM SET max_prepared_transactions = 64 (or in postgresql.conf), "
                    "and restart the server")
            if conn.execute("SELECT to_regclass(%s)", (self.qualified,)).fetchone()[0] is None:
                raise ConfigurationError(
                    f"{where}: option 'table': table {self.schema}.{self.table} does not exist (or this role cannot "
                    f"see its schema) in database {conn.info.dbname}; create it first (twophase-postgres never "
                    "creates the target table) or fix option 'table' ('schema.table')")
            need = ["INSERT"] + (["UPDATE", "SELECT"] if self.upsert_keys else [])
            missing = [p for p in need if not conn.execute("SELECT has_table_privilege(%s, %s)",
                                                            (self.qualified, p)).fetchone()[0]]
            if missing:
                raise ConfigurationError(
                    f"{where}: role {conn.info.user} may not {', '.join(missing)} table {self.schema}.{self.table}: "
                    f"GRANT {', '.join(missing)} ON {self.qualified} TO {_quote_ident(conn.info.user)}")
            self._ensure_marker(conn)
            self.claim_prefix(conn)
            if self.upsert_keys:
                self._check_upsert_keys(conn)
            self.warn_old_prepared(conn)
        except ConfigurationError:
            raise
        except _psycopg().Error as e:
            raise self._error(e, "checking the destination") from None

    def _ensure_marker(self, conn: Any) -> None:
        where = f"twophase-postgres (sink {self.sink_id!r})"
        ddl = (f"CREATE TABLE IF NOT EXISTS {self.marker} (gid text PRIMARY KEY, gid_prefix text NOT NULL, "
               "checkpoint_id bigint NOT NULL, prepared_at timestamptz NOT NULL DEFAULT now())")
        if conn.execute("SELECT to_regclass(%s)", (self.marker,)).fetchone()[0] is None:
            try:
                conn.execute(ddl)
            except _psycopg().errors.InsufficientPrivilege:
                raise ConfigurationError(
                    f"{where}: the marker table {self.marker_schema}.{self.marker_table} (which tells a repeated "
                    "commit from a lost one) does not exist and this role may not create it. Have its owner run: "
                    f"{ddl}; GRANT SELECT, INSERT, DELETE ON {self.marker} TO {_quote_ident(conn.info.user)} "
                    "(or give option markerTable)") from None
        missing = [p for p in ("SELECT", "INSERT", "DELETE")
                   if not conn.execute("SELECT has_table_privilege(%s, %s)", (self.marker, p)).fetchone()[0]]
        if missing:
            raise ConfigurationError(
                f"{where}: role {conn.info.user} may not {', '.join(missing)} the marker table "
                f"{self.marker_schema}.{self.marker_table}: GRANT SELECT, INSERT, DELETE ON {self.marker} TO "
                f"{_quote_ident(conn.info.user)}")

    #: the marker table's row that claims a gid prefix for one transaction log: gid = OWNER + gid prefix, gid_prefix =
    #: OWNER + the log's location (never a gid: every gid starts with 'tp_'; never pruned: its gid_prefix is no sink's)
    OWNER = "owner:"

    def claim_prefix(self, conn: Any) -> None:
        """One sink id on one table serves one query (one transaction log): the first log to start claims the gid
        prefix in the marker table; another log is refused. Two logs sharing a prefix sweep each other's prepared
        transactions, a decided batch's too (it is LOST then). A batch write's sink id carries its log's digest
        already (``#write:``); a sink without a log location yet claims nothing."""
        import os
        from twophase.errors import ConfigurationError as _CE
        if "#write:" in self.sink_id:
            return
        try:
            location = self.resolved_log_location()
        except _CE:
            return
        location = location.rstrip("/") if "://" in location else os.path.abspath(location)
        key, mine = self.OWNER + self.gid_prefix, self.OWNER + location
        row = None
        for _ in range(3):  # a claim released between the insert and the read is claimed again
            conn.execute(f"INSERT INTO {self.marker} (gid, gid_prefix, checkpoint_id) VALUES (%s, %s, 0) "
                         "ON CONFLICT (gid) DO NOTHING", (key, mine))
            row = conn.execute(f"SELECT gid_prefix FROM {self.marker} WHERE gid = %s", (key,)).fetchone()
            if row is not None:
                break
        if row is not None and row[0] != mine:
            from twophase._redact import redact_text
            raise ConfigurationError(
                f"twophase-postgres (sink {self.sink_id!r}): option 'sink_id' {self.sink_id!r} on table "
                f"{self.schema}.{self.table} belongs to another query: its transaction log is at "
                f"{redact_text(row[0][len(self.OWNER):])}, this one's at {redact_text(location)}. Two logs with one sink "
                "id on one table roll back each other's prepared transactions (a committed batch's too: lost). Give "
                "this query its own sink_id; or, if the other query is gone for good (its checkpoint deleted or "
                f"moved here), release its claim: DELETE FROM {self.marker} WHERE gid = '{key}'")

    def _check_upsert_keys(self, conn: Any) -> None:
        cols = self.columns(conn)
        unknown = [k for k in self.upsert_keys if k not in cols]
        if unknown:
            raise ConfigurationError(f"twophase-postgres: option 'upsertKeys' names {unknown}, which are not columns "
                                     f"of {self.schema}.{self.table} ({', '.join(cols)})")
        uniques = conn.execute(
            "SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_index i "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indpred IS NULL GROUP BY i.indexrelid",
            (self.qualified,)).fetchall()
        if sorted(self.upsert_keys) not in [sorted(r[0]) for r in uniques]:
            raise ConfigurationError(
                f"twophase-postgres: option 'upsertKeys' {list(self.upsert_keys)} must be exactly the columns of a "
                f"unique index or constraint of {self.schema}.{self.table} (INSERT ... ON CONFLICT needs one): "
                f"ALTER TABLE {self.qualified} ADD UNIQUE ({', '.join(map(_quote_ident, self.upsert_keys))})")
        if not conn.execute("SELECT has_schema_privilege(%s, 'CREATE')", (self.schema,)).fetchone()[0]:
            raise ConfigurationError(
                f"twophase-postgres: option 'upsertKeys' stages rows in a table of the attempt in schema "
                f"{self.schema} (a temporary table cannot be in a prepared transaction); role {conn.info.user} may "
                f"not create tables there: GRANT CREATE ON SCHEMA {_quote_ident(self.schema)} TO "
                f"{_quote_ident(conn.info.user)}")

    def check_arrow_schema(self, schema: Any, columns: dict[str, _Column], *, what: str = "twophase-postgres") -> None:
        """Refuse a column the table cannot take exactly (invariant 6); names the column, both types and the fix."""
        names = list(schema.names)
        for field in schema:
            allowed = _pg_types_for(field.type)
            col = columns.get(field.name)
            if col is None:
                raise ConfigurationError(
                    f"{what}: column {field.name!r} of the stream is not a column of {self.schema}.{self.table} "
                    f"({', '.join(columns)}); add it to the table or drop / rename it in the query")
            if allowed is None:
                raise ConfigurationError(f"{what}: column {field.name!r} has type {field.type}, which twophase-postgres "
                                         f"cannot write so that it reads back the same: {_FIX_TYPES}")
            if col.typname not in allowed:
                raise ConfigurationError(
                    f"{what}: column {field.name!r} ({field.type}) cannot round-trip through {self.schema}.{self.table}"
                    f".{col.name} of type {col.typname}: make the table column one of {', '.join(allowed)}, or cast "
                    "the stream's column")
            if col.typname == "numeric" and col.typmod >= 4:
                import pyarrow as pa
                prec, scale = ((col.typmod - 4) >> 16) & 0xFFFF, (col.typmod - 4) & 0xFFFF
                p, s = ((field.type.precision, field.type.scale) if pa.types.is_decimal(field.type)
                        else (len(str(2 ** (field.type.bit_width - 1))), 0))
                if s > scale or p - s > prec - scale:
                    raise ConfigurationError(
                        f"{what}: column {field.name!r} ({field.type}) does not fit {col.name} numeric({prec},{scale}): "
                        f"widen the table column to numeric({max(prec - scale, p - s) + max(s, scale)},"
                        f"{max(s, scale)}) or unconstrained numeric")
        required = [c.name for c in columns.values() if c.not_null and not c.has_default and c.name not in names]
        if required:
            raise ConfigurationError(f"{what}: {self.schema}.{self.table} has NOT NULL columns without a default that "
                                     f"the stream does not carry: {required}; add them to the query or give them a "
                                     "default")
        missing_keys = [k for k in self.upsert_keys if k not in names]
        if missing_keys:
            raise ConfigurationError(f"{what}: option 'upsertKeys' names {missing_keys}, which the stream does not carry")

    def check_spark_schema(self, schema: Any) -> None:
        """The driver's check of a Spark stream's columns (``foreach_batch`` calls it before any data moves)."""
        import pyarrow as pa
        from pyspark.sql import types as T
        from pyspark.sql.pandas.types import to_arrow_schema
        fields = []
        for f in schema.fields:
            try:
                fields.append(to_arrow_schema(T.StructType([f]), timezone="UTC", prefers_large_types=False)[0])
            except Exception:
                raise ConfigurationError(f"foreach_batch(twophase-postgres): column {f.name!r} has Spark type "
                                         f"{f.dataType.simpleString()}, which has no exact form here: {_FIX_TYPES}") from None
        try:
            with self.waiting("reading the table's columns"):
                cols = self.columns(self._driver_conn())
        except _psycopg().Error as e:
            raise self._error(e, "reading the table's columns") from None
        if not cols:
            self.validate_destination()  # names what is wrong with option 'table'
        self.check_arrow_schema(pa.schema(fields), cols, what="foreach_batch(twophase-postgres)")

    def warn_old_prepared(self, conn: Any) -> int:
        """Log ``postgres_prepared_transaction_old`` for each prepared transaction of this sink older than
        ``preparedWarnAfter`` seconds; returns how many."""
        rows = conn.execute(
            "SELECT gid, extract(epoch FROM now() - prepared) FROM pg_prepared_xacts WHERE database = "
            "current_database() AND starts_with(gid, %s) AND now() - prepared > make_interval(secs => %s)",
            (self.gid_prefix, self.prepared_warn_after)).fetchall()
        for gid, age in rows:
            _log.warning("postgres_prepared_transaction_old", sink_id=self.sink_id, gid=gid, age_s=round(float(age), 1),
                         consequence="it holds its row and table locks and holds back VACUUM until the driver commits "
                                     "or the sweep rolls it back; a stopped query leaves it: restart the query (or "
                                     f"ROLLBACK PREPARED '{gid}' if its checkpoint was never completed)")
        return len(rows)
