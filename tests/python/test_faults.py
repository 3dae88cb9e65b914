"""The fault matrix through Python against the mock server.

Every status class, every Retry-After form, x-should-retry, rate-limit
resets, insufficient_quota, delays and timeouts, stalls, resets, closes,
truncated / invalid / huge bodies, deadlines and unsafe mode: each checks
the exception class and its attributes, the events (exact fields, calling
thread, invariants) and that neither the key nor the prompt leaks anywhere.
"""

from __future__ import annotations

import email.utils
import socket
import time
from typing import Any, Dict, List, Optional

import pytest

import llmretry
from conftest import (FAST, SECRET_KEY, Outcome, Scenario, check_calling_thread, check_error,
                      check_event_sequence, check_outcome_secrets, request_checks, run_call,
                      serialised)

RETRY_FLOW = ["llm_request_started", "llm_request_failed", "llm_retry_scheduled",
              "llm_request_started", "llm_request_succeeded"]
ERROR_FLOW = ["llm_request_started", "llm_request_error", "llm_retry_scheduled",
              "llm_request_started", "llm_request_succeeded"]
STOP_FLOW = ["llm_request_started", "llm_request_failed", "llm_request_gave_up"]


def common(out: Outcome, scen: Scenario, attempts: int) -> None:
    """Checks every outcome of the matrix gets."""
    meta_or_err = out.result.meta if out.ok else out.error
    assert meta_or_err.attempts == attempts, (
        f"attempts {meta_or_err.attempts}, expected {attempts} ({out.error!r})")
    check_event_sequence(out.events, attempts, meta_or_err.request_id)
    check_calling_thread(out)
    check_outcome_secrets(out)
    recs = scen.requests()
    assert len(recs) == attempts, f"server saw {len(recs)} requests for {attempts} attempts"
    request_checks(recs, meta_or_err.request_id, serialised(out.body))
    if not out.ok:
        gave_up = out.events.of("llm_request_gave_up")
        assert len(gave_up) == 1
        assert gave_up[0]["reason"] == out.error.reason
        assert gave_up[0]["error_kind"] == out.error.kind
        assert gave_up[0]["status"] == out.error.status


def ok_result(out: Outcome) -> llmretry.Result:
    assert out.ok, f"expected success, got {out.error!r}"
    return out.result


# ---------------------------------------------------------------------------
# Status classes
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("status", [200, 201, 202])
def test_2xx_success(scen: Scenario, status: int) -> None:
    out = run_call(scen, [{"status": status, "content": "hello"}])
    res = ok_result(out)
    common(out, scen, 1)
    assert res.meta.status == status
    assert res.data["choices"][0]["message"]["content"] == "hello"
    assert out.events.names == ["llm_request_started", "llm_request_succeeded"]


def test_204_no_body_is_invalid_response_then_retried(scen: Scenario) -> None:
    out = run_call(scen, [{"status": 204}])
    res = ok_result(out)
    common(out, scen, 2)
    assert out.events.names == ERROR_FLOW
    assert out.events.of("llm_request_error")[0]["error_kind"] == "invalid_response"
    assert res.meta.status == 200


def test_redirect_is_not_followed(scen: Scenario) -> None:
    target = scen.url + "/chat/completions"
    out = run_call(scen, [{"status": 302, "headers": {"Location": target}}])
    assert out.error is not None, "a 302 must not be followed"
    check_error(out.error, "http_status", reason="not_retryable", attempts=1, status=302)
    common(out, scen, 1)
    assert out.events.names == STOP_FLOW


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422, 501, 505])
def test_status_not_retried(scen: Scenario, status: int) -> None:
    out = run_call(scen, [{"status": status}])
    check_error(out.error, "http_status", reason="not_retryable", attempts=1, status=status)
    common(out, scen, 1)
    assert out.events.names == STOP_FLOW
    err = out.error
    # The mock's default error body has code null and type "server_error":
    # the core reports error.code, else error.type.
    assert err.error_code == "server_error"
    assert err.retry_after_ms is None
    assert err.body_preview and f"mock error {status}" in err.body_preview
    failed = out.events.of("llm_request_failed")[0]
    assert failed["status"] == status
    assert failed["retry_after"] is None
    assert failed["error_code"] == "server_error"
    assert f"mock error {status}" in failed["body_preview"]


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504, 599])
def test_status_retried_then_ok(scen: Scenario, status: int) -> None:
    out = run_call(scen, [{"status": status}])
    res = ok_result(out)
    common(out, scen, 2)
    assert out.events.names == RETRY_FLOW
    assert out.events.field("llm_retry_scheduled", "delay_source") == ["backoff"]
    assert out.events.field("llm_retry_scheduled", "delay_ms") == [20]
    assert res.meta.status == 200
    assert res.meta.attempt == 1


