"""The shared state store in Redis (redis-py's asyncio client), with the lease and
its fence.

What a router needs to take over from another lives under one key prefix
(config ``store_prefix``):

==================  ======  ===========================================================
key                 type    what
==================  ======  ===========================================================
``lease``           string  ``<fence>|<router id>|<advertised URL>``, expires (``PX``)
``fence``           int     incremented at every acquisition (the fencing counter)
``agents``          hash    agent id → row (:meth:`router.ledger.Agent.to_row`, JSON)
``queues``          hash    instance → its held agents head first, ``[[id, since_unix_s]]``
``instances``       hash    name → registry entry and latest decision (JSON)
``records``         hash    agent id → its record, until a records file has it
``secret``          string  the identity signing secret (hex)
``credentials``     hash    role → SHA-256 of the credential (never the credential)
``version``         int     incremented by every write
``changes``         stream  every write's batch, for standbys to follow (capped)
==================  ======  ===========================================================

Every write is one Lua script that first compares the lease and the fence with
the writer's, so a router whose lease was taken over (it was paused, partitioned)
is refused, atomically with the batch it tried to apply: there is no window
between the check and the write. Redis errors are translated here:
:class:`~router.errors.StoreUnavailableError` when Redis does not answer,
:class:`~router.errors.FencedError` when another router took the lease (or the
fence moved), :class:`~router.errors.LeaseLapsedError` when the writer's lease
only lapsed (Redis was away or restarted; nobody else holds it),
:class:`~router.errors.StateStoreError` otherwise.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import orjson
import redis.asyncio as aioredis
from redis import exceptions as rx

from router.errors import (
    FencedError,
    LeaseLapsedError,
    StateStoreError,
    StoreUnavailableError,
)
from router.store import Changes, Held, Row, Snapshot

T = TypeVar("T")
STREAM_MAX_ENTRIES = 200
"""Change batches kept for standbys (about 20 s at the default flush interval): a
standby further behind reads everything again. Entries name what changed, not
the rows, so the stream stays small whatever the fleet's size."""

# ARGV: router id, URL, lease ms, the fence the caller last held ('' for none): a
# leader re-acquiring after an outage may only if nobody led meanwhile.
_ACQUIRE = """
local held = redis.call('GET', KEYS[1])
if held then return {0, held} end
if ARGV[4] ~= '' then
  local last = redis.call('GET', KEYS[2])
  if last and last ~= ARGV[4] then return redis.error_reply('FENCED another router led') end
end
local fence = redis.call('INCR', KEYS[2])
local value = fence .. '|' .. ARGV[1] .. '|' .. ARGV[2]
redis.call('SET', KEYS[1], value, 'PX', ARGV[3])
return {fence, value}
"""

_RENEW = """
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, held}
end
return {0, held or ''}
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: lease fence agents queues instances records credentials version changes
# ARGV: lease value, fence, batch (JSON), stream cap, writer (router id), summary (JSON)
_WRITE = """
local held, fence = redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2])
if held ~= ARGV[1] or fence ~= ARGV[2] then
  if not held and (fence == ARGV[2] or not fence) then
    return redis.error_reply('LAPSED lease expired and nobody holds it')
  end
  return redis.error_reply('FENCED lease or fence changed')
end
local b = cjson.decode(ARGV[3])
if b.full then redis.call('DEL', KEYS[3], KEYS[4], KEYS[5], KEYS[6]) end
for id, row in pairs(b.rows) do redis.call('HSET', KEYS[3], id, row) end
for _, id in ipairs(b.deleted) do redis.call('HDEL', KEYS[3], id) end
for name, order in pairs(b.queues) do
  if order == '' then redis.call('HDEL', KEYS[4], name)
  else redis.call('HSET', KEYS[4], name, order) end
end
for name, entry in pairs(b.instances) do redis.call('HSET', KEYS[5], name, entry) end
for _, name in ipairs(b.removed) do
  redis.call('HDEL', KEYS[5], name)
  redis.call('HDEL', KEYS[4], name)
