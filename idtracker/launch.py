"""One id-tracker run: register → build the child env → spawn → supervise → report end.

The order matters: signals are blocked by the caller before anything else (so
none is lost or kills id-tracker half-way), keys are validated before
registering (a bad inherited key must not leave a registered agent behind), and
once the agent is registered every path — spawn failure, signal before spawn,
normal end — reports its end.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass

import structlog

from idtracker import env as child_env_mod
from idtracker.errors import RegistrationError, SpawnError
from idtracker.lifecycle_client import Clock, LifecycleClient
from idtracker.summary import missing_line, summary_line
from idtracker.supervisor import (
    STOP_SIGNALS,
    ChildOutcome,
    SignalGate,
    spawn,
    supervise,
)
from kairos_common.wire import AgentEnd, AgentStart, AgentStarted

log = structlog.get_logger()


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """What the CLI resolved from flags, environment and config."""

    cmd: list[str]
    router_urls: tuple[str, ...]
    """The router URLs in the operator's order; the agent gets the first."""
    name: str | None = None
    slo_tok_s: float | None = None
    fail_open: bool = False
    control_token: str | None = None
    start_timeout_s: float = 5.0
    end_timeout_s: float = 15.0
    request_timeout_s: float = 2.0
    kill_grace_s: float = 10.0
    summary: bool = False
    """Print what the run cost (the router's record of it) on stderr at the end."""
    summary_wait_s: float = 15.0
    """How long the end call may wait for that record's last joules."""

    @property
    def agent_url(self) -> str:
        """The one base URL the agent gets: an SDK takes a single base URL, so the
        agent cannot follow a leader itself; the front balancer (listed first) is
        what makes its requests follow one (docs/idtracker.md, "Several routers")."""
        return self.router_urls[0]


def launch(
    req: LaunchRequest,
    gate: SignalGate,
    *,
    parent_env: Mapping[str, str] | None = None,
    clock: Clock | None = None,
) -> int:
    """Run ``req.cmd`` under a new agent identity; returns the exit status to use.

    ``gate`` must already be blocking — before any thread exists (see cli.py).
    """
    parent = dict(os.environ if parent_env is None else parent_env)
    now = clock or time.monotonic
    keys = child_env_mod.real_keys(parent)
    start = _start_message(req, parent)
    client = LifecycleClient(
        req.router_urls,
        control_token=req.control_token,
        request_timeout_s=req.request_timeout_s,
        clock=now,
        wait=gate.wait_unless_stopped,
        headers=child_env_mod.start_headers(start.parent_id),
    )
    try:
        started = client.register(start, deadline_s=req.start_timeout_s)
    except RegistrationError as exc:
        if not req.fail_open:
            raise
        log.warning(
            "--fail-open: running the agent UNTAGGED (no Kairos identity)",
            error=str(exc),
            exit_code_without_fail_open=exc.exit_code,
        )
        # Untagged, but never with a control credential (the router may be failing
        # over, so this path runs in production).
        untagged = child_env_mod.without_credentials(parent, [req.control_token])
        return _run(req, untagged, gate, now).exit_code
    agent_id = started.agent_id
    log.info("agent registered", agent_id=agent_id, parent_id=start.parent_id, name=start.name)
    env = child_env_mod.child_env(
        parent,
        router_url=req.agent_url,
        agent_id=agent_id,
        token=started.token,
        keys=keys,
        router_urls=req.router_urls,
        credentials=[req.control_token],
    )
    early = gate.wait(0.0, STOP_SIGNALS)  # asked to stop during registration: never start
    if early is not None:
        outcome = ChildOutcome(128 + early.si_signo, None, "cancelled")
    else:
        try:
            outcome = _run(req, env, gate, now)
        except SpawnError as exc:
            spawn_failed = ChildOutcome(exc.exit_code, None, "spawn_failed")
            _report_end(client, started, spawn_failed, req)
            raise
    _report_end(client, started, outcome, req)
    return outcome.exit_code


def _start_message(req: LaunchRequest, parent: Mapping[str, str]) -> AgentStart:
    """The agent-start body; ``pid`` is id-tracker's, the root of the agent's process tree."""
    return AgentStart(
        name=req.name or child_env_mod.default_agent_name(req.cmd),
        parent_id=child_env_mod.parent_agent_id(parent),
        slo_tok_s=req.slo_tok_s,
        pid=os.getpid(),
    )


def _run(req: LaunchRequest, env: dict[str, str], gate: SignalGate, clock: Clock) -> ChildOutcome:
    proc = spawn(req.cmd, env, gate)
    outcome = supervise(proc, gate, kill_grace_s=req.kill_grace_s, clock=clock)
    log.info("agent exited", exit_code=outcome.exit_code, reason=outcome.reason)
    return outcome


def _report_end(
    client: LifecycleClient,
    started: AgentStarted,
    outcome: ChildOutcome,
    req: LaunchRequest,
) -> None:
    """Report the end with the agent's end key (kept in this process, never in the
    child's); with ``req.summary``, print what the run cost."""
    agent_id = started.agent_id
    wait_s = req.summary_wait_s if req.summary else 0.0
    end = AgentEnd(
        exit_code=outcome.exit_code,
        signal=outcome.signal,
        reason=outcome.reason,
        end_key=started.end_key,
        summary_wait_s=wait_s,
    )
    receipt = client.report_end(agent_id, end, deadline_s=req.end_timeout_s + wait_s)
    if receipt is None:
        log.warning(
            "could not report agent end; the router's idle expiry will retire the agent",
            agent_id=agent_id,
            exit_code=outcome.exit_code,
        )
    if req.summary:
        summary = receipt.summary if receipt is not None else None
        line = summary_line(summary) if summary else missing_line(receipt is not None)
        print(line, file=sys.stderr, flush=True)
