"""Many replay agents in one process, each under its own Kairos agent identity.

Why: launching an agent as ``id-tracker -- python -m simulator.replay_agent``
costs about 2 s of CPU (the ``openai`` import alone 1.6 s). Inside a
time-accelerated window on a 2-core machine, a few dozen such launches starve
every other process and agents never reach their first turn, so the demo
measured the machine, not Kairos. This host pays the import once, *before* the
window, then starts each agent at its arrival time as an asyncio task.

Each agent gets its identity exactly as ``id-tracker`` gets one, with
id-tracker's own code: the lifecycle credential from
:func:`idtracker.config.resolve_control_token`,
:class:`~idtracker.lifecycle_client.LifecycleClient`
registers it (``POST /kairos/v1/agents``) just before its arrival, its client is
configured from :func:`idtracker.env.child_env` (router base URL, key carrying
the identity), a sub-agent registers with its parent's id (read back with
:func:`idtracker.env.parent_agent_id`), and its end is reported with
``report_end`` (exit status, or 143/``terminated`` when the host is stopped).
The only difference from a real launch is the process: every agent reports the
host's pid.

Protocol (with :mod:`simulator.agent_driver`): the host loads its plan, prints
``ready`` on stdout, and waits for ``go <t0_unix_s>`` on stdin; agent ``k``
arrives at ``t0 + at_real_s``. One JSON line per agent goes to ``--report``:
``{"agent", "agent_id", "late_s", "exit_code"}`` (``late_s``: how late its first
request left, real seconds; null when it never got that far).

Usage: ``python -m simulator.agent_host --router-url URL --plan FILE --report FILE``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import aiohttp

from idtracker import config as config_mod
from idtracker import env as child_env_mod
from idtracker.errors import IdTrackerError
from idtracker.lifecycle_client import LifecycleClient
from kairos_common.wire import AgentEnd, AgentStart, AgentStarted
from simulator.replay_agent import (
    TurnFailedError,
    TurnSender,
    play,
    program_from_json,
    program_to_json,
    ready_then_go,
    request_body,
)
from simulator.workload import AgentProgram

EXIT_TERMINATED = 128 + int(signal.SIGTERM)
MAX_ATTEMPTS = 9  # the SDK's first try + the replay agent's max_retries=8


@dataclass(frozen=True, slots=True)
class PlannedAgent:
    """One top-level agent: its program and its arrival, real seconds after t0."""

    at_real_s: float
    program: AgentProgram


def plan_to_json(plan: list[PlannedAgent]) -> list[dict[str, Any]]:
    return [{"at_real_s": a.at_real_s, "program": program_to_json(a.program)} for a in plan]


def plan_from_json(obj: list[dict[str, Any]]) -> list[PlannedAgent]:
    return [PlannedAgent(float(a["at_real_s"]), program_from_json(a["program"])) for a in obj]


@dataclass(frozen=True, slots=True)
class HostConfig:
    router_url: str
    speedup: float
    api_key: str = "sk-kairos-demo"
    stream: bool = True
    start_timeout_s: float = 5.0
    end_timeout_s: float = 15.0
    request_timeout_s: float = 2.0
    register_lead_s: float = 1.0
    """Register this long before the arrival, then wait for it — as a pre-started
    ``id-tracker`` launch does — so the registration round trip to a busy router
    does not make the first request late."""


class AgentHost:
    """Runs hosted agents; one JSON line per finished agent goes to ``report``."""

    def __init__(self, cfg: HostConfig, report: IO[str], http: aiohttp.ClientSession) -> None:
        self.cfg = cfg
        self._report = report
        self._http = http
        self._model: str | None = None
        self._model_lock = asyncio.Lock()
        # What a user's shell would hand id-tracker: just the real key.
        self._base_env: dict[str, str] = {"OPENAI_API_KEY": cfg.api_key}
        # The lifecycle credential, found as id-tracker finds it (flag, env,
        # config file, else the one a local router published).
        id_cfg = config_mod.load(path=None, overrides={"router_url": cfg.router_url})
        self._control_token = config_mod.resolve_control_token(id_cfg)

    def _lifecycle(self) -> LifecycleClient:
        return LifecycleClient(
            self.cfg.router_url,
            control_token=self._control_token,
            request_timeout_s=self.cfg.request_timeout_s,
        )

    async def _model_name(self, base_url: str, key: str) -> str:
        async with self._model_lock:
            if self._model is None:
                async with self._http.get(
                    f"{base_url}/models", headers={"Authorization": f"Bearer {key}"}
                ) as resp:
                    resp.raise_for_status()
                    self._model = str((await resp.json())["data"][0]["id"])
            return self._model

    async def run_agent(
        self, program: AgentProgram, due_unix_s: float, parent_env: Mapping[str, str]
    ) -> int:
        """Register, play, report the end — what one id-tracker launch does."""
        late: list[float] = []
        agent_id: str | None = None
        code = EXIT_TERMINATED
        lifecycle = self._lifecycle()
        try:
            start = AgentStart(
                name=program.agent_id,
                parent_id=child_env_mod.parent_agent_id(parent_env),
                slo_tok_s=None,
                pid=os.getpid(),
            )
            try:
                started = await asyncio.to_thread(
                    lifecycle.register, start, deadline_s=self.cfg.start_timeout_s
                )
            except IdTrackerError as exc:
                code = exc.exit_code
                print(f"agent {program.agent_id}: {exc}", file=sys.stderr)
                return code
            agent_id = started.agent_id
            env = child_env_mod.child_env(
                parent_env,
                router_url=self.cfg.router_url,
                agent_id=agent_id,
                token=started.token,
                keys=child_env_mod.real_keys(parent_env),
            )
            code = await self._play(program, env, due_unix_s, late)
            return code
        finally:
            self._write(program.agent_id, agent_id, late, code)
            if agent_id is not None:
                await self._end(lifecycle, started, code)

    async def _play(
        self,
        program: AgentProgram,
        env: dict[str, str],
        due_unix_s: float,
        late: list[float],
    ) -> int:
        base_url, key = env["OPENAI_BASE_URL"], env["OPENAI_API_KEY"]
        try:
            model = await self._model_name(base_url, key)
        except (aiohttp.ClientError, TimeoutError, KeyError, IndexError, ValueError) as exc:
            print(f"agent {program.agent_id}: no model list: {exc}", file=sys.stderr)
            return 1
        await asyncio.sleep(max(0.0, due_unix_s - time.time()))

        async def child(sub: AgentProgram, delay_s: float) -> int:
            await asyncio.sleep(delay_s)
            return await self.run_agent(sub, time.time(), env)

        return await play(
            program,
            speedup=self.cfg.speedup,
            send_turn=self._sender(base_url, key, program, model),
            run_child=child,
            on_first_turn=lambda: late.append(time.time() - due_unix_s),
        )

    def _sender(self, base_url: str, key: str, program: AgentProgram, model: str) -> TurnSender:
        """Turns over the host's shared aiohttp session: the same request body as
        the SDK's, at a fraction of its CPU (retries like the SDK's: connection
        errors, 429 and 5xx, with backoff)."""
        headers = {"Authorization": f"Bearer {key}"}
        url = f"{base_url}/chat/completions"

        async def send(i: int) -> None:
            body = request_body(program, i, model, self.cfg.stream)
            for attempt in range(MAX_ATTEMPTS):
                try:
                    async with self._http.post(url, json=body, headers=headers) as resp:
                        if resp.status == 200:
                            data = await resp.read()  # streamed or not: until the last byte
                            if b'data: {"error"' in data:  # failed mid-stream (as the SDK sees)
                                raise TurnFailedError(data[-300:].decode("utf-8", "replace"))
                            return
                        error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                        if resp.status != 429 and resp.status < 500:
                            raise TurnFailedError(error)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    error = f"{type(exc).__name__}: {exc}"
                if attempt + 1 < MAX_ATTEMPTS:
                    await asyncio.sleep(min(8.0, 0.5 * 2**attempt))
            raise TurnFailedError(f"{error} (after {MAX_ATTEMPTS} attempts)")

        return send

    async def _end(self, lifecycle: LifecycleClient, started: AgentStarted, code: int) -> None:
        terminated = code == EXIT_TERMINATED
        agent_id = started.agent_id
        end = AgentEnd(
            exit_code=code,
            signal=int(signal.SIGTERM) if terminated else None,
            reason="terminated" if terminated else ("exit" if code == 0 else "error"),
            end_key=started.end_key,
        )
        # Shielded: a stop must not lose the end report of the agent it stopped.
        await asyncio.shield(
            asyncio.to_thread(
                lifecycle.report_end, agent_id, end, deadline_s=self.cfg.end_timeout_s
            )
        )

    def _write(self, name: str, agent_id: str | None, late: list[float], code: int) -> None:
        row = {
            "agent": name,
            "agent_id": agent_id,
            "late_s": round(late[0], 4) if late else None,
            "exit_code": code,
        }
        self._report.write(json.dumps(row) + "\n")
        self._report.flush()

    async def run_plan(self, plan: list[PlannedAgent], t0_unix_s: float) -> list[int]:
        """Start every planned agent at its arrival; wait for all of them."""

        async def one(agent: PlannedAgent) -> int:
            due = t0_unix_s + agent.at_real_s
            await asyncio.sleep(max(0.0, due - self.cfg.register_lead_s - time.time()))
            return await self.run_agent(agent.program, due, self._base_env)

        # return_exceptions: a stop cancels every agent, and the first cancelled one
        # must not end the wait while the others still report their end.
        codes = await asyncio.gather(*(one(a) for a in plan), return_exceptions=True)
        return [c if isinstance(c, int) else EXIT_TERMINATED for c in codes]


def http_session() -> aiohttp.ClientSession:
    """One connection pool for every hosted agent (no per-host connection cap)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=600.0)
    )


async def _amain(args: argparse.Namespace) -> int:
    plan = plan_from_json(json.loads(args.plan.read_text()))
    cfg = HostConfig(router_url=args.router_url, speedup=args.speedup, stream=not args.no_stream)
    loop = asyncio.get_running_loop()
    # Registrations and end reports are blocking calls in threads: at a stop every
    # running agent reports its end at once.
    loop.set_default_executor(ThreadPoolExecutor(max_workers=32))
    t0 = await ready_then_go()
    if t0 is None:
        return 2
    with args.report.open("a") as report:
        async with http_session() as http:
            host = AgentHost(cfg, report, http)
            task = asyncio.ensure_future(host.run_plan(plan, t0))
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
            with contextlib.suppress(asyncio.CancelledError):
                await task
            loop.remove_signal_handler(signal.SIGTERM)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--router-url", required=True)
    parser.add_argument("--plan", type=Path, required=True, help="JSON list of planned agents.")
    parser.add_argument("--report", type=Path, required=True, help="JSONL: one line per agent.")
    parser.add_argument("--speedup", type=float, default=1.0)
    parser.add_argument("--no-stream", action="store_true")
    return asyncio.run(_amain(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
