"""What llmretry does against LiteLLM's proxy (a server nobody here wrote).

Run by tools/interop.sh (``make interop``), not by ``make test``: LiteLLM
takes minutes to install. Each check prints one line; the script exits 1
when any fails. Usage: check_litellm.py BASE_URL
"""

from __future__ import annotations

import sys
import time
from typing import Callable, List, Tuple

import llmretry

KEY = "sk-1234"
results: List[Tuple[str, bool, str]] = []


def check(name: str, fn: Callable[[], str]) -> None:
    try:
        detail = fn()
        results.append((name, True, detail))
    except AssertionError as exc:
        results.append((name, False, str(exc)))
    except Exception as exc:  # a foreign exception is a failure too
        results.append((name, False, f"{type(exc).__name__}: {exc}"))
    ok, what = results[-1][1], results[-1][2]
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {what}", flush=True)


def body(model: str, text: str = "hi") -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}]}


def main(base_url: str) -> int:
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

    check("a plain call", plain)
    check("a 500 is retried, the error names the path", server_error_retried)
    check("an idle keep-alive connection uvicorn closed", idle_keepalive_resent)
    check("batches over LiteLLM's rpm limits, nothing configured", rate_limited_batches)
    check("a wrong base_url names the path", bad_path_named)
    client.close()
    failed = [name for name, ok, _ in results if not ok]
    print(f"interop (litellm): {len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
