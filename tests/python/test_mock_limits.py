"""Tests of the mock server's rate limits (llmretry.testing, "Rate limits").

The mock is driven with raw http.client requests so that it is tested on its
own; only ``test_call_llm_retries_after_the_mocks_retry_after`` uses llmretry.
A test that needs time to pass scripts a manual clock and advances it
(``clock="manual"``, ``advance_clock``): nothing sleeps, and its waits are
exact. Others use the real clock with windows of about a second, their
timing assertions leaving a few hundred ms of slack for a loaded machine.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from typing import Any, Dict, Iterator, List, Tuple

import pytest

import llmretry
from llmretry.testing import MockServer, ScriptError

# Python only (the mock server, the type checker, version files): the
# sanitizer and pipe-notifier passes skip it (tools/check.sh, pipe-notifier-test.sh).
pytestmark = pytest.mark.pure_python

Response = Tuple[int, Dict[str, str], Any]


@pytest.fixture
def mock() -> Iterator[MockServer]:
    with MockServer() as server:
        yield server


def request(mock: MockServer, method: str, path: str,
            body: Any = None, timeout: float = 10.0) -> Response:
    """One request on a new connection: (status, lower-case headers, JSON or
    raw body)."""
    conn = http.client.HTTPConnection("127.0.0.1", mock.port, timeout=timeout)
    try:
        data = None if body is None else (
            body if isinstance(body, (str, bytes)) else json.dumps(body))
        conn.request(method, path, body=data,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        headers = {k.lower(): v for k, v in resp.getheaders()}
        try:
            return resp.status, headers, json.loads(raw)
        except ValueError:
            return resp.status, headers, raw
    finally:
        conn.close()


def chat(mock: MockServer, name: str, content: str = "hi",
         **fields: Any) -> Response:
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    body.update(fields)
    return request(mock, "POST", f"/s/{name}/v1/chat/completions", body)


def duration_ms(text: str) -> float:
    """Parse an OpenAI (Go) duration such as "1m30.5s", "250ms", "0s"."""
    assert re.fullmatch(r"(\d+(\.\d+)?(h|ms|m|s))+", text), text
    units = {"h": 3600000.0, "m": 60000.0, "s": 1000.0, "ms": 1.0}
    return sum(float(n) * units[u]
               for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text))


def content(body: Any) -> Any:
    return body["choices"][0]["message"]["content"]


def rate(headers: Dict[str, str]) -> Dict[str, str]:
    return {k: v for k, v in headers.items() if k.startswith("x-ratelimit-")}


# --------------------------------------------------------------------------
# Requests per window
# --------------------------------------------------------------------------

def test_rpm_refusal_headers_and_retry_after(mock: MockServer) -> None:
    mock.script("r", [], limits={"rpm": 2, "window_ms": 1000})
    status, h1, _ = chat(mock, "r")
    assert status == 200
    # No tpm: no -tokens headers.
    # The limit is stated per minute: 2 per 1 s window is 120 a minute.
    assert rate(h1) == {"x-ratelimit-limit-requests": "120",
                        "x-ratelimit-remaining-requests": "1",
                        "x-ratelimit-reset-requests": "0s"}
    assert "retry-after" not in h1
    status, h2, _ = chat(mock, "r")
    assert status == 200
    assert h2["x-ratelimit-remaining-requests"] == "0"
    # Full now: one more request fits when the first leaves (~1 s after it).
    assert 500 <= duration_ms(h2["x-ratelimit-reset-requests"]) <= 1000

    status, h3, body = chat(mock, "r")
    assert status == 429
    assert h3["content-type"] == "application/json"
    assert body["error"]["type"] == "requests"
    assert body["error"]["code"] == "rate_limit_exceeded"
    assert body["error"]["message"].startswith(
        "Rate limit reached for requests")
    assert h3["x-ratelimit-limit-requests"] == "120"
    assert h3["x-ratelimit-remaining-requests"] == "0"
    wait = int(h3["retry-after-ms"])
    assert 500 <= wait <= 1000
    assert h3["retry-after"] == "1"          # seconds, rounded up
    assert abs(duration_ms(h3["x-ratelimit-reset-requests"]) - wait) <= 1

    records = mock.requests("r")
    assert [r["rate_limited"] for r in records] == [False, False, True]
    assert [r["index"] for r in records] == [0, 1, 2]
    assert [r["step"] for r in records] == [-1, -1, None]


def test_retry_after_is_at_least_one_second_and_rounds_up(
        mock: MockServer) -> None:
    mock.script("short", [], limits={"rpm": 1, "window_ms": 200})
    assert chat(mock, "short")[0] == 200
    status, headers, _ = chat(mock, "short")
    assert status == 429
    assert headers["retry-after"] == "1"     # 200 ms -> at least 1 s
    assert 1 <= int(headers["retry-after-ms"]) <= 200

    mock.script("long", [], limits={"rpm": 1, "window_ms": 90500})
    assert chat(mock, "long")[0] == 200
    status, headers, _ = chat(mock, "long")
    assert status == 429
    assert headers["retry-after"] == "91"    # 90.5 s rounded up
    reset = headers["x-ratelimit-reset-requests"]
    assert re.fullmatch(r"1m30(\.\d+)?s", reset), reset
    assert 89000 < duration_ms(reset) <= 90500


def test_refused_requests_do_not_consume_steps(mock: MockServer) -> None:
    mock.script("steps", [{"content": "first"}, {"content": "second"}],
                after={"status": 500},
                limits={"rpm": 1, "window_ms": 400}, clock="manual")
    status, _, body = chat(mock, "steps")
    assert status == 200 and content(body) == "first"
    for _ in range(3):
        assert chat(mock, "steps")[0] == 429
    mock.advance_clock("steps", 400)
    status, _, body = chat(mock, "steps")
    assert status == 200 and content(body) == "second"
    records = mock.requests("steps")
    assert [r["step"] for r in records] == [0, None, None, None, 1]
    assert [r["index"] for r in records] == [0, 1, 2, 3, 4]


def test_sliding_window_frees_capacity_as_requests_age(
        mock: MockServer) -> None:
    mock.script("slide", [], limits={"rpm": 2, "window_ms": 1000},
                clock="manual")
    assert chat(mock, "slide")[0] == 200                 # A at 0
    mock.advance_clock("slide", 500)
    assert chat(mock, "slide")[0] == 200                 # B at 0.5
    status, headers, _ = chat(mock, "slide")             # C: full
    assert status == 429
    assert int(headers["retry-after-ms"]) == 500         # until A leaves
    mock.advance_clock("slide", 499)
    assert chat(mock, "slide")[0] == 429                 # A still in
    mock.advance_clock("slide", 1)
    status, headers, _ = chat(mock, "slide")             # D: A has left
    assert status == 200
    assert headers["x-ratelimit-remaining-requests"] == "0"
    # A fixed window would be empty again now; the sliding one still
    # holds B (until 1.5 s), so E is refused.
    status, headers, body = chat(mock, "slide")
    assert status == 429 and body["error"]["type"] == "requests"
    assert int(headers["retry-after-ms"]) == 500
    assert mock.limit_stats("slide") == {"admitted": 3, "refused": 3,
                                         "tokens": 3 * (1 + 3)}


def test_remaining_counts_decrease(mock: MockServer) -> None:
    mock.script("count", [], limits={"rpm": 5, "tpm": 1000,
                                     "window_ms": 5000})
    seen: List[Tuple[str, str]] = []
    for content in ("a" * 8, "b" * 40, "c" * 1):
        status, headers, _ = chat(mock, "count", content)
        assert status == 200
        assert headers["x-ratelimit-limit-requests"] == "60"        # 5 per 5 s
        assert headers["x-ratelimit-limit-tokens"] == "12000"
        seen.append((headers["x-ratelimit-remaining-requests"],
                     headers["x-ratelimit-remaining-tokens"]))
        # Tokens are in the window: back to the limit ~5 s after the last.
        assert 4000 < duration_ms(headers["x-ratelimit-reset-tokens"]) <= 5000
        assert headers["x-ratelimit-reset-requests"] == "0s"
    # Charges: ceil(8/4)+3 = 5, ceil(40/4)+3 = 13, ceil(1/4)+3 = 4.
    assert seen == [("4", "995"), ("3", "982"), ("2", "978")]
    assert [r["tokens_charged"] for r in mock.requests("count")] == [5, 13, 4]


# --------------------------------------------------------------------------
# Tokens per window
# --------------------------------------------------------------------------

def test_tpm_refusal_with_max_tokens(mock: MockServer) -> None:
    mock.script("tok", [], limits={"tpm": 100, "window_ms": 1000})
    # 40 characters -> 10 prompt tokens, + max_tokens 50 = 60.
    status, headers, _ = chat(mock, "tok", "x" * 40, max_tokens=50)
    assert status == 200
    assert rate(headers).keys() == {"x-ratelimit-limit-tokens",
                                    "x-ratelimit-remaining-tokens",
                                    "x-ratelimit-reset-tokens"}
    assert headers["x-ratelimit-remaining-tokens"] == "40"

    status, headers, body = chat(mock, "tok", "x" * 40, max_tokens=50)
    assert status == 429
    assert body["error"]["type"] == "tokens"
    assert body["error"]["code"] == "rate_limit_exceeded"
    assert headers["x-ratelimit-remaining-tokens"] == "40"
    assert 500 <= int(headers["retry-after-ms"]) <= 1000
    assert headers["retry-after"] == "1"

    # 40 fits exactly (10 + max_completion_tokens 30), which wins over
    # max_tokens.
    status, headers, _ = chat(mock, "tok", "x" * 40, max_tokens=500,
                              max_completion_tokens=30)
    assert status == 200
    assert headers["x-ratelimit-remaining-tokens"] == "0"
    records = mock.requests("tok")
    assert [(r["rate_limited"], r["tokens_charged"]) for r in records] == \
        [(False, 60), (True, 60), (False, 40)]
    assert mock.limit_stats("tok") == {"admitted": 2, "refused": 1,
                                       "tokens": 100}


def test_token_charge_without_max_tokens_uses_the_steps_usage(
        mock: MockServer) -> None:
    mock.script("usage", [{"usage": {"prompt_tokens": 1,
                                     "completion_tokens": 40,
                                     "total_tokens": 41}}, {}],
                limits={"tpm": 1000})
    body = {"model": "m",
            "messages": [{"role": "system", "content": "abc"},   # 3
                         {"role": "user", "content": [
                             {"type": "text", "text": "defgh"},  # 5
                             {"type": "image_url",
                              "image_url": {"url": "x"}}]},
                         {"role": "assistant", "content": None}],
            "input": "ij"}                                       # 2
    for _ in range(2):
        assert request(mock, "POST", "/s/usage/v1/chat/completions",
                       body)[0] == 200
    assert request(mock, "POST", "/s/usage/v1/chat/completions",
                   b"not json")[0] == 200
    # ceil(10/4) = 3, + 40 (the step's usage), + 3 (default usage); a body
    # that is not JSON costs the default completion tokens alone.
    assert [r["tokens_charged"] for r in mock.requests("usage")] == \
        [43, 6, 3]


def test_token_wait_counts_only_the_tokens_needed(mock: MockServer) -> None:
    mock.script("need", [], limits={"tpm": 100, "window_ms": 1000},
                clock="manual")
    assert chat(mock, "need", "", max_tokens=60)[0] == 200      # A at 0
    mock.advance_clock("need", 400)
    assert chat(mock, "need", "", max_tokens=30)[0] == 200      # B at 0.4
    status, headers, _ = chat(mock, "need", "", max_tokens=50)  # 90+50 > 100
    assert status == 429
    # 50 fits once A leaves (0.6 s from now); every token has left when B
    # does (1 s from now): Retry-After and the tokens reset differ.
    assert int(headers["retry-after-ms"]) == 600
    assert duration_ms(headers["x-ratelimit-reset-tokens"]) == 1000
    mock.advance_clock("need", 600)
    assert chat(mock, "need", "", max_tokens=50)[0] == 200


def test_request_larger_than_tpm_is_always_refused(mock: MockServer) -> None:
    mock.script("big", [], limits={"tpm": 50, "window_ms": 1000})
    status, headers, body = chat(mock, "big", max_tokens=1000)
    assert status == 429
    assert body["error"]["type"] == "tokens"
    assert "never fits" in body["error"]["message"]
    assert headers["retry-after"] == "1"
    assert headers["retry-after-ms"] == "1000"   # a whole window
    assert headers["x-ratelimit-remaining-tokens"] == "50"
    assert chat(mock, "big", max_tokens=10)[0] == 200


# --------------------------------------------------------------------------
# Header options, streaming, concurrency
# --------------------------------------------------------------------------

def test_no_retry_after_mode(mock: MockServer) -> None:
    mock.script("lite", [], limits={"rpm": 1, "window_ms": 1000,
                                    "retry_after": False})
    assert chat(mock, "lite")[0] == 200
    status, headers, body = chat(mock, "lite")
    assert status == 429 and body["error"]["type"] == "requests"
    assert "retry-after" not in headers
    assert "retry-after-ms" not in headers
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert 500 <= duration_ms(headers["x-ratelimit-reset-requests"]) <= 1000


def test_rate_headers_off(mock: MockServer) -> None:
    mock.script("quiet", [], limits={"rpm": 1, "tpm": 100,
                                     "rate_headers": False})
    status, headers, _ = chat(mock, "quiet")
    assert status == 200 and rate(headers) == {}
    status, headers, _ = chat(mock, "quiet")
    assert status == 429 and rate(headers) == {}
    assert int(headers["retry-after"]) >= 59      # default window: 60 s


def test_limits_stated_per_window(mock: MockServer) -> None:
    """stated_per "window": the limit headers give the window's own figures
    (a server with a 1 s window saying 10, not 600 a minute)."""
    mock.script("win", [], limits={"rpm": 10, "tpm": 500, "window_ms": 1000,
                                   "stated_per": "window"})
    status, headers, _ = chat(mock, "win", max_tokens=7)
    assert status == 200
    assert rate(headers) == {"x-ratelimit-limit-requests": "10",
                             "x-ratelimit-remaining-requests": "9",
                             "x-ratelimit-reset-requests": "0s",
                             "x-ratelimit-limit-tokens": "500",
                             "x-ratelimit-remaining-tokens": "492",
                             "x-ratelimit-reset-tokens":
                                 headers["x-ratelimit-reset-tokens"]}
    mock.script("min", [], limits={"rpm": 10, "window_ms": 1000, "stated_per": "minute"})
    assert chat(mock, "min")[1]["x-ratelimit-limit-requests"] == "600"


def test_step_headers_override_rate_headers(mock: MockServer) -> None:
    mock.script("over", [{"ratelimit_reset_requests": "garbage",
                          "headers": {"x-ratelimit-limit-requests": "9"}}],
                limits={"rpm": 3})
    status, headers, _ = chat(mock, "over")
    assert status == 200
    assert headers["x-ratelimit-reset-requests"] == "garbage"
    assert headers["x-ratelimit-limit-requests"] == "9"
    assert headers["x-ratelimit-remaining-requests"] == "2"


def test_streams_are_limited_the_same_way(mock: MockServer) -> None:
    mock.script("sse", [{"stream": {"chunks": 2}, "content": "hey"}],
                limits={"rpm": 1, "tpm": 100, "window_ms": 1000})
    status, headers, raw = chat(mock, "sse", "x" * 8, stream=True,
                                max_tokens=20)
    assert status == 200
    assert headers["content-type"] == "text/event-stream"
    assert raw.endswith(b"data: [DONE]\n\n")
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-remaining-tokens"] == str(100 - 2 - 20)
    status, headers, body = chat(mock, "sse", stream=True)
    assert status == 429                     # JSON, not a stream
    assert headers["content-type"] == "application/json"
    assert body["error"]["code"] == "rate_limit_exceeded"
    first, second = mock.requests("sse")
    assert first["events_sent"] == 4 and first["tokens_charged"] == 22
    assert "events_sent" not in second and second["rate_limited"] is True


def test_concurrent_requests_never_overshoot(mock: MockServer) -> None:
    mock.script("race", [], limits={"rpm": 5, "window_ms": 30000})
    statuses: List[int] = []
    lock = threading.Lock()

    def worker() -> None:
        status = chat(mock, "race")[0]
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=worker) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(statuses) == [200] * 5 + [429] * 15
    assert mock.limit_stats("race") == {"admitted": 5, "refused": 15,
                                        "tokens": 5 * 4}


# --------------------------------------------------------------------------
# Stats, scripting, validation
# --------------------------------------------------------------------------

def test_stats_endpoint(mock: MockServer) -> None:
    mock.script("st", [], limits={"rpm": 2, "window_ms": 10000})
    for _ in range(3):
        chat(mock, "st", "abcd")
    status, _, stats = request(mock, "GET", "/_mock/limits/st")
    assert status == 200
    assert stats == {"admitted": 2, "refused": 1, "tokens": 2 * (1 + 3)}
    assert mock.limit_stats("st") == stats
    # Clearing the records keeps the totals (and the window) ...
    assert request(mock, "DELETE", "/_mock/requests/st")[0] == 204
    assert mock.limit_stats("st") == stats
    assert chat(mock, "st")[0] == 429
    # ... a new script resets both.
    mock.script("st", [], limits={"rpm": 2, "window_ms": 10000})
    assert mock.limit_stats("st") == {"admitted": 0, "refused": 0, "tokens": 0}
    assert chat(mock, "st")[0] == 200
    # A scenario without limits: 404, KeyError, no extra record fields.
    mock.script("plain", [])
    chat(mock, "plain")
    status, _, body = request(mock, "GET", "/_mock/limits/plain")
    assert status == 404 and "no limits" in body["error"]["message"]
    assert request(mock, "GET", "/_mock/limits/unknown")[0] == 404
    assert request(mock, "POST", "/_mock/limits/st")[0] == 405
    with pytest.raises(KeyError):
        mock.limit_stats("plain")
    assert "rate_limited" not in mock.requests("plain")[0]
    assert "tokens_charged" not in mock.requests("plain")[0]


def test_limits_by_put_and_load_scenarios(mock: MockServer) -> None:
    status, _, _ = request(mock, "PUT", "/_mock/scenarios/put",
                           {"steps": [], "limits": {"rpm": 1}})
    assert status == 204
    assert chat(mock, "put")[0] == 200
    assert chat(mock, "put")[0] == 429
    mock.load_scenarios({"file": {"steps": [{"content": "x"}],
                                  "limits": {"tpm": 10}}})
    assert chat(mock, "file", max_tokens=11)[0] == 429
    assert chat(mock, "file", max_tokens=5)[0] == 200
    # {} limits nothing but counts.
    mock.script("count", [], limits={})
    status, headers, _ = chat(mock, "count", max_tokens=7)
    assert status == 200 and rate(headers) == {}
    assert mock.limit_stats("count") == {"admitted": 1, "refused": 0,
                                         "tokens": 8}


@pytest.mark.parametrize("limits", [
    5, [], "rpm", {"rpm": 0}, {"rpm": -1}, {"rpm": 1.5}, {"rpm": True},
    {"rpm": "10"}, {"tpm": 0}, {"window_ms": 0}, {"window_ms": -5},
    {"window_ms": "1000"}, {"window_ms": True}, {"retry_after": "yes"},
    {"rate_headers": 1}, {"rmp": 3}, {"stated_per": "hour"}, {"stated_per": None},
])
def test_bad_limits_are_rejected(mock: MockServer, limits: Any) -> None:
    mock.script("bad", [{"content": "kept"}], limits={"rpm": 100})
    status, _, body = request(mock, "PUT", "/_mock/scenarios/bad",
                              {"steps": [], "limits": limits})
    assert status == 400
    assert "limits" in body["error"]["message"]
    with pytest.raises(ScriptError):
        mock.script("bad", [], limits=limits)
    with pytest.raises(ScriptError):
        mock.load_scenarios({"bad": {"steps": [], "limits": limits}})
    # The previous script (and its limits) is kept.
    status, headers, body = chat(mock, "bad")
    assert status == 200 and content(body) == "kept"
    assert headers["x-ratelimit-limit-requests"] == "100"


# --------------------------------------------------------------------------
# With the client
# --------------------------------------------------------------------------

@pytest.mark.parametrize("retry_after", [True, False])
def test_call_llm_retries_after_the_mocks_retry_after(
        mock: MockServer, retry_after: bool) -> None:
    name = f"client-{retry_after}"
    mock.script(name, [], limits={"rpm": 1, "window_ms": 700,
                                  "retry_after": retry_after})
    filled = time.monotonic()
    assert chat(mock, name)[0] == 200          # fill the window
    events: List[Dict[str, Any]] = []
    seen_at: List[float] = []

    def log(event: Dict[str, Any]) -> None:
        events.append(event)
        seen_at.append(time.monotonic())

    start = time.monotonic()
    # A client of its own: no connections cached by other tests.
    with llmretry.Client() as client:
        data, meta = llmretry.call_llm(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            base_url=mock.scenario_url(name), api_key="sk-test",
            max_retries=2, base_delay_ms=10, jitter="none", timeout_ms=5000,
            logger=log, client=client)
    elapsed = time.monotonic() - start
    assert meta.attempts == 2
    assert data["choices"][0]["message"]["content"] == "ok"
    scheduled = [e for e in events if e["event"] == "llm_retry_scheduled"]
    assert len(scheduled) == 1
    # With Retry-After the client waits retry-after-ms; without, it falls
    # back on x-ratelimit-reset-requests: the same wait either way.
    assert scheduled[0]["delay_source"] == \
        ("retry_after" if retry_after else "ratelimit_reset")
    # The window's rest when the 429 was sent: at most 700 ms, and at least
    # 700 ms less the time from before the fill to this event (which came
    # after the 429). A fixed floor flaked on a loaded machine.
    waited_before = seen_at[events.index(scheduled[0])] - filled
    assert 700 - waited_before * 1000 - 5 <= scheduled[0]["delay_ms"] <= 700
    assert elapsed >= scheduled[0]["delay_ms"] / 1000 - 0.01
    assert [r["rate_limited"] for r in mock.requests(name)] == \
        [False, True, False]
