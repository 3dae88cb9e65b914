"""The endpoint option against LiteLLM's proxy (issue 32): an embeddings
batch from Python and from the command line, its prompt tokens in the
totals and no completion tokens. Run by tools/interop.sh (``make interop``).
Usage: check_endpoints.py BASE_URL
"""

from __future__ import annotations

import sys

import llmretry
from interop_util import Checks, batch_cli

KEY = "sk-1234"
VECTOR = [0.5, -0.25, 0.125]      # fake-embed's mock_response (litellm_proxy.yaml)


def main(base_url: str) -> int:
    checks = Checks()
    texts = [f"text {i}" for i in range(12)]

    def embeddings_batch() -> str:
        bodies = [{"model": "fake-embed", "input": text} for text in texts]
        batch = llmretry.call_many(bodies, base_url=base_url, api_key=KEY, logger=None,
                                   endpoint="embeddings", limit=4, base_delay_ms=200)
        errors = [(i, repr(e)) for i, e in batch.errors()]
        assert not errors, errors[:3]
        for res in batch:
            assert res.data["data"][0]["embedding"] == VECTOR, res.data
            assert res.meta.usage["completion_tokens"] == 0, res.meta.usage
            assert res.meta.usage["prompt_tokens"] > 0, res.meta.usage
        s = batch.summary
        assert s.prompt_tokens == sum(r.meta.usage["prompt_tokens"] for r in batch), s
        assert s.completion_tokens == 0 and s.attempts == len(texts), s
        return (f"{s.ok} ok, {s.attempts} attempts, tokens {s.prompt_tokens} prompt + "
                f"{s.completion_tokens} completion")

    def embeddings_cli() -> str:
        p, lines = batch_cli(base_url, KEY, [{"input": t} for t in texts],
                             "--model", "fake-embed", "--endpoint", "embeddings")
        assert [x["index"] for x in lines] == list(range(len(texts))), lines[:2]
        assert all(x["ok"] and x["data"]["data"][0]["embedding"] == VECTOR for x in lines)
        assert " + 0 completion" in p.stderr, p.stderr
        return p.stderr.strip().splitlines()[2].strip()

    checks.check("an embeddings batch (endpoint=embeddings)", embeddings_batch)
    checks.check("llmretry batch --endpoint embeddings", embeddings_cli)
    return checks.summary("endpoints")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
