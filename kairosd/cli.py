"""``kairosd`` command line: ``run``, ``gpus``, ``reset`` (typer).

``kairosd run --instance NAME --vllm-url URL [--router-url URL]
[--gpu-backend zeus|sim|observe] [--gpus 0,1] [--config FILE]`` is a stable
contract (docs/design.md §4). Every flag overrides the TOML file and ``KAIROSD_*`` env.
Errors are reported through :func:`kairos_common.cli.run_app`: one line, exit 2
for bad input, 3/4 for GPU permission/availability, 1 for anything else.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
from pathlib import Path
from typing import Annotated, Any

import aiohttp
import typer

from kairos_common.cli import (
    LogJsonOpt,
    LogLevelOpt,
    VersionOpt,
    check_can_listen,
    check_http_url,
    check_log_level,
    check_slo,
    fail,
    make_app,
    parse_gpus,
    run_app,
)
from kairos_common.errors import ConfigError
from kairos_common.logs import configure_logging
from kairosd.errors import EXIT_CONFIG, EXIT_NO_CONTROL, EXIT_NO_GPU, GpuError, GpuPermissionError
from kairosd.gpu.base import GpuBackend, GpuStatus
from kairosd.gpu.opening import BACKENDS, open_backend

# ``run``'s configuration and service (controllers, numpy) are imported inside
# the commands that need them: ``kairosd reset`` runs from ExecStopPost after a
# crash, and must not spend a second importing the control law.

app = make_app(
    "Kairos per-instance GPU power daemon (context-aware DVFS + admission control).",
    no_args_is_help=True,
)

Opt = typer.Option
PROG = "kairosd"


@app.callback()
def _root(version: VersionOpt = False) -> None:
    """Kairos per-instance GPU power daemon (context-aware DVFS + admission control)."""


@app.command()
def run(
    instance: Annotated[
        str | None, Opt(help="Instance name as the router knows it (its backend name).")
    ] = None,
    vllm_url: Annotated[
        str | None, Opt(help="Base URL of this instance's vLLM server, e.g. http://127.0.0.1:8000.")
    ] = None,
    router_url: Annotated[
        list[str] | None,
        Opt(
            help="Kairos router base URL; repeat it for a router pair (the daemon follows "
            "the leader). Omit for standalone mode (U from vLLM, no SLO boost)."
        ),
    ] = None,
    gpu_backend: Annotated[
        str | None,
        Opt(
            help="zeus (real GPUs via NVML/zeusd), sim (fake vLLM's simulated GPU), or "
            "observe (read-only). Default zeus."
        ),
    ] = None,
    gpus: Annotated[
        str | None,
        Opt(
            help="Comma-separated GPU indices of this instance (a TP group), set together. "
            "Zeus indices respect CUDA_VISIBLE_DEVICES. Default 0."
        ),
    ] = None,
    config: Annotated[
        Path | None, Opt(help="TOML config file for this instance (flags override it).")
    ] = None,
    policy: Annotated[
        str | None,
        Opt(
            help="kairos, kairos-alg1, kairos-no-ta, predictive, no-control, "
            "fixed:MHZ. Default kairos."
        ),
    ] = None,
    require_control: Annotated[
        bool | None,
        Opt(
            "--require-control/--allow-observe",
            help="Exit 3 if clocks cannot be changed, instead of falling back to observe mode.",
        ),
    ] = None,
    epoch_s: Annotated[
        float | None, Opt(help="Control epoch length in seconds. Default 5.")
    ] = None,
    stale_epochs: Annotated[
        int | None,
        Opt(help="Epochs an input may be missing before the fail-safe max clock. Default 3."),
    ] = None,
    report: Annotated[
        Path | None, Opt(help="Append the per-epoch power report (JSONL) to this file.")
    ] = None,
    run_label: Annotated[
        str | None, Opt("--run", help="Label written into every report line ('run' field).")
    ] = None,
    listen_host: Annotated[
        str | None, Opt(help="Address for /metrics and /healthz. Default 127.0.0.1.")
    ] = None,
    listen_port: Annotated[
        int | None, Opt(help="Port for /metrics and /healthz (0 = any free port). Default 9470.")
    ] = None,
    floor_mhz: Annotated[
        int | None, Opt(help="Lowest clock level allowed (MHz; from the GPU's list).")
    ] = None,
    ceiling_mhz: Annotated[
        int | None, Opt(help="Highest clock level allowed (MHz; from the GPU's list).")
    ] = None,
    num_levels: Annotated[
        int | None, Opt(help="Thin the GPU's clock list to this many evenly spaced levels.")
    ] = None,
    capacity_tokens: Annotated[
        int | None, Opt(help="Override U_max (KV token capacity) if vLLM does not export it.")
    ] = None,
    slo: Annotated[
        float | None, Opt(help="Per-agent SLO τ in decode tokens/s (kairos.slo_tok_s). Default 20.")
    ] = None,
    log_level: LogLevelOpt = None,
    log_json: LogJsonOpt = None,
) -> None:
    """Run the control loop for one serving instance until SIGTERM/SIGINT.

    The router control token is read from KAIROSD_ROUTER_TOKEN or router_token_file
    (never a flag: flags are visible in ps). Exit codes: 0 stopped, 1 crashed,
    2 bad configuration, 3 control required but not permitted, 4 no usable GPU.
    """
    try:
        check_slo(slo)
        check_log_level(log_level)
        overrides: dict[str, Any] = {
            "instance": instance,
            "vllm_url": vllm_url,
            "router_url": tuple(router_url) if router_url else None,
            "gpu_backend": gpu_backend,
            "gpus": parse_gpus(gpus),
            "policy": policy,
            "require_control": require_control,
            "epoch_s": epoch_s,
            "stale_epochs": stale_epochs,
            "report_path": report,
            "run": run_label,
            "listen_host": listen_host,
            "listen_port": listen_port,
            "floor_mhz": floor_mhz,
            "ceiling_mhz": ceiling_mhz,
            "num_levels": num_levels,
            "capacity_tokens": capacity_tokens,
            "log_level": log_level,
        }
        if slo is not None:
            overrides["kairos"] = {"slo_tok_s": slo}
        from kairosd.config import load_daemon_config

        cfg = load_daemon_config(config, overrides=overrides)
        if not cfg.instance or not cfg.vllm_url:
            raise ConfigError("--instance and --vllm-url are required (flag, config or env)")
        check_can_listen(cfg.listen_host, cfg.listen_port, "--listen-port")
        if cfg.report_path is not None and cfg.report_path.is_dir():
            raise ConfigError(f"--report {cfg.report_path}: a directory; expected a file path")
    except ConfigError as exc:
        fail(PROG, str(exc), EXIT_CONFIG)
    configure_logging(cfg.log_level, log_json)
    raise typer.Exit(asyncio.run(_run(cfg)))


async def _run(cfg: Any) -> int:
    from kairosd.service import serve

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return await serve(cfg, stop)


async def _with_backend(
    kind: str, vllm_url: str, gpus: tuple[int, ...] | None, action: str
) -> tuple[list[GpuStatus], str]:
    async with aiohttp.ClientSession() as session:
        if kind == "sim" and gpus is None:
            probe = await open_backend(
                "sim", vllm_url=vllm_url, gpus=(0,), timeout_s=5.0, session=session
            )
            gpus = await _all_sim_indices(probe)
        backend = await open_backend(
            kind, vllm_url=vllm_url, gpus=gpus, timeout_s=5.0, session=session
        )
        try:
            if action == "reset":
                await backend.reset_clocks()
            return await backend.status(), _access(kind)
        finally:
            await backend.close()


async def _all_sim_indices(probe: GpuBackend) -> tuple[int, ...]:
    from kairosd.gpu.sim_backend import SimBackend

    assert isinstance(probe, SimBackend)
    return await probe.all_indices()


def _access(kind: str) -> str:
    if kind == "sim":
        return "yes (simulated GPU)"
    if kind == "observe":
        return "no (observe mode)"
    from kairosd.gpu.zeus_backend import control_access

    access = control_access()
    return {"zeusd": "yes, via zeusd", "root": "yes, as root"}.get(
        access, "no: run as root, or run zeusd and set ZEUSD_SOCK_PATH"
    )


BackendOpt = Annotated[
    str | None, Opt("--gpu-backend", help=f"One of {', '.join(BACKENDS)}. Default zeus.")
]
VllmOpt = Annotated[
    str | None,
    Opt("--vllm-url", help="Fake vLLM base URL hosting the simulated GPU (sim backend)."),
]
ConfigOpt = Annotated[
    Path | None,
    Opt("--config", help="Take backend, vLLM URL and GPUs from this instance's TOML config."),
]


def _target(
    config: Path | None, backend: str | None, vllm_url: str | None, log_level: str | None
) -> tuple[str, str, tuple[int, ...] | None]:
    """(backend, vllm_url, instance GPUs or None) from flags over an optional config.

    Checked like ``run`` checks them, before any GPU is opened.
    """
    try:
        configure_logging(check_log_level(log_level) or "warning")
        if config is None:
            if backend is not None and backend not in BACKENDS:
                raise ConfigError(
                    f"--gpu-backend {backend!r}: expected one of {', '.join(BACKENDS)}"
                )
            url = check_http_url(vllm_url or "http://127.0.0.1:8000", "--vllm-url")
            return backend or "zeus", url, None
        from kairosd.config import load_daemon_config

        cfg = load_daemon_config(config, overrides={"gpu_backend": backend, "vllm_url": vllm_url})
    except ConfigError as exc:
        fail(PROG, str(exc), EXIT_CONFIG)
    return cfg.gpu_backend, cfg.vllm_url or "http://127.0.0.1:8000", cfg.gpus


@app.command("gpus")
def gpus_cmd(
    gpu_backend: BackendOpt = None,
    vllm_url: VllmOpt = None,
    config: ConfigOpt = None,
    as_json: Annotated[bool, Opt("--json", help="Print JSON instead of a table.")] = False,
    log_level: LogLevelOpt = None,
) -> None:
    """List GPUs: supported clocks, current clock, power, and whether control is permitted."""
    kind, url, indices = _target(config, gpu_backend, vllm_url, log_level)
    try:
        statuses, access = asyncio.run(_with_backend(kind, url, indices, "read"))
    except GpuError as exc:
        fail(PROG, str(exc), EXIT_NO_GPU)
    if as_json:
        rows = [{**dataclasses.asdict(s), "control": access} for s in statuses]
        typer.echo(json.dumps(rows, indent=2))
        return
    typer.echo(f"{'gpu':>3}  {'name':<24} {'clocks (MHz)':<22} {'now':>6} {'power':>8}  control")
    for s in statuses:
        clocks = s.supported_clocks_mhz
        span = f"{clocks[0]}-{clocks[-1]} ({len(clocks)})" if clocks else "?"
        power = f"{s.power_w:.0f} W" if s.power_w is not None else "?"
        now = str(s.current_clock_mhz) if s.current_clock_mhz is not None else "?"
        typer.echo(f"{s.index:>3}  {s.name[:24]:<24} {span:<22} {now:>6} {power:>8}  {access}")


@app.command()
def reset(
    gpus: Annotated[
        str | None,
        Opt("--gpus", help="Comma-separated GPU indices to reset, e.g. 0,1. Default: all."),
    ] = None,
    gpu: Annotated[
        list[int] | None, Opt("--gpu", hidden=True, help="Old spelling of --gpus (repeatable).")
    ] = None,
    gpu_backend: BackendOpt = None,
    vllm_url: VllmOpt = None,
    config: ConfigOpt = None,
    log_level: LogLevelOpt = None,
) -> None:
    """Unlock GPU clocks (for systemd ExecStopPost, or after a crash).

    With --config, resets that instance's GPUs; --gpus overrides; else every GPU.
    """
    kind, url, cfg_gpus = _target(config, gpu_backend, vllm_url, log_level)
    try:
        raw = ",".join([*(str(g) for g in gpu or ()), *([gpus] if gpus else [])])
        flagged = parse_gpus(raw or None, "--gpus")
    except ConfigError as exc:
        fail(PROG, str(exc), EXIT_CONFIG)
    indices = flagged or cfg_gpus
    try:
        statuses, _ = asyncio.run(_with_backend(kind, url, indices, "reset"))
    except GpuPermissionError as exc:
        fail(PROG, str(exc), EXIT_NO_CONTROL)
    except GpuError as exc:
        fail(PROG, str(exc), EXIT_NO_GPU)
    typer.echo(f"reset clocks of GPU(s) {', '.join(str(s.index) for s in statuses)}")


def main(argv: list[str] | None = None) -> None:
    """Entry point ``kairosd``: one error-reporting path (kairos_common.cli.run_app)."""
    run_app(app, PROG, argv)
