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
"route": {...}, "clock": "real" or "manual"}}`` before serving.
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
    "limits": {...}?, "outage": {...}?, "route": {...}?, "clock": str?}`` -> 204.
    Replaces the script, resets its cursor and clears its records (and its
    rate-limit windows and totals, its outage counts, its clock, and a ``PUT
    /_mock/outage``). A missing ``steps`` means ``[]``; a missing or null
    ``after`` means the plain success; a missing or null ``limits`` means no
    rate limits (see "Rate limits"); a missing or null ``outage`` means no
    scripted outage (see "Outages"); a missing or null ``route`` routes
    nothing (see "Routing by model"); a missing or null ``clock`` is the
    real one (see "Clock"). A malformed script (not JSON, a step that is not
    an object, an unknown ``fault``, a field of the wrong type, bad
    ``limits``, ``outage``, ``route`` or ``clock``) -> 400 JSON error, and
    the previous script is kept.
``GET /_mock/requests/<name>``
    -> 200, a JSON array of records in arrival order::

        {"index": n, "time": unix_seconds_float, "method": "POST",
         "path": "...", "headers": {lower-case-name: value},
         "body": "<request body text>", "client_port": int,
         "connection": int, "step": int, "outage": bool}

    ``index`` is the 0-based ordinal of the request among those the scenario
    received since it was last scripted (so it equals ``step`` while steps
    remain and no request was refused by limits); ``DELETE`` clears records
    but does not reset it. ``time`` is when the request line arrived: the
    kernel's time of receipt where it gives one (Linux), else when the
    mock read the line; records are in the order the mock handled them,
    which for requests on several connections may differ. ``path`` is the
    request target as sent (query included). A header sent more than once is joined with
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
``POST``, ``GET /_mock/clock/<name>``: see "Clock".
``GET /_mock/connections`` -> ``{"accepted": N}``, TCP connections accepted
    since start.
``GET /_mock/health`` -> ``{"ok": true}``.
``POST /_mock/batches/<id>/advance``, ``PUT /_mock/batches``: the Batch API's
    clock (below).

Files and Batch APIs
--------------------
``/v1/files`` (upload as multipart, list, retrieve, ``/content``, delete) and
``/v1/batches`` (create, retrieve, ``/cancel``, list), with or without a
``/s/<name>`` prefix (one store per server), are in ``llmretry.testing._batches``
and tests/mock_protocol.md ("Batch API"): a batch moves validating ->
in_progress -> finalizing -> completed (or failed, expired, cancelled) when
``POST /_mock/batches/<id>/advance`` says so (``{}`` one step, ``{"to":
"completed"}``, ``{"to": "expired", "completed": K}``), or at each retrieve
after ``PUT /_mock/batches {"auto": true}`` (or ``{"auto": {"to": ...}}``);
``PUT /_mock/batches {"fail": N}`` makes the next N of their requests answer 503;
``{"create_delay_ms": N}`` makes each batch N ms after its create arrives
(not listed until then, made even if the client has gone);
``{"lost_creates": N}`` makes the next N creates make their batch, then answer 503.

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
    wait this long before sending anything (also before any fault), on the
    scenario's clock (see "Clock").
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
    ``client_gone`` are described in ``llmretry.testing._sse``.

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

Clock
-----
A scenario times its rate-limit windows, its outage windows and ``for_ms``
and its steps' ``delay_ms`` on a clock of its own, so that a test skips
server-side time instead of sleeping through it. The script's ``"clock"``
is ``"real"`` (the default: the monotonic clock) or ``"manual"`` (stands
still, at 0, until advanced); a new script starts a new clock.

``POST /_mock/clock/<name>`` with ``{"advance_ms": N}`` (a number >= 0, the
    only field) -> 204: the clock moves on by N ms at once (a real one keeps
    running from there): windows and ``for_ms`` are that much nearer their
    end, and a request waiting out its ``delay_ms`` is answered as soon as
    the clock has passed it (on a manual clock only then: a delay no advance
    ends lasts until ``stop()``). An unknown scenario is created (empty
    script, real clock). Another body -> 400 JSON error.
``GET /_mock/clock/<name>`` -> ``{"clock": "real" or "manual",
    "advanced_ms": x}``, the sum of the advances since the script.

On a manual clock the headers' times are exact: ``{"rpm": 1, "window_ms":
1000}`` answers a second request with ``retry-after-ms: 1000``, after an
advance of 999 ms with ``1``, and admits it after one more ms. Records'
``time`` stays the wall clock; a stream's own waits, ``stall_ms``,
``interval_ms`` and ``idle_close_ms`` run on the real clock.

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
``.script(name, steps, after=None, limits=None, outage=None, route=None,
clock=None)`` (validated like the PUT), ``.load_scenarios({name: {"steps": ..., "after":
..., "limits": ..., "outage": ..., "route": ..., "clock": ...}})``, ``.limit_stats(name)`` (the
``/_mock/limits`` totals; ``KeyError`` without limits),
``.outage(name, mode="503", for_ms=None)``, ``.end_outage(name)``,
``.outage_stats(name)`` (PUT, DELETE and GET of ``/_mock/outage``),
``.advance_clock(name, ms)``, ``.clock_stats(name)`` (POST and GET of
``/_mock/clock``),
``.requests(name)`` (a copy of the records), ``.clear(name)``,
``.connections_accepted``. A stopped server cannot be restarted.
"""

# The package by concern: _scripts.py (a script's checks and defaults),
# _replies.py (what is answered), _state.py (the scenarios, their limits and
# outages), _connection.py (a connection's plumbing), _handler.py (its routes
# and the control API), _chat.py (the scripted replies), _server.py
# (MockServer, the command line), _sse.py (streams: their checks; _sse_plan.py
# their events, _sse_send.py the sending), _batches.py (the Files and Batch
# APIs).
from ._scripts import (DEFAULT_COMPLETION_TOKENS, DEFAULT_EMBEDDING, DEFAULT_EMBEDDING_USAGE,
                       DEFAULT_HUGE_SIZE, DEFAULT_INTERVAL_MS, DEFAULT_STALL_MS, DEFAULT_USAGE,
                       DEFAULT_WINDOW_MS, FAULTS, HEADER_SHORTCUTS, INVALID_JSON_BODY,
                       LIMIT_KEYS, OUTAGE_BODY, OUTAGE_KEYS, OUTAGE_MODES, Record, ScriptError,
                       Step)
from ._server import MockServer, main

__all__ = ["MockServer", "ScriptError", "main"]
