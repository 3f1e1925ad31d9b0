"""Where the router keeps what must outlive its process: the store protocol, and
its embedded implementation in SQLite (stdlib ``sqlite3``), off the event loop.

Two implementations behind one :class:`StateStore` protocol, chosen in the
composition root (config ``store``): this module's :class:`SqliteStore`, the
default (one router, nothing to install), and :class:`router.redis_store.RedisStore`,
shared by routers that elect a leader (docs/scale-out.md). The router hands
either a :class:`Changes` batch (what changed since the last write) and reads a
:class:`Snapshot` back at start-up or promotion.

What SQLite keeps: agent rows (identity, parent, assignment, admitted flag,
counters, conversations' sizes — see :meth:`router.ledger.Agent.to_row`).
Identities survive because the signing secret is a file in the same state
directory. The hold queues, the instance registry and pending records are
Redis's alone: a single router that restarts has lost its held requests anyway.

All SQLite calls run on one dedicated worker thread (the connection is created
and used only there), so the event loop never blocks on disk.

A database SQLite cannot read (corrupt, or not a database at all) is renamed
``router.sqlite3.corrupt-<unix time>`` with an error log naming it, and the router
starts with an empty state instead of failing at every restart.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog

from router.errors import StateStoreError

log = structlog.get_logger("kairos.router.store")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS agents (
    agent_id TEXT PRIMARY KEY,
    row TEXT NOT NULL
);
"""

Row = dict[str, Any]
Held = tuple[str, float]
"""A held agent's place in line: ``(agent_id, since_unix_s)``."""


@dataclass(slots=True)
class Snapshot:
    """Everything a store holds, as read at start-up or on promotion."""

    agents: list[Row] = field(default_factory=list)
    queues: dict[str, list[Held]] = field(default_factory=dict)
    """Per instance, its held agents head first (shared stores only)."""
    instances: dict[str, Row] = field(default_factory=dict)
    """The instance registry with each one's latest decision (shared stores only)."""
    records: list[Row] = field(default_factory=list)
    """Ended agents' records not yet written to a records file (shared stores only)."""


@dataclass(slots=True)
class Changes:
    """One batch of changes since the previous successful write."""

    rows: list[Row] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    queues: dict[str, list[Held]] = field(default_factory=dict)
    """Instances whose hold-queue order changed, each with its whole new order."""
    instances: dict[str, Row] = field(default_factory=dict)
    removed_instances: list[str] = field(default_factory=list)
    records: dict[str, Row] = field(default_factory=dict)
    """Ended agents whose record is not written yet (by agent id)."""
    records_done: list[str] = field(default_factory=list)
    """Agent ids whose record is now written: no router writes it again."""
    full: bool = False
    """Replace the whole stored state with this batch (a leader writing its state
    back after an outage of the store)."""

    def __bool__(self) -> bool:
        return bool(
            self.rows or self.deleted or self.queues or self.instances
            or self.removed_instances or self.records or self.records_done or self.full
        )  # fmt: skip


class StateStore(Protocol):
    """What the router needs of a store; errors are :class:`StateStoreError`."""

    kind: str
    shared: bool
    """True when several routers share it (and so must elect a leader)."""

    async def load(self) -> Snapshot: ...

    async def write(self, changes: Changes) -> None: ...

    async def close(self) -> None: ...

    def describe(self) -> dict[str, object]:
        """Its state for ``/health/ready`` (kind, reachable, ...)."""
        ...


class SqliteStore:
    """Agent rows keyed by id in one SQLite file; a write is one transaction."""

    kind = "sqlite"
    shared = False

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="router-sqlite")
        self._conn: sqlite3.Connection | None = None

    def _open(self) -> sqlite3.Connection:
        if self._conn is None:
            try:
                self._conn = self._connect()
            except sqlite3.DatabaseError as exc:
                self._set_aside(exc)
                try:
                    self._conn = self._connect()
                except (sqlite3.Error, OSError) as again:
                    raise StateStoreError(
                        f"cannot open router state {self.path}: {again}"
                    ) from again
            except (sqlite3.Error, OSError) as exc:
                raise StateStoreError(f"cannot open router state {self.path}: {exc}") from exc
        return self._conn

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(self.path), check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
            conn.execute("SELECT count(*) FROM agents").fetchone()
        except BaseException:
            conn.close()
            raise
        return conn

    def _set_aside(self, exc: Exception) -> None:
        """Rename an unreadable database (and its WAL files) out of the way."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        for suffix in ("", "-wal", "-shm"):
            src = Path(f"{self.path}{suffix}")
            if src.exists():
                try:
                    src.rename(Path(f"{aside}{suffix}"))
                except OSError as err:
                    raise StateStoreError(f"cannot set aside corrupt {src}: {err}") from err
        log.error("state_database_corrupt_set_aside", path=str(self.path), moved_to=str(aside),
                  error=str(exc), hint="starting with no persisted agents")  # fmt: skip

    def _load(self) -> list[dict[str, Any]]:
        try:
            rows = self._open().execute("SELECT row FROM agents").fetchall()
        except sqlite3.DatabaseError as exc:
            self._set_aside(exc)
            return []
        out: list[dict[str, Any]] = []
        for (text,) in rows:
            try:
                obj = json.loads(text)
            except (json.JSONDecodeError, TypeError, RecursionError):
                continue
            if isinstance(obj, dict) and isinstance(obj.get("agent_id"), str):
                out.append(obj)
        return out

    def _write(self, rows: list[dict[str, Any]], deleted: list[str]) -> None:
        conn = self._open()
        try:
            with conn:
                conn.executemany(
                    "INSERT OR REPLACE INTO agents(agent_id, row) VALUES (?, ?)",
                    [(r["agent_id"], json.dumps(r)) for r in rows],
                )
                conn.executemany("DELETE FROM agents WHERE agent_id = ?", [(d,) for d in deleted])
        except sqlite3.Error as exc:
            raise StateStoreError(f"cannot write router state {self.path}: {exc}") from exc

    async def load(self) -> Snapshot:
        rows = await asyncio.get_running_loop().run_in_executor(self._pool, self._load)
        return Snapshot(agents=rows)

    async def write(self, changes: Changes) -> None:
        rows, deleted = changes.rows, changes.deleted
        if rows or deleted:
            await asyncio.get_running_loop().run_in_executor(self._pool, self._write, rows, deleted)

    def describe(self) -> dict[str, object]:
        return {"kind": self.kind, "path": str(self.path), "reachable": True}

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._pool, self._close)
        self._pool.shutdown(wait=True)
