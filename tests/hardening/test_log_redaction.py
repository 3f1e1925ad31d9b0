"""Keys never appear in logs, traceback text included."""

from __future__ import annotations

import logging

import pytest
import structlog

from kairos_common.identity import compose_key, issue_token
from kairos_common.logs import configure_logging
from router.server_limits import http_logger


def test_traceback_text_is_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    key = compose_key(issue_token("agent-1", b"k" * 32), "sk-real-user-key")
    configure_logging("info", json=True)
    try:
        raise ValueError(f"upstream said no to Authorization: Bearer sk-secret-123 and {key}")
    except ValueError:
        structlog.get_logger("t").exception("boom")
    err = capsys.readouterr().err
    assert "boom" in err and "Traceback" in err
    assert "sk-secret-123" not in err and key not in err


def test_malformed_http_is_one_redacted_warning_line(caplog: pytest.LogCaptureFixture) -> None:
    from aiohttp.http_exceptions import LineTooLong

    logger = http_logger()
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        try:
            raise LineTooLong(b"Bearer sk-leaked-credential" + b"a" * 100, "8190")
        except LineTooLong:
            logger.exception("Error handling request")
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert "sk-leaked-credential" not in record.getMessage()