def test_status_retries_exhausted(scen: Scenario) -> None:
    out = run_call(scen, [], after={"status": 500})
    check_error(out.error, "http_status", reason="retries_exhausted", attempts=4, status=500)
    common(out, scen, 4)
    assert out.events.field("llm_retry_scheduled", "delay_ms") == [20, 40, 80]
    assert out.error.total_ms >= 140


def test_provider_error_code_kept(scen: Scenario) -> None:
    out = run_call(scen, [{"status": 400, "error_code": "context_length_exceeded"}])
    check_error(out.error, "http_status", reason="not_retryable", attempts=1, status=400)
    common(out, scen, 1)
    assert out.error.error_code == "context_length_exceeded"
    assert out.events.of("llm_request_failed")[0]["error_code"] == "context_length_exceeded"


def test_custom_retry_statuses(scen: Scenario) -> None:
    out = run_call(scen, [{"status": 418}], retry_statuses=[418])
    ok_result(out)
    common(out, scen, 2)
    other = scen.sub("exclude")
    out = run_call(other, [{"status": 503}], retry_statuses=[429])
    check_error(out.error, "http_status", reason="not_retryable", attempts=1, status=503)
    common(out, other, 1)


@pytest.mark.parametrize("jitter", ["additive", "full"])
def test_jitter_bounds(scen: Scenario, jitter: str) -> None:
    out = run_call(scen, [], after={"status": 503}, jitter=jitter, base_delay_ms=20,
                   max_delay_ms=1000, max_retries=3)
    check_error(out.error, "http_status", reason="retries_exhausted", attempts=4, status=503)
    common(out, scen, 4)
    delays = out.events.field("llm_retry_scheduled", "delay_ms")
    assert len(delays) == 3
    for n, d in enumerate(delays):
        exp = 20 * 2 ** n
        if jitter == "additive":
            assert exp <= d < exp + 20, f"additive delay {n}: {d}"
        else:
            assert 0 <= d < exp, f"full delay {n}: {d}"


def test_max_delay_caps_backoff(scen: Scenario) -> None:
    out = run_call(scen, [{"status": 500}] * 3, base_delay_ms=50, max_delay_ms=60)
    ok_result(out)
    common(out, scen, 4)
    assert out.events.field("llm_retry_scheduled", "delay_ms") == [50, 60, 60]


def test_max_retries_zero(scen: Scenario) -> None:
    out = run_call(scen, [{"status": 502}], max_retries=0)
    check_error(out.error, "http_status", reason="retries_exhausted", attempts=1, status=502)
    common(out, scen, 1)


# ---------------------------------------------------------------------------
# Retry-After and friends
# ---------------------------------------------------------------------------

def http_date(ts: float, form: str) -> str:
    t = time.gmtime(ts)
    if form == "imf":
        return email.utils.formatdate(ts, usegmt=True)
    if form == "rfc850":
        return time.strftime("%A, %d-%b-%y %H:%M:%S GMT", t)
    # asctime: "Sun Nov  6 08:49:37 1994" (day padded with a space)
    return time.strftime("%a %b ", t) + f"{t.tm_mday:2d}" + time.strftime(" %H:%M:%S %Y", t)


@pytest.mark.parametrize("step,delay,source", [
    ({"status": 429, "retry_after": "0.25"}, 250, "retry_after"),
    ({"status": 503, "retry_after": "0.2"}, 200, "retry_after"),
    ({"status": 429, "retry_after_ms": "120"}, 120, "retry_after"),
    ({"status": 429, "retry_after_ms": "100", "retry_after": "10"}, 100, "retry_after"),
    ({"status": 429, "ratelimit_reset_requests": "200ms"}, 200, "ratelimit_reset"),
    ({"status": 429, "ratelimit_reset_tokens": "150ms"}, 150, "ratelimit_reset"),
    ({"status": 429, "ratelimit_reset_requests": "100ms",
      "ratelimit_reset_tokens": "0.25s"}, 250, "ratelimit_reset"),
], ids=["seconds_decimal", "seconds_on_503", "retry_after_ms", "ms_wins",
        "reset_requests", "reset_tokens", "reset_later_of_two"])
