"""A batch from async code (a notebook cell, an async job): llmretry.acall_many.

In a Jupyter notebook, paste main()'s body into a cell and drop the
``asyncio.run``: a cell may ``await`` at its top level, on the kernel's loop.

    OPENAI_API_KEY=... python3 examples/async_batch.py

The endpoint is $OPENAI_BASE_URL (else OpenAI's), the model $LLMRETRY_MODEL.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Dict, List

import llmretry

MODEL = os.environ.get("LLMRETRY_MODEL", "gpt-4.1-mini")
QUESTIONS = [f"In one word: what is {n} + {n}?" for n in range(1, 21)]


def body(question: str) -> Dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": question}]}


async def main() -> int:
    # At most 8 calls at once; a progress bar on stderr (tqdm's when it is
    # installed); failures come back in place, never raised.
    out = await llmretry.acall_many([body(q) for q in QUESTIONS], limit=8, progress=True,
                                    timeout_ms=20000, deadline_ms=120000)
    answers: List[str] = []
    for question, item in zip(QUESTIONS, out):
        if isinstance(item, llmretry.Result):
            answers.append(f"{question} -> {item.data['choices'][0]['message']['content']}")
        else:
            answers.append(f"{question} -> FAILED: {item}")
    print("\n".join(answers))
    s = out.summary
    print(f"{s.ok} ok, {s.failed} failed, {s.retries} retries, {s.total_tokens} tokens, "
          f"{s.elapsed_ms} ms")
    return 0 if s.failed == 0 else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
