"""A fault-injecting, OpenAI-compatible mock chat server (stdlib only).

It ships in the package so that the project's C, Python and Lua test suites,
and users testing their own code, can script a server's behaviour request by
request: statuses, every ``Retry-After`` form, delays, resets, truncated or
invalid bodies, huge bodies, stalls, trickled responses, SSE streams
with every stream fault (``stream``, below), rate limits and outages.

Python use::

    from llmretry.testing import MockServer

    with MockServer() as mock:
        mock.script("flaky", [{"status": 503, "retry_after": "0"}, {}])
        url = mock.scenario_url("flaky")   # http://127.0.0.1:PORT/s/flaky/v1
        ...                                # POST url + "/chat/completions"
        assert len(mock.requests("flaky")) == 2

Command line (this is how the C and Lua suites start it)::

    python -m llmretry.testing --port 0 [--host 127.0.0.1] \
        [--scenarios FILE.json] [--strict]

prints the port alone on the first line of stdout (flushed), then serves until
SIGTERM or SIGINT and exits with status 0. ``--scenarios`` loads
``{name: {"steps": [...], "after": step, "limits": {...}, "outage": {...},
"route": {...}}}`` before serving.
Nothing else is written to stdout; requests are not logged.

The server is an ``http.server.ThreadingHTTPServer`` speaking HTTP/1.1 with
keep-alive (one daemon thread per connection). ``Expect: 100-continue`` is
honoured, request bodies are read by ``Content-Length`` (a chunked request body
is decoded too), and accepted sockets have ``TCP_NODELAY`` set.

Chat endpoint
-------------
``POST /v1/chat/completions`` uses scenario ``"default"``;
``POST /s/<name>/v1/chat/completions`` uses scenario ``<name>``. Any path
ending in ``/chat/completions``, ``/completions``, ``/embeddings`` or
``/responses`` is accepted (a success answers in that API's shape, see
``content``; a stream's shape is the step's ``stream.api``); the scenario
is the (percent-decoded) segment after a leading ``/s/``, else
``"default"``. The
query string is ignored for routing. Other paths get a 404 JSON error;
another method on a chat path gets a 405 JSON error (neither is recorded).

Each request to a scenario consumes the next step of its script; once the steps
are exhausted requests get the scenario's ``after`` step (default: a plain 200
success). Unknown scenarios behave as an empty script (plain success), and
their requests are recorded too. Every request is recorded, whatever its step
does (faults included), *before* the step is executed, so a test can inspect
the record of a request the server is still stalling.

Control API (JSON in and out)
-----------------------------
``PUT /_mock/scenarios/<name>`` with ``{"steps": [step, ...], "after": step?,
    "limits": {...}?, "outage": {...}?, "route": {...}?}`` -> 204. Replaces the script, resets
    its cursor and clears its records (and its rate-limit windows and totals,
    its outage counts, and a ``PUT /_mock/outage``). A missing ``steps`` means
    ``[]``; a missing or null ``after`` means the plain success; a missing or
    null ``limits`` means no rate limits (see "Rate limits"); a missing or
    null ``outage`` means no scripted outage (see "Outages"); a missing or
    null ``route`` routes nothing (see "Routing by model"). A malformed
    script (not JSON, a step that is not an object, an unknown ``fault``, a
    field of the wrong type, bad ``limits``, ``outage`` or ``route``) -> 400
    JSON error, and the previous script is kept.
``GET /_mock/requests/<name>``
    -> 200, a JSON array of records in arrival order::

        {"index": n, "time": unix_seconds_float, "method": "POST",
         "path": "...", "headers": {lower-case-name: value},
         "body": "<request body text>", "client_port": int,
         "connection": int, "step": int, "outage": bool}

    ``index`` is the 0-based ordinal of the request among those the scenario
    received since it was last scripted (so it equals ``step`` while steps
    remain and no request was refused by limits); ``DELETE`` clears records
    but does not reset it. ``time`` is taken when the request has been fully
    read. ``path`` is the request target as
    sent (query included). A header sent more than once is joined with
    ``", "``. ``body`` is the body decoded as UTF-8 (invalid bytes replaced).
    ``connection`` is the server-assigned id of the TCP connection (1-based,
    in accept order), so keep-alive reuse is visible. ``step`` is the index of
    the step used, -1 for ``after``. The record of a streamed response also
    has ``"events_sent": int`` and ``"client_gone": bool``, updated as the
    stream goes (see ``stream``). The records of a scenario with limits also
    have ``"rate_limited"`` and ``"tokens_charged"``, and a refused request's
    ``step`` is null (see "Rate limits"). ``outage`` is true for a request
    that met an outage (see "Outages").
``DELETE /_mock/requests/<name>`` -> 204 (clears the records).
``GET /_mock/limits/<name>`` -> ``{"admitted": n, "refused": n, "tokens": n}``,
    the totals of a scenario with limits since it was scripted (``tokens``:
    tokens charged to admitted requests); 404 JSON error for a scenario
    without limits.
``PUT``, ``DELETE``, ``GET /_mock/outage/<name>``: see "Outages".
``GET /_mock/connections`` -> ``{"accepted": N}``, TCP connections accepted
    since start.
``GET /_mock/health`` -> ``{"ok": true}``.
``POST /_mock/batches/<id>/advance``, ``PUT /_mock/batches``: the Batch API's
    clock (below).

Files and Batch APIs
--------------------
``/v1/files`` (upload as multipart, list, retrieve, ``/content``, delete) and
``/v1/batches`` (create, retrieve, ``/cancel``, list), with or without a
``/s/<name>`` prefix (one store per server), are in ``llmretry._mock_batches``
and tests/mock_protocol.md ("Batch API"): a batch moves validating ->
in_progress -> finalizing -> completed (or failed, expired, cancelled) when
``POST /_mock/batches/<id>/advance`` says so (``{}`` one step, ``{"to":
"completed"}``, ``{"to": "expired", "completed": K}``), or at each retrieve
after ``PUT /_mock/batches {"auto": true}`` (or ``{"auto": {"to": ...}}``);
``PUT /_mock/batches {"fail": N}`` makes the next N of their requests answer 503.

Error bodies of the mock itself have the OpenAI shape
``{"error": {"message": ..., "type": "invalid_request_error", "code": null}}``.

Step fields (all optional; unknown fields are ignored)
------------------------------------------------------
``status``
    int (100..999), default 200.
``headers``
    ``{name: value}`` extra response headers.
``retry_after``, ``retry_after_ms``, ``should_retry``,
``ratelimit_reset_requests``, ``ratelimit_reset_tokens``
    shortcuts for ``Retry-After``, ``retry-after-ms``, ``x-should-retry``,
    ``x-ratelimit-reset-requests`` and ``x-ratelimit-reset-tokens``.

    Header values are sent verbatim, so garbage can be sent: strings as they
    are, numbers ``str()``'d, JSON booleans as ``true``/``false``; a null value
    omits the header. Response headers are, in order: ``Date``,
    ``Content-Type: application/json``, ``Content-Length`` (omitted for 204
    and 304, which have no body), then the shortcuts, then ``headers``. A later
    header replaces an earlier one of the same name (case-insensitively), so a
    step may override even ``Content-Type`` or ``Content-Length``. A step
    header ``Connection: close`` makes the server close after the response.
``error_code``
    for a non-2xx status the error body is ``{"error": {"message": "mock error
    <status>", "type": <error_code or "server_error">, "code": <error_code or
    null>}}``; that default error body (with a null code) is used for any
    non-2xx without ``body``.
``body``
    a str sent verbatim (UTF-8), or any other JSON value serialised
    (``"body": null`` sends ``null``); overrides the generated body.
``content``, ``model``, ``usage``, ``system_fingerprint``
    the success body (2xx without ``body``) is an OpenAI chat.completion::

        {"id": "chatcmpl-mock-<n>", "object": "chat.completion",
         "created": <int>, "model": <model>, "system_fingerprint": <fp>,
         "choices": [{"index": 0, "message": {"role": "assistant",
                      "content": <content>}, "finish_reason": "stop"}],
         "usage": <usage>}

    with ``content`` default ``"ok"``, ``model`` default the request body's
    ``"model"`` (when the body is a JSON object with a string ``model``), else
    ``"mock-model"``, ``usage`` default ``{"prompt_tokens": 12,
    "completion_tokens": 3, "total_tokens": 15}``, ``system_fingerprint``
    default ``"fp_mock"``. ``<n>`` is the server-wide 1-based ordinal of the
    chat request. The request's messages are never echoed.

    The other paths answer in their API's shape, with the same fields:
    ``/completions`` a ``text_completion`` (``choices[0].text`` =
    ``content``); ``/responses`` a ``response`` (``status: "completed"``,
    one ``message`` output item whose ``output_text`` part is ``content``,
    ``usage`` named ``input_tokens`` / ``output_tokens``); ``/embeddings``
    ``{"object": "list", "model": <model>, "data": [{"object": "embedding",
    "index": i, "embedding": <embedding>}, ...], "usage": <usage>}``, one
    item per input (the request's ``input`` list, else one), ``embedding``
    (a step field) default ``[0.0, 0.25, -0.5]``, ``usage`` default
    ``{"prompt_tokens": 8, "total_tokens": 8}`` (no completion tokens).
``delay_ms``
    wait this long before sending anything (also before any fault).
``fault``
    one of:

    ``"reset"``
        abort the connection with a TCP RST (``SO_LINGER`` 0) without
        responding.
    ``"close"``
        close the connection (FIN) without responding.
    ``"no_headers"``
        never respond; hold the connection for ``stall_ms`` (default 30000),
        then close.
    ``"stall_body"``
        send status and headers (with the full ``Content-Length``) and the
        first half (``len // 2`` bytes) of the body, hold for ``stall_ms``
        (default 30000), then close.
    ``"truncate"``
        send the headers with the full ``Content-Length`` and the first half
        of the body, then close.
    ``"invalid_json"``
        status 200 (or ``status``) with body ``{"choices": [ not json``
        (overrides ``body``).
    ``"huge"``
        a valid chat.completion whose content (the step's ``content``, default
        ``"ok"``, followed by ``x`` padding) makes the body exactly ``size``
        bytes (default 64 MiB), streamed in chunks. A ``size`` smaller than
        the unpadded body sends the unpadded body.
    ``"trickle"``
        send the normal response (status line, headers and body) one byte
        every ``interval_ms`` (default 1000); the first byte goes at once.
        The connection stays usable afterwards.

``idle_close_ms``
    a number >= 0: after this step's answer, if the connection stays open,
    the server waits at most this long for the connection's next request,
    then closes it (FIN) unasked, as uvicorn does after its 5 s keep-alive
    timeout. The request's record has ``"idle_closed": false`` from the
    start, true once the FIN is sent (a test may wait for it before the
    next call).

``stream``
    ``true`` or an object: answer with an SSE stream of
    ``chat.completion.chunk`` events (``Content-Type: text/event-stream``,
    chunked), with the stream's faults: chunks and delays, ``end`` one of
    ``done``, ``no_done``, ``drop``, ``reset``, ``stall``, ``error_event``
    after ``after`` events, CR/CRLF line ends, keep-alive comments, a BOM,
    split writes, the usage chunk, tool calls, a role-only stream
    (``role_only``), a body held open or fed junk after ``[DONE]``
    (``after_done``), a ``Content-Length`` never met (``framing:
    "length"``), the Responses API's typed events with or without
    ``event:`` lines (``api: "responses"``, ``event_lines``). ``false``:
    never stream. A
    request body with ``"stream": true`` gets the default stream from a 2xx
    step without ``stream``, ``body`` or ``fault``; a non-2xx step answers it
    with its JSON error. The fields and the records' ``events_sent`` and
    ``client_gone`` are described in ``llmretry._mock_sse``.

Rate limits
-----------
A script's ``limits`` (all fields optional; unknown fields are an error)::

    {"rpm": N, "tpm": M, "window_ms": 60000, "retry_after": true,
     "rate_headers": true, "stated_per": "minute"}

make the scenario enforce provider-like limits: ``rpm`` requests and ``tpm``
tokens per sliding window of ``window_ms`` ms (integers >= 1; absent or null:
that dimension is not limited; ``window_ms`` any number > 0). ``{}`` limits
nothing but still counts (records, totals).

* Charge. A request costs ``ceil(C / 4) + B`` tokens, computed when it is
  admitted, as OpenAI estimates: ``C`` is the number of characters (code
  points) of every message's ``content`` string (for a content list, its
  strings and its parts' ``text`` strings) plus the body's ``input`` and
  ``prompt`` (same rules); ``B`` is the body's ``max_completion_tokens``, else
  its ``max_tokens`` (integers >= 0), else the ``completion_tokens`` of the
  ``usage`` of the step the request would get (default 3). A body that is not
  a JSON object costs just that usage's completion tokens.
* Admission. The window holds the requests admitted in the last
  ``window_ms`` (one admitted at ``t`` counts while ``now < t + window``). A
  request is admitted when (requests in the window) < ``rpm`` and (tokens in
  the window) + its cost <= ``tpm``; it is then charged and consumes its step
  as usual. Otherwise it is refused at once (no step consumed, no delay,
  nothing charged, JSON even for ``"stream": true``) with 429 and
  ``{"error": {"message": "Rate limit reached for <type> ...", "type":
  <type>, "code": "rate_limit_exceeded"}}``, ``<type>`` ``"requests"`` when
  the request limit is hit, else ``"tokens"``. A request costing more than
  ``tpm`` is always refused. Admission is decided and charged under the
  server's lock, so concurrent requests never overshoot. Streamed steps are
  limited the same way (charged at admission, like any other).
* Headers (``rate_headers``, default true), on every response of the
  scenario, admitted or refused (before the step's shortcuts and
  ``headers``, which may override them), for each limited dimension only,
  describing the window just after the decision (an admitted request
  included)::

      x-ratelimit-limit-requests      rpm per minute: rpm x 60000 / window_ms
                                      (a provider's per-minute limit that it
                                      enforces in window_ms slices); with
                                      ``stated_per: "window"``, rpm itself
                                      (a server stating its window's limit)
      x-ratelimit-remaining-requests  rpm - requests in the window
      x-ratelimit-reset-requests      time until one more request fits the
                                      request limit: 0s while remaining > 0,
                                      else until the oldest request leaves
      x-ratelimit-limit-tokens        tpm per minute (or per window), likewise
      x-ratelimit-remaining-tokens    tpm - tokens in the window (>= 0)
      x-ratelimit-reset-tokens        time until every token in the window
                                      has left (remaining == tpm again):
                                      until the newest charged request
                                      leaves; 0s when none is charged

  Times are rounded up to the millisecond and written as OpenAI does (Go's
  duration format): ``0s``, ``250ms``, ``1s``, ``1.5s``, ``6m0s``,
  ``1m30.5s``, ``1h0m0s``. They are taken at admission, before the step's
  ``delay_ms``. Faults that send no response (``reset``, ``close``,
  ``no_headers``) send no headers either.
* ``Retry-After``. A 429 also has ``Retry-After`` (integer seconds, rounded
  up, at least 1) and ``retry-after-ms`` (integer ms, rounded up, at least 1)
  when ``retry_after`` is true (the default): the wait until this same
  request would be admitted if nothing else arrived (the later of the
  request wait and the wait until enough tokens leave the window; for a
  request larger than ``tpm``, which never fits, ``window_ms``).
  ``retry_after: false``
  sends neither (as LiteLLM's router does), only the rate headers.
* Records get ``"rate_limited": bool`` and ``"tokens_charged": int`` (the
  request's cost; for a refused request the cost it was refused for, which
  was not charged); a refused request's record has ``"step": null`` and an
  ``index`` of its own (``index`` counts every request received, ``step``
  only admitted ones). ``DELETE /_mock/requests/<name>`` does not reset the
  windows or totals; a new script does.

Outages
-------
A scenario can be down, as a provider in an outage, and come back while
calls run. Modes: ``"503"`` (every request gets 503 and ``{"error":
{"message": "mock outage: the service is unavailable", "type":
"server_error", "code": null}}``, JSON even for a stream request, the
connection kept), ``"reset"`` (a TCP RST, no answer), ``"close"`` (a FIN, no
answer), ``"hang"`` (no answer until the client closes the connection or the
server stops; a hung request stays unanswered when the outage ends).

While down nothing past the outage runs: no step is consumed (the script
resumes where it was), no delay, no limiter (nothing admitted, refused or
charged). Requests are recorded as usual with ``"outage": true`` and
``"step": null`` (with limits also ``"rate_limited": false,
"tokens_charged": 0``); a hang's record has ``"client_gone"``, true once the
server noticed the client left.

``PUT /_mock/outage/<name>`` with ``{"mode": "503", "for_ms": N}`` (both
    optional: ``mode`` default ``"503"``; ``for_ms`` a number > 0, null or
    absent: until DELETE) -> 204: down from now, for ``for_ms`` ms, replacing
    an earlier PUT; a new script of the scenario ends it. A bad mode, field
    or ``for_ms`` -> 400 JSON error.
``DELETE /_mock/outage/<name>`` -> 204: ends the PUT outage (a scripted
    window is not affected).
A script's ``"outage": {"mode": "503", "from_ms": 0, "to_ms": null}``
    (defaults shown; unknown fields, ``from_ms`` < 0 or ``to_ms`` <=
    ``from_ms`` are errors): requests at ``from_ms <= t < to_ms`` meet the
    outage (``to_ms`` null: from ``from_ms`` on), ``t`` counted from the
    scenario's first request after the script (that request is at 0), not
    from the PUT, so a client's start-up does not shift the window. A PUT
    outage, while on, wins over it.
``GET /_mock/outage/<name>`` -> ``{"down": bool, "mode": str or null,
    "during": n, "outside": n}``: whether a request arriving now would meet
    an outage (before the first request the window's clock reads 0), its
    mode, and the scenario's requests since the script that met one or did
    not (``DELETE /_mock/requests`` keeps the counts).

Routing by model
----------------
A script's ``"route": {"<model>": "<scenario>", ...}`` hands each request to
this scenario whose body is a JSON object with a string ``model`` listed
there to that other scenario, as if it had been sent to its path: it takes
that scenario's steps, limits and outage and is recorded there (and not
here). One hop: the other scenario's own ``route`` is not followed. So one
batch sent to one URL can meet a different script per row (rows whose model
is ``"m-400"`` answered 400 for good, the others with the scenario's own
steps). Keys and values are non-empty strings.

Strict mode
-----------
``MockServer(strict=True)`` (``--strict``) refuses what a real OpenAI server
refuses, as it does, so that a test catches the mistake a lenient mock would
answer with a success; the docs' examples use it. With it:

* a path that is not an OpenAI route gets 404 and ``{"error": {"message":
  "Invalid URL (POST /vi/chat/completions)", "type": "invalid_request_error",
  "param": null, "code": null}}``. The routes: ``/v1/`` then
  ``chat/completions``, ``completions``, ``responses``, ``embeddings``,
  ``files``, ``batches`` or ``models`` (and what is under them), after an
  optional ``/s/<name>``; ``/_mock/`` is the mock's own.
* a POST to ``/v1/chat/completions`` whose body is not a JSON object, or
  lacks ``model`` (a string) or ``messages`` (a non-empty array), gets 400
  and e.g. ``{"error": {"message": "Missing required parameter:
  'messages'.", "type": "invalid_request_error", "param": "messages",
  "code": "missing_required_parameter"}}`` (``code`` ``invalid_type`` for a
  wrong type, ``empty_array`` for ``[]``; ``param`` null for a body that is
  not JSON). ``/v1/responses`` and ``/v1/completions`` need ``model``,
  ``/v1/embeddings`` ``model`` and ``input``.

Refused requests are not recorded and consume no step. Everything else is
as without it.

Stalls, delays and trickles wait on an event that ``stop()`` sets, and
``stop()`` also shuts down the sockets of open connections, so it returns
promptly (well under a second) even while threads are stalled.

Python API
----------
``MockServer(host="127.0.0.1", port=0, *, strict=False)``: ``.start()`` (returns self),
``.stop()``, context manager (starts on enter, stops on exit); ``.port``,
``.base_url`` (``"http://127.0.0.1:PORT/v1"``), ``.scenario_url(name)`` (the
scenario's base_url, ``http://127.0.0.1:PORT/s/<name>/v1``),
``.script(name, steps, after=None, limits=None, outage=None, route=None)``
(validated like the PUT), ``.load_scenarios({name: {"steps": ..., "after":
..., "limits": ..., "outage": ..., "route": ...}})``, ``.limit_stats(name)`` (the
``/_mock/limits`` totals; ``KeyError`` without limits),
``.outage(name, mode="503", for_ms=None)``, ``.end_outage(name)``,
``.outage_stats(name)`` (PUT, DELETE and GET of ``/_mock/outage``),
``.requests(name)`` (a copy of the records), ``.clear(name)``,
``.connections_accepted``. A stopped server cannot be restarted.
"""

