"""Recording agent traces (router/trace_recorder.py): what each agent ran, in the trace
format ``kairos sim`` reads, with what was measured; off by default; bounded."""

from __future__ import annotations

import json
from pathlib import Path

import openai

from reporting.agent_trace import TraceSession, TraceTurn
from router.ledger import Agent
from router.testing import FakeBackend
from router.trace_recorder import TraceRecorder, TraceSettings
from simulator.workload_recorded import load_recording, recording_files
from simulator.workload_trace import load_trace
from tests.router.conftest import StartRouter, agent_key, end_agent, start_agent

TEXT = "secret project words " * 50
MAIN_PROMPT = "You are the main coding agent."
SIDE_PROMPT = "Write a 5-word title for this session."


async def _turns(url: str, token: str, backend: FakeBackend) -> None:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=agent_key(token), max_retries=0)
    history = [{"role": "system", "content": MAIN_PROMPT}, {"role": "user", "content": TEXT}]
    backend.behaviour.prompt_tokens = 1000
    backend.behaviour.completion_tokens = 40
    stream = await client.chat.completions.create(
        model="fake-model",
        messages=history,
        stream=True,  # type: ignore[arg-type]
    )
    async for _ in stream:
        pass
    backend.behaviour.prompt_tokens = 1100
    await client.chat.completions.create(model="fake-model", messages=history)  # type: ignore[arg-type]
    side = [{"role": "system", "content": SIDE_PROMPT}, {"role": "user", "content": "title"}]
    backend.behaviour.prompt_tokens = 30
    await client.chat.completions.create(model="fake-model", messages=side)  # type: ignore[arg-type]
    await client.close()


async def test_an_agents_program_is_recorded_without_its_text(
    make_router: StartRouter, backend: FakeBackend, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    router = await make_router([backend.url], trace=TraceSettings(path=trace))
    token = await start_agent(router.url, name="coder-7", slo_tok_s=15.0)
    await _turns(router.url, token, backend)
    await end_agent(router, token)
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    agent_id = token.split(".")[1]
    main, side = lines
    assert (main["session_id"], main["parent"], main["name"]) == (agent_id, None, "coder-7")
    assert main["slo_tok_s"] == 15.0 and main["source"] == "kairos-router"
    first, second = main["turns"]
    assert (first["prompt_tokens"], first["output_tokens"], first["shared_prefix_tokens"]) == (
        1000,
        40,
        0,
    )
    assert "ttft_s" in first  # streamed: its first byte was timed
    assert "ttft_s" not in second  # not streamed
    # The second turn extends the first one's context (prompt and output).
    assert second["shared_prefix_tokens"] == 1040
    assert second["think_s"] >= 0 and second["at_s"] >= first["latency_s"]
    for turn in main["turns"]:
        assert turn["latency_s"] >= turn["queue_s"] >= 0
        assert turn["instance"] == "i0"
    # The title request is another conversation: a sub-session of the agent.
    assert side["session_id"] == f"{agent_id}.c1" and side["parent"] == agent_id
    assert side["turns"][0]["prompt_tokens"] == 30 and side["offset_s"] >= 0
    text = trace.read_text()
    assert "secret" not in text and MAIN_PROMPT not in text  # never a prompt's text
    # What the simulator reads: as a trace sample, and as a recorded day.
    (program,) = load_trace(trace)
    assert [t.prompt_tokens for t in program.turns] == [1000, 1100]
    assert program.children[0].agent_id == f"{agent_id}.c1"
    recording = load_recording([trace])
    assert recording.arrivals_s == (0.0,)


async def test_no_trace_unless_asked(
    make_router: StartRouter, backend: FakeBackend, tmp_path: Path
) -> None:
    router = await make_router([backend.url], state_dir=tmp_path / "state")
    token = await start_agent(router.url)
    await _turns(router.url, token, backend)
    await end_agent(router, token)
    assert not list(tmp_path.rglob("*trace*"))


async def test_a_live_agent_is_written_when_the_router_stops(
    make_router: StartRouter, backend: FakeBackend, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    router = await make_router([backend.url], trace=TraceSettings(path=trace))
    token = await start_agent(router.url)
    await _turns(router.url, token, backend)
    await router.stop()
    main = json.loads(trace.read_text().splitlines()[0])
    assert main["ended"] is False and len(main["turns"]) == 2


def test_the_file_rotates_and_a_rotated_recording_reads_whole(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    now = [100.0]
    rec = TraceRecorder(
        TraceSettings(path=trace, max_bytes=4096, backups=50),
        clock=lambda: now[0],
        wall_clock=lambda: 1e9 + now[0],
    )
    for i in range(60):
        agent = Agent(agent_id=f"a{i:02d}", arrival_s=now[0], start_unix_s=1e9)
        for k in range(3):
            now[0] += 1.0
            rec.request(
                agent, 0, t0_s=now[0] - 0.5, t_sent_s=now[0] - 0.5, first_data_s=None,
                t_end_s=now[0], prompt_tokens=100 * (k + 1), completion_tokens=10,
                cached_tokens=None, instance="i0",
            )  # fmt: skip
        rec.agent_left(agent.agent_id)
    rec.close()
    files = recording_files(trace)
    assert len(files) > 2 and all(f.stat().st_size <= 4096 for f in files)
    recording = load_recording(files)
    assert [p.agent_id for p in recording.programs] == [f"a{i:02d}" for i in range(60)]
    assert recording.arrivals_s[1] - recording.arrivals_s[0] == 3.0


def test_a_call_that_does_not_extend_its_context_shares_what_vllm_cached(tmp_path: Path) -> None:
    rec = TraceRecorder(TraceSettings(path=tmp_path / "t.jsonl"), clock=lambda: 0.0,
                        wall_clock=lambda: 0.0)  # fmt: skip
    agent = Agent(agent_id="a", arrival_s=0.0, start_unix_s=0.0)
    calls = [(5000, None), (2000, None), (2500, 1024)]  # a compaction, then vLLM's hit
    for t, (prompt, cached) in enumerate(calls):
        rec.request(agent, 0, t0_s=float(t), t_sent_s=float(t), first_data_s=None,
                    t_end_s=t + 0.5, prompt_tokens=prompt, completion_tokens=10,
                    cached_tokens=cached, instance="i0")  # fmt: skip
    rec.agent_left("a")
    rec.close()
    turns = json.loads((tmp_path / "t.jsonl").read_text())["turns"]
    assert [t["shared_prefix_tokens"] for t in turns] == [0, 0, 2010]
    assert [t.get("cached_tokens") for t in turns] == [None, None, 1024]
    assert turns[1]["think_s"] == 0.5


def test_trace_lines_round_trip_their_fields() -> None:
    turn = TraceTurn(1.0, 100, 50, 10, 0.5, 0.2, 0.01, ttft_s=0.05, cached_tokens=48)
    line = TraceSession("s", None, 0.0, 12.5, (turn,), name="n", slo_tok_s=20.0).to_json_line()
    obj = json.loads(line)
    assert obj["turns"][0] == {
        "at_s": 1.0, "prompt_tokens": 100, "shared_prefix_tokens": 50, "output_tokens": 10,
        "think_s": 0.5, "latency_s": 0.2, "queue_s": 0.01, "ttft_s": 0.05, "cached_tokens": 48,
    }  # fmt: skip
    assert obj["start_unix_s"] == 12.5 and obj["name"] == "n"
