"""Transport faults beyond statuses, and the key never sent elsewhere.

Through ``llmretry.call_llm`` against real local servers: connections closed
mid-body, servers that never answer or trickle, unknown hosts, refused
connections, TLS to a self-signed server, a proxy variable pointing nowhere,
redirects to another local server; then the secrets check (key and prompt in
no error text, traceback or event) across that fault matrix and the status,
timeout and invalid-JSON faults.
"""

from __future__ import annotations

import contextlib
import io
import json
import socket
import time
import traceback
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

import llmretry
from conftest import (wait_until, FAST, SECRET_KEY, Outcome, Scenario, check_calling_thread, check_error,
                      check_event_sequence, check_outcome_secrets, request_checks, run_call,
                      serialised)
from tls_server import RecordingServer, make_self_signed, tls_context

PROMPT = "SECRET-PROMPT-xyz"
SECRETS = (SECRET_KEY, PROMPT)
# Also checked: no Authorization header text and no request-body fragment.
SECRET_BITS = SECRETS + ("Bearer sk-", '"messages"')


def body() -> Dict[str, Any]:
    return {"model": "gpt-test", "messages": [{"role": "user", "content": PROMPT}]}


PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY",
              "ALL_PROXY", "no_proxy", "NO_PROXY")


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy from the developer's environment reroutes these calls."""
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)


class Target:
    """Stands in for a mock Scenario where run_call needs only a base_url."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.name = "target"


def closed_port() -> int:
    """A local port nothing listens on (bound once, then released)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="module")
def tls_cert(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, Path]:
    # tools/ensure-deps.sh installs openssl: without it the TLS tests fail
    # (an error naming what is missing), they never skip.
    try:
        return make_self_signed(tmp_path_factory.mktemp("tls"))
    except FileNotFoundError:
        pytest.fail("the openssl command line tool is not installed "
                    "(tools/ensure-deps.sh installs it)", pytrace=False)


@pytest.fixture
def tls_server(tls_cert: Tuple[Path, Path]) -> Iterator[RecordingServer]:
    with RecordingServer(tls_context(*tls_cert)) as srv:
        yield srv


@pytest.fixture
def other_server() -> Iterator[RecordingServer]:
    """A plain-HTTP server that records any connection or request reaching it."""
    with RecordingServer() as srv:
        yield srv


wait_for = wait_until          # conftest's poll


def error_kinds(out: Outcome) -> List[str]:
    return out.events.field("llm_request_error", "error_kind")


def finish(out: Outcome, attempts: int) -> None:
    """Checks every failed outcome here gets: events, thread, secrets."""
    assert out.error is not None, f"expected a failure, got {out.result!r}"
    check_event_sequence(out.events, attempts, out.error.request_id)
    check_calling_thread(out)
    check_outcome_secrets(out)
    gave_up = out.events.of("llm_request_gave_up")
    assert len(gave_up) == 1 and gave_up[0]["reason"] == out.error.reason


# ---------------------------------------------------------------------------
# 1. Broken, silent and trickling servers
# ---------------------------------------------------------------------------

def test_close_mid_body_is_network_error_retried(scen: Scenario) -> None:
    """Headers and half the body, a short stall, then FIN: a network error."""
    fault = {"fault": "stall_body", "stall_ms": 300}
    out = run_call(scen, [], after=fault, body=body(), timeout_ms=5000, max_retries=1)
    check_error(out.error, "network", reason="retries_exhausted", attempts=2)
    assert isinstance(out.error, ConnectionError)
    assert isinstance(out.error, llmretry.NetworkError)
    assert error_kinds(out) == ["network", "network"]
    assert out.events.names.count("llm_retry_scheduled") == 1
    finish(out, 2)
    recs = scen.requests()
    assert len(recs) == 2, f"server saw {len(recs)} requests for 2 attempts"
    request_checks(recs, out.error.request_id, serialised(out.body))
    # Closed well before the 5 s attempt timeout: not a timeout in disguise.
    assert 500 <= out.wall_ms < 3000

    # ... and a retry after it succeeds.
    again = scen.sub("then_ok")
    ok = run_call(again, [fault], body=body(), timeout_ms=5000)
    assert ok.ok, f"expected success after one mid-body close, got {ok.error!r}"
    assert ok.result.meta.attempts == 2
    assert error_kinds(ok) == ["network"]
    assert len(again.requests()) == 2