end
for id, rec in pairs(b.records) do redis.call('HSET', KEYS[6], id, rec) end
for _, id in ipairs(b.records_done) do redis.call('HDEL', KEYS[6], id) end
for role, digest in pairs(b.credentials) do redis.call('HSETNX', KEYS[7], role, digest) end
local version = redis.call('INCR', KEYS[8])
redis.call('XADD', KEYS[9], 'MAXLEN', '~', ARGV[4], '*', 'v', version, 'w', ARGV[5], 'b', ARGV[6])
return version
"""


@dataclass(frozen=True, slots=True)
class Lease:
    """Who holds the lease: fence, router id and advertised URL (may be empty)."""

    fence: int
    router_id: str
    url: str
    value: str

    @classmethod
    def parse(cls, value: str) -> Lease | None:
        fence, _, rest = value.partition("|")
        router_id, _, url = rest.partition("|")
        try:
            return cls(int(fence), router_id, url, value)
        except ValueError:
            return None


@dataclass(slots=True)
class StoreStatus:
    """What the store last saw of Redis (for ``/health/ready`` and the metrics)."""

    reachable: bool = True
    error: str = ""
    version: int = 0
    """The version of the last batch this router wrote or read."""


def _key_prefix(url: str, prefix: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise StateStoreError(f"store URL {url!r}: expected redis://HOST:PORT/DB")
    return prefix.rstrip(":")


def encode_batch(changes: Changes, credentials: dict[str, str]) -> tuple[bytes, bytes]:
    """The JSON batch the write script applies (rows and records pre-encoded, so
    that Redis's cjson never re-encodes them: it would turn ``[]`` into ``{}``),
    and its summary for the change stream (what changed, by id)."""
    queues = {
        name: orjson.dumps(order).decode() if order else ""
        for name, order in changes.queues.items()
    }
    instances = {n: orjson.dumps(e).decode() for n, e in changes.instances.items()}
    batch = {
        "full": changes.full,
        "rows": {r["agent_id"]: orjson.dumps(r).decode() for r in changes.rows},
        "deleted": changes.deleted,
        "queues": queues,
        "instances": instances,
        "removed": changes.removed_instances,
        "records": {i: orjson.dumps(r).decode() for i, r in changes.records.items()},
        "records_done": changes.records_done,
        "credentials": credentials,
    }
    summary = batch | {"rows": [r["agent_id"] for r in changes.rows],
                       "records": list(changes.records), "credentials": {}}  # fmt: skip
    return orjson.dumps(batch), orjson.dumps(summary)


def apply_summary(
    view: Snapshot,
    batch: dict[str, Any],
    rows: dict[str, Row | None],
    records: dict[str, Row | None],
) -> None:
    """Apply one change-stream entry to a standby's ``view``; ``rows`` and ``records``
    are the store's current values of the ids it names (None: gone since)."""
    if batch.get("full"):
        view.agents, view.queues, view.instances, view.records = [], {}, {}, []
    agents = {r["agent_id"]: r for r in view.agents}
    for agent_id in batch.get("rows") or ():
        row = rows.get(agent_id)
        if row is None:
            agents.pop(agent_id, None)
        else:
            agents[agent_id] = row
    for agent_id in batch.get("deleted") or ():
        agents.pop(agent_id, None)
    view.agents = list(agents.values())
    for name, order in (batch.get("queues") or {}).items():
        if order:
            view.queues[name] = _held(orjson.loads(order))
        else:
            view.queues.pop(name, None)
    for name, entry in (batch.get("instances") or {}).items():
        view.instances[name] = orjson.loads(entry)
    for name in batch.get("removed") or ():
        view.instances.pop(name, None)
        view.queues.pop(name, None)
    pending = {r["agent_id"]: r for r in view.records}
    for agent_id in batch.get("records") or ():
        rec = records.get(agent_id)
        if rec is None:
            pending.pop(agent_id, None)
        else:
            pending[agent_id] = rec
    for agent_id in batch.get("records_done") or ():
        pending.pop(agent_id, None)
    view.records = list(pending.values())


def _held(order: Any) -> list[Held]:
    return [(str(i), float(s)) for i, s in order] if isinstance(order, list) else []


class RedisStore:
    """The shared store; one per router process. ``fence``/``lease_value`` are set
    by the lease keeper (:mod:`router.lease`) and checked by every write."""

    kind = "redis"
    shared = True

    def __init__(self, url: str, *, prefix: str = "kairos:router", timeout_s: float = 0.5) -> None:
        self.url = url
        p = _key_prefix(url, prefix)
        self.keys = {
            name: f"{p}:{name}"
            for name in (
                "lease",
                "fence",
                "agents",
                "queues",
                "instances",
                "records",
                "credentials",
                "version",
                "changes",
                "secret",
            )
        }
        self.timeout_s = timeout_s
        self._redis = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            retry_on_timeout=False, decode_responses=True,
        )  # fmt: skip
        self._acquire = self._redis.register_script(_ACQUIRE)
        self._renew = self._redis.register_script(_RENEW)
        self._release = self._redis.register_script(_RELEASE)
        self._write = self._redis.register_script(_WRITE)
        self.lease: Lease | None = None
        """The lease this router holds (None: none); writes carry it."""
        self.pending_credentials: dict[str, str] = {}
        """Credential digests to add (``HSETNX``) with the next write."""
        self.status = StoreStatus()

    def describe(self) -> dict[str, object]:
        s = self.status
        out: dict[str, object] = {"kind": self.kind, "reachable": s.reachable}
        out["url"] = _redacted(self.url)
        out["version"] = s.version
        if s.error:
            out["error"] = s.error
        return out

    async def _call(self, op: Callable[[], Awaitable[T]]) -> T:
        """Run one Redis operation, translating its errors (and noting reachability)."""
        try:
            result = await op()
        except (rx.ConnectionError, rx.TimeoutError, TimeoutError, OSError) as exc:
            self.status.reachable, self.status.error = False, _short(exc)
            raise StoreUnavailableError(f"Redis at {_redacted(self.url)}: {_short(exc)}") from exc
        except rx.ResponseError as exc:
            self.status.reachable = True
            if str(exc).startswith("FENCED"):
                raise FencedError("the store refused the write: lease taken over") from exc
            if str(exc).startswith("LAPSED"):
                raise LeaseLapsedError("the lease lapsed; nobody else holds it") from exc
            raise StateStoreError(f"Redis refused: {_short(exc)}") from exc
        except rx.RedisError as exc:
            raise StateStoreError(f"Redis: {_short(exc)}") from exc
        self.status.reachable, self.status.error = True, ""
        return result

    # -- the lease ------------------------------------------------------------------------

    async def current_lease(self) -> Lease | None:
        value = await self._call(lambda: self._redis.get(self.keys["lease"]))
        return Lease.parse(value) if isinstance(value, str) else None

    async def try_acquire(
        self, router_id: str, url: str, lease_ms: int, *, after_fence: int | None = None
    ) -> tuple[Lease | None, Lease | None]:
        """Take the lease if nobody holds it, with a new fence: ``(ours, None)``;
        else ``(None, whoever holds it)``. ``after_fence``: the fence this router
        last held; FencedError if another router has led since (its state is newer)."""
        keys = [self.keys["lease"], self.keys["fence"]]
        last = "" if after_fence is None else str(after_fence)
        fence, value = await self._call(
            lambda: self._acquire(keys, [router_id, url, lease_ms, last])
        )
        if int(fence) == 0:
            return None, Lease.parse(str(value))
        self.lease = Lease.parse(str(value))
        return self.lease, None

    async def renew(self, lease_ms: int) -> Lease | None:
        """Extend our lease; None if it is gone, else who holds it now (us: renewed)."""
        held = self.lease
        if held is None:
            return None
        ok, value = await self._call(
            lambda: self._renew([self.keys["lease"]], [held.value, lease_ms])
        )
        if int(ok):
            return held
        return Lease.parse(str(value)) if value else None

    async def release(self) -> None:
        """Give the lease up at a clean shutdown (a standby takes over at once)."""
        held, self.lease = self.lease, None
        if held is not None:
            await self._call(lambda: self._release([self.keys["lease"]], [held.value]))

    # -- state ----------------------------------------------------------------------------

    async def write(self, changes: Changes) -> None:
        held = self.lease
        if held is None:
            raise FencedError("this router holds no lease: it may not write")
        if not changes and not self.pending_credentials:
            return
        creds, self.pending_credentials = self.pending_credentials, {}
        batch, summary = encode_batch(changes, creds)
        k = self.keys
        keys = [k[n] for n in ("lease", "fence", "agents", "queues", "instances", "records",
                               "credentials", "version", "changes")]  # fmt: skip
        args: list[str | int | bytes] = [
            held.value, held.fence, batch, STREAM_MAX_ENTRIES, held.router_id, summary
        ]  # fmt: skip
        try:
            version = await self._call(lambda: self._write(keys, args))
        except (StoreUnavailableError, LeaseLapsedError):
            self.pending_credentials = creds | self.pending_credentials
            raise
        except FencedError:
            if self.lease is not None and self.lease is not held:
                self.pending_credentials = creds | self.pending_credentials
                raise LeaseLapsedError("written under a lease since renewed") from None
            raise
        self.status.version = int(version)

    async def load(self) -> Snapshot:
        snap, _ = await self.load_with_position()
        return snap

    async def load_with_position(self) -> tuple[Snapshot, str]:
        """Everything, read atomically, and the stream position it corresponds to."""
        k = self.keys

        async def read() -> list[Any]:
            async with self._redis.pipeline(transaction=True) as pipe:
                for name in ("agents", "queues", "instances", "records"):
                    pipe.hgetall(k[name])
                pipe.get(k["version"])
                pipe.xrevrange(k["changes"], count=1)
                return list(await pipe.execute())

        agents, queues, instances, records, version, last = await self._call(read)
        snap = Snapshot(
            agents=[row for row in map(_loads, agents.values()) if _is_row(row)],
            queues={name: _held(_loads(v)) for name, v in queues.items()},
            instances=_entries(instances),
            records=[r for r in map(_loads, records.values()) if _is_row(r)],
        )
        self.status.version = int(version or 0)
        return snap, (last[0][0] if last else "0-0")

    async def follow(self, position: str, block_ms: int) -> list[tuple[str, int, dict[str, Any]]]:
        """Change-stream entries after ``position`` (blocking up to ``block_ms``):
        ``(stream id, version, summary)`` each (the entry also names its writer, ``w``)."""
        name = self.keys["changes"]
        reply: Any = await self._call(
            lambda: self._redis.xread({name: position}, count=100, block=block_ms)
        )
        out = []
        for _stream, entries in reply or ():
            for entry_id, fields in entries:
                batch = _loads(fields.get("b", "{}"))
                out.append((entry_id, int(fields.get("v", 0)), batch if isinstance(batch, dict)
                            else {}))  # fmt: skip
        return out

    async def current(
        self, rows: list[str], records: list[str]
    ) -> tuple[dict[str, Row | None], dict[str, Row | None]]:
        """The stored rows and pending records of these agent ids (None: none)."""
        k = self.keys

        async def read() -> list[Any]:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hmget(k["agents"], rows or ["-"])
                pipe.hmget(k["records"], records or ["-"])
                return list(await pipe.execute())

        got_rows, got_records = await self._call(read)
        return (
            {i: _row_or_none(v) for i, v in zip(rows, got_rows, strict=False)},
            {i: _row_or_none(v) for i, v in zip(records, got_records, strict=False)},
        )

    async def version(self) -> int:
        value = await self._call(lambda: self._redis.get(self.keys["version"]))
        return int(value or 0)

    # -- secrets ----------------------------------------------------------------------------

    async def share_secret(self, local_hex: str) -> str:
        """The store's signing secret (hex); ``local_hex`` becomes it if none is there."""
        key = self.keys["secret"]

        async def op() -> Any:
            await self._redis.set(key, local_hex, nx=True)
            return await self._redis.get(key)

        return str(await self._call(op))

    async def share_credentials(self, digests: dict[str, str]) -> dict[str, str]:
        """Add our digests where none is set (``HSETNX``); every stored digest."""
        key = self.keys["credentials"]

        async def op() -> Any:
            async with self._redis.pipeline(transaction=True) as pipe:
                for role, digest in digests.items():
                    pipe.hsetnx(key, role, digest)
                pipe.hgetall(key)
                return (await pipe.execute())[-1]

        return dict(await self._call(op))

    async def close(self) -> None:
        await self._redis.aclose()


def _loads(text: Any) -> Any:
    try:
        return orjson.loads(text)
    except (orjson.JSONDecodeError, TypeError):
        return None


def _entries(raw: dict[str, str]) -> dict[str, Row]:
    out = {}
    for name, text in raw.items():
        entry = _loads(text)
        if isinstance(entry, dict):
            out[name] = entry
    return out


def _row_or_none(text: Any) -> Row | None:
    obj = _loads(text) if text is not None else None
    return obj if _is_row(obj) else None


def _is_row(obj: Any) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("agent_id"), str)


def _short(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0][:200]


def _redacted(url: str) -> str:
    """The URL without a password (``redis://:secret@host`` is how Redis AUTH is given)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://***@{host}{port}{parts.path}"
