"""An async web service's handler: llmretry.acall_llm under asyncio.timeout.

The handler never blocks the service's event loop: the call waits on the
loop, and its own deadline (``deadline_ms``) bounds every retry. The
request's budget (``asyncio.timeout``, Python 3.11+) bounds the whole
handler; when it fires, the call is cancelled on the engine (its connection
closed) and the client gets a 504.

    OPENAI_API_KEY=... python3 examples/async_handler.py

The endpoint is $OPENAI_BASE_URL (else OpenAI's), the model $LLMRETRY_MODEL.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Dict, Tuple

import llmretry

MODEL = os.environ.get("LLMRETRY_MODEL", "gpt-4.1-mini")
# The service's budget for one HTTP request (seconds), and the share of it
# the LLM call may spend, retries included (ms).
REQUEST_BUDGET_S = 10.0
CALL_DEADLINE_MS = 8000

Response = Tuple[int, Dict[str, Any]]   # (HTTP status, JSON body)


async def handle_summarize(text: str) -> Response:
    """POST /summarize {"text": ...} -> 200 {"summary": ...}, else 502/504."""
    body = {"model": MODEL,
            "messages": [{"role": "system", "content": "Summarize in one sentence."},
                         {"role": "user", "content": text}]}
    try:
        async with asyncio.timeout(REQUEST_BUDGET_S):
            res = await llmretry.acall_llm(body, timeout_ms=5000, deadline_ms=CALL_DEADLINE_MS,
                                           max_retries=2)
    except TimeoutError:
        return 504, {"error": "the summary took too long"}
    except llmretry.LLMError as exc:
        # kind/reason say what failed; request_id ties it to the call's events.
        status = 504 if exc.kind in ("timeout", "deadline_exceeded") else 502
        return status, {"error": f"upstream {exc.kind}", "request_id": exc.request_id}
    summary = res.data["choices"][0]["message"]["content"]
    return 200, {"summary": summary, "request_id": res.meta.request_id,
                 "tokens": res.meta.usage["total_tokens"] if res.meta.usage else None}


async def main() -> int:
    # Three requests served at once, as a server would.
    texts = ["The cat sat on the mat all day.", "It rained in Paris.", "Tea is hot."]
    responses = await asyncio.gather(*(handle_summarize(t) for t in texts))
    for status, doc in responses:
        print(status, doc)
    return 0 if all(status == 200 for status, _ in responses) else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