from __future__ import annotations

import argparse
import copy
import email.utils
import http
import json
import math
import os
import re
import selectors
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import (Any, Callable, Deque, Dict, List, Mapping, Optional,
                    Sequence, Set, Tuple, Type)
from urllib.parse import quote, unquote, urlsplit

from . import _mock_batches, _mock_sse

__all__ = ["MockServer", "ScriptError", "main"]

Step = Dict[str, Any]
Record = Dict[str, Any]

FAULTS = frozenset(
    {"reset", "close", "no_headers", "stall_body", "truncate", "invalid_json",
     "huge", "trickle"})

HEADER_SHORTCUTS: Tuple[Tuple[str, str], ...] = (
    ("retry_after", "Retry-After"),
    ("retry_after_ms", "retry-after-ms"),
    ("should_retry", "x-should-retry"),
    ("ratelimit_reset_requests", "x-ratelimit-reset-requests"),
    ("ratelimit_reset_tokens", "x-ratelimit-reset-tokens"),
)

DEFAULT_USAGE: Dict[str, int] = {
    "prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
# An embeddings answer's: one vector per input, and usage without completion
# tokens (as OpenAI's /v1/embeddings reports it).
DEFAULT_EMBEDDING: Tuple[float, ...] = (0.0, 0.25, -0.5)
DEFAULT_EMBEDDING_USAGE: Dict[str, int] = {"prompt_tokens": 8, "total_tokens": 8}
DEFAULT_STALL_MS = 30000
DEFAULT_INTERVAL_MS = 1000
DEFAULT_HUGE_SIZE = 64 * 1024 * 1024
INVALID_JSON_BODY = b'{"choices": [ not json'

_CHUNK = 256 * 1024
_PADDING = b"x" * _CHUNK
_MAX_BODY = 1 << 31
_NO_BODY_STATUSES = frozenset({204, 304})


class ScriptError(ValueError):
    """A scenario script that does not follow the protocol."""


# --------------------------------------------------------------------------
# Validation and response building
# --------------------------------------------------------------------------

def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_step(step: Any, where: str) -> Step:
    """Validate one step; return it (a dict) or raise ScriptError."""
    if not isinstance(step, dict):
        raise ScriptError(f"{where}: a step must be a JSON object")
    status = step.get("status", 200)
    if isinstance(status, bool) or not isinstance(status, int) \
            or not 100 <= status <= 999:
        raise ScriptError(f"{where}: status must be an integer in 100..999")
    headers = step.get("headers")
    if headers is not None:
        if not isinstance(headers, dict):
            raise ScriptError(f"{where}: headers must be an object")
        for name, value in headers.items():
            if not name or not isinstance(name, str):
                raise ScriptError(f"{where}: bad header name {name!r}")
            _check_header_value(value, f"{where}: header {name}")
    for key, _ in HEADER_SHORTCUTS:
        if key in step:
            _check_header_value(step[key], f"{where}: {key}")
    for key in ("delay_ms", "stall_ms", "interval_ms", "idle_close_ms"):
        if key in step and (not _is_number(step[key]) or step[key] < 0):
            raise ScriptError(f"{where}: {key} must be a number >= 0")
    if "size" in step:
        size = step["size"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ScriptError(f"{where}: size must be an integer >= 0")
    fault = step.get("fault")
    if fault is not None and fault not in FAULTS:
        raise ScriptError(
            f"{where}: unknown fault {fault!r} (one of {sorted(FAULTS)})")
    try:
        _mock_sse.check_stream(step, where)
    except _mock_sse.BadStream as exc:
        raise ScriptError(str(exc)) from None
    return step


def _check_header_value(value: Any, where: str) -> None:
    if value is not None and not isinstance(value, (str, int, float, bool)):
        raise ScriptError(f"{where}: a header value must be a string, "
                          "number, boolean or null")


def _check_script(steps: Any, after: Any) -> Tuple[List[Step], Optional[Step]]:
    if steps is None:
        steps = []
    if not isinstance(steps, list):
        raise ScriptError("steps must be an array")
    checked = [_check_step(s, f"steps[{i}]") for i, s in enumerate(steps)]
    if after is not None:
        after = _check_step(after, "after")
    return copy.deepcopy(checked), copy.deepcopy(after)


LIMIT_KEYS = frozenset({"rpm", "tpm", "window_ms", "retry_after",
                        "rate_headers", "stated_per"})
DEFAULT_WINDOW_MS = 60000
DEFAULT_COMPLETION_TOKENS = DEFAULT_USAGE["completion_tokens"]


def _check_fields(obj: Any, name: str, known: "frozenset[str]") -> None:
    """A script's object field: an object of known keys only."""
    if not isinstance(obj, dict):
        raise ScriptError(f"{name} must be an object")
    unknown = sorted(set(obj) - known)
    if unknown:
        raise ScriptError(f"{name}: unknown field(s) {unknown} (known: {sorted(known)})")


def _check_limits(limits: Any) -> Optional[Dict[str, Any]]:
    """Validate a script's ``limits``; return it with defaults filled in.

    Unknown keys are errors (unlike a step's): a misspelt ``rmp`` would
    otherwise silently leave the scenario unlimited.
    """
    if limits is None:
        return None
    _check_fields(limits, "limits", LIMIT_KEYS)
    for key in ("rpm", "tpm"):
        value = limits.get(key)
        if value is not None and (isinstance(value, bool)
                                  or not isinstance(value, int) or value < 1):
            raise ScriptError(f"limits: {key} must be an integer >= 1 or null")
    window = limits.get("window_ms", DEFAULT_WINDOW_MS)
    if not _is_number(window) or not 0 < window < float("inf"):
        raise ScriptError("limits: window_ms must be a number > 0")
    for key in ("retry_after", "rate_headers"):
        if key in limits and not isinstance(limits[key], bool):
            raise ScriptError(f"limits: {key} must be a boolean")
    stated_per = limits.get("stated_per", "minute")
    if stated_per not in ("minute", "window"):
        raise ScriptError('limits: stated_per must be "minute" or "window"')
    return {"rpm": limits.get("rpm"), "tpm": limits.get("tpm"),
            "window_ms": window,
            "retry_after": limits.get("retry_after", True),
            "rate_headers": limits.get("rate_headers", True),
            "stated_per": stated_per}


OUTAGE_MODES = frozenset({"503", "reset", "close", "hang"})
OUTAGE_KEYS = frozenset({"mode", "from_ms", "to_ms"})
OUTAGE_BODY = json.dumps({"error": {
    "message": "mock outage: the service is unavailable",
    "type": "server_error", "code": None}}).encode("utf-8")
_HANG_POLL = 0.05


def _check_outage_mode(mode: Any, where: str) -> str:
    if mode not in OUTAGE_MODES:
        raise ScriptError(f"{where}: unknown outage mode {mode!r} "
                          f"(one of {sorted(OUTAGE_MODES)})")
    return str(mode)


def _check_outage(outage: Any) -> Optional[Dict[str, Any]]:
    """Validate a script's ``outage`` window; return it with defaults.

    Unknown keys are errors, as in ``limits``: a misspelt ``to`` would
    otherwise leave the scenario down for good.
    """
    if outage is None:
        return None
    _check_fields(outage, "outage", OUTAGE_KEYS)
    mode = _check_outage_mode(outage.get("mode", "503"), "outage")
    start = outage.get("from_ms", 0)
    if not _is_number(start) or not 0 <= start < float("inf"):
        raise ScriptError("outage: from_ms must be a number >= 0")
    end = outage.get("to_ms")
    if end is not None and (not _is_number(end) or not end > start):
        raise ScriptError("outage: to_ms must be a number > from_ms, or null")
    return {"mode": mode, "from_ms": start, "to_ms": end}


def _check_route(route: Any) -> Optional[Dict[str, str]]:
    """Validate a script's ``route``: model -> scenario, non-empty strings."""
    if route is None:
        return None
    if not isinstance(route, dict):
        raise ScriptError("route must be an object of model -> scenario")
    for model, target in route.items():
        if not isinstance(model, str) or not model \
                or not isinstance(target, str) or not target:
            raise ScriptError(f"route: {model!r} -> {target!r}: models and "
                              f"scenarios must be non-empty strings")
    return dict(route)


def _text_length(value: Any) -> int:
    """Characters of a content/input/prompt value: a string, or a list of
    strings and content parts (``{"type": "text", "text": ...}``)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        total = 0
        for item in value:
            if isinstance(item, str):
                total += len(item)
            elif isinstance(item, dict) and isinstance(item.get("text"), str):
                total += len(item["text"])
        return total
    return 0


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) \
        and value >= 0


def _token_charge(request: Any, step: Step) -> int:
    """Tokens a request is charged at admission (OpenAI's estimate).

    ceil(prompt characters / 4) plus the completion budget: the body's
    ``max_completion_tokens`` or ``max_tokens``, else the completion_tokens
    of the usage the step would answer with.
    """
    chars = 0
    budget: Optional[int] = None
    if isinstance(request, dict):
        messages = request.get("messages")
        if isinstance(messages, list):
            for message in messages:
                if isinstance(message, dict):
                    chars += _text_length(message.get("content"))
        chars += _text_length(request.get("input"))
        chars += _text_length(request.get("prompt"))
        for key in ("max_completion_tokens", "max_tokens"):
            if _is_count(request.get(key)):
                budget = request[key]
                break
    if budget is None:
        usage = step.get("usage")
        budget = DEFAULT_COMPLETION_TOKENS
        if isinstance(usage, dict) \
                and _is_count(usage.get("completion_tokens")):
            budget = usage["completion_tokens"]
    return (chars + 3) // 4 + budget


def _duration(seconds: float) -> str:
    """A wait in OpenAI's (Go's time.Duration) format, rounded up to a
    millisecond: "0s", "250ms", "1s", "1.5s", "6m0s", "1m30.5s", "1h0m0s"."""
    ms = math.ceil(seconds * 1000) if seconds > 0 else 0
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3600000)
    minutes, rest = divmod(rest, 60000)
    secs, frac = divmod(rest, 1000)
    text = str(secs) + (f".{frac:03d}".rstrip("0") if frac else "") + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    if minutes:
        return f"{minutes}m{text}"
    return text


def _header_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _step_headers(step: Step) -> List[Tuple[str, str]]:
    """The step's own response headers: shortcuts first, then ``headers``."""
    out: List[Tuple[str, str]] = []
    for key, name in HEADER_SHORTCUTS:
        value = step.get(key)
        if value is not None:
            out.append((name, _header_text(value)))
    for name, value in (step.get("headers") or {}).items():
        if value is not None:
            out.append((name, _header_text(value)))
    return out


def _merge_headers(base: List[Tuple[str, str]],
                   extra: Sequence[Tuple[str, str]]) -> List[Tuple[str, str]]:
    """Later headers replace earlier ones of the same (case-less) name."""
    out = list(base)
    for name, value in extra:
        lower = name.lower()
        for i, (old, _) in enumerate(out):
            if old.lower() == lower:
                out[i] = (name, value)
                break
        else:
            out.append((name, value))
    return out


def _reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def _error_body(status: int, error_code: Any) -> Dict[str, Any]:
    return {"error": {"message": f"mock error {status}",
                      "type": error_code if error_code is not None
                      else "server_error",
                      "code": error_code}}


# Strict mode (MockServer(strict=True), --strict): the requests a real
# OpenAI server refuses are refused here too, with its statuses and error
# shape, so that a test catches a wrong base_url or a body missing what every
# call needs instead of getting a success from a lenient mock. Nothing else
# changes: a request that passes gets its scenario's step as usual.
_OPENAI_PATH = re.compile(
    r"/v1/(chat/completions|completions|responses|embeddings|files|batches|models)(?:/|$)")
# Each endpoint's required body fields, with the JSON type each must have.
_REQUIRED: Dict[str, Tuple[Tuple[str, Any, str], ...]] = {
    "chat/completions": (("model", str, "a string"), ("messages", list, "an array of objects")),
    "completions": (("model", str, "a string"),),
    "responses": (("model", str, "a string"),),
    "embeddings": (("model", str, "a string"), ("input", (str, list), "a string or an array")),
}


def _openai_error(message: str, param: Optional[str] = None,
                  code: Optional[str] = None) -> Dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error",
                      "param": param, "code": code}}