def test_no_headers_is_timeout_bounded(scen: Scenario) -> None:
    out = run_call(scen, [], after={"fault": "no_headers", "stall_ms": 5000}, body=body(),
                   timeout_ms=500, max_retries=1)
    check_error(out.error, "timeout", reason="retries_exhausted", attempts=2, status=None)
    assert isinstance(out.error, TimeoutError)
    assert isinstance(out.error, llmretry.RequestTimeoutError)
    assert error_kinds(out) == ["timeout", "timeout"]
    for dur in out.events.field("llm_request_error", "duration_ms"):
        assert 450 <= dur < 1500, f"attempt lasted {dur} ms with timeout_ms=500"
    finish(out, 2)
    assert len(scen.requests()) == 2
    # 2 attempts x 500 ms + 20 ms backoff, with generous slack.
    assert 950 <= out.wall_ms < 500 * 2 + 1500


def test_trickle_one_byte_a_second_is_bounded(scen: Scenario) -> None:
    """Bytes keep arriving, yet the attempt still ends at timeout_ms."""
    timeout = 1200
    out = run_call(scen, [], after={"fault": "trickle", "interval_ms": 1000}, body=body(),
                   timeout_ms=timeout, max_retries=1)
    check_error(out.error, "timeout", reason="retries_exhausted", attempts=2)
    assert error_kinds(out) == ["timeout", "timeout"]
    for dur in out.events.field("llm_request_error", "duration_ms"):
        assert timeout - 50 <= dur < timeout + 800, f"attempt lasted {dur} ms"
    finish(out, 2)
    assert len(scen.requests()) == 2
    assert 2 * (timeout - 50) <= out.wall_ms < 2 * timeout + 1500


# ---------------------------------------------------------------------------
# 2. Never connected: unknown host, connection refused
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["safe", "unsafe"])
def test_unknown_host_is_network_error_retried(mode: str) -> None:
    """DNS failure: provably never sent, so retried (even in unsafe mode)."""
    out = run_call(Target("http://llmretry-test.invalid/v1"), body=body(),  # type: ignore[arg-type]
                   max_retries=2, retry_mode=mode)
    check_error(out.error, "network", reason="retries_exhausted", attempts=3, status=None)
    assert isinstance(out.error, ConnectionError)
    assert "resolve" in out.error.message.lower(), out.error.message
    assert error_kinds(out) == ["network"] * 3
    finish(out, 3)
    assert out.wall_ms < 5000


def test_connection_refused_is_network_error_retried() -> None:
    out = run_call(Target(f"http://127.0.0.1:{closed_port()}/v1"),  # type: ignore[arg-type]
                   body=body(), max_retries=1)
    check_error(out.error, "network", reason="retries_exhausted", attempts=2, status=None)
    assert isinstance(out.error, ConnectionError)
    assert "connect" in out.error.message.lower(), out.error.message
    assert error_kinds(out) == ["network", "network"]
    finish(out, 2)


# ---------------------------------------------------------------------------
# 3. TLS verification
# ---------------------------------------------------------------------------

def test_tls_self_signed_fails_without_retry(tls_server: RecordingServer) -> None:
    out = run_call(Target(tls_server.base_url), body=body(),  # type: ignore[arg-type]
                   max_retries=3)
    check_error(out.error, "network", reason="not_retryable", attempts=1, status=None)
    assert isinstance(out.error, llmretry.NetworkError)
    msg = out.error.message
    assert "TLS verification" in msg, f"message does not say why: {msg!r}"
    assert "not retried" in msg, msg
    assert out.events.names == ["llm_request_started", "llm_request_error",
                                "llm_request_gave_up"]
    finish(out, 1)
    # One connection, whose handshake the client aborted; no HTTP request
    # (so no Authorization header) ever reached the unverified server.
    assert wait_for(lambda: tls_server.handshake_failures), "no TLS handshake was attempted"
    assert len(tls_server.connections) == 1, tls_server.connections
    assert tls_server.requests == []