def test_server_delay_waited_as_is(scen: Scenario, step: Dict[str, Any], delay: int,
                                   source: str) -> None:
    # max_delay_ms 50: a server-given wait is neither capped nor jittered.
    out = run_call(scen, [step], max_delay_ms=50, jitter="full")
    res = ok_result(out)
    common(out, scen, 2)
    assert out.events.names == RETRY_FLOW
    assert out.events.field("llm_retry_scheduled", "delay_source") == [source]
    assert out.events.field("llm_retry_scheduled", "delay_ms") == [delay]
    assert res.meta.total_ms >= delay - 10
    recs = scen.requests()
    assert recs[1]["time"] - recs[0]["time"] >= (delay - 10) / 1000.0
    failed = out.events.of("llm_request_failed")[0]
    if "retry_after" in step and "retry_after_ms" not in step:
        assert failed["retry_after"] == step["retry_after"]


@pytest.mark.parametrize("value", ["soon-ish", "0", "-5", "", "Wed, 21 Oct 2015 07:28:00 GMT"],
                         ids=["garbage", "zero", "negative", "empty", "past_date"])
def test_unusable_retry_after_falls_back_to_backoff(scen: Scenario, value: str) -> None:
    out = run_call(scen, [{"status": 429, "retry_after": value}])
    ok_result(out)
    common(out, scen, 2)
    assert out.events.field("llm_retry_scheduled", "delay_source") == ["backoff"]
    assert out.events.field("llm_retry_scheduled", "delay_ms") == [20]


def test_ratelimit_reset_ignored_on_503(scen: Scenario) -> None:
    out = run_call(scen, [{"status": 503, "ratelimit_reset_requests": "5s"}])
    ok_result(out)
    common(out, scen, 2)
    assert out.events.field("llm_retry_scheduled", "delay_source") == ["backoff"]
    assert out.events.field("llm_retry_scheduled", "delay_ms") == [20]


@pytest.mark.parametrize("form", ["imf", "rfc850", "asctime"])
def test_retry_after_http_date_forms(scen: Scenario, form: str) -> None:
    """A date 100 s ahead parses (retry_after_ms ~100000), too long for the cap."""
    value = http_date(time.time() + 100, form)
    out = run_call(scen, [{"status": 429, "retry_after": value}], max_retry_after_ms=10000)
    check_error(out.error, "http_status", reason="retry_after_too_long", attempts=1, status=429)
    common(out, scen, 1)
    assert out.error.retry_after_ms is not None
    assert 95000 <= out.error.retry_after_ms <= 101000, (form, value, out.error.retry_after_ms)
    assert out.events.of("llm_request_failed")[0]["retry_after"] == value
    assert out.error.total_ms < 3000


@pytest.mark.slow
def test_retry_after_http_date_waited(scen: Scenario) -> None:
    value = email.utils.formatdate(time.time() + 2, usegmt=True)
    out = run_call(scen, [{"status": 503, "retry_after": value}])
    res = ok_result(out)
    common(out, scen, 2)
    assert out.events.field("llm_retry_scheduled", "delay_source") == ["retry_after"]
    (delay,) = out.events.field("llm_retry_scheduled", "delay_ms")
    assert 0 < delay <= 2100
    assert res.meta.total_ms >= delay - 10


def test_retry_after_seconds_too_long(scen: Scenario) -> None:
    out = run_call(scen, [{"status": 429, "retry_after": "30"}], max_retry_after_ms=1000)
    check_error(out.error, "http_status", reason="retry_after_too_long", attempts=1, status=429)
    common(out, scen, 1)
    assert out.error.retry_after_ms == 30000
    assert out.error.total_ms < 3000
    assert out.events.names == STOP_FLOW


def test_ratelimit_reset_too_long(scen: Scenario) -> None:
    out = run_call(scen, [{"status": 429, "ratelimit_reset_tokens": "6m0s"}],
                   max_retry_after_ms=10000)
    check_error(out.error, "http_status", reason="retry_after_too_long", attempts=1, status=429)
    common(out, scen, 1)
    assert out.error.total_ms < 3000


# ---------------------------------------------------------------------------
# x-should-retry, insufficient_quota
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("status,header", [(400, "true"), (422, "True"), (501, "true")])
def test_should_retry_true(scen: Scenario, status: int, header: str) -> None:
    out = run_call(scen, [{"status": status, "should_retry": header}])
    ok_result(out)
    common(out, scen, 2)
    assert out.events.names == RETRY_FLOW