def _strict_refusal(method: str, path: str,
                    body: bytes) -> Optional[Tuple[int, Dict[str, Any]]]:
    """(status, error body) for a request OpenAI would refuse, else None."""
    rest = path
    if rest.startswith("/s/"):      # the scenario prefix is the mock's own
        rest = rest[3:]
        rest = rest[rest.find("/"):] if "/" in rest else ""
    match = _OPENAI_PATH.match(rest)
    if match is None:
        return 404, _openai_error(f"Invalid URL ({method} {path})")
    required = _REQUIRED.get(match.group(1)) if method == "POST" and \
        rest == f"/v1/{match.group(1)}" else None
    if required is None:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return 400, _openai_error(
            "We could not parse the JSON body of your request. (The OpenAI API "
            "expects a JSON object.)")
    for name, kind, kind_text in required:
        value = doc.get(name)
        if value is None:
            return 400, _openai_error(f"Missing required parameter: '{name}'.",
                                      name, "missing_required_parameter")
        if not isinstance(value, kind):
            return 400, _openai_error(
                f"Invalid type for '{name}': expected {kind_text}, but got "
                f"{type(value).__name__} instead.", name, "invalid_type")
        if isinstance(value, list) and not value:
            return 400, _openai_error(
                f"Invalid '{name}': empty array. Expected an array with minimum "
                f"length 1, but got an empty array instead.", name, "empty_array")
    return None


