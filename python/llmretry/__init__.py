"""llmretry: the boring production layer around OpenAI-compatible LLM calls.

Every call gets a timeout per attempt, one total deadline, retries of
transient failures only (exponential backoff with jitter, ``Retry-After``),
a request id, structured log events, response validation and token
accounting. One C core (libcurl) does the I/O on its own thread; the waiting
thread releases the GIL, and Ctrl-C cancels the call.

Example::

    import llmretry

    body = {"model": "gpt-4.1-mini",
            "messages": [{"role": "user", "content": "Say hi"}]}
    try:
        data, meta = llmretry.call_llm(body, timeout_ms=20000, deadline_ms=60000)
    except llmretry.LLMError as exc:
        print("gave up:", exc.kind, exc.reason, exc)
    else:
        print(data["choices"][0]["message"]["content"])
        llmretry.log_usage(meta, label="hello")

    # Batches: at most 4 calls at once on the engine thread, results in input
    # order, failures in place, every failed item written to failed.jsonl.
    out = llmretry.call_many(bodies, limit=4, failures_path="failed.jsonl")
    print(out.summary.ok, "ok,", out.summary.failed, "failed")
    # ... and later, the same bodies again: only what did not succeed runs.
    out = llmretry.call_many(bodies, limit=4, failures_path="failed.jsonl", resume=True)

    # Your own worker per item, at most 4 at once, under the same batch policy.
    answers = llmretry.map_with_concurrency(
        prompts, 4, lambda prompt, i: llmretry.call_llm(make_body(prompt)).data)

From a shell: ``llmretry batch requests.jsonl -o results.jsonl --failures
failed.jsonl`` (also ``python -m llmretry``).

The endpoint is ``base_url`` (else ``$OPENAI_BASE_URL``, else OpenAI) and
the key ``api_key`` (else ``$OPENAI_API_KEY``). Events go to the
``"llmretry"`` logger unless ``logger=`` says otherwise; configure logging
(e.g. ``logging.basicConfig(level=logging.INFO)``) to see them.
"""

import logging as _logging_module

from typing import TYPE_CHECKING as _TYPE_CHECKING

from . import _llmretry
from ._batch import SKIPPED, BatchInterrupted, BatchResult, BatchSummary
from ._api import (acall_llm, acall_many, astream_llm, call_llm, call_llm_with_deadline, call_many,
                   stream_llm)
from ._client import BatchOptions, CallOptions, Client, Meta, Result
from ._json import assert_shape, extract_json
from ._models import strict_schema
from ._logging import DEFAULT, jsonl_logger, log_usage
from ._policies import Policy, load_policies
from ._pool import map_with_concurrency
from ._stream import Stream
from . import errors as _errors
from .errors import *  # noqa: F401,F403 (the exception classes: errors.__all__)

if _TYPE_CHECKING:
    from ._aio import AsyncStream
    from ._aio_batch import amap_with_concurrency

__version__: str = _llmretry.VERSION

__all__ = [
    "__version__",
    "DEFAULT",
    "Client",
    "Result",
    "Meta",
    "CallOptions",
    "BatchOptions",
    "call_llm",
    "call_llm_with_deadline",
    "call_many",
    "stream_llm",
    "Stream",
    "acall_llm",
    "astream_llm",
    "acall_many",
    "amap_with_concurrency",
    "AsyncStream",
    "map_with_concurrency",
    "Policy",
    "load_policies",
    "BatchResult",
    "BatchSummary",
    "BatchInterrupted",
    "SKIPPED",
    "extract_json",
    "assert_shape",
    "strict_schema",
    "log_usage",
    "jsonl_logger",
]
__all__ += _errors.__all__

# A library stays silent until the application configures logging.
_logging_module.getLogger("llmretry").addHandler(_logging_module.NullHandler())


# What `import llmretry` leaves to first use: asyncio (about half of its
# import time) and the Batch API's urllib.request. A script that never awaits
# never imports asyncio.
# name: (its module, the module's attribute; None: the module itself).
_ON_FIRST_USE = {"AsyncStream": ("._aio", "AsyncStream"),
                 "amap_with_concurrency": ("._aio_batch", "amap_with_concurrency"),
                 "batch_api": (".batch_api", None)}


def __getattr__(name: str) -> object:
    if name in _ON_FIRST_USE:
        import importlib
        where, attribute = _ON_FIRST_USE[name]
        module = importlib.import_module(where, __name__)
        value = module if attribute is None else getattr(module, attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
