"""Client-side rate limits (issue 18): rpm/tpm paced by the engine, one
budget per endpoint shared by every call, batch, pool and loop of a client;
times come from the mock's records of when each request arrived."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from typing import Any, List

import pytest

import llmretry
from conftest import FAST, SECRET_KEY, child_env

BODY = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}


def arrivals(scen: Any) -> List[float]:
    """Each request's arrival, in ms after the first, in arrival order (the
    mock's records are in the order it handled them)."""
    times = sorted(r["time"] for r in scen.requests())
    return [(t - times[0]) * 1000 for t in times]


def assert_paced(t: List[float], per_second: int) -> None:
    """Evenly: any request k came no earlier than (k - j) * 1000 / per_second
    ms after any earlier request j, less 100 ms. The times are the kernel's
    (when each request reached the mock's socket, not when a thread of a
    loaded machine read it); the slack lets the engine's I/O thread, woken
    late, send one request with its neighbour, never a burst (40 requests
    at once would be ~0 ms apart against the 1,950 ms asked)."""
    gap = 1000 / per_second
    for k in range(1, len(t)):
        for j in range(k):
            assert t[k] - t[j] >= (k - j) * gap - 100, (j, k, t[j], t[k], t)


def test_rpm_paces_a_batch(scen: Any) -> None:
    client = llmretry.Client(api_key=SECRET_KEY, logger=None, rpm=600, **FAST)
    try:
        out = client.call_many([BODY] * 20, limit=20, base_url=scen.url)
    finally:
        client.close()
    assert out.summary.ok == 20
    t = arrivals(scen)
    assert len(t) == 20
    assert_paced(t, 10)
    assert t[-1] < 3500


def test_one_budget_for_batches_threads_and_loops(scen: Any) -> None:
    """Two batches in two threads, a thread pool and an event loop on one
    client: 40 requests in all, paced together at 20 a second."""
    client = llmretry.Client(api_key=SECRET_KEY, logger=None, rpm=1200, base_url=scen.url,
                             **FAST)
    errors: List[BaseException] = []

    def batch() -> None:
        try:
            assert client.call_many([BODY] * 10, limit=10).summary.ok == 10
        except BaseException as exc:   # reported below
            errors.append(exc)

    def pool() -> None:
        try:
            out = llmretry.map_with_concurrency(
                range(10), 5, lambda i, k: client.call_llm(BODY).meta.status)
            assert list(out) == [200] * 10
        except BaseException as exc:
            errors.append(exc)

    def loop() -> None:
        async def main() -> None:
            rs = await asyncio.gather(*(client.acall_llm(BODY) for _ in range(10)))
            assert all(r.meta.status == 200 for r in rs)
        try:
            asyncio.run(main())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=f) for f in (batch, batch, pool, loop)]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
    finally:
        client.close()
    assert not errors, errors
    t = arrivals(scen)
    assert len(t) == 40
    assert_paced(t, 20)


def test_tpm_paces_by_estimated_tokens(scen: Any) -> None:
    body = dict(BODY, max_tokens=400)       # 401 tokens each against 1000 a second
    client = llmretry.Client(api_key=SECRET_KEY, logger=None, tpm=60000, **FAST)
    try:
        out = client.call_many([body] * 5, limit=5, base_url=scen.url)
    finally:
        client.close()
    assert out.summary.ok == 5
    t = arrivals(scen)
    for k in range(1, 5):                   # one each 401 ms
        assert t[k] >= k * 401 - 60, (k, t)


def test_a_call_waiting_for_budget_fails_at_its_deadline(scen: Any) -> None:
    client = llmretry.Client(api_key=SECRET_KEY, logger=None, rpm=60, base_url=scen.url,
                             **FAST)
    try:
        client.call_llm(BODY)
        with pytest.raises(llmretry.DeadlineExceededError) as ei:
            client.call_llm(BODY, deadline_ms=300)
    finally:
        client.close()
    assert ei.value.attempts == 0 and "rate budget" in str(ei.value)
    assert len(scen.requests()) == 1


