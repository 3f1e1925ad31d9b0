"""OpenAI-style (and Anthropic-style) error bodies.

Clients built on the OpenAI SDK parse ``{"error": {"message", "type", "code",
"param"}}``; Anthropic clients (``/v1/messages``) parse ``{"type": "error",
"error": {"type", "message"}}``. The router answers every failure in the form the
route's clients understand, and never with a stack trace.
"""

from __future__ import annotations

import json
import math

from aiohttp import web

from router.errors import RouterError

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_body(
    status: int, message: str, err_type: str, code: str | None, anthropic: bool = False
) -> bytes:
    """Serialised error body in the route's protocol form."""
    if anthropic:
        a_type = _ANTHROPIC_TYPES.get(status, "api_error")
        return json.dumps({"type": "error", "error": {"type": a_type, "message": message}}).encode()
    return json.dumps(
        {"error": {"message": message, "type": err_type, "param": None, "code": code}}
    ).encode()


def error_parts(
    status: int,
    message: str,
    *,
    err_type: str = "invalid_request_error",
    code: str | None = None,
    retry_after_s: float | None = None,
    anthropic: bool = False,
    request_id: str | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and JSON body of an error answer, for either server
    (``Retry-After`` in whole seconds when given)."""
    headers = {"Content-Type": "application/json"}
    if retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
    if request_id:
        headers["X-Request-Id"] = request_id
    return status, headers, error_body(status, message, err_type, code, anthropic)


def as_response(parts: tuple[int, dict[str, str], bytes]) -> web.Response:
    """An error answer from :func:`error_parts` (or its kin) as an aiohttp response."""
    status, headers, body = parts
    return web.Response(status=status, body=body, headers=headers)


def internal_error_parts(anthropic: bool = False) -> tuple[int, dict[str, str], bytes]:
    """The 500 for an unexpected failure: no detail of it reaches the client."""
    return error_parts(
        500, "internal router error", err_type="server_error", code="internal_error",
        anthropic=anthropic,
    )  # fmt: skip


def router_error_parts(
    exc: RouterError, *, anthropic: bool = False, request_id: str | None = None
) -> tuple[int, dict[str, str], bytes]:
    """:func:`error_parts` of a :class:`RouterError`."""
    status, headers, body = error_parts(
        exc.status, exc.message, err_type=exc.err_type, code=exc.code,
        retry_after_s=exc.retry_after_s, anthropic=anthropic and not exc.openai_form,
        request_id=request_id,
    )  # fmt: skip
    extra = exc.extra_headers()
    if extra:
        headers.update(extra)
    return status, headers, body


def from_router_error(
    exc: RouterError, *, anthropic: bool = False, request_id: str | None = None
) -> web.Response:
    return as_response(router_error_parts(exc, anthropic=anthropic, request_id=request_id))


def sse_error_event(message: str, anthropic: bool = False) -> bytes:
    """An error as an SSE event, for failures after the first byte of a stream.

    OpenAI-compatible servers (vLLM included) emit ``data: {"error": ...}``; the
    Anthropic protocol has a named ``error`` event.
    """
    body = error_body(502, message, "server_error", "upstream_error", anthropic)
    if anthropic:
        return b"event: error\ndata: " + body + b"\n\n"
    return b"data: " + body + b"\n\n"