@pytest.mark.parametrize("status", [429, 500, 503])
def test_should_retry_false(scen: Scenario, status: int) -> None:
    out = run_call(scen, [{"status": status, "should_retry": "false"}])
    check_error(out.error, "http_status", reason="not_retryable", attempts=1, status=status)
    common(out, scen, 1)


def test_insufficient_quota(scen: Scenario) -> None:
    out = run_call(scen, [{"status": 429, "error_code": "insufficient_quota",
                           "retry_after": "1"}])
    check_error(out.error, "http_status", reason="not_retryable", attempts=1, status=429)
    common(out, scen, 1)
    assert out.error.error_code == "insufficient_quota"
    assert out.error.total_ms < 900
    assert "insufficient_quota" in (out.error.body_preview or "")


def test_other_429_code_is_retried(scen: Scenario) -> None:
    out = run_call(scen, [{"status": 429, "error_code": "rate_limit_exceeded"}])
    ok_result(out)
    common(out, scen, 2)


# ---------------------------------------------------------------------------
# Delays, timeouts, stalls, broken connections and bodies
# ---------------------------------------------------------------------------

def test_slow_but_in_time(scen: Scenario) -> None:
    out = run_call(scen, [{"delay_ms": 200}], timeout_ms=3000)
    res = ok_result(out)
    common(out, scen, 1)
    assert res.meta.duration_ms >= 180


def test_attempt_timeout_then_ok(scen: Scenario) -> None:
    out = run_call(scen, [{"delay_ms": 1500}], timeout_ms=300)
    res = ok_result(out)
    common(out, scen, 2)
    assert out.events.names == ERROR_FLOW
    assert out.events.field("llm_request_error", "error_kind") == ["timeout"]
    assert out.events.of("llm_request_started")[0]["timeout_ms"] == 300
    assert 290 <= res.meta.total_ms < 1400


def test_timeouts_exhausted(scen: Scenario) -> None:
    out = run_call(scen, [], after={"delay_ms": 1500}, timeout_ms=300, max_retries=1)
    check_error(out.error, "timeout", reason="retries_exhausted", attempts=2, status=None)
    assert isinstance(out.error, TimeoutError)
    assert isinstance(out.error, llmretry.RequestTimeoutError)
    common(out, scen, 2)
    assert out.events.field("llm_request_error", "error_kind") == ["timeout", "timeout"]
    assert 550 <= out.wall_ms < 3000


@pytest.mark.parametrize("fault", ["stall_body", "no_headers"])
def test_stall_is_a_timeout(scen: Scenario, fault: str) -> None:
    out = run_call(scen, [{"fault": fault, "stall_ms": 3000}], timeout_ms=500, max_retries=0)
    check_error(out.error, "timeout", reason="retries_exhausted", attempts=1)
    assert isinstance(out.error, TimeoutError)
    common(out, scen, 1)
    assert 450 <= out.wall_ms < 2000
    assert out.events.field("llm_request_error", "error_kind") == ["timeout"]
    if fault == "no_headers":
        assert out.error.status is None


def test_trickle_is_a_timeout(scen: Scenario) -> None:
    """The attempt timeout covers the whole transfer, not the idle gaps."""
    out = run_call(scen, [{"fault": "trickle", "interval_ms": 50}], timeout_ms=600,
                   max_retries=0)
    check_error(out.error, "timeout", reason="retries_exhausted", attempts=1)
    common(out, scen, 1)
    assert out.wall_ms < 2000


@pytest.mark.parametrize("fault", ["reset", "close", "truncate"])
def test_broken_connection_then_ok(scen: Scenario, fault: str) -> None:
    # A fresh engine: on a reused keep-alive connection the same fault is
    # retried at once, without a backoff (below, and tests/c/test_resend.c).
    fresh = llmretry.Client()
    out = run_call(scen, [{"fault": fault}], client=fresh)
    fresh.close()
    ok_result(out)
    common(out, scen, 2)
    assert out.events.names == ERROR_FLOW
    assert out.events.field("llm_request_error", "error_kind") == ["network"]


