"""``U_i`` is a running sum in the ledger (read twice per request); whatever sequence
of joins, moves, holds, completions, estimates and removals, it must equal the sum
the paper defines, Σ C_a over the instance's ongoing agents, recomputed from scratch."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from router.ledger import Agent, Ledger

INSTANCES = ("i0", "i1", "i2")
AGENTS = tuple(f"a{i}" for i in range(6))

_op = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(AGENTS), st.sampled_from((*INSTANCES, None))),
    st.tuples(st.just("ongoing"), st.sampled_from(AGENTS), st.sampled_from(INSTANCES)),
    st.tuples(st.just("pending"), st.sampled_from(AGENTS), st.sampled_from(INSTANCES)),
    st.tuples(st.just("place"), st.sampled_from(AGENTS), st.sampled_from(INSTANCES)),
    st.tuples(st.just("done"), st.sampled_from(AGENTS), st.integers(0, 50_000)),
    st.tuples(st.just("estimate"), st.sampled_from(AGENTS), st.integers(0, 50_000)),
    st.tuples(st.just("remove"), st.sampled_from(AGENTS), st.none()),
    st.tuples(st.just("forget"), st.sampled_from(INSTANCES), st.none()),
)


def _recomputed(ledger: Ledger, instance: str) -> int:
    return sum(
        ledger.context_of(ledger.agents[a])
        for a in ledger.ongoing_ids(instance)
        if a in ledger.agents
    )


def _apply(ledger: Ledger, op: tuple[str, str, object]) -> None:
    kind, name, arg = op
    agent = ledger.get(name)
    if kind == "add":
        instance = arg if isinstance(arg, str) else None
        ledger.add(
            Agent(
                agent_id=name,
                arrival_s=0.0,
                start_unix_s=0.0,
                instance=instance,
                admitted=instance is not None,
            )
        )
    elif kind == "forget":
        ledger.forget_instance(name)
    elif agent is None:
        return
    elif kind == "ongoing":
        ledger.set_ongoing(agent, str(arg))
    elif kind == "pending":
        ledger.set_pending(agent, str(arg), 1.0)
    elif kind == "place":
        ledger.place(agent, str(arg))
    elif kind == "done":
        assert isinstance(arg, int)
        ledger.record_completion(
            agent, prompt_tokens=arg, completion_tokens=7, latency_s=0.1, estimated=False
        )
    elif kind == "estimate":
        assert isinstance(arg, int)
        ledger.set_estimate(agent, arg)
    elif kind == "remove":
        ledger.remove(name)


@settings(max_examples=300, deadline=None)
@given(st.lists(_op, max_size=40))
def test_running_usage_equals_the_sum_over_ongoing_agents(
    ops: list[tuple[str, str, object]],
) -> None:
    ledger = Ledger(3000, clock=lambda: 0.0)
    for op in ops:
        _apply(ledger, op)
        for instance in INSTANCES:
            assert ledger.usage_tokens(instance) == _recomputed(ledger, instance), op


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(("add", "remove")),
            st.sampled_from(AGENTS),
            st.sampled_from((None, *AGENTS[:2])),
        ),
        max_size=40,
    )
)
def test_the_sub_agent_index_matches_the_live_agents(
    ops: list[tuple[str, str, str | None]],
) -> None:
    """``has_children`` (a parent's record waits for its sub-agents') after any adds,
    re-adds (a restore) with another parent, and removals."""
    ledger = Ledger(3000, lambda: 0.0)
    for kind, name, parent in ops:
        if kind == "add":
            ledger.add(Agent(agent_id=name, arrival_s=0.0, start_unix_s=0.0, parent_id=parent))
        else:
            ledger.remove(name)
    for candidate in AGENTS:
        expected = any(a.parent_id == candidate for a in ledger)
        assert ledger.has_children(candidate) == expected
