"""The error hierarchy of the router.

Every error that reaches a client is translated into an OpenAI-style error body
at the edge (:mod:`router.openai_errors`); nothing below the HTTP layer knows
about status codes except through :attr:`RouterError.status`.
"""

from __future__ import annotations

from kairos_common.wire import (
    LEADER_HEADER,
    NOT_LEADER_CODE,
    NOT_LEADER_RETRY_AFTER_S,
    NOT_LEADER_STATUS,
)


class RouterError(Exception):
    """Base class; ``status``/``code`` are what the client sees."""

    status: int = 500
    code: str = "internal_error"
    err_type: str = "server_error"
    openai_form: bool = False
    """Answer in the OpenAI error form on the Anthropic routes too (a contract with
    clients that read ``error.code`` whatever the route)."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s

    def extra_headers(self) -> dict[str, str]:
        """Headers the answer carries besides ``Retry-After`` (none by default)."""
        return {}


class BadRequestError(RouterError):
    status = 400
    code = "invalid_request"
    err_type = "invalid_request_error"


class UnsupportedWireVersionError(BadRequestError):
    """A control message of a ``/kairos/v1`` wire version this router does not speak;
    the message names the version it does (kairos_common.wire.SUPPORTED_VERSIONS)."""

    code = "unsupported_wire_version"


class AuthenticationError(RouterError):
    status = 401
    code = "invalid_api_key"
    err_type = "authentication_error"


class ForbiddenError(RouterError):
    status = 403
    code = "forbidden"
    err_type = "permission_error"


class NotFoundError(RouterError):
    status = 404
    code = "not_found"
    err_type = "invalid_request_error"


class MisdirectedError(RouterError):
    """An agent identity of another cell reached this cell's router (421): the front
    balancer's cell map is wrong, or a client was pointed past it."""

    status = 421
    code = "wrong_cell"
    err_type = "invalid_request_error"


class CellFullError(RouterError):
    """An agent start that asked for room (``X-Kairos-Require-Room``) reached a cell
    that cannot admit a new agent now (503 + Retry-After): the front balancer
    tries another cell at once (docs/cells.md)."""

    status = 503
    code = "cell_full"
    err_type = "server_error"


class BodyTooLargeError(RouterError):
    status = 413
    code = "request_too_large"
    err_type = "invalid_request_error"


class RequestTimeoutError(RouterError):
    """The client did not send its request body within the read bound."""

    status = 408
    code = "request_timeout"
    err_type = "invalid_request_error"


class TooManyRequestsError(RouterError):
    """One agent has too many requests waiting (429 + Retry-After)."""

    status = 429
    code = "too_many_waiting_requests"
    err_type = "rate_limit_error"


class HoldQueueFullError(RouterError):
    """The instance's admission queue is at its bound (429 + Retry-After)."""

    status = 429
    code = "admission_queue_full"
    err_type = "rate_limit_error"


class HoldTimeoutError(RouterError):
    """An agent waited longer than the hold bound (503 + Retry-After)."""

    status = 503
    code = "admission_timeout"
    err_type = "server_error"


class NoBackendError(RouterError):
    """No healthy, non-draining instance can serve the request."""

    status = 503
    code = "no_healthy_backend"
    err_type = "server_error"


class UpstreamError(RouterError):
    """Every attempt to reach a backend failed before the first byte."""

    status = 502
    code = "upstream_unavailable"
    err_type = "server_error"


class UpstreamTimeoutError(RouterError):
    status = 504
    code = "upstream_timeout"
    err_type = "server_error"


class StateStoreError(RouterError):
    """The state store (SQLite, Redis) cannot be opened, read or written."""


class StoreUnavailableError(StateStoreError):
    """The shared store did not answer (connection refused or lost, a timeout): the
    leader keeps routing from memory and retries; a standby does not promote."""


class FencedError(StateStoreError):
    """The store refused a write: this router's fence is stale (another router holds
    the lease now). It must stop serving at once (docs/scale-out.md)."""


class LeaseLapsedError(StateStoreError):
    """A write refused because this router's lease lapsed (or was re-acquired under a
    new fence since the write was sent) while no other router took it: Redis was
    away, or restarted. Not a fence: the changes are kept, and the router
    re-acquires and writes them under its new lease."""


class NotLeaderError(RouterError):
    """This router is a standby (or a leader whose lease lapsed): 503 ``not_leader``
    with ``Retry-After`` and, when known, the leader's URL
    (:data:`kairos_common.wire.LEADER_HEADER`)."""

    status = NOT_LEADER_STATUS
    code = NOT_LEADER_CODE
    err_type = "server_error"
    openai_form = True

    def __init__(self, message: str, *, leader_url: str | None = None) -> None:
        super().__init__(message, retry_after_s=NOT_LEADER_RETRY_AFTER_S)
        self.leader_url = leader_url

    def extra_headers(self) -> dict[str, str]:
        return {LEADER_HEADER: self.leader_url} if self.leader_url else {}


class TransportError(Exception):
    """The hot path's connection to a backend failed (:mod:`router.upstream`).

    Not a :class:`RouterError`: it never reaches a client as such. The proxy
    translates it where it knows what was sent: a retry on another instance, an
    :class:`UpstreamError` or an :class:`UpstreamTimeoutError`.
    """


class TransportConnectError(TransportError):
    """No connection could be made: nothing was sent, so a retry cannot duplicate."""


class TransportClosedError(TransportError):
    """The connection broke (or the answer was malformed) after the request went out."""


class TransportTimeoutError(TransportError):
    """The backend sent nothing within the read bound."""


class TransportRequestError(TransportError):
    """The request cannot be written as given (a control character in a header or
    the target): nothing was sent; the client's request is at fault (400)."""