@pytest.mark.parametrize("fault", ["reset", "close", "truncate"])
def test_broken_connection_exhausted(scen: Scenario, fault: str) -> None:
    fresh = llmretry.Client()       # see test_broken_connection_then_ok
    out = run_call(scen, [], after={"fault": fault}, max_retries=2, client=fresh)
    fresh.close()
    check_error(out.error, "network", reason="retries_exhausted", attempts=3)
    assert isinstance(out.error, ConnectionError)
    assert isinstance(out.error, llmretry.NetworkError)
    common(out, scen, 3)
    assert out.events.field("llm_request_error", "error_kind") == ["network"] * 3
    if fault != "truncate":
        assert out.error.status is None


@pytest.mark.parametrize("mode", ["safe", "unsafe"])
def test_reset_after_read_is_bounded(scen: Scenario, mode: str) -> None:
    """Requests the server may have seen: at most 1 + max_retries (issue 27
    item 6). The server reads each request after the first and resets the
    connection unanswered, like a proxy dropping generations it started (each
    billed). The first such request goes out on the first call's kept-alive
    connection, which libcurl would send again by itself: before, a free
    re-send, so 4 requests for max_retries=2."""
    scen.script([{}], after={"fault": "reset"})
    own = llmretry.Client()     # its own connections: the first call's is reused
    try:
        assert run_call(scen, client=own).ok
        out = run_call(scen, client=own, max_retries=2, retry_mode=mode)
    finally:
        own.close()
    recs = scen.requests()
    assert recs[1]["connection"] == recs[0]["connection"], "not the kept-alive connection"
    if mode == "unsafe":
        check_error(out.error, "network", reason="unsafe_mode", attempts=1, status=None)
        assert len(recs) == 1 + 1
        assert "llm_retry_scheduled" not in out.events.names
    else:
        check_error(out.error, "network", reason="retries_exhausted", attempts=3, status=None)
        assert len(recs) == 1 + 3, f"the server saw {len(recs) - 1} requests for 3 attempts"
        # The lost written request is retried at once; the next one (a new
        # connection, a plain network error) after the backoff.
        assert out.events.field("llm_retry_scheduled", "delay_ms") == [0, 40]
    assert out.error.resends == 0


@pytest.mark.parametrize("mode", ["safe", "unsafe"])
def test_idle_connection_closed_by_server_is_free(scen: Scenario, mode: str) -> None:
    """A kept-alive connection the server closed while it idled (uvicorn's
    5 s keep-alive timeout; here 20 ms) never carries the next request:
    no attempt is spent on it, in either mode."""
    scen.script([{"idle_close_ms": 20}])
    own = llmretry.Client()
    try:
        assert run_call(scen, client=own).ok
        end = time.monotonic() + 5
        while not scen.requests()[0]["idle_closed"] and time.monotonic() < end:
            time.sleep(0.005)
        assert scen.requests()[0]["idle_closed"], "the mock never closed the idle connection"
        out = run_call(scen, client=own, retry_mode=mode)
    finally:
        own.close()
    res = ok_result(out)
    assert res.meta.attempts == 1
    assert out.events.names == ["llm_request_started", "llm_request_succeeded"]
    recs = scen.requests()
    assert len(recs) == 2
    assert recs[1]["connection"] != recs[0]["connection"]


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("mode", ["safe", "unsafe"])
def test_connection_refused_is_retried(mode: str) -> None:
    """Never connected: provably not sent, so retried even in unsafe mode."""
    from conftest import Events
    events = Events()
    url = f"http://127.0.0.1:{closed_port()}/v1"
    with pytest.raises(llmretry.NetworkError) as info:
        llmretry.call_llm({"model": "gpt-test", "messages": []}, base_url=url,
                          api_key=SECRET_KEY, logger=events, retry_mode=mode,
                          **{**FAST, "max_retries": 2})
    check_error(info.value, "network", reason="retries_exhausted", attempts=3, status=None)
    assert isinstance(info.value, ConnectionError)
    assert events.names.count("llm_request_error") == 3


def test_invalid_json_then_ok(scen: Scenario) -> None:
    out = run_call(scen, [{"fault": "invalid_json"}])
    ok_result(out)
    common(out, scen, 2)
    assert out.events.field("llm_request_error", "error_kind") == ["invalid_response"]


def test_invalid_json_exhausted(scen: Scenario) -> None:
    out = run_call(scen, [], after={"fault": "invalid_json"}, max_retries=1)
    check_error(out.error, "invalid_response", reason="retries_exhausted", attempts=2,
                status=200)
    common(out, scen, 2)