def _completion(step: Step, n: int, request_model: Optional[str],
                content: Any) -> Dict[str, Any]:
    model = step.get("model", request_model or "mock-model")
    return {
        "id": f"chatcmpl-mock-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": step.get("system_fingerprint", "fp_mock"),
        "choices": [{"index": 0,
                     "message": {"role": "assistant", "content": content},
                     "finish_reason": "stop"}],
        "usage": step.get("usage", copy.deepcopy(DEFAULT_USAGE)),
    }


def _api_of(path: str) -> str:
    """Which API a path is (what a success answers): "chat", "completions"
    (legacy), "embeddings" or "responses"."""
    if path.endswith("/chat/completions"):
        return "chat"
    for api in ("completions", "embeddings", "responses"):
        if path.endswith("/" + api):
            return api
    return "chat"


def _inputs(request: Any) -> int:
    """How many inputs an embeddings request has (a list's length, else 1)."""
    given = request.get("input") if isinstance(request, dict) else None
    return max(len(given), 1) if isinstance(given, list) else 1


def _api_success(api: str, step: Step, n: int, request_model: Optional[str],
                 request: Any) -> Dict[str, Any]:
    """The success body of a path that is not Chat Completions'."""
    model = step.get("model", request_model or "mock-model")
    content = step.get("content", "ok")
    if api == "embeddings":
        vector = step.get("embedding", list(DEFAULT_EMBEDDING))
        return {"object": "list", "model": model,
                "data": [{"object": "embedding", "index": i, "embedding": vector}
                         for i in range(_inputs(request))],
                "usage": step.get("usage", copy.deepcopy(DEFAULT_EMBEDDING_USAGE))}
    usage = step.get("usage", copy.deepcopy(DEFAULT_USAGE))
    if api == "completions":
        return {"id": f"cmpl-mock-{n}", "object": "text_completion",
                "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "text": content, "logprobs": None,
                             "finish_reason": "stop"}],
                "usage": usage}
    return {"id": f"resp_mock-{n}", "object": "response",
            "created_at": int(time.time()), "status": "completed", "model": model,
            "output": [{"type": "message", "id": f"msg_mock-{n}",
                        "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": content,
                                     "annotations": []}]}],
            "usage": _mock_sse._responses_usage(usage)}


def _response_body(step: Step, status: int, n: int,
                   request_model: Optional[str], api: str = "chat",
                   request: Any = None) -> bytes:
    if step.get("fault") == "invalid_json":
        return INVALID_JSON_BODY
    if "body" in step:
        body = step["body"]
        if isinstance(body, str):
            return body.encode("utf-8")
        return json.dumps(body).encode("utf-8")
    if 200 <= status < 300 and api != "chat":
        doc = _api_success(api, step, n, request_model, request)
    elif 200 <= status < 300:
        doc = _completion(step, n, request_model, step.get("content", "ok"))
    else:
        doc = _error_body(status, step.get("error_code"))
    return json.dumps(doc).encode("utf-8")


