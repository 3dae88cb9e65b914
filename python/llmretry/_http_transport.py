"""What llmretry.httpx and llmretry.httpx2 share: an httpx request run as a
call on a Client's engine, and the call's end made the response (or the
exception) the httpx client expects.

Both modules hand in their own httpx flavour (``hx``: the module ``httpx``
or ``httpx2``, whose transport interfaces are the same) so the responses
and exceptions are that flavour's; nothing here imports either.

A POST with a JSON object body is a call: the request's URL is the call's
``url``, its headers go as they are (the SDK's ``Authorization`` included;
framing and hop-by-hop ones are libcurl's to write), ``X-Client-Request-Id``
and ``Idempotency-Key`` become the call's ``request_id`` and
``idempotency_key``. The engine keeps the response as received
(``keep_response``): a success and a response the policy gave up on (a 429
after the retries, a 400) reach the client with their status, headers and
body; a call that ended with no response to hand on (the network, a
timeout, the deadline, an open breaker) raises the flavour's
``RequestError`` subclass, the message ending with llmretry's request id.
A ``"stream": true`` body streams: the first chunk is read here, so the
engine retries until then (the commit point) and never after, and the
response's body is the stream's events again as SSE bytes (a whole answer
to it comes as the chunks it would have streamed: the core's
stream_whole.c). A POST whose Accept header names only other types (the
SDK's binary endpoints, audio.speech: application/octet-stream) is carried
raw: its 2xx body is handed on as it came, not judged as JSON (it was
retried as an invalid answer, and billed each time).

A GET whose Accept header names JSON (the SDK's retrieve and list calls) is
a call too, so the SDK's polls get the policy (retries, budgets, breaker)
with the SDK's own retries off; its 2xx body is handed on as it came.
Anything else (a binary download, which httpx can stream; multipart
uploads; DELETE and a POST with no body, which are not retried) goes to the
flavour's own HTTP transport.
"""

from __future__ import annotations

import json
import warnings
from typing import Any, AsyncIterator, Dict, Iterator, List, Optional, Tuple

from . import _aio
from ._client import Client
from ._options import _check_option_names
from ._bodies import _core_url
from ._tokens import estimate_tokens
from .errors import error_from_outcome

__all__ = ["TransportCore", "SyncTransportBase", "AsyncTransportBase"]

# Options the transport cannot take: the client it serves owns them.
_REFUSED = {
    "fallbacks": "fallbacks are refused: the SDK must see one server's response (its "
                 "status, headers and body, parsed into its own types), and another "
                 "model's or provider's would not be the request it made",
    "url": "url is refused: each request's URL is the SDK's (from its base_url)",
    "base_url": "base_url is refused: each request's URL is the SDK's (set "
                "base_url on the SDK's client)",
    "api_key": "api_key is refused: the SDK sends its own key (its Authorization "
               "header is passed on as it is)",
}
# Keywords of Client() that are not call options.
_CLIENT_ONLY = ("max_in_flight", "max_host_connections", "shared", "policies", "io_loop")

# Request headers libcurl writes itself (framing, the connection) or that
# would change what comes back (a compressed body the engine cannot read).
_DROPPED = frozenset((
    "host", "content-length", "transfer-encoding", "connection", "keep-alive",
    "proxy-connection", "te", "upgrade", "expect", "accept-encoding",
))
# Request headers that are options of the call (the core refuses them as headers).
_AS_OPTIONS = {"x-client-request-id": "request_id", "idempotency-key": "idempotency_key"}