def test_invalid_json_not_retried(scen: Scenario) -> None:
    out = run_call(scen, [{"fault": "invalid_json"}], retry_invalid_response=False)
    check_error(out.error, "invalid_response", reason="not_retryable", attempts=1, status=200)
    common(out, scen, 1)
    assert out.events.names == ["llm_request_started", "llm_request_error",
                                "llm_request_gave_up"]


def test_response_too_large(scen: Scenario) -> None:
    out = run_call(scen, [{"fault": "huge", "size": 2 * 1024 * 1024}],
                   max_response_bytes=1024 * 1024)
    check_error(out.error, "response_too_large", reason="not_retryable", attempts=1)
    assert isinstance(out.error, llmretry.ResponseTooLargeError)
    common(out, scen, 1)
    assert out.events.field("llm_request_error", "error_kind") == ["response_too_large"]
    assert out.wall_ms < 5000


def test_large_response_within_limit(scen: Scenario) -> None:
    size = 3 * 1024 * 1024
    out = run_call(scen, [{"fault": "huge", "size": size, "content": "BIG"}],
                   max_response_bytes=4 * 1024 * 1024)
    res = ok_result(out)
    common(out, scen, 1)
    content = res.data["choices"][0]["message"]["content"]
    assert content.startswith("BIG") and len(content) > size - 1000


# ---------------------------------------------------------------------------
# Deadlines
# ---------------------------------------------------------------------------

def test_deadline_cuts_attempt(scen: Scenario) -> None:
    out = run_call(scen, [{"delay_ms": 2000}], deadline_ms=300)
    check_error(out.error, "deadline_exceeded", reason="deadline", attempts=1)
    assert isinstance(out.error, TimeoutError)
    assert isinstance(out.error, llmretry.DeadlineExceededError)
    common(out, scen, 1)
    assert 250 <= out.wall_ms < 1500
    started = out.events.of("llm_request_started")[0]
    assert 0 < started["timeout_ms"] <= 300
    assert started["deadline_left_ms"] is not None and 0 < started["deadline_left_ms"] <= 300


def test_deadline_cuts_wait(scen: Scenario) -> None:
    out = run_call(scen, [{"status": 429, "retry_after": "2"}], deadline_ms=500)
    check_error(out.error, "deadline_exceeded", reason="deadline", attempts=1, status=429)
    common(out, scen, 1)
    assert out.error.retry_after_ms == 2000
    assert out.wall_ms < 450
    assert out.events.names == STOP_FLOW


def test_deadline_cuts_backoff(scen: Scenario) -> None:
    out = run_call(scen, [], after={"status": 500}, base_delay_ms=300, max_delay_ms=10000,
                   deadline_ms=800)
    check_error(out.error, "deadline_exceeded", reason="deadline", attempts=2, status=500)
    common(out, scen, 2)
    assert out.events.field("llm_retry_scheduled", "delay_ms") == [300]
    assert out.wall_ms < 800


def test_call_llm_with_deadline(scen: Scenario) -> None:
    scen.script([{"delay_ms": 2000}])
    t0 = time.monotonic()
    with pytest.raises(llmretry.DeadlineExceededError) as info:
        llmretry.call_llm_with_deadline({"model": "gpt-test", "messages": []}, deadline_ms=300,
                                        base_url=scen.url, api_key=SECRET_KEY, logger=None)
    assert time.monotonic() - t0 < 1.5
    check_error(info.value, "deadline_exceeded", reason="deadline", attempts=1)


def test_call_llm_with_deadline_default(scen: Scenario) -> None:
    from conftest import Events
    events = Events()
    res = llmretry.call_llm_with_deadline({"model": "gpt-test", "messages": []},
                                          base_url=scen.url, api_key=SECRET_KEY,
                                          logger=events)
    assert res.meta.status == 200
    left = events.of("llm_request_started")[0]["deadline_left_ms"]
    assert left is not None and 170000 <= left <= 180000


def test_no_deadline_by_default(scen: Scenario) -> None:
    out = run_call(scen, [{}])
    ok_result(out)
    started = out.events.of("llm_request_started")[0]
    assert started["deadline_left_ms"] is None
    assert started["timeout_ms"] == FAST["timeout_ms"]