def test_a_429_in_a_batch_pauses_a_plain_call(scen: Any) -> None:
    """The named wait holds for every call to the endpoint."""
    scen.script([{"status": 429, "retry_after": "1"}])
    client = llmretry.Client(api_key=SECRET_KEY, logger=None, base_url=scen.url, **FAST)
    got: List[Any] = []
    try:
        th = threading.Thread(target=lambda: got.append(client.call_many([BODY], limit=1)))
        th.start()
        # The 429 is in (its attempt over, nothing in flight): the wait is named.
        end = time.monotonic() + 10
        while not (scen.requests() and client.endpoint_stats()
                   and client.endpoint_stats()[0]["in_flight"] == 0):
            assert time.monotonic() < end, "the batch's 429 never came back"
            time.sleep(0.01)
        res = client.call_llm(BODY)
        th.join(10)
    finally:
        client.close()
    assert res.meta.attempts == 1 and got[0].summary.ok == 1
    t = arrivals(scen)
    assert len(t) == 3 and min(t[1:]) >= 900, t


def test_rate_options_are_checked_and_named() -> None:
    with pytest.raises(ValueError, match=r"rpm must be >= 0 \(0: none\) \(got -1\)"):
        llmretry.call_llm(BODY, base_url="http://127.0.0.1:9/v1", api_key="k", rpm=-1)
    with pytest.raises(TypeError, match="tpm"):
        llmretry.Client(tpm="100")  # type: ignore[arg-type]


def test_a_policy_sets_rpm(scen: Any, tmp_path: Any) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"paced": {"rpm": 300}}))
    client = llmretry.Client.from_file(path, api_key=SECRET_KEY, logger=None, **FAST)
    try:
        assert client.policies["paced"]
        out = client.call_many([BODY] * 6, limit=6, base_url=scen.url, policy="paced")
    finally:
        client.close()
    assert out.summary.ok == 6
    assert_paced(arrivals(scen), 5)


