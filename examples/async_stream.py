"""Print an answer as it arrives: llmretry.astream_llm.

    OPENAI_API_KEY=... python3 examples/async_stream.py "Tell me a short story"

The endpoint is $OPENAI_BASE_URL (else OpenAI's), the model $LLMRETRY_MODEL.
"""

from __future__ import annotations

import asyncio
import os
import sys

import llmretry

MODEL = os.environ.get("LLMRETRY_MODEL", "gpt-4.1-mini")


async def main(prompt: str) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}]}
    try:
        # idle_timeout_ms: the longest silence allowed between two chunks.
        async with llmretry.astream_llm(body, timeout_ms=20000, idle_timeout_ms=15000) as s:
            async for text in s.text_deltas():
                print(text, end="", flush=True)
            res = await s.result()   # the assembled response, with its usage
    except llmretry.LLMError as exc:
        print(f"\nfailed: {exc.kind} ({exc.reason}): {exc}", file=sys.stderr)
        return 1
    print()
    m = res.meta
    print(f"[{m.request_id}: {m.chunks} chunks, first after {m.ttft_ms} ms, "
          f"usage {m.usage}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    prompt = " ".join(sys.argv[1:]) or "Say hello in five words."
    raise SystemExit(asyncio.run(main(prompt)))
