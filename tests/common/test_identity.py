from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kairos_common import identity
from kairos_common.errors import IdentityError

SECRET = b"s" * 32


def test_roundtrip_recovers_real_key_and_identity() -> None:
    token = identity.issue_token("abc123", SECRET)
    key = identity.compose_key(token, "sk-real.key/with+odd=chars")
    parsed = identity.parse_key(key)
    assert parsed.agent_id == "abc123" and parsed.real_key == "sk-real.key/with+odd=chars"
    identity.verify(parsed, SECRET)
    assert "abc123" not in (parsed.real_key or "")


@given(st.text(min_size=0, max_size=80))
def test_any_real_key_survives(real: str) -> None:
    key = identity.compose_key(identity.issue_token("a-1", SECRET), real)
    assert identity.parse_key(key).real_key == (real or None)


def test_plain_key_passes_through() -> None:
    parsed = identity.parse_key("sk-plain")
    assert parsed.agent_id is None and parsed.real_key == "sk-plain"


def test_forged_signature_rejected() -> None:
    token = identity.issue_token("abc", b"other-secret")
    with pytest.raises(IdentityError, match="forged"):
        identity.verify(identity.parse_key(identity.compose_key(token, "k")), SECRET)


def test_altered_agent_id_rejected() -> None:
    token = identity.issue_token("abc", SECRET)
    altered = token.replace("abc", "abd")
    with pytest.raises(IdentityError):
        identity.verify(identity.parse_key(altered), SECRET)


def test_unsigned_tokens_accepted_without_secret() -> None:
    token = identity.issue_token("abc", None)
    assert token.endswith(".-")
    identity.verify(identity.parse_key(token), None)


@pytest.mark.parametrize("bad", ["kairos1.", "kairos1.a", "kairos1.a.b.c.d", "kairos1.a b.c"])
def test_malformed_keys(bad: str) -> None:
    with pytest.raises(IdentityError):
        identity.parse_key(bad)


def test_nested_tracker_recovers_user_key() -> None:
    key = identity.compose_key(identity.issue_token("p", SECRET), "user")
    assert identity.real_key_of(key) == "user"


def test_a_cell_router_mints_ids_that_carry_the_cell() -> None:
    agent_id = identity.new_agent_id("cell-2")
    assert agent_id.startswith("cell-2_") and len(agent_id) == len("cell-2_") + 32
    assert identity.cell_of(agent_id) == "cell-2"
    assert identity.cell_of(identity.new_agent_id()) is None  # no cell: bare hex, as before
    longest = identity.new_agent_id("c" * identity.MAX_CELL_CHARS)
    assert identity.issue_token(longest, SECRET)  # fits the 64-character id


@pytest.mark.parametrize("agent_id", ["my_agent", "a_xyz", "key-abc", "A_" + "0" * 32, None, ""])
def test_only_minted_cell_ids_name_a_cell(agent_id: str | None) -> None:
    assert identity.cell_of(agent_id) is None


@pytest.mark.parametrize("bad", ["", "A", "-a", "a-", "a_b", "a.b", "c" * 32])
def test_bad_cell_names_are_refused(bad: str) -> None:
    with pytest.raises(IdentityError):
        identity.check_cell(bad)


def test_the_signature_covers_the_cell() -> None:
    """A client that moves its key to another cell breaks the signature."""
    agent_id = identity.new_agent_id("a")
    key = identity.compose_key(identity.issue_token(agent_id, SECRET), "sk")
    moved = key.replace("kairos1.a_", "kairos1.b_", 1)
    assert identity.cell_of(identity.parse_key(moved).agent_id) == "b"
    with pytest.raises(IdentityError, match="forged"):
        identity.verify(identity.parse_key(moved), SECRET)