def _huge_parts(step: Step, n: int,
                request_model: Optional[str]) -> Tuple[bytes, int, bytes]:
    """(prefix, padding length, suffix) of a ``size``-byte chat.completion."""
    size = step.get("size", DEFAULT_HUGE_SIZE)
    content = step.get("content", "ok")
    if not isinstance(content, str):
        content = "" if content is None else str(content)
    sentinel = "\u0001llmretry-huge\u0001"
    text = json.dumps(_completion(step, n, request_model, sentinel))
    marker = json.dumps(sentinel)
    at = text.index(marker)
    prefix = (text[:at] + json.dumps(content)[:-1]).encode("utf-8")
    suffix = ('"' + text[at + len(marker):]).encode("utf-8")
    return prefix, max(0, size - len(prefix) - len(suffix)), suffix


# --------------------------------------------------------------------------
# Scenario state
# --------------------------------------------------------------------------

class _Limiter:
    """A scenario's rate limits: sliding windows of admitted requests.

    Guarded by the state's lock. ``admit`` decides and charges at once, so
    concurrent requests cannot both take the last slot.
    """

    def __init__(self, config: Dict[str, Any]) -> None:
        self.rpm: Optional[int] = config["rpm"]
        self.tpm: Optional[int] = config["tpm"]
        self.window: float = float(config["window_ms"]) / 1000.0
        self.retry_after: bool = config["retry_after"]
        self.rate_headers: bool = config["rate_headers"]
        self.stated_per_window: bool = config["stated_per"] == "window"
        # (monotonic admission time, tokens charged), oldest first.
        self.entries: Deque[Tuple[float, int]] = deque()
        self.window_tokens = 0
        self.admitted = 0
        self.refused = 0
        self.tokens = 0

    def _prune(self, now: float) -> None:
        # An entry admitted at t counts while now < t + window.
        while self.entries and self.entries[0][0] + self.window <= now:
            self.window_tokens -= self.entries.popleft()[1]

    def _request_wait(self, now: float, extra: int) -> float:
        """Seconds until ``extra`` more requests fit (0: they fit now)."""
        if self.rpm is None:
            return 0.0
        over = len(self.entries) + extra - self.rpm
        if over <= 0:
            return 0.0
        if over > len(self.entries):   # cannot happen for extra <= rpm
            return self.window
        return self.entries[over - 1][0] + self.window - now

    def _token_wait(self, now: float, cost: int) -> float:
        """Seconds until ``cost`` more tokens fit (0: they fit now); for a
        cost above tpm (it never fits), a whole window."""
        if self.tpm is None or self.window_tokens + cost <= self.tpm:
            return 0.0
        if cost > self.tpm:
            return self.window
        left = self.window_tokens
        for at, tokens in self.entries:      # oldest leave first
            left -= tokens
            if left + cost <= self.tpm:
                return at + self.window - now
        return self.window                   # not reached: all leave

    def _tokens_reset(self, now: float) -> float:
        """Seconds until every token charged in the window has expired."""
        for at, tokens in reversed(self.entries):
            if tokens:
                return at + self.window - now
        return 0.0

    def _stated(self, per_window: int) -> int:
        """A limit as the headers state it: per minute, as OpenAI's (a limit
        of 10 per 1 s window is a 600-a-minute limit enforced per second,
        the way providers slice theirs), or with ``stated_per: "window"``
        the window's own figure (as servers with short windows state it)."""
        if self.stated_per_window:
            return per_window
        return max(1, round(per_window * 60.0 / self.window))

    def headers(self, now: float) -> List[Tuple[str, str]]:
        """The x-ratelimit-* headers for the window as it is now."""
        if not self.rate_headers:
            return []
        out: List[Tuple[str, str]] = []
        if self.rpm is not None:
            out += [("x-ratelimit-limit-requests", str(self._stated(self.rpm))),
                    ("x-ratelimit-remaining-requests",
                     str(max(0, self.rpm - len(self.entries)))),
                    ("x-ratelimit-reset-requests",
                     _duration(self._request_wait(now, 1)))]
        if self.tpm is not None:
            out += [("x-ratelimit-limit-tokens", str(self._stated(self.tpm))),
                    ("x-ratelimit-remaining-tokens",
                     str(max(0, self.tpm - self.window_tokens))),
                    ("x-ratelimit-reset-tokens",
                     _duration(self._tokens_reset(now)))]
        return out

    def admit(self, cost: int, name: str
              ) -> Tuple[List[Tuple[str, str]], Optional[bytes]]:
        """Admit (and charge) or refuse one request costing ``cost`` tokens.

        Returns (headers, None) when admitted, else (headers, 429 body).
        """
        now = time.monotonic()
        self._prune(now)
        request_wait = self._request_wait(now, 1)
        token_wait = self._token_wait(now, cost)
        if request_wait <= 0 and token_wait <= 0:
            self.entries.append((now, cost))
            self.window_tokens += cost
            self.admitted += 1
            self.tokens += cost
            return self.headers(now), None
        self.refused += 1
        wait = max(request_wait, token_wait)
        if request_wait > 0:
            kind, limit, used, asked = "requests", self.rpm, \
                len(self.entries), 1
        else:
            kind, limit, used, asked = "tokens", self.tpm, \
                self.window_tokens, cost
        message = (f"Rate limit reached for {kind} in scenario {name!r}: "
                   f"Limit {limit}, Used {used}, Requested {asked}. ")
        if kind == "tokens" and cost > (self.tpm or 0):
            message += "The request is larger than the limit and never fits."
        else:
            message += f"Please try again in {_duration(wait)}."
        body = json.dumps({"error": {"message": message, "type": kind,
                                     "code": "rate_limit_exceeded"}})
        headers = self.headers(now)
        if self.retry_after:
            headers += [("Retry-After", str(max(1, math.ceil(wait)))),
                        ("retry-after-ms",
                         str(max(1, math.ceil(wait * 1000))))]
        return headers, body.encode("utf-8")

    def stats(self) -> Dict[str, int]:
        return {"admitted": self.admitted, "refused": self.refused,
                "tokens": self.tokens}


class _Scenario:
    """A script, its cursor, its records and its limiter (guarded by the
    state's lock)."""

    __slots__ = ("steps", "after", "count", "received", "records", "limiter",
                 "window", "manual", "first", "during", "route")

    def __init__(self, steps: Optional[List[Step]] = None,
                 after: Optional[Step] = None,
                 limits: Optional[Dict[str, Any]] = None,
                 outage: Optional[Dict[str, Any]] = None,
                 route: Optional[Dict[str, str]] = None) -> None:
        self.steps: List[Step] = steps or []
        self.after: Optional[Step] = after
        self.count = 0        # steps consumed (the cursor)
        self.received = 0     # requests received, refused ones included
        self.records: List[Record] = []
        self.limiter = _Limiter(limits) if limits is not None else None
        self.window = outage  # the scripted outage window, or None
        # PUT /_mock/outage: (mode, monotonic end or None for "until DELETE").
        self.manual: Optional[Tuple[str, Optional[float]]] = None
        self.first: Optional[float] = None   # monotonic time of 1st request
        self.during = 0       # requests that met the outage
        self.route: Dict[str, str] = route or {}   # model -> scenario

    def outage_mode(self, now: float) -> Optional[str]:
        """The outage mode a request arriving at ``now`` meets, or None.

        A manual outage wins over the scripted window. Before the first
        request the window's clock reads 0 (that request starts it).
        """
        if self.manual is not None:
            mode, until = self.manual
            if until is None or now < until:
                return mode
            self.manual = None
        if self.window is not None:
            elapsed = 0.0 if self.first is None \
                else (now - self.first) * 1000.0
            end = self.window["to_ms"]
            if self.window["from_ms"] <= elapsed \
                    and (end is None or elapsed < end):
                return str(self.window["mode"])
        return None


class _Admission:
    """What ``_State.consume`` decided for one chat request."""

    __slots__ = ("step", "n", "headers", "refusal", "outage")

    def __init__(self, step: Step, n: int, headers: List[Tuple[str, str]],
                 refusal: Optional[bytes], outage: Optional[str] = None
                 ) -> None:
        self.step = step            # the step to run ({} when refused)
        self.n = n                  # server-wide chat ordinal
        self.headers = headers      # x-ratelimit-* (and Retry-After) headers
        self.refusal = refusal      # the 429 body, None when admitted
        self.outage = outage        # the outage mode met, None when up