def test_tls_with_ca_file_succeeds(tls_cert: Tuple[Path, Path],
                                   tls_server: RecordingServer) -> None:
    cert, _ = tls_cert
    res = llmretry.call_llm(body(), base_url=tls_server.base_url, api_key=SECRET_KEY,
                            ca_file=str(cert), logger=None,
                            **FAST)
    assert res.data["choices"][0]["message"]["content"] == "over tls"
    assert res.meta.attempts == 1
    assert [r["headers"].get("authorization") for r in tls_server.requests] == [
        f"Bearer {SECRET_KEY}"]


def test_tls_ca_file_is_per_call(tls_cert: Tuple[Path, Path],
                                 tls_server: RecordingServer) -> None:
    """On one Client, a verified connection made with ca_file does not let a
    later call without ca_file through (nothing cached skips verification)."""
    cert, _ = tls_cert
    with llmretry.Client(api_key=SECRET_KEY, **FAST) as client:
        res = client.call_llm(body(), base_url=tls_server.base_url,
                              ca_file=str(cert), logger=None)
        assert res.data["choices"][0]["message"]["content"] == "over tls"
        with pytest.raises(llmretry.NetworkError) as info:
            client.call_llm(body(), base_url=tls_server.base_url, logger=None)
    check_error(info.value, "network", reason="not_retryable", attempts=1, status=None)
    assert "TLS verification" in info.value.message, info.value.message
    assert len(tls_server.requests) == 1


# ---------------------------------------------------------------------------
# 4. Proxy variables
# ---------------------------------------------------------------------------

def set_dead_proxy(monkeypatch: pytest.MonkeyPatch) -> int:
    port = closed_port()
    for name in PROXY_VARS:
        if "no_proxy" in name.lower():
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, f"http://127.0.0.1:{port}")
    return port


