"""The error hierarchy of the router.

Every error that reaches a client is translated into an OpenAI-style error body
at the edge (:mod:`router.openai_errors`); nothing below the HTTP layer knows
about status codes except through :attr:`RouterError.status`.
"""

from __future__ import annotations


class RouterError(Exception):
    """Base class; ``status``/``code`` are what the client sees."""

    status: int = 500
    code: str = "internal_error"
    err_type: str = "server_error"

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


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
    """The SQLite state store cannot be opened or written."""


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
