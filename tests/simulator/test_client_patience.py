"""Held sessions whose clients stop retrying end unfinished, as they do in production."""

from __future__ import annotations

import openai

from reporting.metrics import summarize
from reporting.records import GAVE_UP
from router.config import AdmissionSettings
from simulator.cluster import DEFAULT_CLIENT_PATIENCE_S, Cluster, ClusterConfig
from tests.simulator.conftest import ListWorkload, list_agent, small_preset


def _held_scenario(patience_s: float | None) -> Cluster:
    # Three 6000-token sessions fill a 20K-token cache; three more wait about 28 s.
    programs = [list_agent(i, turns=6, think_s=5.0, prompt=6000) for i in range(6)]
    config = ClusterConfig(policy="kairos", duration_s=900.0, client_patience_s=patience_s)
    cluster = Cluster(
        small_preset(kv_tokens=20_000), config, ListWorkload(programs), [0.5 * i for i in range(6)]
    )
    cluster.run()
    return cluster


def test_a_session_held_past_its_clients_patience_gives_up_and_is_no_session_done() -> None:
    patient = _held_scenario(None)
    assert {a.end_reason for a in patient.agents_done} == {"end"}
    waited = {a.agent_id: a.pending_s for a in patient.agents_done if a.pending_s > 0}
    assert len(waited) == 3 and min(waited.values()) > 20.0

    cluster = _held_scenario(10.0)
    gave_up = [a for a in cluster.agents_done if a.end_reason == GAVE_UP]
    assert {a.agent_id for a in gave_up} == set(waited)
    epoch_s = cluster.epoch_s
    for rec in gave_up:  # checked once an epoch: gone within one epoch past the patience
        assert 10.0 <= rec.pending_s < 10.0 + epoch_s
        assert (rec.turns, rec.decode_tokens, rec.throughput_tok_s) == (0, 0, None)
        assert rec.end_s - rec.start_s == rec.pending_s
    assert not any(inst.pending for inst in cluster.instances)

    s = summarize("kairos", cluster.epochs, cluster.agents_done, slo_tok_s=1.0)
    assert s.completed_agents == 3 and s.gave_up_agents == 3
    assert s.slo_attainment == 0.5  # the three that gave up are SLO misses
    mean = sum(a.pending_s for a in cluster.agents_done) / 6
    assert s.mean_pending_s == mean > 0.0


def test_patience_longer_than_the_wait_changes_nothing() -> None:
    patient, long = _held_scenario(None), _held_scenario(60.0)
    assert [(a.agent_id, a.end_s) for a in long.agents_done] == [
        (a.agent_id, a.end_s) for a in patient.agents_done
    ]


def test_the_default_patience_is_the_routers_hold_times_the_openai_sdks_attempts() -> None:
    # The router answers a held request 503 after admission.max_wait_s and keeps the
    # agent's place across retries; the OpenAI SDK retries DEFAULT_MAX_RETRIES times.
    attempts = 1 + openai.DEFAULT_MAX_RETRIES
    assert attempts * AdmissionSettings().max_wait_s == DEFAULT_CLIENT_PATIENCE_S
    assert ClusterConfig().client_patience_s == DEFAULT_CLIENT_PATIENCE_S
