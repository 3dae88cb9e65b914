"""Fallbacks, the retry budget and the circuit breaker (issue 19) against
servers nobody here wrote: LiteLLM's proxy (its fake-500 and fake-ok models)
and, when it runs, llama-cpp-python's server as another endpoint to fall back
to. Run by tools/interop.sh (``make interop``). Each check prints one line;
exits 1 when any fails.

Usage: check_health.py LITELLM_BASE_URL [LLAMA_BASE_URL LLAMA_ACCESS_LOG]
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from typing import Any, Dict, List, Optional

import llmretry
from interop_util import AccessLog, Checks

KEY = "sk-1234"


def body(model: str, **extra: Any) -> Dict[str, Any]:
    b: Dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    b.update(extra)
    return b


def by_model(client: llmretry.Client) -> Dict[Any, Dict[str, Any]]:
    """The client's endpoint stats by model (each model is an endpoint)."""
    return {s["model"]: s for s in client.endpoint_stats()}


def dead_url() -> str:
    """A base URL nothing listens on (connection refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/v1"


def main(litellm: str, llama: Optional[str], llama_log: Optional[str]) -> int:
    checks = Checks()

    def model_fallback() -> str:
        with llmretry.Client(base_url=litellm, api_key=KEY, logger=None,
                             base_delay_ms=50) as client:
            res = client.call_llm(body("fake-500"), max_retries=1,
                                  fallbacks=[{"model": "fake-ok"}])
        text = res.data["choices"][0]["message"]["content"]
        assert res.meta.target == 1 and text == "hello from litellm", (res.meta, text)
        assert res.meta.attempts == 3, res.meta
        return f"fake-500 x2, then fake-ok on the same proxy: target {res.meta.target}"

    def model_fallback_breaker() -> str:
        # One breaker per model: fake-500's opens after its own 2 failures
        # and the calls after go straight to fake-ok on the same proxy. With
        # one breaker for the URL, fake-ok's successes reset the count after
        # every failure: it never opened (5 requests to fake-500 of 5 calls).
        with llmretry.Client(base_url=litellm, api_key=KEY, logger=None, max_retries=0,
                             breaker_failures=2, breaker_cooldown_ms=60000,
                             fallbacks=[{"model": "fake-ok"}]) as client:
            targets = [client.call_llm(body("fake-500")).meta.target for _ in range(5)]
            stats = by_model(client)
        dead, up = stats["fake-500"], stats["fake-ok"]
        assert targets == [1] * 5, targets
        assert dead["breaker"] == "open" and dead["requests"] == 2, dead
        assert dead["short_circuited"] == 3 and up["requests"] == 5, (dead, up)
        return "fake-500's breaker open after 2 requests; 3 calls straight to fake-ok"

    def breaker() -> str:
        # fake-500's breaker opens on its 500s; fake-ok, another model of the
        # proxy, is not held by it (each model has its own); after the
        # cooldown one probe of fake-500 goes out, fails, and opens it again.
        with llmretry.Client(base_url=litellm, api_key=KEY, logger=None,
                             max_retries=0, breaker_failures=3,
                             breaker_cooldown_ms=500) as client:
            kinds = []
            for _ in range(5):
                try:
                    client.call_llm(body("fake-500"))
                    kinds.append("ok")
                except llmretry.LLMError as exc:
                    kinds.append(exc.kind)
            assert kinds == ["http_status"] * 3 + ["circuit_open"] * 2, kinds
            other = client.call_llm(body("fake-ok"))
            stats = by_model(client)
            st = stats["fake-500"]
            assert st["breaker"] == "open" and st["requests"] == 3, st
            assert other.meta.attempts == 1 and stats["fake-ok"]["breaker"] == "closed", stats
            time.sleep(0.6)
            try:
                client.call_llm(body("fake-500"))      # the probe: the proxy fails it
                raise AssertionError("the probe of fake-500 succeeded")
            except llmretry.HTTPStatusError:
                pass
            st = by_model(client)["fake-500"]
            assert st["breaker"] == "open" and st["requests"] == 4, st
        return (f"{kinds}; fake-ok answered meanwhile; after the cooldown one probe, "
                f"failed: open again ({st['requests']} requests to fake-500 in all)")

    def budget() -> str:
        with llmretry.Client(base_url=litellm, api_key=KEY, logger=None,
                             max_retries=3, base_delay_ms=20, max_delay_ms=100) as client:
            errors: List[BaseException] = []

            def one() -> None:
                try:
                    client.call_llm(body("fake-500"))
                except llmretry.LLMError as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=one) for _ in range(30)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            [st] = client.endpoint_stats()
        sent = st["requests"] + st["retries"]
        assert len(errors) == 30 and st["requests"] == 30, (len(errors), st)
        assert sent <= 30 + 6 + 10, st         # 120 without the budget
        refused = sum(1 for e in errors if getattr(e, "reason", "") == "retry_budget_exhausted")
        return f"30 calls x (1 + 3 retries) would be 120 requests: {sent} sent, {refused} refused"

    def cross_server() -> str:
        assert llama and llama_log
        log = AccessLog(llama_log)
        mark = log.mark()
        res = llmretry.call_llm(
            body("fake-500", max_tokens=8, temperature=0), base_url=litellm, api_key=KEY,
            max_retries=0, logger=None,
            fallbacks=[{"url": dead_url().replace("/v1", "/v1/chat/completions")},
                       {"model": "tiny", "base_url": llama}])
        assert res.meta.target == 2 and res.meta.model == "tiny", res.meta
        assert res.data["choices"][0]["message"]["content"] is not None
        sent = log.since(mark, 1)
        assert sent == [200], f"llama.cpp received {sent}"
        return "LiteLLM 500, a dead port, then llama.cpp's server answered (no key sent)"

    checks.check("a model fallback on LiteLLM", model_fallback)
    checks.check("a dead model's breaker sends its fallback model at once", model_fallback_breaker)
    checks.check("the breaker opens on LiteLLM's 500s, one probe after the cooldown", breaker)
    checks.check("the retry budget bounds a storm against LiteLLM", budget)
    if llama:
        checks.check("fall back from LiteLLM to llama.cpp's server", cross_server)
    return checks.summary("health")


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(args[0], args[1] if len(args) > 1 else None,
                  args[2] if len(args) > 2 else None))