def test_dead_proxy_is_network_error(scen: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    port = set_dead_proxy(monkeypatch)
    with llmretry.Client() as fresh:
        out = run_call(scen, [], body=body(), client=fresh, max_retries=1)
    check_error(out.error, "network", reason="retries_exhausted", attempts=2, status=None)
    assert isinstance(out.error, ConnectionError)
    # The proxy's port, not the mock's: the proxy variable was used.
    assert str(port) in out.error.message, out.error.message
    assert error_kinds(out) == ["network", "network"]
    finish(out, 2)
    assert scen.requests() == [], "the request went around the proxy"

    # NO_PROXY=127.0.0.1 exempts the mock: the call goes straight through.
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    with llmretry.Client() as fresh:
        ok = run_call(scen, [], body=body(), client=fresh, max_retries=1)
    assert ok.ok, f"NO_PROXY=127.0.0.1 did not bypass the proxy: {ok.error!r}"
    assert ok.result.meta.attempts == 1
    assert len(scen.requests()) == 1


# ---------------------------------------------------------------------------
# 5. Redirects are not followed: the key never reaches another host
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("status", [307, 301, 302, 303, 308])
def test_redirect_to_other_host_not_followed(scen: Scenario, other_server: RecordingServer,
                                             status: int) -> None:
    target = other_server.base_url + "/chat/completions"
    out = run_call(scen, [{"status": status, "headers": {"Location": target}}], body=body(),
                   max_retries=3)
    check_error(out.error, "http_status", reason="not_retryable", attempts=1, status=status)
    assert isinstance(out.error, llmretry.HTTPStatusError)
    assert out.events.names == ["llm_request_started", "llm_request_failed",
                                "llm_request_gave_up"]
    finish(out, 1)
    recs = scen.requests()
    assert len(recs) == 1
    request_checks(recs, out.error.request_id, serialised(out.body))  # key went to the mock
    time.sleep(0.3)  # give a (wrongly) followed redirect time to land
    assert other_server.connections == [], "the client connected to the redirect target"
    assert other_server.requests == []


# ---------------------------------------------------------------------------
# 6. Secrets across the fault matrix
# ---------------------------------------------------------------------------

MATRIX = ["close_mid_body", "no_headers", "trickle", "unknown_host", "refused", "tls",
          "proxy", "redirect", "400", "429", "503", "timeout", "invalid_json"]


def leak_report(err: BaseException, events_text: str) -> Dict[str, str]:
    e: Any = err
    return {
        "str(err)": str(err),
        "repr(err)": repr(err),
        "err.message": e.message,
        "err.body_preview": e.body_preview or "",
        "err.args": repr(err.args),
        "traceback": "".join(traceback.format_exception(err)),
        "events": events_text,
    }


def check_report(report: Dict[str, str]) -> None:
    for where, text in report.items():
        for s in SECRET_BITS:
            assert s not in text, f"{s!r} leaked into {where}: {text[:400]!r}"


def matrix_call(case: str, scen: Scenario, monkeypatch: pytest.MonkeyPatch,
                request: pytest.FixtureRequest) -> Tuple[BaseException, str]:
    stream = io.StringIO()
    opts: Dict[str, Any] = dict(FAST, api_key=SECRET_KEY, base_url=scen.url, max_retries=1,
                                logger=llmretry.jsonl_logger(stream))
    expected: type = llmretry.LLMError
    with contextlib.ExitStack() as stack:
        if case == "close_mid_body":
            scen.script([], {"fault": "stall_body", "stall_ms": 200})
            expected = llmretry.NetworkError
        elif case == "no_headers":
            scen.script([], {"fault": "no_headers", "stall_ms": 3000})
            opts["timeout_ms"] = 400
            expected = llmretry.RequestTimeoutError
        elif case == "trickle":
            scen.script([], {"fault": "trickle", "interval_ms": 1000})
            opts.update(timeout_ms=700, max_retries=0)
            expected = llmretry.RequestTimeoutError
        elif case == "unknown_host":
            opts["base_url"] = "http://llmretry-test.invalid/v1"
            expected = llmretry.NetworkError
        elif case == "refused":
            opts["base_url"] = f"http://127.0.0.1:{closed_port()}/v1"
            expected = llmretry.NetworkError
        elif case == "tls":
            cert, key = request.getfixturevalue("tls_cert")
            srv = stack.enter_context(RecordingServer(tls_context(cert, key)))
            opts["base_url"] = srv.base_url
            expected = llmretry.NetworkError
        elif case == "proxy":
            set_dead_proxy(monkeypatch)
            opts["client"] = stack.enter_context(llmretry.Client())
            expected = llmretry.NetworkError
        elif case == "redirect":
            other = stack.enter_context(RecordingServer())
            scen.script([{"status": 307, "headers": {
                "Location": other.base_url + "/chat/completions"}}])
            expected = llmretry.HTTPStatusError
        elif case in ("400", "429", "503"):
            scen.script([], {"status": int(case)})
            expected = llmretry.HTTPStatusError
        elif case == "timeout":
            scen.script([], {"delay_ms": 1500})
            opts["timeout_ms"] = 300
            expected = llmretry.RequestTimeoutError
        elif case == "invalid_json":
            scen.script([], {"fault": "invalid_json"})
            expected = llmretry.InvalidResponseError
        else:  # pragma: no cover
            raise AssertionError(case)
        with pytest.raises(expected) as info:
            llmretry.call_llm(body(), **opts)
    return info.value, stream.getvalue()


@pytest.mark.parametrize("case", MATRIX)
def test_secrets_never_leak(case: str, scen: Scenario, monkeypatch: pytest.MonkeyPatch,
                            request: pytest.FixtureRequest) -> None:
    err, events_text = matrix_call(case, scen, monkeypatch, request)
    lines = [json.loads(line) for line in events_text.splitlines()]
    names = [ev["event"] for ev in lines]
    assert names[0] == "llm_request_started" and names[-1] == "llm_request_gave_up", names
    assert "llm_request_failed" in names or "llm_request_error" in names, names
    check_report(leak_report(err, events_text))


def test_leak_check_can_fail(scen: Scenario) -> None:
    """The matrix's checker catches a secret that does reach an error:
    here a server that echoes the prompt back in its error body."""
    scen.script([{"status": 400, "body": {"error": {"message": f"bad: {PROMPT}"}}}])
    stream = io.StringIO()
    with pytest.raises(llmretry.HTTPStatusError) as info:
        llmretry.call_llm(body(), **dict(FAST, api_key=SECRET_KEY, base_url=scen.url,
                                         logger=llmretry.jsonl_logger(stream)))
    report = leak_report(info.value, stream.getvalue())
    assert PROMPT in report["err.body_preview"]  # the response body is the server's
    with pytest.raises(AssertionError, match="leaked into"):
        check_report(report)
