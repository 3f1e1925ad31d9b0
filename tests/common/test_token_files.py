"""One rule for token files across router, kairosd and id-tracker.

Each component reads its credential file with
:func:`kairos_common.credentials.read_credential`: the value is stripped, and an
empty, missing or non-ASCII file is a configuration error in all three (kairosd
used to treat an empty file as "no token" and go on unauthenticated).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from idtracker import config as idtracker_config
from idtracker.errors import ConfigurationError
from kairos_common.credentials import read_credential
from kairos_common.errors import ConfigError
from kairosd.config import KairosdConfig
from router.app import resolve_config
from router.config import RouterConfig


def _idtracker(path: Path) -> str | None:
    return idtracker_config.resolve_control_token(
        idtracker_config.IdTrackerConfig(control_token_file=path)
    )


def _kairosd(path: Path) -> str | None:
    return KairosdConfig(router_token_file=path).resolved_router_token()


def _router(path: Path) -> str | None:
    state = path.parent / "state"
    cfg = RouterConfig(state_dir=state, signing=False, control_token_file=path)
    resolved, _secret, store, records = resolve_config(cfg)
    asyncio.run(store.close())
    records.close()
    return resolved.control_token


READERS: dict[str, Callable[[Path], str | None]] = {
    "read_credential": read_credential,
    "id-tracker": _idtracker,
    "kairosd": _kairosd,
    "router": _router,
}


@pytest.mark.parametrize("who", sorted(READERS))
def test_every_component_reads_the_same_value(who: str, tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("  s3cret-token \n")
    assert READERS[who](path) == "s3cret-token"


@pytest.mark.parametrize("who", sorted(READERS))
@pytest.mark.parametrize(
    ("content", "why"),
    [(b"", "empty"), (b" \n\n", "empty"), (b"\xff\xfe", "cannot read"), (b"t\x00k", "printable")],
)
def test_every_component_refuses_an_unusable_file(
    who: str, content: bytes, why: str, tmp_path: Path
) -> None:
    path = tmp_path / "token"
    path.write_bytes(content)
    with pytest.raises((ConfigError, ConfigurationError), match=why):
        READERS[who](path)


@pytest.mark.parametrize("who", sorted(READERS))
def test_a_missing_file_is_a_config_error_that_does_not_leak(who: str, tmp_path: Path) -> None:
    with pytest.raises((ConfigError, ConfigurationError), match="cannot read"):
        READERS[who](tmp_path / "absent")
