"""Exceptions raised by llmretry.

A call that fails after the retry policy has run raises an :class:`LLMError`
subclass chosen by the failure's ``kind``:

=====================  ==========================================================
kind                   exception
=====================  ==========================================================
``http_status``        :class:`HTTPStatusError`
``timeout``            :class:`RequestTimeoutError` (also a ``TimeoutError``)
``network``            :class:`NetworkError` (also a ``ConnectionError``)
``invalid_response``   :class:`InvalidResponseError`
``deadline_exceeded``  :class:`DeadlineExceededError` (also a ``TimeoutError``)
``response_too_large`` :class:`ResponseTooLargeError`
``cancelled``          :class:`CallCancelledError`
``stream_interrupted`` :class:`StreamInterruptedError`
``circuit_open``       :class:`CircuitOpenError`
``refusal``            :class:`RefusalError`
=====================  ==========================================================

An ``http_status`` failure is raised as the :class:`HTTPStatusError`
subclass of its status, as openai-python names them (so ``except
RateLimitError`` reads the same with either library):

======  ================================
status  exception
======  ================================
400     :class:`BadRequestError`
401     :class:`AuthenticationError`
403     :class:`PermissionDeniedError`
404     :class:`NotFoundError`
409     :class:`ConflictError`
422     :class:`UnprocessableEntityError`
429     :class:`RateLimitError`
>= 500  :class:`InternalServerError`
======  ================================

Any other status is a plain :class:`HTTPStatusError`.

Every one carries the same attributes (see :class:`LLMError`), and none of
them ever holds the API key or the prompt. Wrong arguments are not
``LLMError``: they raise ``TypeError`` or ``ValueError`` before any I/O.
:class:`ShapeError` is raised by :func:`llmretry.assert_shape`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple, Type

__all__ = [
    "LLMError",
    "HTTPStatusError",
    "BadRequestError",
    "AuthenticationError",
    "PermissionDeniedError",
    "NotFoundError",
    "ConflictError",
    "UnprocessableEntityError",
    "RateLimitError",
    "InternalServerError",
    "RequestTimeoutError",
    "NetworkError",
    "InvalidResponseError",
    "DeadlineExceededError",
    "ResponseTooLargeError",
    "CallCancelledError",
    "StreamInterruptedError",
    "CircuitOpenError",
    "RefusalError",
    "ShapeError",
]

# BEGIN GENERATED error-fields (tools/gen_surface.py, from the core's tables: do not edit)
# The attributes every LLMError carries besides ``message`` (the core's
# error shape, in its order); also the keys read from a failure outcome,
# and each one's value when an outcome lacks it.
_FIELDS: Tuple[str, ...] = (
    "kind", "status", "attempt", "attempts", "request_id", "retry_after_ms", "error_code",
    "body_preview", "reason", "model", "duration_ms", "total_ms", "resends", "target",
    "targets", "validation_errors", "usage_total",
)
_DEFAULTS: Dict[str, Any] = {
    "kind": None, "status": None, "attempt": 0, "attempts": 0, "request_id": None,
    "retry_after_ms": None, "error_code": None, "body_preview": None, "reason": None,
    "model": None, "duration_ms": 0, "total_ms": 0, "resends": 0, "target": 0,
    "targets": None, "validation_errors": None, "usage_total": None,
}
# END GENERATED error-fields


class LLMError(Exception):
    """A call that failed for good, after the retry policy had its say.

    Attributes:
        kind: the failure class, one of the kinds in the table above.
        message: what went wrong, for humans (never the key or the prompt);
            an HTTP error quotes the provider's message unless it echoes the
            request (docs/security.md).
        status: the last HTTP status, or None when no response arrived.
        attempt: the 0-based index of the last attempt.
        attempts: how many attempts were made.
        request_id: the call's request id (sent as ``X-Client-Request-Id``).
        retry_after_ms: the server's requested wait, when it sent one.
        error_code: the provider's error code (e.g. ``insufficient_quota``);
            ``"invalid_code"`` when the server's was not a short token.
        body_preview: the first 500 bytes of the last response body.
        reason: why the policy stopped: ``retries_exhausted``,
            ``not_retryable``, ``deadline``, ``retry_after_too_long``,
            ``unsafe_mode``, ``cancelled``, ``retry_budget_exhausted`` (the
            endpoint's retry budget was spent) or ``circuit_open``; for a
            stream that broke (``stream_interrupted``), how it broke (see
            :class:`StreamInterruptedError`).
        model: the model named in the request body.
        duration_ms: how long the last attempt took.
        total_ms: how long the whole call took.
        resends: requests sent again at once, not counted as attempts (a
            refused stream, a dead or stale kept-alive connection): the
            server saw at most ``attempts + resends`` requests.
        target: with ``fallbacks``, the target the last attempt went to (0:
            the call's own); the error is that target's.
        targets: with ``fallbacks``, what each target came to, in order: a
            list of ``{"model", "attempts", "status", "kind", "reason"}``
            (``attempts`` 0: never tried); None without fallbacks.
        validation_errors: an answer that did not match the call's schema
            (``schema=`` or the body's ``response_format``): the last
            attempt's errors, ``[{"path": "$.items[2].price", "message":
            "expected number"}, ...]`` (at most 20); None otherwise.
        usage_total: the usage of every attempt that returned one, summed
            (what the failed call was billed), or None.
    """

    kind: str = "error"

    # BEGIN GENERATED error-init (tools/gen_surface.py, from the core's tables: do not edit)
    def __init__(self, message: str, *, kind: Optional[str] = None,
                 status: Optional[int] = None, attempt: int = 0, attempts: int = 0,
                 request_id: Optional[str] = None, retry_after_ms: Optional[int] = None,
                 error_code: Optional[str] = None, body_preview: Optional[str] = None,
                 reason: Optional[str] = None, model: Optional[str] = None,
                 duration_ms: int = 0, total_ms: int = 0, resends: int = 0, target: int = 0,
                 targets: Optional[List[Dict[str, Any]]] = None,
                 validation_errors: Optional[List[Dict[str, str]]] = None,
                 usage_total: Optional[Dict[str, int]] = None) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind if kind is not None else type(self).kind
        self.status = status
        self.attempt = attempt
        self.attempts = attempts
        self.request_id = request_id
        self.retry_after_ms = retry_after_ms
        self.error_code = error_code
        self.body_preview = body_preview
        self.reason = reason
        self.model = model
        self.duration_ms = duration_ms
        self.total_ms = total_ms
        self.resends = resends
        self.target = target
        self.targets = targets
        self.validation_errors = validation_errors
        self.usage_total = usage_total
    # END GENERATED error-init

    def __str__(self) -> str:
        if self.request_id:
            return f"{self.message} [request_id={self.request_id}]"
        return self.message

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(kind={self.kind!r}, status={self.status!r}, "
                f"attempts={self.attempts!r}, reason={self.reason!r}, "
                f"request_id={self.request_id!r})")

    def __reduce__(self) -> Tuple[Any, ...]:
        fields = {name: getattr(self, name) for name in _FIELDS}
        return (_rebuild, (type(self), self.message, fields), None)

    def as_dict(self) -> Dict[str, Any]:
        """The error's fields as a plain dict (``message`` included)."""
        fields = {name: getattr(self, name) for name in _FIELDS}
        fields["message"] = self.message
        return fields


def _rebuild(cls: Type[LLMError], message: str, fields: Dict[str, Any]) -> LLMError:
    """Unpickle an LLMError (keyword-only fields need a helper)."""
    return cls(message, **fields)


class HTTPStatusError(LLMError):
    """The server answered with a status that was not retried (or no longer)."""

    kind = "http_status"


# One subclass per status a caller commonly tells apart (openai-python's
# names); error_from_outcome picks it by ``status``, the kind staying
# ``http_status``.

class BadRequestError(HTTPStatusError):
    """HTTP 400: the server refused the request as malformed (not retried)."""


class AuthenticationError(HTTPStatusError):
    """HTTP 401: the API key is missing, wrong or revoked."""


class PermissionDeniedError(HTTPStatusError):
    """HTTP 403: the key may not use this model or endpoint."""


class NotFoundError(HTTPStatusError):
    """HTTP 404: no such model or route (check ``base_url`` and the model)."""


class ConflictError(HTTPStatusError):
    """HTTP 409: the request conflicts with the resource's state."""


class UnprocessableEntityError(HTTPStatusError):
    """HTTP 422: the body was well-formed but its values were refused."""


class RateLimitError(HTTPStatusError):
    """HTTP 429 once the retries gave up: the rate limit or the quota
    (``error_code`` ``insufficient_quota``) was hit."""


class InternalServerError(HTTPStatusError):
    """HTTP 500 or above once the retries gave up: the server failed."""


_ERROR_BY_STATUS: Dict[int, Type[HTTPStatusError]] = {
    400: BadRequestError, 401: AuthenticationError, 403: PermissionDeniedError,
    404: NotFoundError, 409: ConflictError, 422: UnprocessableEntityError,
    429: RateLimitError,
}


def _http_status_class(status: Any) -> Type[HTTPStatusError]:
    """The HTTPStatusError subclass of a status (the class itself for one
    without its own)."""
    if not isinstance(status, int):
        return HTTPStatusError
    if status >= 500:
        return InternalServerError
    return _ERROR_BY_STATUS.get(status, HTTPStatusError)


class RequestTimeoutError(LLMError, TimeoutError):
    """The last attempt exceeded ``timeout_ms``."""

    kind = "timeout"


class NetworkError(LLMError, ConnectionError):
    """The connection failed: DNS, connect, reset, TLS or a truncated body."""

    kind = "network"


class InvalidResponseError(LLMError):
    """A 2xx response whose body was not a JSON object, whose answer did not
    match the call's schema (``validation_errors`` lists where), or that
    ``validate`` rejected."""

    kind = "invalid_response"


class DeadlineExceededError(LLMError, TimeoutError):
    """The call's total ``deadline_ms`` ran out before it succeeded."""

    kind = "deadline_exceeded"


class ResponseTooLargeError(LLMError):
    """The response body exceeded ``max_response_bytes``."""

    kind = "response_too_large"


class CallCancelledError(LLMError):
    """The call was cancelled (its client was closed while it ran)."""

    kind = "cancelled"


class StreamInterruptedError(LLMError):
    """A stream failed after you had read a chunk of it: not retried, as the
    output would repeat.

    Attributes (besides :class:`LLMError`'s):
        reason: how it broke: ``network``, ``idle_timeout``, ``error_event``,
            ``truncated``, ``deadline``, ``cancelled``, ``invalid_chunk`` or
            ``too_large``.
        chunks_delivered: the chunks you had read.
        partial: the :class:`~llmretry.Result` assembled from what arrived
            (its ``data`` a chat.completion with the text so far), or None.
        error_code: for ``error_event``, the provider's code.
    """

    kind = "stream_interrupted"
    chunks_delivered: int = 0
    partial: Any = None


class CircuitOpenError(LLMError):
    """The endpoint's circuit breaker was open (``breaker_failures``): no
    request was sent. It closes after ``breaker_cooldown_ms`` once a probe
    call succeeds; give the call ``fallbacks`` to go elsewhere meanwhile."""

    kind = "circuit_open"


class RefusalError(LLMError):
    """The model refused to answer a call with a schema (its message had a
    ``refusal``): not retried, as the same request would be refused again.
    ``body_preview`` shows the start of the response, the refusal in it."""

    kind = "refusal"


class ShapeError(ValueError):
    """A value does not match the shape given to :func:`llmretry.assert_shape`.

    Its message names the path, e.g.
    ``"invalid response at root.user.name: expected string"``.
    """


# BEGIN GENERATED error-kinds (tools/gen_surface.py, from the core's tables: do not edit)
# The exception of each error kind the core has (a kind it adds needs its
# class above: until it is written, this fails at import).
_ERROR_BY_KIND: Dict[str, Type[LLMError]] = {
    "http_status": HTTPStatusError,
    "timeout": RequestTimeoutError,
    "network": NetworkError,
    "invalid_response": InvalidResponseError,
    "deadline_exceeded": DeadlineExceededError,
    "cancelled": CallCancelledError,
    "response_too_large": ResponseTooLargeError,
    "stream_interrupted": StreamInterruptedError,
    "circuit_open": CircuitOpenError,
    "refusal": RefusalError,
}
# END GENERATED error-kinds


def error_from_outcome(outcome: Mapping[str, Any]) -> LLMError:
    """The exception for a failed call outcome of ``_llmretry.Engine.call``:
    its error fields are the core's (a broken stream's ``reason`` already
    says how it broke), read the same way for every kind."""
    cls = _ERROR_BY_KIND.get(outcome.get("kind"), LLMError)  # type: ignore[arg-type]
    if cls is HTTPStatusError:
        cls = _http_status_class(outcome.get("status"))
    get = outcome.get
    err = cls(get("message") or "LLM call failed",
              **{name: get(name, default) for name, default in _DEFAULTS.items()})
    if "chunks_delivered" in outcome:     # a stream's
        err.chunks_delivered = outcome["chunks_delivered"]  # type: ignore[attr-defined]
    return err