class _State:
    """All scenarios, the chat counter and the connection counter."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.scenarios: Dict[str, _Scenario] = {}
        self.chat_count = 0
        self.accepted = 0
        self.batch_store = _mock_batches.Store()

    def script(self, name: str, steps: Any, after: Any,
               limits: Any = None, outage: Any = None,
               route: Any = None) -> None:
        checked, checked_after = _check_script(steps, after)
        checked_limits = _check_limits(limits)
        checked_outage = _check_outage(outage)
        checked_route = _check_route(route)
        with self.lock:
            self.scenarios[name] = _Scenario(checked, checked_after,
                                             checked_limits, checked_outage,
                                             checked_route)

    def routed(self, name: str, model: Optional[str]) -> str:
        """The scenario that serves a request sent to ``name`` for
        ``model`` (its ``route``, one hop)."""
        with self.lock:
            scenario = self.scenarios.get(name)
            if scenario is None or model is None:
                return name
            return scenario.route.get(model, name)

    def _scenario(self, name: str) -> _Scenario:
        """Scenario ``name``, created empty if unknown (lock held)."""
        scenario = self.scenarios.get(name)
        if scenario is None:
            scenario = self.scenarios[name] = _Scenario()
        return scenario

    def start_outage(self, name: str, mode: Any, for_ms: Any) -> None:
        """Take scenario ``name`` down now, until ``end_outage`` or for
        ``for_ms`` ms (replacing a previous manual outage)."""
        mode = _check_outage_mode(mode, "outage")
        if for_ms is not None and (not _is_number(for_ms)
                                   or not 0 < for_ms < float("inf")):
            raise ScriptError("outage: for_ms must be a number > 0, or null")
        with self.lock:
            until = None if for_ms is None \
                else time.monotonic() + for_ms / 1000.0
            self._scenario(name).manual = (mode, until)

    def end_outage(self, name: str) -> None:
        """End scenario ``name``'s manual outage (its window is kept)."""
        with self.lock:
            scenario = self.scenarios.get(name)
            if scenario is not None:
                scenario.manual = None

    def outage_stats(self, name: str) -> Dict[str, Any]:
        """Whether the scenario is down now, in which mode, and how many
        requests met the outage (``during``) or not (``outside``)."""
        with self.lock:
            scenario = self.scenarios.get(name)
            if scenario is None:
                return {"down": False, "mode": None, "during": 0,
                        "outside": 0}
            mode = scenario.outage_mode(time.monotonic())
            return {"down": mode is not None, "mode": mode,
                    "during": scenario.during,
                    "outside": scenario.received - scenario.during}

    def consume(self, name: str, record: Record,
                fields: Callable[[Step], Record],
                request: Any = None) -> _Admission:
        """Record a request, admit or refuse it, and say what to answer.

        ``fields(step)`` gives more fields for the record of that step;
        ``request`` is the parsed body (for the token charge). A refused
        request consumes no step.
        """
        with self.lock:
            scenario = self._scenario(name)
            now = time.monotonic()
            if scenario.first is None:
                scenario.first = now
            outage = scenario.outage_mode(now)
            record["outage"] = outage is not None
            if outage is not None:
                # The provider is down: nothing past it runs (no step, no
                # limiter), but the request is seen and counted.
                record["index"] = scenario.received
                scenario.received += 1
                scenario.during += 1
                record["step"] = None
                if scenario.limiter is not None:
                    record["rate_limited"] = False
                    record["tokens_charged"] = 0
                if outage == "hang":
                    record["client_gone"] = False
                scenario.records.append(record)
                self.chat_count += 1
                return _Admission({}, self.chat_count, [], None, outage)
            index = scenario.count
            if index < len(scenario.steps):
                step, step_index = scenario.steps[index], index
            else:
                step, step_index = scenario.after or {}, -1
            headers: List[Tuple[str, str]] = []
            refusal: Optional[bytes] = None
            if scenario.limiter is not None:
                cost = _token_charge(request, step)
                headers, refusal = scenario.limiter.admit(cost, name)
                record["rate_limited"] = refusal is not None
                record["tokens_charged"] = cost
            record["index"] = scenario.received
            scenario.received += 1
            if refusal is None:
                scenario.count += 1
                record["step"] = step_index
                record.update(fields(step))
            else:
                step, record["step"] = {}, None
            scenario.records.append(record)
            self.chat_count += 1
            return _Admission(step, self.chat_count, headers, refusal)

    def limit_stats(self, name: str) -> Optional[Dict[str, int]]:
        """A limited scenario's totals, None for one without limits."""
        with self.lock:
            scenario = self.scenarios.get(name)
            if scenario is None or scenario.limiter is None:
                return None
            return scenario.limiter.stats()

    def update(self, record: Record, **fields: Any) -> None:
        """Change fields of a (recorded) record under the lock."""
        with self.lock:
            record.update(fields)

    def records(self, name: str) -> List[Record]:
        with self.lock:
            scenario = self.scenarios.get(name)
            return copy.deepcopy(scenario.records) if scenario else []

    def clear(self, name: str) -> None:
        with self.lock:
            scenario = self.scenarios.get(name)
            if scenario is not None:
                scenario.records = []


# --------------------------------------------------------------------------
# HTTP server and handler
# --------------------------------------------------------------------------

class _Abort(Exception):
    """The connection is gone (or must go): write nothing more."""


class _BadRequest(Exception):
    """A request whose body cannot be framed; answer 400 and close."""


