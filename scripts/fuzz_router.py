"""Fuzz every router route with generated malformed or odd requests (loopback only).

    python -m scripts.fuzz_router --examples 10000 --seed 1

Starts a router in-process on 127.0.0.1 in front of an in-process fake backend,
then sends hypothesis-generated requests (method, route, Authorization /
x-api-key / identity headers, bodies: JSON of any shape and depth, broken JSON,
random bytes, huge numbers, NaN literals) and counts answers by status class and
every log record carrying a traceback. The verdict is "0 5xx, 0 tracebacks";
anything else is listed. Bounded: ``--examples`` requests, each with a timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import structlog
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from router.testing import FakeBackend, RunningRouter, start_router

T = TypeVar("T")

ROUTES = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/responses"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
    ("GET", "/v1/models"),
    ("GET", "/health"),
    ("GET", "/health/ready"),
    ("GET", "/health/room"),
    ("GET", "/metrics"),
    ("POST", "/kairos/v1/agents"),
    ("POST", "/kairos/v1/agents/{id}/end"),
    ("GET", "/kairos/v1/agents/{id}"),
    ("GET", "/kairos/v1/instances"),
    ("GET", "/kairos/v1/instances/{inst}/state"),
    ("POST", "/kairos/v1/instances/{inst}/decision"),
    ("GET", "/kairos/v1/fleet"),
    ("POST", "/kairos/v1/admin/instances"),
    ("DELETE", "/kairos/v1/admin/instances/{inst}"),
    ("POST", "/kairos/v1/admin/instances/{inst}/drain"),
]

_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
)
_json = st.recursive(
    _json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=30,
)
_known_keys = st.sampled_from(
    ["model", "messages", "stream", "stream_options", "instance", "daemon_id", "epoch",
     "daemon_start_unix_s", "admit", "valid_for_s", "capacity_tokens", "exit_code", "name",
     "url", "draining", "slo_tok_s", "parent_id", "report", "levels_mhz", "measured_power_w"]
)  # fmt: skip
_shaped = st.dictionaries(_known_keys, _json, max_size=8)


def _nested(depth: int) -> bytes:
    return b'{"model": "m", "messages": ' + b"[" * depth + b"]" * depth + b"}"


_body = st.one_of(
    st.none(),
    _json.map(lambda v: json.dumps(v).encode()),
    _shaped.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=300),
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.integers(min_value=50, max_value=200_000).map(_nested),
    st.sampled_from([b"{", b"[1,2", b'{"a": NaN}', b'{"stream": Infinity}', b"\xff\xfe", b"null"]),
)
_token = st.one_of(
    st.text(max_size=60),
    st.sampled_from(["kairos1.x.y", "kairos1.abc.def.ghi", "kairos1..", "sk-" + "a" * 200]),
    st.just("CREDENTIAL"),
)
_header_value = st.text(
    alphabet=st.characters(min_codepoint=32, max_codepoint=0x2FFF, blacklist_characters="\r\n"),
    max_size=80,
)


def _printable(value: str) -> str:
    """Without control characters (the client refuses to send those at all);
    non-ASCII stays, which is what used to crash the credential check."""
    return "".join(c for c in value if ord(c) >= 32 and not 127 <= ord(c) < 160)


@dataclass
class FuzzResult:
    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)
    tracebacks: list[str] = field(default_factory=list)
    client_errors: Counter[str] = field(default_factory=Counter)

    def to_json(self) -> dict[str, Any]:
        by_class = Counter(f"{s // 100}xx" for s in self.statuses.elements())
        return {
            "requests": self.requests,
            "by_class": dict(sorted(by_class.items())),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "5xx": sum(v for k, v in self.statuses.items() if k >= 500),
            "tracebacks": len(self.tracebacks),
            "client_errors": dict(self.client_errors),
            "examples_5xx": self.server_errors[:5],
            "examples_tracebacks": self.tracebacks[:3],
        }


class _TracebackCounter(logging.Handler):
    def __init__(self, sink: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.sink.append(f"{record.name}: {record.getMessage()[:200]}")


class _Loop:
    """An event loop in a thread: hypothesis drives requests from the main thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def run_fuzz(examples: int, seed_value: int = 0, state_dir: Path | None = None) -> FuzzResult:
    """Send ``examples`` generated requests to a fresh router; collect the outcome."""
    result = FuzzResult()
    counter = _TracebackCounter(result.tracebacks)
    logging.getLogger().addHandler(counter)
    tmp = tempfile.TemporaryDirectory()
    state = state_dir or Path(tmp.name) / "state"
    runner = _Loop()
    backend = FakeBackend(record=False)
    router: RunningRouter | None = None
    session: aiohttp.ClientSession | None = None

    async def setup() -> tuple[RunningRouter, aiohttp.ClientSession]:
        await backend.start()
        r = await start_router([backend.url], state, max_body_bytes=1 << 20)
        return r, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))

    try:
        with structlog.testing.capture_logs() as logs:
            router, session = runner.run(setup())
            creds = router.credentials
            real = {
                "admin": creds.admin.decode(),
                "lifecycle": creds.lifecycle.decode(),
                "daemon": creds.daemon_token("i0").decode(),
            }

            async def restore() -> None:
                """Undo what a *valid* admin call changed (drain, remove, add): a router
                with no backend rightly answers 503, which is not what is measured."""
                assert router is not None
                core = router.core
                for inst in list(core.pool):
                    if inst.name != "i0":
                        core.remove_instance(inst.name)
                if core.pool.get("i0") is None:
                    core.add_instance("i0", backend.url)
                core.set_draining("i0", False)

            async def send(method: str, path: str, headers: dict[str, str], body: Any) -> int:
                assert session is not None and router is not None
                async with session.request(
                    method, router.url + path, data=body, headers=headers
                ) as resp:
                    await resp.read()
                    return resp.status

            @settings(
                max_examples=examples,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(
                route=st.sampled_from(ROUTES),
                ident=st.sampled_from(["i0", "nope", "../x", "%2e%2e", "i0:1", "é"]),
                role=st.sampled_from([None, "admin", "lifecycle", "daemon", "garbage"]),
                auth=_token,
                scheme=st.sampled_from(["Bearer ", "bearer ", "Basic ", "", "Bearer  "]),
                x_api_key=st.one_of(st.none(), _token),
                agent_hdr=st.one_of(st.none(), _header_value),
                body=_body,
            )
            @seed(seed_value)
            def one(
                route: tuple[str, str], ident: str, role: str | None, auth: str, scheme: str,
                x_api_key: str | None, agent_hdr: str | None, body: bytes | None,
            ) -> None:  # fmt: skip
                method, template = route
                path = template.format(id=ident, inst=ident)
                headers: dict[str, str] = {"Content-Type": "application/json"}
                token = real.get(role or "", auth) if role != "garbage" else auth
                if role is not None:
                    headers["Authorization"] = _printable(scheme + token)
                if x_api_key is not None:
                    headers["x-api-key"] = _printable(x_api_key)
                if agent_hdr is not None:
                    headers["X-Kairos-Agent"] = _printable(agent_hdr)
                result.requests += 1
                try:
                    status = runner.run(send(method, path, headers, body))
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    result.client_errors[f"{type(exc).__name__}: {str(exc)[:60]}"] += 1
                    return
                result.statuses[status] += 1
                if status >= 500:
                    result.server_errors.append(f"{status} {method} {path} {body!r:.120}")
                runner.run(restore())

            one()
        result.tracebacks.extend(
            f"structlog {e.get('event')}" for e in logs if e.get("exc_info") or e.get("exception")
        )
    finally:

        async def teardown() -> None:
            if session is not None:
                await session.close()
            if router is not None:
                await router.stop()
            await backend.stop()

        runner.run(teardown())
        runner.close()
        logging.getLogger().removeHandler(counter)
        tmp.cleanup()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.CRITICAL)  # keep the console quiet; records still counted
    out = run_fuzz(args.examples, args.seed).to_json()
    print(json.dumps(out, indent=2))
    return 0 if out["5xx"] == 0 and out["tracebacks"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
