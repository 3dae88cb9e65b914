"""httpx transports that run an httpx client's LLM calls on llmretry's engine.

The openai SDK, and the frameworks built on it (LangChain's ``ChatOpenAI``,
instructor, pydantic-ai, LlamaIndex), accept an ``httpx`` client; give it one
of these transports and every call gets llmretry's policy (retries,
``Retry-After``, the deadline, rate limits, the breaker, shared budgets,
events) with the SDK's own types and exceptions unchanged::

    import httpx, openai, llmretry.httpx
    client = openai.OpenAI(max_retries=0, http_client=httpx.Client(
        transport=llmretry.httpx.Transport(max_retries=4, deadline_ms=60000)))

``Transport(**options)`` and ``AsyncTransport(**options)`` take the
options of a :class:`llmretry.Client` and of its calls (or ``client=`` an
existing Client, whose engine and budgets they then share, with options
for its calls). Not ``fallbacks``: the SDK must see one server's response.
Not ``url``, ``base_url`` or ``api_key``: the SDK's requests carry them.

What goes where (docs/openai-sdk.md): a POST with a JSON object body is
one call on the engine (its URL the request's, its headers the request's,
the SDK's per-request timeout the attempt timeout unless ``timeout_ms`` is
set); the SDK gets the final response as the server sent it (status,
headers, body), so a 429 the engine gave up on reaches the SDK as that
429. A ``"stream": true`` body is retried until its first chunk, then
streamed to the SDK as SSE; closing the SDK's stream cancels the call. A
call that ends without a response (the network, a timeout, the deadline)
raises ``httpx.ConnectError`` or ``httpx.ReadTimeout`` whose message ends
with llmretry's request id. A POST whose ``Accept`` names no JSON type
(``audio.speech``) is one call whose answer is taken as bytes. A GET whose
``Accept`` names JSON (retrieving and listing files, batches, models) is a
call too, its body handed on as it came. Other requests (downloads,
multipart uploads, DELETE, a POST with no body) go through
``httpx.HTTPTransport`` as they would without llmretry.

Importing ``llmretry`` does not import this module (nor httpx).
"""

from __future__ import annotations

import httpx

from ._http_transport import AsyncTransportBase, SyncTransportBase

__all__ = ["Transport", "AsyncTransport"]


class Transport(SyncTransportBase, httpx.BaseTransport):
    """An ``httpx.BaseTransport`` whose LLM calls run on llmretry's engine
    (see the module's docstring). Thread-safe, like the Client it holds;
    ``close()`` (the httpx client's close calls it) stops the engine when
    the transport made it."""

    _hx = httpx


class AsyncTransport(AsyncTransportBase, httpx.AsyncBaseTransport):
    """An ``httpx.AsyncBaseTransport`` on the running asyncio loop's channel
    of llmretry's engine: no thread per request, thousands at once (see the
    module's docstring). Cancelling the awaiting task cancels the call."""

    _hx = httpx
