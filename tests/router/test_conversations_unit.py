"""Several conversations under one identity (router/conversations.py): their roots,
and the ``C_a`` they add up to."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from router.conversations import (
    CLAUDE_CODE_AGENT,
    CLAUDE_CODE_SESSION,
    DEFAULT_KEY,
    MAX_CONVERSATIONS,
    Conversations,
    claude_code_thread,
    conversation_key,
)

PARENT, SUB1, SUB2, MAIN, TITLE, NEW, RUNNING, LATEST = range(2, 10)
SYSTEM = {"role": "system", "content": "You are the main agent."}
TASK = {"role": "user", "content": "Fix the failing test."}


def test_turns_of_one_chat_conversation_share_its_root() -> None:
    first = {"messages": [SYSTEM, TASK]}
    later = {
        "messages": [
            SYSTEM,
            TASK,
            {"role": "assistant", "content": "Reading the test."},
            {"role": "user", "content": "tool result: 3 failed"},
        ]
    }
    assert conversation_key("chat", first) == conversation_key("chat", later) != DEFAULT_KEY


def test_another_first_message_or_system_prompt_is_another_conversation() -> None:
    main = conversation_key("chat", {"messages": [SYSTEM, TASK]})
    other_task = {"role": "user", "content": "Summarise this session in 5 words."}
    other_system = {"role": "system", "content": "You are a search sub-agent."}
    assert conversation_key("chat", {"messages": [SYSTEM, other_task]}) != main
    assert conversation_key("chat", {"messages": [other_system, TASK]}) != main


def test_anthropic_cache_breakpoints_do_not_change_the_root() -> None:
    """Claude Code marks its latest messages with ``cache_control``: the first
    message carries it on the first turn and not on the later ones."""
    text = {"type": "text", "text": "Fix the failing test."}
    system = [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "x"}}]
    first = {
        "system": system,
        "messages": [{"role": "user", "content": [{**text, "cache_control": {"type": "x"}}]}],
    }
    later = {
        "system": system,
        "messages": [
            {"role": "user", "content": [text]},
            {"role": "assistant", "content": [{"type": "text", "text": "On it."}]},
        ],
    }
    assert conversation_key("messages", first) == conversation_key("messages", later)
    sub = {**later, "system": [{"type": "text", "text": "You are a sub-agent."}]}
    assert conversation_key("messages", sub) != conversation_key("messages", later)


def _claude_code(billing: str, system: str, first: str) -> dict[str, object]:
    """A Claude Code 2.1.332 request body, as captured (docs/agents.md): its billing
    header, which it derives from the first message, then its system prompt."""
    return {
        "system": [
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.332.{billing};"},
            {"type": "text", "text": system, "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [{"role": "user", "content": [{"type": "text", "text": first}]}],
    }


SESSION = {CLAUDE_CODE_SESSION: "7bd2df25-fdd5-48bd-9170-ddfdfa9de445"}


def test_a_compacted_claude_code_conversation_keeps_its_key() -> None:
    """A compaction replaces Claude Code's first message with a summary (and the
    billing header with it): the root changes, the session and the system prompt
    do not, and the conversation is the same one (its old context is replaced)."""
    thread = claude_code_thread(SESSION)
    before = _claude_code("79e", "You are Claude Code.", "Summarise this text: ...")
    after = _claude_code("cf6", "You are Claude Code.", "This session is being continued ...")
    assert conversation_key("messages", before, thread) == conversation_key(
        "messages", after, thread
    )
    assert conversation_key("messages", before) != conversation_key("messages", after)


def test_claude_code_sub_agents_and_side_requests_stay_apart() -> None:
    """Sub-agents share their parent's session (measured): the sub-agent header
    tells them apart, also when two get the same prompt, where the root cannot;
    a request with a system prompt of its own (a side request) is apart too."""
    sub = _claude_code("7cd", "You are a Claude agent.", "List the files")
    one = claude_code_thread({**SESSION, CLAUDE_CODE_AGENT: "a97d8422baa7f25f3"})
    two = claude_code_thread({**SESSION, CLAUDE_CODE_AGENT: "af72882eb8c6c3211"})
    main = claude_code_thread(SESSION)
    assert len({one, two, main}) == 3
    keys = {conversation_key("messages", sub, t) for t in (one, two, main)}
    assert len(keys) == 3 and DEFAULT_KEY not in keys
    assert conversation_key("messages", sub) == conversation_key("messages", sub)
    title = _claude_code("181", "Write a 5-word title for this session.", "List the files")
    assert conversation_key("messages", title, main) != conversation_key("messages", sub, main)


def test_no_session_header_is_not_claude_code() -> None:
    assert claude_code_thread({}) is None
    assert claude_code_thread({CLAUDE_CODE_SESSION: ""}) is None


def test_completions_and_responses_roots() -> None:
    prompt = "def add(a, b):\n" * 10
    assert conversation_key("completions", {"prompt": prompt}) == conversation_key(
        "completions", {"prompt": [prompt]}
    )
    one = conversation_key("responses", {"instructions": "be brief", "input": "hi"})
    two = conversation_key("responses", {"instructions": "be brief", "input": [{"content": "hi"}]})
    assert DEFAULT_KEY not in (one, two)


def test_no_readable_root_is_the_default_conversation() -> None:
    assert conversation_key("chat", {"messages": []}) == DEFAULT_KEY
    assert conversation_key("chat", {}) == DEFAULT_KEY
    assert conversation_key("messages", {"messages": "not a list"}) == DEFAULT_KEY
    assert conversation_key("embeddings", {"input": "x"}) == DEFAULT_KEY


def test_a_huge_first_message_is_hashed_only_so_far() -> None:
    """The root is bounded: two 400 KB first prompts that differ only at the end are
    one conversation (what tells conversations apart comes first)."""
    head = "x" * 40_000
    a = conversation_key("chat", {"messages": [{"role": "user", "content": head + "a"}]})
    b = conversation_key("chat", {"messages": [{"role": "user", "content": head + "b"}]})
    assert a == b


_EVENTS = st.lists(
    st.tuples(st.sampled_from(["start", "done", "complete"]), st.integers(1, 300_000)),
    max_size=40,
)


@given(_EVENTS, st.floats(0.0, 3600.0))
def test_one_conversation_is_the_papers_c_a(events: list[tuple[str, int]], window_s: float) -> None:
    """Whatever happens to a single conversation, ``C_a`` is its latest context."""
    convs = Conversations()
    for t, (kind, tokens) in enumerate(events):
        if kind == "start":
            convs.start(1)
        elif kind == "done":
            convs.done(1)
        else:
            convs.complete(1, tokens, float(t) * 60.0)
        assert convs.context_tokens(float(t) * 60.0, window_s) == convs.latest_tokens()


@given(st.lists(st.integers(1, 200_000), min_size=1, max_size=40))
def test_a_root_that_changes_every_request_counts_once(contexts: list[int]) -> None:
    """A client whose root is new at every request (a timestamp in its system prompt)
    is counted as its largest recent request, never once per request, also while
    a request runs and at the moment it completes."""
    convs = Conversations()
    for i, tokens in enumerate(contexts):
        recent = contexts[max(0, i + 1 - MAX_CONVERSATIONS) : i + 1]
        convs.start(100 + i)  # a new root: nothing of it is known yet
        if i:
            assert convs.context_tokens(float(i), 3600.0) == max(contexts[max(0, i - 15) : i])
        convs.complete(100 + i, tokens, float(i))  # the request ends with its completion
        assert convs.context_tokens(float(i), 3600.0) == max(recent)
        assert len(convs) <= MAX_CONVERSATIONS


def test_parallel_sub_agents_count_beside_their_waiting_parent() -> None:
    convs = Conversations()
    convs.start(PARENT)
    convs.complete(PARENT, 100_000, 0.0)  # the parent now waits for its sub-agents
    convs.start(SUB1)
    convs.start(SUB2)
    assert convs.context_tokens(1.0, 300.0) == 100_000  # their contexts are not known yet
    convs.complete(SUB1, 30_000, 50.0)
    convs.complete(SUB2, 40_000, 50.0)
    assert convs.context_tokens(50.0, 300.0) == 100_000  # the largest idle one
    convs.start(SUB1)
    convs.start(SUB2)  # both run again beside the waiting parent
    assert convs.context_tokens(60.0, 300.0) == 100_000 + 30_000 + 40_000
    convs.done(SUB1)  # one fails, the other completes
    convs.complete(SUB2, 45_000, 70.0)
    assert convs.context_tokens(70.0, 300.0) == 100_000
    assert convs.live(70.0, 300.0) == 3
    # The parent came back within the window: its own context, as the paper's C_a.
    convs.start(PARENT)
    convs.complete(PARENT, 120_000, 200.0)
    assert convs.context_tokens(200.0, 300.0) == 120_000
    # Finished sub-agents stop counting once the window has passed.
    assert convs.context_tokens(400.0, 300.0) == 120_000
    assert convs.live(400.0, 300.0) == 1


def test_a_side_request_does_not_shrink_c_a() -> None:
    convs = Conversations()
    convs.complete(MAIN, 100_000, 0.0)
    convs.start(TITLE)
    convs.complete(TITLE, 120, 5.0)
    assert convs.latest_tokens() == 120  # what the paper's C_a would be
    assert convs.context_tokens(5.0, 300.0) == 100_000
    assert convs.context_of(MAIN) == 100_000 and convs.context_of(NEW) is None
    # With no window only what runs counts beside the latest: the paper's value.
    assert convs.context_tokens(5.0, 0.0) == 120


def test_bound_keeps_the_latest_and_what_runs() -> None:
    convs = Conversations()
    convs.start(RUNNING)
    convs.complete(LATEST, 5, 0.0)
    for i in range(3 * MAX_CONVERSATIONS):
        convs.complete(1000 + i, 1, 0.0)
        convs.complete(LATEST, 5, 0.0)
    assert len(convs) == MAX_CONVERSATIONS
    assert convs.latest == LATEST and convs.context_of(LATEST) == 5
    assert convs.live(10.0, 0.0) == 2  # the latest, and RUNNING, still in flight