# ---------------------------------------------------------------------------
# Unsafe mode
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("step,kind", [
    ({"status": 503}, "http_status"),
    ({"status": 429, "retry_after": "0"}, "http_status"),
    ({"fault": "reset"}, "network"),
    ({"fault": "invalid_json"}, "invalid_response"),
    ({"delay_ms": 1500}, "timeout"),
], ids=["503", "429", "reset", "invalid_json", "timeout"])
def test_unsafe_mode_never_resends(scen: Scenario, step: Dict[str, Any], kind: str) -> None:
    out = run_call(scen, [step], retry_mode="unsafe", timeout_ms=400)
    check_error(out.error, kind, reason="unsafe_mode", attempts=1)
    common(out, scen, 1)
    assert "llm_retry_scheduled" not in out.events.names


def test_unsafe_mode_success(scen: Scenario) -> None:
    out = run_call(scen, [{}], retry_mode="unsafe")
    ok_result(out)
    common(out, scen, 1)


# ---------------------------------------------------------------------------
# Request ids, idempotency keys, headers
# ---------------------------------------------------------------------------

def test_request_id_and_idempotency_key_on_every_attempt(scen: Scenario) -> None:
    out = run_call(scen, [{"status": 500}, {"status": 502}], request_id="req-py-0001",
                   idempotency_key="idem-py-1")
    res = ok_result(out)
    common(out, scen, 3)
    assert res.meta.request_id == "req-py-0001"
    for rec in scen.requests():
        assert rec["headers"]["x-client-request-id"] == "req-py-0001"
        assert rec["headers"]["idempotency-key"] == "idem-py-1"
    assert {e["request_id"] for e in out.events.events} == {"req-py-0001"}


def test_generated_request_ids_are_uuid4_and_distinct(scen: Scenario) -> None:
    import uuid
    ids = []
    for _ in range(3):
        out = run_call(scen, [{}])
        rid = ok_result(out).meta.request_id
        assert uuid.UUID(rid).version == 4
        ids.append(rid)
    assert len(set(ids)) == 3


def test_request_id_on_errors(scen: Scenario) -> None:
    out = run_call(scen, [{"status": 400}], request_id="req-err-7")
    assert out.error.request_id == "req-err-7"
    assert "req-err-7" in str(out.error)
    assert scen.requests()[0]["headers"]["x-client-request-id"] == "req-err-7"


def test_custom_headers_on_every_attempt(scen: Scenario) -> None:
    out = run_call(scen, [{"status": 503}],
                   headers={"X-Custom-Trace": "trace-42", "OpenAI-Organization": "org-x"})
    ok_result(out)
    common(out, scen, 2)
    for rec in scen.requests():
        assert rec["headers"]["x-custom-trace"] == "trace-42"
        assert rec["headers"]["openai-organization"] == "org-x"


def test_full_url(scen: Scenario) -> None:
    scen.script([{}])
    res = llmretry.call_llm({"model": "gpt-test", "messages": []},
                            url=scen.url + "/chat/completions", api_key=SECRET_KEY,
                            logger=None)
    assert res.meta.status == 200
    (rec,) = scen.requests()
    assert rec["path"].endswith("/v1/chat/completions")
    assert "/chat/completions/chat/completions" not in rec["path"]


# ---------------------------------------------------------------------------
# The secrets, across every kind of outcome at once
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("steps,kw", [
    ([{}], {}),
    ([{"status": 400}], {}),
    ([{"status": 429, "retry_after": "0.05"}], {}),
    ([{"delay_ms": 1000}], {"timeout_ms": 200, "max_retries": 0}),
    ([{"fault": "reset"}], {"max_retries": 0}),
    ([{"fault": "invalid_json"}], {"retry_invalid_response": False}),
    ([{"fault": "huge", "size": 300000}], {"max_response_bytes": 100000}),
    ([{"status": 429, "retry_after": "5"}], {"deadline_ms": 300}),
    ([{"status": 503}], {"retry_mode": "unsafe"}),
], ids=["ok", "400", "429", "timeout", "reset", "invalid", "huge", "deadline", "unsafe"])
def test_no_secret_anywhere(scen: Scenario, steps: List[Dict[str, Any]],
                            kw: Dict[str, Any]) -> None:
    out = run_call(scen, steps, **kw)
    check_outcome_secrets(out)
    assert out.events.events
    if out.error is not None:
        e = out.error
        assert SECRET_KEY not in str(e.__dict__)
        assert "SECRET-PROMPT" not in str(e.__dict__)
        assert "SECRET-SYSTEM" not in str(e.__dict__)
