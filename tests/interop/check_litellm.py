"""What llmretry does against LiteLLM's proxy (a server nobody here wrote).

Run by tools/interop.sh (``make interop``), not by ``make test``: LiteLLM
takes minutes to install. Each check prints one line; the script exits 1
when any fails. Usage: check_litellm.py BASE_URL
"""

from __future__ import annotations

import sys
import time

import llmretry
from interop_util import Checks

KEY = "sk-1234"


def body(model: str, text: str = "hi") -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}]}


def main(base_url: str) -> int:
    checks = Checks()
    check = checks.check
    client = llmretry.Client(base_url=base_url, api_key=KEY, logger=None,
                             base_delay_ms=200, max_delay_ms=2000)

    def plain() -> str:
        res = client.call_llm(body("fake-ok"))
        text = res.data["choices"][0]["message"]["content"]
        assert text == "hello from litellm", text
        assert res.meta.attempts == 1, res.meta
        return f"1 attempt, usage {res.meta.usage}"

    def server_error_retried() -> str:
        try:
            client.call_llm(body("fake-500"), max_retries=2)
        except llmretry.HTTPStatusError as exc:
            assert exc.status == 500 and exc.attempts == 3, repr(exc)
            assert "/chat/completions" in str(exc), str(exc)
            assert KEY not in str(exc) and KEY not in repr(exc)
            return f"{exc.attempts} attempts, {str(exc)[:90]}..."
        raise AssertionError("no error")

    def idle_keepalive_resent() -> str:
        # uvicorn closes a keep-alive connection idle for 5 s: the next call
        # must not pay for it (issue 13 items 4 and 6), in either mode.
        out = []
        for mode in ("safe", "unsafe"):
            c = llmretry.Client(base_url=base_url, api_key=KEY, logger=None, retry_mode=mode)
            try:
                c.call_llm(body("fake-ok"))
                time.sleep(6.5)
                t0 = time.monotonic()
                res = c.call_llm(body("fake-ok"))
                ms = (time.monotonic() - t0) * 1000
                assert res.meta.attempts == 1, f"{mode}: {res.meta.attempts} attempts"
                out.append(f"{mode}: 1 attempt, {res.meta.resends} re-sends, {ms:.0f} ms")
            finally:
                c.close()
        return "; ".join(out)

    def rate_limited_batches() -> str:
        # Issue 27, item 8: LiteLLM's rpm 429 names no wait (no Retry-After,
        # no x-ratelimit-*; only llm_provider-retry-after). With nothing
        # configured on the client, a batch over the limit must lose nothing:
        # 20 items at rpm 10 (LiteLLM refuses them) and 150 at rpm 60 (it
        # mostly queues them), side by side (minutes: the limits are per
        # minute).
        import threading
        plain = llmretry.Client(base_url=base_url, api_key=KEY, logger=None)
        out: dict = {}

        def run(model: str, n: int, limit: int) -> None:
            out[model] = plain.call_many([body(model, f"q{i}") for i in range(n)], limit=limit)

        threads = [threading.Thread(target=run, args=("fake-limited", 20, 4)),
                   threading.Thread(target=run, args=("fake-limited-60", 150, 16))]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        plain.close()
        lines = []
        for model, n in (("fake-limited", 20), ("fake-limited-60", 150)):
            s = out[model].summary
            lost = [repr(v)[:120] for v in out[model] if not isinstance(v, llmretry.Result)]
            assert s.ok == n, f"{model}: {s.ok} of {n} ok; {lost[:2]}"
            lines.append(f"{model}: {s.ok} of {n} ok, {s.attempts} attempts")
        return "; ".join(lines) + f"; {time.monotonic() - t0:.0f} s"

    def models_limited_apart() -> str:
        # LiteLLM limits each model apart and its x-ratelimit-* are the
        # answering model's: the 10 a minute that fake-limited-apart's answer
        # states must not pace fake-ok (one endpoint per URL and key paced
        # 20 fake-ok calls at 10 a minute: 122 s instead of 0.1). The
        # deadlines fail a paced call (6 s a turn) without a timed assertion.
        with llmretry.Client(base_url=base_url, api_key=KEY, logger=None) as c:
            c.call_llm(body("fake-limited-apart"))
            try:
                c.call_llm(body("fake-limited-apart"), deadline_ms=500)
                raise AssertionError("a second call of the 10-a-minute model went at once")
            except llmretry.DeadlineExceededError:
                pass
            metas = [c.call_llm(body("fake-ok", f"a{i}"), deadline_ms=3000).meta
                     for i in range(20)]
            rpm = {s["model"]: s["rpm"] for s in c.endpoint_stats()}
        assert [m.attempts for m in metas] == [1] * 20, [m.attempts for m in metas]
        assert rpm == {"fake-limited-apart": 10, "fake-ok": 0}, rpm
        return f"rpm in force by model: {rpm}; 20 fake-ok calls, none paced"

    def malformed_answer_retried_and_counted() -> str:
        # Issue 31: an answer that is not the asked-for JSON is retried, and
        # the tokens of every attempt are in usage_total (usage stays empty:
        # no attempt succeeded).
        schema = {"type": "object", "properties": {"a": {"type": "integer"}},
                  "required": ["a"], "additionalProperties": False}
        try:
            client.call_llm(body("fake-ok"), schema=schema, max_retries=2)
        except llmretry.InvalidResponseError as exc:
            assert exc.attempts == 3, repr(exc)
            assert exc.validation_errors, repr(exc)
            one = client.call_llm(body("fake-ok")).meta.usage
            total = exc.usage_total
            assert one and total, (one, total)
            assert total["total_tokens"] == 3 * one["total_tokens"] > 0, (one, total)
            assert "hello from litellm" not in str(exc) + repr(exc.validation_errors)
            return (f"{exc.attempts} attempts, {exc.validation_errors[0]}, "
                    f"usage_total {total}")
        raise AssertionError("no error")

    def bad_path_named() -> str:
        c = llmretry.Client(base_url=base_url.rsplit("/v1", 1)[0] + "/nope", api_key=KEY,
                            logger=None, max_retries=0)
        try:
            c.call_llm(body("fake-ok"))
        except llmretry.HTTPStatusError as exc:
            assert "/nope/chat/completions" in str(exc), str(exc)
            return str(exc)[:100]
        finally:
            c.close()
        raise AssertionError("no error")

    def burst_over_cache_shards() -> str:
        # Past 64 HTTP/1.1 calls in flight the engine spreads them over
        # connection caches of 64 (core/src/conn_shards.c): two bursts of 200
        # at once against uvicorn, every answer whole, the second on the
        # first's connections.
        lines = []
        for round_ in (1, 2):
            t0 = time.monotonic()
            out = client.call_many([body("fake-ok", f"b{i}") for i in range(200)], limit=200)
            texts = [r.data["choices"][0]["message"]["content"]
                     for r in out if isinstance(r, llmretry.Result)]
            lost = [repr(v)[:120] for v in out if not isinstance(v, llmretry.Result)]
            assert out.summary.ok == 200, f"round {round_}: {out.summary.ok} of 200 ok; {lost[:2]}"
            assert texts == ["hello from litellm"] * 200, texts[:3]
            lines.append(f"round {round_}: 200 of 200 ok, {out.summary.attempts} attempts, "
                         f"{time.monotonic() - t0:.1f} s")
        return "; ".join(lines)

    check("a plain call", plain)
    check("a 500 is retried, the error names the path", server_error_retried)
    check("an idle keep-alive connection uvicorn closed", idle_keepalive_resent)
    check("batches over LiteLLM's rpm limits, nothing configured", rate_limited_batches)
    check("models limited apart on one key", models_limited_apart)
    check("a wrong base_url names the path", bad_path_named)
    check("two bursts of 200 calls at once (connection caches of 64)", burst_over_cache_shards)
    check("a malformed answer is retried, every attempt's tokens counted",
          malformed_answer_retried_and_counted)
    client.close()
    return checks.summary("litellm")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
