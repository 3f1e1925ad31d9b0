"""Which router URL to call (kairos_common/leader.py): the leader a standby names only
when the operator configured it, else the next URL in the operator's order."""

from __future__ import annotations

import json

import pytest

from kairos_common.leader import LEADER_HEADER, RouterUrls, not_leader_hint, url_key

A, B, C = "http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"


def test_url_key_compares_urls_as_the_router_sees_them() -> None:
    assert url_key("HTTP://Router.Example/v1/") == url_key("http://router.example:80")
    assert url_key("https://r") == "https://r:443"
    assert url_key(A) != url_key(B)


def test_starts_with_the_first_and_remembers_who_answered() -> None:
    urls = RouterUrls([A, B, C])
    assert urls.current == A
    urls.succeeded(B)
    assert urls.current == B


def test_a_failure_moves_to_the_next_url_cyclically() -> None:
    urls = RouterUrls([A, B, C])
    assert urls.failed(A) == B
    assert urls.failed(B) == C
    assert urls.failed(C) == A


def test_a_configured_leader_hint_is_followed() -> None:
    urls = RouterUrls([A, B, C])
    assert urls.failed(A, leader_hint="http://127.0.0.1:3/") == C


@pytest.mark.parametrize("hint", ["http://evil.example:24157", "http://127.0.0.1:4", "", None])
def test_an_unconfigured_leader_hint_is_never_followed(hint: str | None) -> None:
    """The calls carry credentials: only the operator's URLs are ever called."""
    urls = RouterUrls([A, B])
    assert urls.failed(A, leader_hint=hint) == B


def test_a_hint_naming_the_failed_url_itself_moves_on() -> None:
    urls = RouterUrls([A, B])
    assert urls.failed(A, leader_hint=A) == B


def test_duplicates_are_dropped_and_an_empty_list_refused() -> None:
    assert RouterUrls([A, A + "/", B]).urls == (A, B)
    with pytest.raises(ValueError):
        RouterUrls([])


def _error(code: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": "m"}}).encode()


def test_not_leader_hint_reads_only_a_not_leader_503() -> None:
    assert not_leader_hint(503, {LEADER_HEADER.lower(): f" {B} "}, _error("not_leader")) == B
    assert not_leader_hint(503, {}, _error("not_leader")) == ""
    assert not_leader_hint(503, {LEADER_HEADER: B}, _error("cell_full")) is None
    assert not_leader_hint(502, {LEADER_HEADER: B}, _error("not_leader")) is None
    assert not_leader_hint(503, {LEADER_HEADER: B}, b"<html>") is None