def test_cli_rpm(scen: Any, tmp_path: Any) -> None:
    req = tmp_path / "in.jsonl"
    req.write_text("".join(json.dumps(BODY) + "\n" for _ in range(6)))
    env = child_env()
    env["OPENAI_API_KEY"] = SECRET_KEY
    proc = subprocess.run([sys.executable, "-m", "llmretry", "batch", str(req), "-o",
                           str(tmp_path / "out.jsonl"), "--limit", "6", "--rpm", "240",
                           "--base-url", scen.url], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert_paced(arrivals(scen), 4)


# ---------------------------------------------------------------------------
# Against the mock enforcing a provider's limits (sliding windows, 429s)

def limited(scen: Any, **limits: Any) -> str:
    scen.server.script(scen.name, [], None, limits=limits)
    return scen.url


def refused(scen: Any) -> int:
    return sum(1 for r in scen.requests() if r.get("rate_limited"))


def test_configured_rpm_stays_under_a_provider_limit(scen: Any) -> None:
    """600 a minute enforced per second (10 in any 1 s): paced at 600/min,
    60 items at limit=16 all go through with at most one refusal."""
    url = limited(scen, rpm=10, window_ms=1000)
    client = llmretry.Client(api_key=SECRET_KEY, logger=None, rpm=600, **FAST)
    try:
        out = client.call_many([BODY] * 40, limit=16, base_url=url)
    finally:
        client.close()
    assert out.summary.ok == 40
    assert refused(scen) <= 1, refused(scen)


def test_learned_limits_stop_before_the_server_refuses(scen: Any) -> None:
    """Nothing configured: the first answers' x-ratelimit-limit-requests
    (600 a minute) pace the rest. Before learning, 60 items at limit=16
    against 10 a second drew 36 refusals."""
    url = limited(scen, rpm=10, window_ms=1000)
    client = llmretry.Client(api_key=SECRET_KEY, logger=None, **FAST)
    try:
        out = client.call_many([BODY] * 40, limit=16, base_url=url)
    finally:
        client.close()
    assert out.summary.ok == 40
    # Only the first wave, sent before any answer, can be refused.
    assert refused(scen) <= 8, refused(scen)


def test_no_retry_after_as_litellm_sends_429s(scen: Any) -> None:
    """429s with no Retry-After (LiteLLM's router): rpm keeps the batch
    under the limit, so none is needed."""
    url = limited(scen, rpm=5, window_ms=1000, retry_after=False)
    client = llmretry.Client(api_key=SECRET_KEY, logger=None, rpm=300, **FAST)
    try:
        out = client.call_many([BODY] * 15, limit=4, base_url=url)
    finally:
        client.close()
    assert out.summary.ok == 15
    assert refused(scen) <= 1, refused(scen)


def test_a_limit_stated_per_window_is_not_read_per_minute(scen: Any) -> None:
    """A server stating its short window's own limit (10 per 500 ms says
    x-ratelimit-limit-requests: 10, not 1200 a minute) with remaining and
    reset: nothing configured, the server's remaining sets the pace, not 10
    a minute (issue 27 item 7: 60 items took minutes while the server said
    9 remained). The batch's deadline, 4x what 20 a second takes, bounds a
    per-minute reading's minutes."""
    url = limited(scen, rpm=10, window_ms=500, stated_per="window")
    client = llmretry.Client(api_key=SECRET_KEY, logger=None, **FAST)
    try:
        out = client.call_many([BODY] * 40, limit=16, base_url=url, deadline_ms=8000)
    finally:
        client.close()
    assert out.summary.ok == 40, out.summary.format()
    # The first wave, sent before any answer, can be refused (6 of 16), and
    # a window's edge seen late by a loaded machine (8 were seen at a load of
    # 13 on 2 cores). A per-minute reading fails items at the deadline,
    # checked above.
    assert refused(scen) <= 10, refused(scen)


def stated(remaining: int, reset: str) -> dict:
    """A step answering 200 and stating 10 requests, `remaining` of them
    left, room again in `reset` (as a server keeping fixed windows does)."""
    return {"headers": {"x-ratelimit-limit-requests": "10",
                        "x-ratelimit-remaining-requests": str(remaining),
                        "x-ratelimit-reset-requests": reset}}


def test_a_window_reading_stands_against_weaker_answers(scen: Any) -> None:
    """Whether a stated limit is a minute's or a shorter window's, an answer
    tells only by how much was used: 8 of 10 used and room again in 5 s is
    a window (a minute's would give 8 back over 48 s); 1 used and room in
    5.5 s is what either says (a minute's gives 1 back in 6 s). The weaker
    answer used to overturn the stronger one's verdict: a server keeping
    6 s windows of 10, seen through LiteLLM's proxy, was read as 10 a
    minute once a window's first answer said so, and then, paced one
    request a window, every answer said so again (40 items took 155 s for
    the 24 s the server allowed). Only an answer as strong overturns it."""
    def rpms(sub: Any, steps: List[Any]) -> List[int]:
        sub.script(steps)
        seen = []
        with llmretry.Client(api_key=SECRET_KEY, logger=None, base_url=sub.url,
                             **FAST) as client:
            for _ in steps:
                client.call_llm(BODY)
                seen.append(client.endpoint_stats()[0]["rpm"])
        return seen

    # While a window has room, its count paces, not a rate (0); once none is
    # left, 10 per the longest reset seen, 5.5 s: 109.1 a minute (shown rounded up).
    assert rpms(scen.sub("window"), [stated(2, "5s"), stated(9, "5.5s"), stated(0, "5s")]) \
        == [0, 0, 110]
    # Told as strongly that 8 used come back over 48 s: a minute's 10.
    assert rpms(scen.sub("minute"), [stated(2, "5s"), stated(2, "48s"), stated(0, "48s")]) \
        == [0, 10, 10]


def test_429s_naming_no_wait_slow_the_endpoint(scen: Any) -> None:
    """429s with no Retry-After and no x-ratelimit-* (LiteLLM's rpm limit):
    nothing configured and the default max_retries, the engine slows the
    endpoint down for every call, their retries spend no retry budget, and
    the batch loses at most a few items (issue 27 item 8: here 50 of 150 were
    ok, the rest retry_budget_exhausted / retries_exhausted). Each item still
    sends at most 1 + max_retries requests: a refused request is one the
    server saw."""
    url = limited(scen, rpm=50, window_ms=500, retry_after=False, rate_headers=False)
    client = llmretry.Client(api_key=SECRET_KEY, logger=None, base_delay_ms=20,
                             max_delay_ms=1000)
    try:
        out = client.call_many([BODY] * 150, limit=16, base_url=url)
        [stats] = client.endpoint_stats()
    finally:
        client.close()
    totals = scen.server.limit_stats(scen.name)
    share = totals["refused"] / (totals["admitted"] + totals["refused"])
    print(f"429 share {share:.1%} ({totals}); slowed to {stats['rpm']} a minute; "
          f"{out.summary.ok} of 150 ok")
    assert out.summary.ok >= 140, out.summary.format()
    for _, err in out.errors():
        assert err.reason == "retries_exhausted" and err.attempts == 4, repr(err)
    assert totals["admitted"] + totals["refused"] == out.summary.attempts <= 150 * 4
    assert stats["retries_refused"] == 0, stats      # 429s spend no retry budget
    assert stats["rpm"] > 0, stats                   # the pace the 429s taught


def test_tpm_stays_under_a_token_limit(scen: Any) -> None:
    """A provider's 60,000 tokens a minute enforced per second (1000 in any
    1 s), max_tokens=200 a call: tpm keeps every call admitted."""
    url = limited(scen, tpm=1000, window_ms=1000)
    body = dict(BODY, max_tokens=200)
    client = llmretry.Client(api_key=SECRET_KEY, logger=None, tpm=60000, **FAST)
    try:
        out = client.call_many([body] * 15, limit=8, base_url=url)
    finally:
        client.close()
    assert out.summary.ok == 15
    assert refused(scen) <= 1, refused(scen)


def test_tiktoken_counts_when_the_host_has_it(scen: Any, monkeypatch: Any) -> None:
    """With tiktoken importable, its count is the call's charge: here a fake
    encoding of one token per character (4 times the core's estimate) paces
    100-character prompts at 100 ms a call under 1000 tokens a second."""
    import types
    from llmretry import _tokens

    fake = types.ModuleType("tiktoken")
    fake.get_encoding = lambda name: types.SimpleNamespace(  # type: ignore[attr-defined]
        encode=lambda text: [0] * len(text))
    monkeypatch.setitem(sys.modules, "tiktoken", fake)
    monkeypatch.setattr(_tokens, "_tried", False)
    monkeypatch.setattr(_tokens, "_count", None)
    body = {"model": "gpt-test", "max_tokens": 0,
            "messages": [{"role": "user", "content": "x" * 100}]}
    assert _tokens.estimate_tokens(None, json.dumps(body).encode()) == 100
    client = llmretry.Client(api_key=SECRET_KEY, logger=None, tpm=60000, base_url=scen.url,
                             **FAST)
    try:
        for _ in range(6):
            client.call_llm(body)
    finally:
        client.close()
    # The core alone would charge 25 (100 characters / 4), then what the
    # usage says (12): 12 ms apart.
    assert_paced(arrivals(scen), 10)


def test_without_tiktoken_the_core_estimates(monkeypatch: Any) -> None:
    from llmretry import _tokens

    monkeypatch.setitem(sys.modules, "tiktoken", None)     # import fails
    monkeypatch.setattr(_tokens, "_tried", False)
    monkeypatch.setattr(_tokens, "_count", None)
    assert _tokens.estimate_tokens(None, b'{"messages": [{"content": "hi"}]}') == 0


@pytest.mark.parametrize("lazy", [False, True])
def test_tiktoken_counts_each_item_of_a_batch(scen: Any, monkeypatch: Any, lazy: bool) -> None:
    """call_many under tpm charges each item tiktoken's count, from a list
    and from a generator alike (the stand-in encoding: a token a character)."""
    import types
    from llmretry import _tokens

    fake = types.ModuleType("tiktoken")
    fake.get_encoding = lambda name: types.SimpleNamespace(  # type: ignore[attr-defined]
        encode=lambda text: [0] * len(text))
    monkeypatch.setitem(sys.modules, "tiktoken", fake)
    monkeypatch.setattr(_tokens, "_tried", False)
    monkeypatch.setattr(_tokens, "_count", None)
    body = {"model": "gpt-test", "max_tokens": 0,
            "messages": [{"role": "user", "content": "x" * 100}]}
    bodies: Any = (body for _ in range(6)) if lazy else [body] * 6
    client = llmretry.Client(api_key=SECRET_KEY, logger=None, tpm=60000, base_url=scen.url,
                             **FAST)
    try:
        got: List[int] = []
        out = client.call_many(bodies, limit=6, on_result=lambda i, v: got.append(i),
                               keep_results=not lazy)
    finally:
        client.close()
    assert sorted(got) == list(range(6)) and out.summary.ok == 6
    # 100 tokens against 1000 a second, less the call's own: 111 ms apart
    # (the core's own estimate, 25, then the usage's 12, would be ~13 ms).
    assert_paced(arrivals(scen), 10)
