"""The router's signing secret and control token, as files in the state directory.

The signing secret is generated on first start and persisted (mode 0600) so a
restart keeps every issued identity valid.
"""

from __future__ import annotations

import os
from pathlib import Path

from kairos_common.errors import ConfigError
from kairos_common.identity import new_secret


def load_or_create_secret(path: Path) -> bytes:
    """Hex secret from ``path``; created (0600) when missing."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        secret = new_secret()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(secret.hex() + "\n")
        return secret
    except OSError as exc:
        raise ConfigError(f"cannot read signing secret {path}: {exc}") from exc
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        secret = text.encode()
    if len(secret) < 16:
        raise ConfigError(f"signing secret {path} is shorter than 16 bytes")
    return secret


def read_token_file(path: Path) -> str:
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"cannot read control token file {path}: {exc}") from exc
    if not token:
        raise ConfigError(f"control token file {path} is empty")
    return token