class _HTTPServer(ThreadingHTTPServer):
    """Threaded server that numbers, tracks and can drop its connections."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024
    strict = False      # MockServer(strict=True): see _strict_refusal

    def __init__(self, address: Tuple[str, int], state: _State,
                 stop_event: threading.Event) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.state = state
        self.stop_event = stop_event
        self._conn_lock = threading.Lock()
        self._conn_ids: Dict[socket.socket, int] = {}
        self._open: Set[Any] = set()
        self._handler_threads: Set[threading.Thread] = set()
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a (possibly slow) getfqdn(); skip it.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def get_request(self) -> Tuple[socket.socket, Any]:
        sock, addr = self.socket.accept()
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        return sock, addr

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conn_lock:
            with self.state.lock:
                self.state.accepted += 1
                conn_id = self.state.accepted
            self._conn_ids[request] = conn_id
            self._open.add(request)
        super().process_request(request, client_address)

    def connection_id(self, request: Any) -> int:
        with self._conn_lock:
            return self._conn_ids.get(request, 0)

    def shutdown_request(self, request: Any) -> None:
        with self._conn_lock:
            self._conn_ids.pop(request, None)
            self._open.discard(request)
        super().shutdown_request(request)

    def process_request_thread(self, request: Any,
                               client_address: Any) -> None:
        thread = threading.current_thread()
        with self._conn_lock:
            self._handler_threads.add(thread)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._conn_lock:
                self._handler_threads.discard(thread)

    def shutdown_open_connections(self) -> None:
        with self._conn_lock:
            sockets = list(self._open)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def join_handlers(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) for connection threads."""
        deadline = time.monotonic() + timeout
        with self._conn_lock:
            threads = list(self._handler_threads)
        for thread in threads:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            thread.join(left)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if self.stop_event.is_set() or isinstance(exc, (OSError, _Abort)):
            return  # a client that went away, or a stop: not an error
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    """One keep-alive connection: control API and scripted chat replies."""

    server: _HTTPServer
    protocol_version = "HTTP/1.1"
    server_version = "llmretry-mock/0.1"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self.conn_id = self.server.connection_id(self.request)
        self._dead = False
        # (seconds, record) of an answered step's idle_close_ms, or None.
        self._idle_close: Optional[Tuple[float, Record]] = None

    # -- plumbing ---------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        """Stay quiet: no per-request logging."""

    def handle_one_request(self) -> None:
        idle, self._idle_close = self._idle_close, None
        if idle is not None and not self._request_within(idle[0]):
            # A keep-alive timeout (uvicorn's): close the idle connection
            # (FIN) before the record says so, so a client told of it can
            # never send on the connection first.
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            self.server.state.update(idle[1], idle_closed=True)
            return
        try:
            super().handle_one_request()
        except _Abort:
            self.close_connection = True

    def _request_within(self, seconds: float) -> bool:
        """Does the next request (or the client's EOF, or a stop) come
        within ``seconds``? Bytes already buffered count at once."""
        self.connection.settimeout(seconds)
        try:
            self.rfile.peek(1)
            return True
        except socket.timeout:
            return False
        except OSError:
            return True     # the request read will meet it
        finally:
            self.connection.settimeout(None)

    def _write(self, data: bytes) -> None:
        if self._dead:
            raise _Abort()
        try:
            self.wfile.write(data)
        except OSError as exc:
            self._dead = True
            raise _Abort() from exc

    def _wait(self, seconds: float) -> None:
        """Sleep ``seconds``; abort the connection if the server stops."""
        if seconds > 0 and self.server.stop_event.wait(seconds):
            raise _Abort()
        if self.server.stop_event.is_set():
            raise _Abort()

    def _reset(self) -> None:
        """Close the socket with a TCP RST and forget it."""
        sock = self.connection
        self._dead = True
        self.close_connection = True
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                            struct.pack("ii", 1, 0))
        except OSError:
            pass
        try:
            # rfile/wfile keep the socket object alive, so close the file
            # descriptor itself; later calls on the object fail harmlessly.
            os.close(sock.detach())
        except OSError:
            pass

    def _head(self, status: int, headers: Sequence[Tuple[str, str]],
              body_length: Optional[int]) -> bytes:
        base: List[Tuple[str, str]] = [
            ("Date", email.utils.formatdate(usegmt=True)),
            ("Content-Type", "application/json"),
        ]
        if body_length is not None:
            base.append(("Content-Length", str(body_length)))
        merged = _merge_headers(base, headers)
        for name, value in merged:
            if name.lower() == "connection" and value.lower() == "close":
                self.close_connection = True
        names = {name.lower() for name, _ in merged}
        if "connection" not in names:
            if self.close_connection:
                merged.append(("Connection", "close"))
            elif self.request_version == "HTTP/1.0":
                merged.append(("Connection", "keep-alive"))
        lines = [f"HTTP/1.1 {status} {_reason(status)}"]
        lines.extend(f"{name}: {value}" for name, value in merged)
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")

    def _send(self, status: int, body: Optional[bytes],
              headers: Sequence[Tuple[str, str]] = ()) -> None:
        if body is None:
            self._write(self._head(status, headers, None))
        else:
            self._write(self._head(status, headers, len(body)) + body)

    def _send_json(self, status: int, doc: Any) -> None:
        self._send(status, json.dumps(doc).encode("utf-8"))

    def _send_error_json(self, status: int, message: str) -> None:
        self._send_json(status, {"error": {
            "message": message, "type": "invalid_request_error",
            "code": None}})

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._read_chunked()
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            return b""
        try:
            length = int(length_text.strip())
        except ValueError:
            raise _BadRequest("bad Content-Length") from None
        if length < 0 or length > _MAX_BODY:
            raise _BadRequest("bad Content-Length")
        body = self.rfile.read(length)
        if len(body) != length:
            raise _Abort()  # the client went away mid-body
        return body

    def _read_chunked(self) -> bytes:
        parts: List[bytes] = []
        while True:
            line = self.rfile.readline(65537)
            if not line:
                raise _Abort()
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise _BadRequest("bad chunk size") from None
            if size == 0:
                while True:  # trailers, up to the empty line
                    trailer = self.rfile.readline(65537)
                    if trailer in (b"\r\n", b"\n", b""):
                        return b"".join(parts)
            data = self.rfile.read(size)
            if len(data) != size:
                raise _Abort()
            parts.append(data)
            self.rfile.readline(65537)

    def _route_path(self) -> str:
        target = self.path
        if target.startswith(("http://", "https://")):
            return urlsplit(target).path or "/"
        return target.split("?", 1)[0].split("#", 1)[0]

    # -- methods ----------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch()

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch()

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch()

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch()

    def do_PATCH(self) -> None:  # noqa: N802
        self._dispatch()

    def _dispatch(self) -> None:
        try:
            body = self._read_body()
        except _BadRequest as exc:
            self.close_connection = True
            self._send_error_json(400, str(exc))
            return
        path = self._route_path()
        method = self.command
        if _mock_batches.handles(path):     # the Files and Batch APIs (strict or not)
            status, ctype, doc = self.server.state.batch_store.handle(
                method, path, self.headers.get("Content-Type") or "", body)
            self._send(status, doc if status != 204 else None,
                       [("Content-Type", ctype)] if ctype else [])
            return
        if self.server.strict and not path.startswith("/_mock/"):
            refusal = _strict_refusal(method, path, body)
            if refusal is not None:     # not recorded: no step consumed
                self._send_json(*refusal)
                return
        if path.startswith("/_mock/"):
            self._control(method, path, body)
        elif path.endswith(("/completions", "/responses", "/embeddings")):
            if method != "POST":
                self._send_error_json(405, f"method {method} not allowed")
                return
            name = "default"
            if path.startswith("/s/"):
                name = unquote(path[3:].split("/", 1)[0]) or "default"
            self._chat(name, body)
        else:
            self._send_error_json(404, f"no route for {method} {path}")

    # -- control API ------------------------------------------------------

    def _control(self, method: str, path: str, body: bytes) -> None:
        state = self.server.state
        allowed: Tuple[str, ...]
        if path.startswith("/_mock/scenarios/") and len(path) > 17:
            allowed = ("PUT",)
            if method == "PUT":
                name = unquote(path[len("/_mock/scenarios/"):])
                try:
                    doc = json.loads(body.decode("utf-8") or "{}")
                    if not isinstance(doc, dict):
                        raise ScriptError("the script must be a JSON object")
                    state.script(name, doc.get("steps"), doc.get("after"),
                                 doc.get("limits"), doc.get("outage"),
                                 doc.get("route"))
                except (ValueError, UnicodeDecodeError) as exc:
                    self._send_error_json(400, f"bad script: {exc}")
                    return
                self._send(204, None)
                return
        elif path.startswith("/_mock/requests/") and len(path) > 16:
            allowed = ("GET", "DELETE")
            name = unquote(path[len("/_mock/requests/"):])
            if method == "GET":
                self._send_json(200, state.records(name))
                return
            if method == "DELETE":
                state.clear(name)
                self._send(204, None)
                return
        elif path.startswith("/_mock/limits/") and len(path) > 14:
            allowed = ("GET",)
            if method == "GET":
                name = unquote(path[len("/_mock/limits/"):])
                stats = state.limit_stats(name)
                if stats is None:
                    self._send_error_json(
                        404, f"scenario {name!r} has no limits")
                else:
                    self._send_json(200, stats)
                return
        elif path.startswith("/_mock/outage/") and len(path) > 14:
            allowed = ("PUT", "DELETE", "GET")
            name = unquote(path[len("/_mock/outage/"):])
            if method == "PUT":
                try:
                    doc = json.loads(body.decode("utf-8") or "{}")
                    if not isinstance(doc, dict):
                        raise ScriptError("the outage must be a JSON object")
                    unknown = sorted(set(doc) - {"mode", "for_ms"})
                    if unknown:
                        raise ScriptError(f"outage: unknown field(s) "
                                          f"{unknown} (known: for_ms, mode)")
                    state.start_outage(name, doc.get("mode", "503"),
                                       doc.get("for_ms"))
                except (ValueError, UnicodeDecodeError) as exc:
                    self._send_error_json(400, f"bad outage: {exc}")
                    return
                self._send(204, None)
                return
            if method == "DELETE":
                state.end_outage(name)
                self._send(204, None)
                return
            if method == "GET":
                self._send_json(200, state.outage_stats(name))
                return
        elif path == "/_mock/connections":
            allowed = ("GET",)
            if method == "GET":
                with state.lock:
                    accepted = state.accepted
                self._send_json(200, {"accepted": accepted})
                return
        elif path == "/_mock/health":
            allowed = ("GET",)
            if method == "GET":
                self._send_json(200, {"ok": True})
                return
        else:
            self._send_error_json(404, f"no route for {method} {path}")
            return
        self._send_error_json(405, f"method {method} not allowed "
                                   f"(allowed: {', '.join(allowed)})")

    # -- chat endpoint ----------------------------------------------------

    def _chat(self, name: str, body: bytes) -> None:
        headers: Dict[str, str] = {}
        for key, value in self.headers.items():
            key = key.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers \
                else value
        record: Record = {
            "index": 0, "time": time.time(), "method": self.command,
            "path": self.path, "headers": headers,
            "body": body.decode("utf-8", errors="replace"),
            "client_port": int(self.client_address[1]),
            "connection": self.conn_id, "step": 0,
        }
        request_model: Optional[str] = None
        doc: Any = None
        try:
            doc = json.loads(body)
            if isinstance(doc, dict) and isinstance(doc.get("model"), str):
                request_model = doc["model"]
        except ValueError:
            pass
        name = self.server.state.routed(name, request_model)

        def stream_fields(chosen: Step) -> Record:
            # A streamed response's record has its live fields from the
            # start, so a test may read them during the step's delay; so
            # has an idle_close_ms step's.
            live: Record = {}
            if chosen.get("idle_close_ms") is not None:
                live["idle_closed"] = False
            if _mock_sse.stream_options(chosen, doc) is None:
                return live
            return {**live, "events_sent": 0, "client_gone": False}

        admission = self.server.state.consume(name, record, stream_fields,
                                              doc)
        if admission.outage is not None:
            self._outage(admission.outage, record)
            return
        if admission.refusal is not None:
            # Refused at once, like a provider: no step, no delay, no stream.
            self._send(429, admission.refusal, admission.headers)
            return
        step, n = admission.step, admission.n
        if step.get("idle_close_ms") is not None:
            # Armed now, acted on only if the answer keeps the connection.
            self._idle_close = (step["idle_close_ms"] / 1000.0, record)

        self._wait(step.get("delay_ms", 0) / 1000.0)
        fault = step.get("fault")
        if fault == "reset":
            self._reset()
            return
        if fault == "close":
            self.close_connection = True
            return
        if fault == "no_headers":
            self.close_connection = True
            self._wait(step.get("stall_ms", DEFAULT_STALL_MS) / 1000.0)
            return

        status = step.get("status", 200)
        # The step's own headers come last, so a step may override (or
        # garble) a rate-limit header.
        extra = _merge_headers(admission.headers, _step_headers(step))
        stream = _mock_sse.stream_options(step, doc)
        if stream is not None:
            self._send_stream(step, stream, status, extra, n, request_model,
                              doc, record)
            return
        if fault == "huge":
            self._send_huge(step, status, extra, n, request_model)
            return
        if (status in _NO_BODY_STATUSES and fault is None
                and "body" not in step):
            payload = self._head(status, extra, None)
            body_out = b""
        else:
            body_out = _response_body(step, status, n, request_model,
                                      _api_of(self._route_path()), doc)
            payload = self._head(status, extra, len(body_out))
        if fault in ("stall_body", "truncate"):
            self.close_connection = True
            self._write(payload + body_out[:len(body_out) // 2])
            if fault == "stall_body":
                self._wait(step.get("stall_ms", DEFAULT_STALL_MS) / 1000.0)
            return
        payload += body_out
        if fault == "trickle":
            interval = step.get("interval_ms", DEFAULT_INTERVAL_MS) / 1000.0
            for i in range(len(payload)):
                if i:
                    self._wait(interval)
                self._write(payload[i:i + 1])
            return
        self._write(payload)

    def _outage(self, mode: str, record: Record) -> None:
        """Answer (or not) a request that met an outage."""
        if mode == "503":
            self._send(503, OUTAGE_BODY)
        elif mode == "reset":
            self._reset()
        elif mode == "close":
            self.close_connection = True
        else:  # "hang"
            self.close_connection = True
            self._hang()
            self.server.state.update(record, client_gone=True)

    def _hang(self) -> None:
        """Answer nothing until the client closes the connection; raise
        _Abort when the server stops."""
        stop = self.server.stop_event
        with selectors.DefaultSelector() as selector:
            selector.register(self.connection, selectors.EVENT_READ)
            while not stop.is_set():
                if not selector.select(_HANG_POLL):
                    continue
                try:
                    data = self.connection.recv(
                        1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""      # reset by the client: gone too
                if not data:
                    break
                # Pipelined bytes stay unread, so the socket stays readable:
                # stop watching rather than spin, and hold until stop().
                selector.unregister(self.connection)
                stop.wait()
        if stop.is_set():    # stop() shuts the socket down: not the client
            raise _Abort()

    def _send_stream(self, step: Step, opts: Dict[str, Any], status: int,
                     extra: Sequence[Tuple[str, str]], n: int,
                     request_model: Optional[str], request: Any,
                     record: Record) -> None:
        """An SSE response (see llmretry._mock_sse for the protocol)."""
        state = self.server.state
        plan = _mock_sse.Plan(
            step, opts, n, step.get("model", request_model or "mock-model"),
            step.get("usage", copy.deepcopy(DEFAULT_USAGE)),
            _mock_sse.include_usage(request))
        # HTTP/1.0 has no chunked coding: the body ends with the connection.
        framing = opts.get("framing", "chunked")
        chunked = framing == "chunked" and self.request_version != "HTTP/1.0"
        if not chunked:
            self.close_connection = True
        length = plan.declared_length() if framing == "length" else None
        headers = _merge_headers(_mock_sse.head_headers(chunked), extra)
        sender = _mock_sse.Sender(
            plan, opts, step, self.connection, self.server.stop_event,
            self._write, self._reset,
            lambda sent: state.update(record, events_sent=sent), chunked)
        try:
            reusable = sender.run(self._head(status, headers, length))
        except _mock_sse.ClientGone:
            state.update(record, client_gone=True)
            reusable = False
        except _mock_sse.Stopped:
            reusable = False
        if not reusable:
            self.close_connection = True

    def _send_huge(self, step: Step, status: int,
                   extra: Sequence[Tuple[str, str]], n: int,
                   request_model: Optional[str]) -> None:
        prefix, padding, suffix = _huge_parts(step, n, request_model)
        total = len(prefix) + padding + len(suffix)
        self._write(self._head(status, extra, total) + prefix)
        view = memoryview(_PADDING)
        while padding > 0:
            if self.server.stop_event.is_set():
                raise _Abort()
            count = min(padding, _CHUNK)
            self._write(view[:count])  # type: ignore[arg-type]
            padding -= count
        self._write(suffix)


# --------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------

class MockServer:
    """A scriptable, fault-injecting OpenAI-compatible chat server.

    Runs in a background thread; see the module docstring for the protocol.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *,
                 strict: bool = False) -> None:
        self.host = host
        self._requested_port = port
        self.strict = strict
        self._state = _State()
        self._stop_event = threading.Event()
        self._server: Optional[_HTTPServer] = None
        self._thread: Optional[threading.Thread] = None
        self._stopped = False

    # -- lifecycle --------------------------------------------------------

    def start(self) -> "MockServer":
        """Bind and start serving in a daemon thread; return self."""
        if self._stopped:
            raise RuntimeError("a stopped MockServer cannot be restarted")
        if self._server is not None:
            return self
        self._server = _HTTPServer((self.host, self._requested_port),
                                   self._state, self._stop_event)
        self._server.strict = bool(self.strict)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
            name=f"llmretry-mock:{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, end stalls and close open connections (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        self._stop_event.set()
        server = self._server
        if server is None:
            return
        server.shutdown()
        server.shutdown_open_connections()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=0.2)
        server.join_handlers(timeout=0.5)

    def __enter__(self) -> "MockServer":
        return self.start()

    def __exit__(self, exc_type: Optional[Type[BaseException]],
                 exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.stop()

    # -- addresses --------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound TCP port (the server must have been started)."""
        if self._server is None:
            raise RuntimeError("MockServer is not started")
        return int(self._server.server_address[1])

    @property
    def _origin(self) -> str:
        host = self.host
        if host in ("", "0.0.0.0"):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """Base URL of scenario "default": http://127.0.0.1:PORT/v1."""
        return f"{self._origin}/v1"

    def scenario_url(self, name: str) -> str:
        """Base URL of scenario ``name``: http://127.0.0.1:PORT/s/<name>/v1."""
        return f"{self._origin}/s/{quote(name, safe='')}/v1"

    # -- scripting and records ------------------------------------------

    def script(self, name: str, steps: Sequence[Step],
               after: Optional[Step] = None,
               limits: Optional[Mapping[str, Any]] = None,
               outage: Optional[Mapping[str, Any]] = None,
               route: Optional[Mapping[str, str]] = None) -> None:
        """Replace scenario ``name``'s script, reset its cursor and records
        (and, with ``limits``, enforce rate limits; with ``outage``, be down
        in that window; with ``route``, hand some models' requests to other
        scenarios: see the module doc).

        Raises ``ValueError`` (``ScriptError``) for a malformed script.
        """
        self._state.script(name, list(steps), after,
                           dict(limits) if isinstance(limits, Mapping)
                           else limits,
                           dict(outage) if isinstance(outage, Mapping)
                           else outage,
                           dict(route) if isinstance(route, Mapping)
                           else route)

    def outage(self, name: str, mode: str = "503",
               for_ms: Optional[float] = None) -> None:
        """Take scenario ``name`` down now (``"503"``, ``"reset"``,
        ``"close"`` or ``"hang"``) until ``end_outage``, or for ``for_ms``
        ms. Raises ``ScriptError`` for a bad mode or ``for_ms``."""
        self._state.start_outage(name, mode, for_ms)

    def end_outage(self, name: str) -> None:
        """End scenario ``name``'s outage started by ``outage`` (no-op if
        none; a scripted window is not affected)."""
        self._state.end_outage(name)

    def outage_stats(self, name: str) -> Dict[str, Any]:
        """``{"down": bool, "mode": str or None, "during": n,
        "outside": n}``: the scenario's outage now, and its requests since
        it was scripted that met an outage or did not."""
        return self._state.outage_stats(name)

    def limit_stats(self, name: str) -> Dict[str, int]:
        """``{"admitted": n, "refused": n, "tokens": n}`` of a scenario
        scripted with limits; ``KeyError`` for one without."""
        stats = self._state.limit_stats(name)
        if stats is None:
            raise KeyError(f"scenario {name!r} has no limits")
        return stats

    def load_scenarios(self, scenarios: Mapping[str, Any]) -> None:
        """Script scenarios: ``{name: {"steps": [...], "after": step,
        "limits": {...}, "outage": {...}, "route": {...}}}``."""
        if not isinstance(scenarios, Mapping):
            raise ScriptError("scenarios must be an object of name -> script")
        for name, doc in scenarios.items():
            if not isinstance(doc, Mapping):
                raise ScriptError(f"scenario {name!r}: must be an object")
            self._state.script(str(name), doc.get("steps"), doc.get("after"),
                               doc.get("limits"), doc.get("outage"),
                               doc.get("route"))

    def requests(self, name: str) -> List[Record]:
        """A copy of scenario ``name``'s records, in arrival order."""
        return self._state.records(name)

    def clear(self, name: str) -> None:
        """Clear scenario ``name``'s records (its cursor is kept)."""
        self._state.clear(name)

    def batch_api(self) -> "_mock_batches.Store":
        """The Files and Batch APIs' store (``.files``, ``.batches``,
        ``.advance(batch_id, to=..., completed=K)``, ``.auto``): see
        "Batch API" in tests/mock_protocol.md."""
        return self._state.batch_store

    @property
    def connections_accepted(self) -> int:
        """TCP connections accepted since start."""
        with self._state.lock:
            return self._state.accepted


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the mock server until SIGTERM/SIGINT; print the port first."""
    parser = argparse.ArgumentParser(
        prog="python -m llmretry.testing",
        description="Fault-injecting OpenAI-compatible mock chat server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--scenarios", metavar="FILE.json",
                        help='scripts to load: {name: {"steps": [...], '
                             '"after": step, "limits": {...}}}')
    parser.add_argument("--strict", action="store_true",
                        help="refuse what OpenAI refuses: 404 for a path that is "
                             "not an OpenAI route, 400 for a chat body without "
                             "model or messages")
    args = parser.parse_args(argv)

    server = MockServer(args.host, args.port, strict=args.strict)
    if args.scenarios:
        try:
            with open(args.scenarios, encoding="utf-8") as fh:
                server.load_scenarios(json.load(fh))
        except (OSError, ValueError) as exc:
            print(f"llmretry.testing: {args.scenarios}: {exc}",
                  file=sys.stderr)
            return 2

    # The handler only appends to a list: taking a lock in a signal handler
    # (Event.set) can deadlock with the main thread re-acquiring that same
    # lock inside Event.wait.
    signals: List[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        signals.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    try:
        sys.stdout.write(f"{server.port}\n")
        sys.stdout.flush()
    except OSError:
        pass
    try:
        while not signals:
            time.sleep(0.1)         # interrupted by the signal (PEP 475)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
