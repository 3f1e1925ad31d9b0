"""The fake vLLM server speaks vLLM's HTTP surface, driven by the engine model."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kairos_common.simgpu import SimGpuState
from kairos_common.vllm_metrics import parse_vllm_metrics
from simulator.fakevllm import DEFAULT_MODEL, FakeVllm, FakeVllmConfig, make_app

KEY = "sk-real"


class Clients:
    """OpenAI clients made during a test, closed before its event loop ends."""

    def __init__(self) -> None:
        self.made: list[openai.AsyncOpenAI] = []

    def __call__(self, url: str, key: str = KEY) -> openai.AsyncOpenAI:
        c = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
        self.made.append(c)
        return c


@pytest.fixture
async def client() -> AsyncIterator[Clients]:
    clients = Clients()
    yield clients
    for c in clients.made:
        await c.close()


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, FakeVllm]]:
    fake = FakeVllm(FakeVllmConfig(speedup=200.0, api_key=KEY, enable_prompt_tokens_details=True))
    runner = web.AppRunner(make_app(fake))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}", fake
    await runner.cleanup()


MSGS = [{"role": "system", "content": "s" * 400}, {"role": "user", "content": "u" * 4000}]


async def test_chat_non_stream_usage_and_prefix_reuse(
    server: tuple[str, FakeVllm], client: Clients
) -> None:
    url, _ = server
    c = client(url)
    r1 = await c.chat.completions.create(model=DEFAULT_MODEL, messages=MSGS, max_tokens=20)
    assert r1.usage is not None
    assert r1.usage.completion_tokens == 20 and r1.choices[0].finish_reason == "length"
    assert r1.usage.prompt_tokens == 100 + 4 + 1000 + 4 + 2
    reply = r1.choices[0].message.content or ""
    msgs2 = [*MSGS, {"role": "assistant", "content": reply}, {"role": "user", "content": "v" * 40}]
    r2 = await c.chat.completions.create(model=DEFAULT_MODEL, messages=msgs2, max_tokens=5)
    assert r2.usage is not None and r2.usage.prompt_tokens_details is not None
    cached = r2.usage.prompt_tokens_details.cached_tokens or 0
    assert 1000 <= cached <= r1.usage.total_tokens


async def test_stream_with_and_without_usage(server: tuple[str, FakeVllm], client: Clients) -> None:
    url, _ = server
    c = client(url)
    chunks = [
        ch
        async for ch in await c.chat.completions.create(
            model=DEFAULT_MODEL,
            messages=MSGS,
            max_tokens=64,
            stream=True,
            stream_options={"include_usage": True},
        )
    ]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == "tok " * 64
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 64
    plain = [
        ch
        async for ch in await c.completions.create(
            model=DEFAULT_MODEL, prompt="p" * 40, max_tokens=8, stream=True
        )
    ]
    assert all(ch.usage is None for ch in plain)
    assert "".join(ch.choices[0].text for ch in plain if ch.choices) == "tok " * 8


async def test_hints_set_sizes(server: tuple[str, FakeVllm], client: Clients) -> None:
    url, _ = server
    r = await client(url).chat.completions.create(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": "x"}],
        max_tokens=50,
        extra_body={"vllm_xargs": {"kairos_prompt_tokens": 5000, "kairos_output_tokens": 7}},
    )
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (5000, 7)
    assert r.choices[0].finish_reason == "stop"


async def test_a_reply_past_the_model_length_is_cut_there(
    server: tuple[str, FakeVllm], client: Clients
) -> None:
    # As vLLM (tests/realvllm/test_drop_and_errors.py): max_tokens is clamped to the
    # room the prompt leaves, and the reply ends with "length" instead of a 400.
    url, fake = server
    limit = fake.preset.engine.max_model_len
    r = await client(url).chat.completions.create(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": "x"}],
        max_tokens=50,
        extra_body={"vllm_xargs": {"kairos_prompt_tokens": limit - 10}},
    )
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (limit - 10, 10)
    assert r.choices[0].finish_reason == "length"


async def test_errors_look_like_vllm(server: tuple[str, FakeVllm], client: Clients) -> None:
    url, _ = server
    with pytest.raises(openai.AuthenticationError):
        await client(url, "wrong").models.list()
    with pytest.raises(openai.NotFoundError):
        await client(url).chat.completions.create(model="nope", messages=MSGS)
    with pytest.raises(openai.BadRequestError, match="Stream options"):
        await client(url).chat.completions.create(
            model=DEFAULT_MODEL, messages=MSGS, stream_options={"include_usage": True}
        )
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        await client(url).chat.completions.create(
            model=DEFAULT_MODEL,
            messages=[{"role": "user", "content": "x"}],
            extra_body={"vllm_xargs": {"kairos_prompt_tokens": 10**7}},
        )
    async with aiohttp.ClientSession() as s:
        async with s.post(
            f"{url}/v1/chat/completions",
            data=b"{not json",
            headers={"Authorization": f"Bearer {KEY}"},
        ) as r:
            assert r.status == 400 and "error" in await r.json()
        async with s.get(f"{url}/health") as r:
            assert r.status == 200


async def test_metrics_parse_with_vllm_names(server: tuple[str, FakeVllm], client: Clients) -> None:
    url, fake = server
    await client(url).completions.create(model=DEFAULT_MODEL, prompt="p" * 400, max_tokens=4)
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        text = await r.text()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:cache_config_info",
        "vllm:prompt_tokens",
        "vllm:num_preemptions",
        "vllm:e2e_request_latency_seconds",
    } <= names
    parsed = parse_vllm_metrics(text)
    assert parsed.metrics_enabled
    assert parsed.capacity_tokens == fake.engine.capacity_tokens
    assert parsed.prompt_tokens_total == 100  # ceil(400 / 4)


async def test_sim_gpu_lock_reset_and_energy(server: tuple[str, FakeVllm], client: Clients) -> None:
    url, _ = server
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{url}/kairos-sim/gpus") as r:
            before = SimGpuState.from_json((await r.json())["gpus"][0])
        assert before.locked_max_mhz is None
        assert before.current_clock_mhz == before.supported_clocks_mhz[-1]
        body = {"gpus": [0], "min_mhz": 900, "max_mhz": 900}
        async with s.post(f"{url}/kairos-sim/gpus/locked-clocks", json=body) as r:
            assert r.status == 200
        bad = {"gpus": [0], "min_mhz": 5, "max_mhz": 5}
        async with s.post(f"{url}/kairos-sim/gpus/locked-clocks", json=bad) as r:
            assert r.status == 400
        await client(url).completions.create(model=DEFAULT_MODEL, prompt="p", max_tokens=4)
        async with s.get(f"{url}/kairos-sim/gpus") as r:
            locked = SimGpuState.from_json((await r.json())["gpus"][0])
        assert locked.locked_max_mhz == 900 and locked.current_clock_mhz == 900
        assert locked.energy_mj > before.energy_mj
        async with s.post(f"{url}/kairos-sim/gpus/reset", json={"gpus": [0]}) as r:
            assert r.status == 200
        async with s.get(f"{url}/kairos-sim/gpus") as r:
            reset = SimGpuState.from_json((await r.json())["gpus"][0])
        assert reset.locked_max_mhz is None


async def test_client_disconnect_aborts_request(
    server: tuple[str, FakeVllm], client: Clients
) -> None:
    url, fake = server
    c = client(url)
    stream = await c.chat.completions.create(
        model=DEFAULT_MODEL, messages=MSGS, max_tokens=100_000, stream=True
    )
    async for _ in stream:
        break
    await stream.close()
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        parsed = parse_vllm_metrics(await r.text())
    # The stream was abandoned after its first chunk; once the server notices,
    # the engine drops it (no request keeps running for 100k tokens).
    for _ in range(200):
        if not fake.engine.running and not fake.engine.waiting:
            break
        async with aiohttp.ClientSession() as s, s.get(f"{url}/health"):
            pass
    assert not fake.engine.running and parsed.metrics_enabled


def test_kv_offloading_size_gives_the_fake_a_cpu_tier() -> None:
    """``--kv-offloading-size 64`` as on vLLM: the engine keeps evicted contexts in a
    64 GiB host tier; a bad size is refused naming the flag."""
    from simulator.errors import PresetError

    fake = FakeVllm(FakeVllmConfig(kv_offloading_size_gib=64.0))
    tier = fake.rt.engine.kv.tier
    assert tier is not None
    assert tier.capacity_blocks * tier.block_size == pytest.approx(64 * 2**30 / 98_304, abs=16)
    assert FakeVllm(FakeVllmConfig()).rt.engine.kv.tier is None
    # ... and says so in /metrics as vLLM does (cache_config_info's kv_offloading_size).
    text = generate_latest(fake.registry).decode()
    assert parse_vllm_metrics(text).kv_offloading_gib == 64.0
    plain = generate_latest(FakeVllm(FakeVllmConfig()).registry).decode()
    assert parse_vllm_metrics(plain).kv_offloading_gib == 0.0
    with pytest.raises(PresetError, match="--kv-offloading-size"):
        FakeVllm(FakeVllmConfig(kv_offloading_size_gib=-1.0))