def _parse_head(head: Optional[bytes]) -> Tuple[int, List[Tuple[bytes, bytes]], Dict[str, Any]]:
    """A response head as the engine kept it: status, header pairs in the
    order received, and the httpx extensions (HTTP version, reason)."""
    lines = (head or b"").split(b"\n")
    parts = lines[0].rstrip(b"\r").split(b" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise ValueError("no status line in the response head")
    headers: List[Tuple[bytes, bytes]] = []
    for line in lines[1:]:
        line = line.rstrip(b"\r")
        if not line:
            continue
        if line[:1] in (b" ", b"\t") and headers:     # an obsolete folded line
            name, value = headers[-1]
            headers[-1] = (name, value + b" " + line.strip(b" \t"))
            continue
        name, sep, value = line.partition(b":")
        if sep:
            headers.append((name, value.strip(b" \t")))
    extensions = {"http_version": parts[0],
                  "reason_phrase": parts[2] if len(parts) > 2 else b""}
    return int(parts[1]), headers, extensions


def _sse(item: Tuple[Optional[str], bytes]) -> bytes:
    """One chunk of the engine's as the SSE event it came in."""
    event, data = item
    out = [b"event: " + event.encode("utf-8") + b"\n"] if event else []
    out.extend(b"data: " + line + b"\n" for line in data.split(b"\n"))
    out.append(b"\n")
    return b"".join(out)


_DONE = b"data: [DONE]\n\n"
# The head of a response whose own the engine could not keep (past
# LLMRETRY_MAX_RESPONSE_HEAD, out of memory): its status and body type.
_MINIMAL_HEAD = b"HTTP/1.1 %d \r\ncontent-type: %s\r\n"


def _as_event_stream(head: bytes) -> bytes:
    """A response head whose body is now an event stream: its label says so
    (the server's own when it did, its charset kept)."""
    lines = head.split(b"\n")
    types = [line.split(b":", 1)[1].strip().lower() for line in lines
             if line.lower().startswith(b"content-type:")]
    if len(types) == 1 and types[0].startswith(b"text/event-stream"):
        return head
    lines = [line for line in lines if not line.lower().startswith(b"content-type:")]
    while lines and not lines[-1].strip():
        lines.pop()
    return b"\n".join(lines + [b"content-type: text/event-stream\r", b""])


class _Call:
    """One request made a call: what the engine is given."""

    __slots__ = ("engine", "payload", "kwargs", "stream")

    def __init__(self, engine: Any, payload: bytes, kwargs: Dict[str, Any],
                 stream: bool) -> None:
        self.engine = engine
        self.payload = payload
        self.kwargs = kwargs
        self.stream = stream


class TransportCore:
    """The part of Transport and AsyncTransport that is neither sync nor
    async: options, requests to calls, outcomes to responses."""

    def __init__(self, hx: Any, options: Dict[str, Any], where: str = "Transport()") -> None:
        self.hx = hx
        for name, why in _REFUSED.items():
            if name in options:
                raise ValueError(why)
        client = options.pop("client", None)
        if client is None:
            # Checked here to be named so, not Client(): the call options,
            # Client's own keywords (max_in_flight, shared...) aside.
            _check_option_names(set(options) - set(_CLIENT_ONLY), where)
            self.client = Client(**options)
            self.owns_client = True
            self.options: Dict[str, Any] = {}
        elif isinstance(client, Client):
            bad = [k for k in _CLIENT_ONLY if k in options]
            if bad:
                raise TypeError(f"{', '.join(bad)}: set on the Client given as client=")
            _check_option_names(options, where)
            # Its endpoint and key are harmless (each call names the SDK's URL
            # and key); its fallbacks are not.
            if client._defaults.get("fallbacks"):
                raise ValueError(f"the client's {_REFUSED['fallbacks']}")
            self.client = client
            self.owns_client = False
            self.options = dict(options)
            client._plan.with_options(options.items())      # wrong types raise now
        else:
            raise TypeError(f"client must be a llmretry.Client or None, "
                            f"not {type(client).__name__}")
        # The SDK's per-request timeout is the attempt's unless one was set.
        self.own_timeout = "timeout_ms" in options or "timeout_ms" in self.client._defaults
        # Headers set for every call (the client's, then these options'):
        # a call's own headers would replace them, so they go under the request's.
        self.headers = dict(self.client._defaults.get("headers") or {})
        self.headers.update(self.options.get("headers") or {})
        self.warned_retries = False
        # The flavour's stream types, which httpx checks the body against.
        self.sync_events = type("SyncEvents", (_SyncEvents, hx.SyncByteStream), {})
        self.async_events = type("AsyncEvents", (_AsyncEvents, hx.AsyncByteStream), {})

    # -- requests -------------------------------------------------------------

    @staticmethod
    def carries(request: Any) -> bool:
        """Whether the engine may carry a request: a POST of JSON, or a GET
        of JSON (decided before a body is read: an upload is not read into
        memory here)."""
        if request.method == "GET":
            return _accepts_json(request.headers.get("accept")) is True
        return bool(request.method == "POST" and request.headers.get(
            "content-type", "").lower().startswith("application/json"))

    def call_of(self, request: Any, content: bytes) -> Optional[_Call]:
        """The call for a request the engine carries, or None when a POST's
        body is not a JSON object."""
        opts = dict(self.options)
        if request.method == "GET":
            body: Dict[str, Any] = {}
            content = b""
            # Its 2xx is handed on as it came, for the SDK to parse: a JSON
            # Lines file (files.retrieve_content) is no JSON object, and an
            # answer's checks are a generation's.
            opts["method"] = "GET"
            opts["raw_response"] = True
        else:
            try:
                body = json.loads(content)
            except (ValueError, RecursionError):
                return None
            if not isinstance(body, dict):
                return None
            if _accepts_json(request.headers.get("accept")) is False:
                opts["raw_response"] = True     # audio.speech: the bytes as they come
        headers: Dict[str, str] = {}
        for raw_name, raw_value in request.headers.raw:
            name = raw_name.decode("latin-1")
            value = raw_value.decode("latin-1")
            lower = name.lower()
            if lower in _DROPPED:
                continue
            if lower in _AS_OPTIONS:
                opts[_AS_OPTIONS[lower]] = value
                continue
            if lower == "x-stainless-retry-count" and value != "0":
                self._warn_sdk_retries()
            if lower == "authorization":
                # Spelled as the engine spells a key's (the SDK writes it in
                # lower case): the engine tells endpoints (rate budgets,
                # breakers) apart by this line, so the SDK's calls share the
                # budgets of a Client's calls with the same key.
                name = "Authorization"
            key = next((k for k in headers if k.lower() == lower), name)
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        names = {k.lower() for k in headers}
        opts["headers"] = {**{k: v for k, v in self.headers.items() if k.lower() not in names},
                           **headers}
        if "authorization" in names:
            opts["api_key"] = None          # a client default's key: the SDK's wins
        opts["url"] = str(request.url)
        if not self.own_timeout:
            timeout_ms = _timeout_ms(request.extensions.get("timeout"))
            if timeout_ms is not None:
                opts["timeout_ms"] = timeout_ms
        client = self.client
        _, plan = client._plan_of(None, None, opts, "Transport")
        engine, payload, extra, _validator = client._prepare(content, plan)
        if plan.kwargs.get("tpm") and "estimated_tokens" not in extra:
            tokens = estimate_tokens(_core_url(plan.kwargs), payload)
            if tokens:
                extra["estimated_tokens"] = tokens
        kwargs = dict(plan.kwargs, **extra)
        kwargs["keep_response"] = True
        return _Call(engine, payload, kwargs, body.get("stream") is True)

    def done(self, request: Any, out: Any) -> Any:
        """A call's outcome, once known (a hook: llmretry.otel ends the
        call's span with it); returns it."""
        return out

    def _warn_sdk_retries(self) -> None:
        if not self.warned_retries:
            self.warned_retries = True
            warnings.warn(
                "the SDK is retrying a request on top of llmretry's retries (its "
                "max_retries is not 0): every retry of the SDK's runs llmretry's "
                "whole policy again; make the SDK's client with max_retries=0",
                RuntimeWarning, stacklevel=2)

    # -- responses ------------------------------------------------------------

    def response(self, request: Any, out: Dict[str, Any], stream: bool) -> Any:
        """The response of a call that ended before any chunk was read (a
        whole response, or a stream answered with something else), or raise
        the flavour's exception when there is no response to hand on.
        ``stream``: whether the request asked to stream. What the answer is
        (a whole body, an event stream) is the core's judgement, never the
        label, which a gateway may have changed."""
        head = out.get("headers")
        if head is None and out["ok"]:
            head = _MINIMAL_HEAD % (out["status"], b"application/json")
        # A refusal too: the SDK reads message.refusal itself.
        if head is not None and (out["ok"] or out.get("kind") in ("http_status",
                                                                   "invalid_response",
                                                                   "refusal")):
            status, headers, ext = _parse_head(head)
            body = out.get("body")
            if not out["ok"] and 200 <= status < 300 and (stream or out.get("stream")):
                # A failure under a 2xx head, none of it read: an error event
                # (or a 2xx error body) on every attempt. To a stream request,
                # that error as one event, for the SDK to raise what it names
                # (an empty 2xx stream would read as an answer with nothing
                # in it); to one that did not stream, or with no body,
                # nothing its client could parse: the error. (A whole answer
                # comes as chunks: the core tells it so.)
                if not stream or not body:
                    raise self.error(request, out)
                return self.stream_response(request, head, self.hx.ByteStream(_sse((None, body))))
            return self.hx.Response(status, headers=headers,
                                    stream=self.hx.ByteStream(body or b""),
                                    request=request, extensions=ext)
        raise self.error(request, out)

    def stream_response(self, request: Any, head: Optional[bytes], stream: Any) -> Any:
        """The response of a stream once its first chunk is in: the head it
        came with, the body re-framed as an event stream (its length is not
        the server's, and its label says what it now is, whatever the
        server's said: a gateway's application/json, a whole answer told as
        chunks)."""
        head = _as_event_stream(head or _MINIMAL_HEAD % (200, b"text/event-stream"))
        status, headers, ext = _parse_head(head)
        headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
        return self.hx.Response(status, headers=headers, stream=stream, request=request,
                                extensions=ext)

    def error(self, request: Any, out: Dict[str, Any]) -> Exception:
        """The flavour's exception for a call that ended with no response to
        hand on; its cause is llmretry's error (kind, attempts, request id)."""
        hx = self.hx
        err = error_from_outcome(out)
        kind = out.get("kind")
        if kind == "stream_interrupted":
            reason = out.get("stream_reason")
            cls = hx.ReadTimeout if reason in ("idle_timeout", "deadline") else hx.RemoteProtocolError
        elif kind in ("timeout", "deadline_exceeded"):
            cls = hx.ReadTimeout
        elif kind in ("network", "circuit_open"):
            cls = hx.ConnectError
        else:                   # response_too_large, cancelled, a lost response
            cls = hx.ReadError
        exc: Exception = cls(f"llmretry: {err}", request=request)
        exc.__cause__ = err
        return exc

    def close(self) -> None:
        if self.owns_client:
            self.client.close()

    # -- sync -----------------------------------------------------------------

    def handle(self, request: Any) -> Optional[Any]:
        """The response for a request the engine carries; None for others."""
        call = self.call_of(request, request.read()) if self.carries(request) else None
        if call is None:
            return None
        if not call.stream:
            return self.response(request, self.done(request, call.engine.call(call.payload,
                                                                              **call.kwargs)),
                                 False)
        raw = call.engine.stream(call.payload, **call.kwargs)
        try:
            first = raw.next_chunk()
        except BaseException:
            _cancel(raw)
            raise
        if first is None:
            return self.response(request, self.done(request, raw.outcome()), call.stream)
        return self.stream_response(request, raw.response_head(),
                                    self.sync_events(self, request, raw, first))

    # -- asyncio --------------------------------------------------------------

    async def ahandle(self, request: Any) -> Optional[Any]:
        """handle() on the running loop's channel (no thread per request)."""
        call = self.call_of(request, await request.aread()) if self.carries(request) else None
        if call is None:
            return None
        lc = _aio._loop_channel(self.client, call.engine)
        kwargs = dict(call.kwargs, **_aio._group_kw(call.engine))
        start = lc.channel.stream if call.stream else lc.channel.call
        raw = start(call.payload, **kwargs)
        s = _aio.AsyncStream(raw, lc, _same, _same)
        first = await s._next()     # a cancelled task cancels the call
        if first is None:
            return self.response(request, self.done(request, raw.outcome()), call.stream)
        return self.stream_response(request, raw.response_head(),
                                    self.async_events(self, request, s, first))


def _accepts_json(accept: Optional[str]) -> Optional[bool]:
    """What a request's Accept header says of a JSON answer: True when it
    names a JSON type, False when it names only others (the SDK's binary
    endpoints: application/octet-stream, application/binary), None when it
    takes anything (no header, ``*/*``, ``application/*``) or an event
    stream."""
    if not accept:
        return None
    anything = False
    for part in accept.split(","):
        media = part.split(";", 1)[0].strip().lower()
        if media == "application/json" or media.endswith("+json"):
            return True
        # An event stream is the engine's to read as one, as before.
        anything = anything or media in ("*/*", "application/*", "text/event-stream")
    return None if anything else False


def _same(value: Any) -> Any:
    return value


def _timeout_ms(timeout: Any) -> Optional[int]:
    """The attempt timeout of httpx's per-request timeout: its read timeout
    (the SDK's ``timeout=``), else the longest one it sets."""
    if not isinstance(timeout, dict):
        return None
    seconds = timeout.get("read")
    if seconds is None:
        seconds = max((v for v in timeout.values() if isinstance(v, (int, float))), default=None)
    if seconds is None:
        return None
    return max(1, int(seconds * 1000))


def _cancel(raw: Any) -> None:
    """Cancel a sync stream and read it to its end (its last event is
    delivered here)."""
    if not raw.done:
        raw.cancel()
        while raw.next_chunk() is not None:
            pass


class _SyncEvents:
    """A stream's body for a sync client: the SSE bytes of each chunk as it
    comes; a failure after the first raises the flavour's error from the
    iterator; closing it early cancels the call."""

    def __init__(self, core: TransportCore, request: Any, raw: Any,
                 first: Tuple[Optional[str], bytes]) -> None:
        self.core = core
        self.request = request
        self.raw = raw
        self.first: Optional[Tuple[Optional[str], bytes]] = first

    def __iter__(self) -> Iterator[bytes]:
        raw = self.raw
        item = self.first
        self.first = None
        while item is not None:
            yield _sse(item)
            item = raw.next_chunk()
        out = self.core.done(self.request, raw.outcome())
        if not out["ok"]:
            raise self.core.error(self.request, out)
        yield _DONE

    def close(self) -> None:
        _cancel(self.raw)


class _AsyncEvents:
    """_SyncEvents on the event loop."""

    def __init__(self, core: TransportCore, request: Any, stream: "_aio.AsyncStream",
                 first: Tuple[Optional[str], bytes]) -> None:
        self.core = core
        self.request = request
        self.stream = stream
        self.first: Optional[Tuple[Optional[str], bytes]] = first

    async def __aiter__(self) -> AsyncIterator[bytes]:
        s = self.stream
        item = self.first
        self.first = None
        while item is not None:
            yield _sse(item)
            item = await s._next()
        out = self.core.done(self.request, s._raw.outcome())
        if not out["ok"]:
            raise self.core.error(self.request, out)
        yield _DONE

    async def aclose(self) -> None:
        await self.stream.aclose()


# ---------------------------------------------------------------------------
# The transports, less their flavour: llmretry.httpx and llmretry.httpx2 mix
# these into their flavour's BaseTransport and AsyncBaseTransport (``_hx``).

class SyncTransportBase:
    """Transport's methods (see llmretry.httpx.Transport)."""

    _hx: Any

    def __init__(self, **options: Any) -> None:
        self._core = TransportCore(self._hx, options, f"{type(self).__name__}()")
        self._plain: Any = None

    def handle_request(self, request: Any) -> Any:
        response = self._core.handle(request)
        if response is not None:
            return response
        if self._plain is None:     # not a call: as httpx would send it
            self._plain = self._hx.HTTPTransport()
        return self._plain.handle_request(request)

    def close(self) -> None:
        self._core.close()
        if self._plain is not None:
            self._plain.close()

    def __repr__(self) -> str:
        return f"{type(self).__module__}.{type(self).__name__}({self._core.client!r})"


class AsyncTransportBase:
    """AsyncTransport's methods (see llmretry.httpx.AsyncTransport)."""

    _hx: Any

    def __init__(self, **options: Any) -> None:
        self._core = TransportCore(self._hx, options, f"{type(self).__name__}()")
        self._plain: Any = None

    async def handle_async_request(self, request: Any) -> Any:
        response = await self._core.ahandle(request)
        if response is not None:
            return response
        if self._plain is None:
            self._plain = self._hx.AsyncHTTPTransport()
        return await self._plain.handle_async_request(request)

    async def aclose(self) -> None:
        self._core.close()
        if self._plain is not None:
            await self._plain.aclose()

    def __repr__(self) -> str:
        return f"{type(self).__module__}.{type(self).__name__}({self._core.client!r})"
