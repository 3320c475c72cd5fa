"""A real PostgreSQL server for twophase-postgres's tests and benchmark: ``scripts/pg_server.sh`` (Debian's
packages, a private data directory, a free port, run as the unprivileged ``postgres`` user), or an external
one with ``TWOPHASE_PG_URL`` (a superuser's URL; the server needs max_prepared_transactions > 0)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any, Iterator, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "pg_server.sh")


@dataclass
class PgServer:
    """One server: ``url`` is a superuser's (twophase / twophase-pg-pw); :meth:`new_table` makes a fresh table."""

    url: str
    directory: Optional[str] = None

    def connect(self, url: Optional[str] = None) -> Any:
        import psycopg
        return psycopg.connect(url or self.url, autocommit=True)

    def sql(self, statement: str, params: Any = None) -> list:
        with self.connect() as c:
            cur = c.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def new_table(self, columns: str = "id bigint NOT NULL, v text", prefix: str = "t") -> str:
        """``public.<prefix>_<random>`` created with ``columns``; returns its qualified name."""
        name = f"public.{prefix}_{uuid.uuid4().hex[:10]}"
        self.sql(f"CREATE TABLE {name} ({columns})")
        return name

    def ids(self, table: str) -> list[int]:
        return sorted(r[0] for r in self.sql(f"SELECT id FROM {table}"))

    def prepared(self, prefix: str = "tp_") -> list[str]:
        return [r[0] for r in self.sql("SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s) ORDER BY gid",
                                       (prefix,))]

    def role(self, name: str, password: str, grants: str = "") -> str:
        """A login role ``name`` (recreated), with ``grants`` (SQL run after it exists); returns its URL."""
        self.sql(f"DROP OWNED BY {name}") if self.sql("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)) else None
        self.sql(f"DROP ROLE IF EXISTS {name}")
        self.sql(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
        if grants:
            self.sql(grants)
        host = self.url.split("@", 1)[1]
        return f"postgresql://{name}:{password}@{host}"


def start(directory: str, *, max_prepared: int = 64) -> PgServer:
    env = {**os.environ, "TWOPHASE_PG_MAX_PREPARED": str(max_prepared)}
    out = subprocess.run(["bash", SCRIPT, "start", directory], env=env, capture_output=True, text=True, timeout=180)
    if out.returncode != 0:
        raise RuntimeError(f"scripts/pg_server.sh start failed: {out.stderr[-2000:]}")
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("TWOPHASE_PG_URL=")][-1]
    values = dict(kv.split("=", 1) for kv in line.split())
    return PgServer(values["TWOPHASE_PG_URL"], directory)


def stop(server: PgServer) -> None:
    if server.directory:
        subprocess.run(["bash", SCRIPT, "stop", server.directory], capture_output=True, timeout=60)


@contextlib.contextmanager
def pg_server(*, max_prepared: int = 64) -> Iterator[PgServer]:
    """A private server for the block (stopped and removed after), or ``TWOPHASE_PG_URL``'s."""
    if os.environ.get("TWOPHASE_PG_URL") and max_prepared:
        yield PgServer(os.environ["TWOPHASE_PG_URL"])
        return
    directory = tempfile.mkdtemp(prefix="twophase-pg-")
    server = start(directory, max_prepared=max_prepared)
    try:
        yield server
    finally:
        stop(server)
        shutil.rmtree(directory, ignore_errors=True)
