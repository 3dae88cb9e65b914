"""The module-level functions: :func:`call_llm`, :func:`stream_llm`,
:func:`call_many`, their asyncio forms, on the default client (or
``client=``)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Union

from ._batch import BatchResult
from ._client import Client, _client_or_default
from ._logging import DEFAULT
from ._options import BatchOptions, Body, CallOptions, _needs_body
from ._results import Result
from ._stream import Stream
from ._streaming import _client_stream

if sys.version_info >= (3, 11):
    from typing import Unpack
elif TYPE_CHECKING:     # only type checkers read the annotations (PEP 563) before 3.11
    from typing_extensions import Unpack
if TYPE_CHECKING:
    from . import _aio      # imported on first use: asyncio stays out of `import llmretry`


# The docstring's paragraph "Built-in defaults of the other keywords:" (before its
# example; absent while the prose shows every default) is written by tools/gen_surface.py
# from the core's option table: `make generate` after adding an option, never by hand.
@_needs_body
def call_llm(body: Body, *, client: Optional[Client] = None, policy: Optional[str] = None,
             **options: Unpack[CallOptions]) -> Result:
    """Call an OpenAI-compatible chat endpoint under the retry policy.

    ``body`` is a dict (sent as compact UTF-8 JSON; its ``"model"`` names the
    call's model in events) or a str/bytes of JSON sent as is. Returns a
    :class:`Result` (``data, meta = result``) or raises an
    :class:`~llmretry.LLMError` subclass once the policy gives up. Wrong
    arguments raise TypeError/ValueError naming them, before any I/O.

    Keywords left out take ``client``'s defaults (the default client has
    none), else these:

    * ``base_url``: else ``$OPENAI_BASE_URL``, else
      ``https://api.openai.com/v1``; ``/`` + the endpoint is appended:
      ``endpoint="chat/completions"``, or ``"completions"``, ``"embeddings"``,
      ``"responses"``. ``url``: the full endpoint URL instead.
    * ``api_key``: else ``$OPENAI_API_KEY``, else no ``Authorization``.
    * ``method="POST"``, or ``"GET"``/``"DELETE"`` with ``body=None``;
      ``content_type="application/json"``: another type sends a str/bytes
      body as is (a multipart upload); ``raw_response=False``: with True a
      2xx answer is ``data`` as text (JSON Lines), not parsed.
    * ``timeout_ms=60000`` per attempt; ``deadline_ms=None`` for the whole
      call, waits included.
    * ``max_retries=3``; ``base_delay_ms=800``, ``max_delay_ms=30000`` and
      ``jitter="additive"`` (or ``"full"``, ``"none"``) for the backoff.
    * ``retry_mode="safe"``; ``"unsafe"`` never retries a request that may
      have reached the server.
    * ``retry_statuses=None``: 408, 429 and 5xx but 501 and 505.
    * ``max_retry_after_ms=120000``: a longer server-requested wait ends
      the call.
    * ``retry_invalid_response=True``: retry 2xx bodies that are not a JSON
      object or that ``validate`` rejects.
    * ``max_response_bytes=33554432`` (32 MiB).
    * ``headers``: extra ``{name: value}`` request headers.
    * ``request_id`` (else a UUID v4) and ``idempotency_key``.
    * ``ca_file``: the CA bundle to verify servers with instead of
      libcurl's default bundle (TLS is always verified; a verification
      failure is not retried).
    * ``idle_timeout_ms=30000``: for a streaming body (``"stream": True``),
      the longest gap between two chunks; ``timeout_ms`` then bounds the
      wait for the first one. The result is the assembled chat.completion.
    * ``rpm=0`` and ``tpm=0`` (0: none): client-side rate limits of the
      endpoint (``base_url`` + key + model), shared by every call, batch and loop
      of the client: at most that many requests and tokens a minute, paced
      evenly; a call's tokens are estimated from its body (prompt
      characters / 4 plus ``max_tokens``) and corrected by the usage.
      Without them the server's ``x-ratelimit-*`` headers pace, and a 429
      naming a wait pauses every call to the endpoint. A call waiting for
      budget still fails at its deadline.
    * ``retry_budget_ratio=0.2``, ``retry_budget_min=10``: the endpoint's
      retry budget: over a rolling 10 s its retries may be at most ratio x
      its requests + min (retries the server timed with Retry-After are
      free); past it a call gives up at once (``retry_budget_exhausted``).
    * ``breaker_failures=0`` (off), ``breaker_cooldown_ms=30000``: the
      endpoint's circuit breaker: that many transient failures in a row
      open it; meanwhile calls fail at once with
      :class:`~llmretry.CircuitOpenError` (nothing sent) or go to their
      fallback; after the cooldown one probe goes, and its success closes it.
    * ``fallbacks``: a list of targets ``{"model", "base_url" or "url",
      "api_key" or "api_key_env", "headers"}`` tried in order when the
      current one gives up (not after a cancel, the deadline, or a 400/422),
      within the same ``deadline_ms``. A target without a URL is the same
      endpoint with another model; one with a URL sends only its own key
      and headers. ``meta.target`` says which answered (0: the primary).
    * ``schema``: a JSON Schema (dict or JSON text) every answer must
      match: each choice's message content, read with :func:`extract_json`,
      is validated by the core (docs/structured-outputs.md). A body with
      ``response_format`` ``json_schema`` is held to its own schema without
      it. A mismatch is ``invalid_response`` (retried) with the errors in
      ``validation_errors``; a ``message.refusal`` raises
      :class:`~llmretry.RefusalError`, not retried.
    * ``repair=False``: True makes a retry after an answer that failed the
      schema (or ``validate``) send the body with the failed answer and one
      user message naming its errors appended (as instructor does).
    * ``response_model``: a pydantic v2 model: its strict schema
      (:func:`~llmretry.strict_schema`) is the call's ``schema``, pydantic
      validates each answer (a rejection is retried like a mismatch), and the
      instance is ``result.parsed``. Not with ``validate``.
    * ``validate(data)``: raising an Exception or returning False rejects
      a response (``invalid_response``).
    * ``logger``: the ``"llmretry"`` logger; None for no events; a
      ``logging.Logger``/``LoggerAdapter``; or a callable given each event.
    * ``policy``: the name of one of ``client``'s policies; its settings
      apply where these keywords are left out (then the client's defaults,
      then the built-in ones). Its name is in every event. An unknown name
      raises ValueError before any I/O.

    Example::

        data, meta = llmretry.call_llm(
            {"model": "gpt-4.1-mini",
             "messages": [{"role": "user", "content": "Say hi"}]},
            timeout_ms=20000, deadline_ms=60000)
        print(data["choices"][0]["message"]["content"], meta.usage)
    """
    return _client_or_default(client).call_llm(body, policy=policy, **options)


@_needs_body
def call_llm_with_deadline(body: Body, deadline_ms: int = 180000,
                           **options: Any) -> Result:
    """:func:`call_llm` with a total deadline (default 180 s) for all attempts."""
    return call_llm(body, deadline_ms=deadline_ms, **options)


def call_many(bodies: Iterable[Body], limit: int = 8, *,
              # BEGIN GENERATED many-keywords (tools/gen_surface.py's BATCH_KEYWORDS: do not edit)
              deadline_ms: Optional[int] = None,
              call_deadline_ms: Optional[int] = DEFAULT,
              failures_path: Optional[Union[str, "os.PathLike[str]"]] = None,
              resume: bool = False,
              progress: Union[bool, Callable[[int, int, int], Any]] = False,
              adaptive: bool = True,
              on_result: Optional[Callable[[int, Any], Any]] = None,
              policy: Optional[str] = None,
              keep_results: bool = True,
              # END GENERATED many-keywords
              client: Optional[Client] = None,
              **options: Unpack[BatchOptions]) -> BatchResult:
    """One call per body, as one batch on the engine thread; in input order.

    Every request runs on the engine's I/O thread; the calling thread only
    waits (GIL released), delivers events and builds the results. Returns a
    :class:`~llmretry.BatchResult`: a list holding, for each body, its
    :class:`Result` or, when it failed, its :class:`~llmretry.LLMError`
    (failures are returned in place, never raised), with ``.summary``.
    Wrong arguments raise before any call starts; so do bad bodies when
    ``bodies`` is a list or tuple (every body is encoded first).

    ``bodies`` may be any iterable: anything but a list or tuple (a
    generator over a file) is read lazily, each item encoded just before it
    is submitted, so only the items in flight are held (at most
    ``4 * limit + 64`` read and not finished); a body that cannot be sent
    then raises TypeError or ValueError naming ``bodies[i]`` when it is
    reached, the items before it having run (and being in the failures
    file: fix it and ``resume``). ``keep_results=False`` keeps no values:
    each goes only to ``on_result`` (and the failures file), and the
    BatchResult returned (or a BatchInterrupted's ``partial``) is an empty
    list with its ``.summary``. A generator with ``on_result`` and
    ``keep_results=False`` runs in memory that does not grow with the
    batch. ``resume`` reads the same iterable again from its start: the
    items an earlier run completed are skipped as they are read.

    ``options`` are :func:`call_llm` keywords, applied to every call
    (except ``request_id`` and ``idempotency_key``); ``policy`` names one of
    ``client``'s policies for every call (with ``idempotency_key = "auto"``
    each item gets its own key, the same on all its attempts). The batch
    policy:

    * ``limit``: at most this many calls in flight. A 429 whose wait the
      server names (``Retry-After``, ``x-ratelimit-reset-*``) pauses the
      batch's new starts of that model for that long, not just that item's
      retry (the other models' items go on); with ``adaptive`` (the
      default) the number in flight halves on a burst of 429s and grows back
      by one per window-full of successes, never above ``limit``.
    * ``deadline_ms``: a budget for the *whole batch*. Items not started in
      time fail with :class:`~llmretry.DeadlineExceededError` (0 attempts);
      running calls get the smaller of their own deadline and the time
      left. A deadline for each call is ``call_deadline_ms``.
    * ``failures_path``: each failed item is appended to this file as one
      JSON line ``{"index", "item", "error": {"kind", "status", "message",
      "request_id", "attempts"}}`` the moment it fails, and the index of
      each success to ``failures_path + ".done"``.
    * ``resume=True`` (needs ``failures_path``): run only the items an
      earlier run of the same bodies did not complete (the failed ones and
      those never run, e.g. after Ctrl-C); the others are not called again
      and their slots hold :data:`~llmretry.SKIPPED`. Keep the earlier
      results yourself (``on_result``); the record says which items
      succeeded, not what they returned.
    * ``progress``: True shows a bar (``tqdm.auto`` when tqdm is installed:
      a widget in Jupyter, text on stderr elsewhere; else a plain line on
      stderr), closed before the summary is logged; a callable gets ``(done, total, failed)`` after each item
      (``total`` None for an iterable of unknown length read lazily).
    * ``on_result(index, value)`` is called on this thread as each item
      finishes (value: its Result or its exception), before it is recorded;
      an exception from it stops the batch and propagates.

    The summary (items ok and failed, attempts, retries, tokens, elapsed)
    is ``result.summary`` and is emitted as an ``llm_batch_summary`` event
    to ``logger``. Ctrl-C cancels the calls in flight and raises
    :class:`BatchInterrupted` (a ``KeyboardInterrupt``) whose ``partial``
    is the BatchResult of what finished; the failures file then lists every
    item that failed before it, and ``resume`` runs the rest.

    Example::

        out = llmretry.call_many(bodies, limit=4, deadline_ms=600000,
                                 failures_path="failed.jsonl", resume=True,
                                 progress=True)
        for i, res in enumerate(out):
            if isinstance(res, llmretry.Result):
                save(i, res.data)
        print(out.summary.total_tokens, "tokens")
    """
    return _client_or_default(client).call_many(
        bodies, limit,
        # BEGIN GENERATED many-forward (tools/gen_surface.py's BATCH_KEYWORDS: do not edit)
        deadline_ms=deadline_ms, call_deadline_ms=call_deadline_ms,
        failures_path=failures_path, resume=resume, progress=progress, adaptive=adaptive,
        on_result=on_result, policy=policy, keep_results=keep_results,
        # END GENERATED many-forward
        **options)


@_needs_body
def stream_llm(body: Body, *, client: Optional[Client] = None, policy: Optional[str] = None,
               stream_buffer_bytes: int = DEFAULT, **options: Unpack[CallOptions]) -> Stream:
    """Start a streaming call and return its :class:`Stream` (a context
    manager; the call runs from here on, chunks waiting for you to read).

    ``body`` as for :func:`call_llm`; a dict gets ``"stream": True`` (and
    the core asks for ``stream_options.include_usage`` unless it sets
    ``stream_options``). ``options`` are :func:`call_llm`'s keywords;
    ``timeout_ms`` bounds the wait for the first chunk, ``idle_timeout_ms``
    (default 30000) each gap between two, ``deadline_ms`` the whole call;
    ``stream_buffer_bytes`` (default 1 MiB) of unread chunks pause the
    transfer until you read.

    Example::

        with llmretry.stream_llm(body, deadline_ms=120000) as s:
            for text in s.text_deltas():
                print(text, end="", flush=True)
            data, meta = s.result()     # the assembled chat.completion
    """
    return _client_stream(_client_or_default(client), body, policy, stream_buffer_bytes,
                          options)


# ---------------------------------------------------------------------------
# asyncio, module level (the default client, or client=)

@_needs_body
async def acall_llm(body: Body, *, client: Optional[Client] = None,
                    policy: Optional[str] = None, **options: Unpack[CallOptions]) -> Result:
    """:func:`call_llm` for asyncio: ``await`` it on a running event loop.

    The same keywords, rules, Result and errors as :func:`call_llm`; no
    thread waits for it (the engine's I/O thread does the requests, this
    loop's thread reads their news through ``loop.add_reader``), so
    thousands can be awaited at once (``Client(max_in_flight=...)`` caps
    how many run). Loggers and validators run on the loop's thread.
    Cancelling the task (``task.cancel()``, ``asyncio.timeout``) cancels the
    call at once and raises ``CancelledError``.

    Example::

        async with asyncio.timeout(30):
            data, meta = await llmretry.acall_llm(body, max_retries=3)
    """
    return await _client_or_default(client).acall_llm(body, policy=policy, **options)


@_needs_body
def astream_llm(body: Body, *, client: Optional[Client] = None, policy: Optional[str] = None,
                stream_buffer_bytes: int = DEFAULT,
                **options: Unpack[CallOptions]) -> "_aio.AsyncStream":
    """:func:`stream_llm` for asyncio: an :class:`AsyncStream` to ``async
    with``, whose chunks come with ``async for`` (call it on a running loop).

    Example::

        async with llmretry.astream_llm(body) as s:
            async for text in s.text_deltas():
                print(text, end="", flush=True)
            data, meta = await s.result()
    """
    return _client_or_default(client).astream_llm(
        body, policy=policy, stream_buffer_bytes=stream_buffer_bytes, **options)


async def acall_many(bodies: Iterable[Body], limit: int = 8, *,
                     # BEGIN GENERATED many-keywords (tools/gen_surface.py's BATCH_KEYWORDS: do not edit)
                     deadline_ms: Optional[int] = None,
                     call_deadline_ms: Optional[int] = DEFAULT,
                     failures_path: Optional[Union[str, "os.PathLike[str]"]] = None,
                     resume: bool = False,
                     progress: Union[bool, Callable[[int, int, int], Any]] = False,
                     adaptive: bool = True,
                     on_result: Optional[Callable[[int, Any], Any]] = None,
                     policy: Optional[str] = None,
                     keep_results: bool = True,
                     # END GENERATED many-keywords
                     client: Optional[Client] = None,
                     **options: Unpack[BatchOptions]) -> BatchResult:
    """:func:`call_many` for asyncio: the batch runs on the engine thread
    while the loop keeps running; ``on_result``, ``progress`` and the
    failures file are handled on the loop's thread as items finish.
    Cancelling the task cancels the calls in flight (the failures file then
    holds what finished; ``resume=True`` runs the rest).

    Example::

        out = await llmretry.acall_many(bodies, limit=16, progress=True,
                                        failures_path="failed.jsonl")
        print(out.summary.ok, "ok")
    """
    return await _client_or_default(client).acall_many(
        bodies, limit,
        # BEGIN GENERATED many-forward (tools/gen_surface.py's BATCH_KEYWORDS: do not edit)
        deadline_ms=deadline_ms, call_deadline_ms=call_deadline_ms,
        failures_path=failures_path, resume=resume, progress=progress, adaptive=adaptive,
        on_result=on_result, policy=policy, keep_results=keep_results,
        # END GENERATED many-forward
        **options)
