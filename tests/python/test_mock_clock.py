"""Tests of the mock server's scripted clock (llmretry.testing, "Clock").

A scenario's rate-limit windows, outage windows and step delays are timed on
its own clock: the real (monotonic) one, or with ``"clock": "manual"`` one
that stands still; ``POST /_mock/clock/<name>`` (``advance_clock``) moves
either on, so a test skips server-side time instead of sleeping through it.
Nothing here sleeps: a "not answered yet" check waits a short while for an
answer that must not come, which a loaded machine can only make truer.
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Any, Callable, Dict, Iterator, Optional

import pytest
from conftest import wait_until

from llmretry.testing import MockServer, ScriptError
from test_mock_limits import Response, request  # one way to send a request to the mock

# Python only (the mock server): the sanitizer and pipe-notifier passes
# skip it (tools/check.sh, pipe-notifier-test.sh).
pytestmark = pytest.mark.pure_python

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def mock() -> Iterator[MockServer]:
    with MockServer() as server:
        yield server


def chat(mock: MockServer, name: str, timeout: float = 10.0) -> Response:
    return request(mock, "POST", f"/s/{name}/v1/chat/completions", BODY,
                   timeout)


def wait_for(condition: Callable[[], bool], what: str,
             deadline_s: float = 10.0) -> None:
    """Poll ``condition`` (conftest's wait_until); fail after ``deadline_s``."""
    assert wait_until(condition, deadline_s), f"timed out waiting for {what}"


class Pending:
    """A chat request sent on a raw socket, its answer read when it comes."""

    def __init__(self, mock: MockServer, name: str) -> None:
        body = json.dumps(BODY).encode()
        self.sock = socket.create_connection(("127.0.0.1", mock.port),
                                             timeout=10)
        self.sock.sendall(
            f"POST /s/{name}/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode() + body)

    def answered_within(self, seconds: float) -> bool:
        """Has any byte of the answer come within ``seconds``?"""
        self.sock.settimeout(seconds)
        try:
            return self.sock.recv(1, socket.MSG_PEEK) != b""
        except socket.timeout:
            return False
        finally:
            self.sock.settimeout(10)

    def status(self) -> int:
        line = self.sock.makefile("rb").readline()
        return int(line.split()[1])

    def close(self) -> None:
        self.sock.close()


# --------------------------------------------------------------------------
# Rate-limit windows
# --------------------------------------------------------------------------

def test_a_manual_clock_holds_a_window_until_advanced(mock: MockServer) -> None:
    mock.script("hold", [], limits={"rpm": 1, "window_ms": 1000},
                clock="manual")
    assert chat(mock, "hold")[0] == 200
    status, headers, _ = chat(mock, "hold")
    # The clock stands still: the wait is the whole window, to the ms.
    assert status == 429 and headers["retry-after-ms"] == "1000"
    assert headers["x-ratelimit-reset-requests"] == "1s"
    mock.advance_clock("hold", 999)
    status, headers, _ = chat(mock, "hold")
    assert status == 429 and headers["retry-after-ms"] == "1"
    mock.advance_clock("hold", 1)
    assert chat(mock, "hold")[0] == 200


def test_an_advance_skips_a_real_clocks_window(mock: MockServer) -> None:
    mock.script("skip", [], limits={"rpm": 1, "window_ms": 60000})
    assert chat(mock, "skip")[0] == 200
    assert chat(mock, "skip")[0] == 429
    mock.advance_clock("skip", 60000)          # a minute, at once
    assert chat(mock, "skip")[0] == 200
    assert mock.limit_stats("skip") == {"admitted": 2, "refused": 1,
                                        "tokens": 8}


def test_an_advance_moves_only_its_scenario(mock: MockServer) -> None:
    for name in ("mine", "other"):
        mock.script(name, [], limits={"rpm": 1, "window_ms": 1000},
                    clock="manual")
        assert chat(mock, name)[0] == 200
    mock.advance_clock("mine", 1000)
    assert chat(mock, "mine")[0] == 200
    assert chat(mock, "other")[0] == 429
    assert mock.clock_stats("other") == {"clock": "manual", "advanced_ms": 0}


# --------------------------------------------------------------------------
# Outages
# --------------------------------------------------------------------------

def test_outage_windows_and_for_ms_on_a_manual_clock(mock: MockServer) -> None:
    mock.script("o", [], outage={"mode": "503", "from_ms": 100, "to_ms": 200},
                clock="manual")
    assert chat(mock, "o")[0] == 200           # at 0: starts the window
    mock.advance_clock("o", 100)
    assert chat(mock, "o")[0] == 503
    mock.advance_clock("o", 100)
    assert chat(mock, "o")[0] == 200
    mock.outage("o", for_ms=5000)
    mock.advance_clock("o", 4999)
    assert chat(mock, "o")[0] == 503
    mock.advance_clock("o", 1)
    assert chat(mock, "o")[0] == 200


def test_an_advance_ends_a_real_clocks_outage(mock: MockServer) -> None:
    mock.script("down", [])
    mock.outage("down", for_ms=60000)
    assert chat(mock, "down")[0] == 503
    mock.advance_clock("down", 60000)
    assert mock.outage_stats("down")["down"] is False
    assert chat(mock, "down")[0] == 200


# --------------------------------------------------------------------------
# Step delays
# --------------------------------------------------------------------------

def test_a_manual_clocks_delay_ends_when_advanced(mock: MockServer) -> None:
    # A minute: the real clock would not end it within the test.
    mock.script("d", [{"delay_ms": 60000, "content": "late"}], clock="manual")
    pending = Pending(mock, "d")
    try:
        wait_for(lambda: len(mock.requests("d")) == 1, "the request")
        # Recorded, and held: the clock does not move by itself.
        assert not pending.answered_within(0.3)
        mock.advance_clock("d", 59999)
        assert not pending.answered_within(0.1)
        mock.advance_clock("d", 1)
        assert pending.status() == 200
    finally:
        pending.close()


def test_an_advance_cuts_a_real_clocks_delay(mock: MockServer) -> None:
    # An hour's delay: only the advance can end it within the test.
    mock.script("long", [{"delay_ms": 3600000}])
    result: Dict[str, Any] = {}

    def call() -> None:
        result["status"] = chat(mock, "long", timeout=30)[0]

    thread = threading.Thread(target=call)
    thread.start()
    wait_for(lambda: len(mock.requests("long")) == 1, "the request")
    mock.advance_clock("long", 3600000)
    thread.join(30)
    assert not thread.is_alive() and result["status"] == 200


def test_stop_ends_a_wait_on_a_manual_clock() -> None:
    server = MockServer().start()
    server.script("s", [{"delay_ms": 1}], clock="manual")
    pending: Optional[Pending] = Pending(server, "s")
    try:
        wait_for(lambda: len(server.requests("s")) == 1, "the request")
        server.stop()       # ends the handler's wait
        assert pending is not None
        assert pending.sock.recv(1) == b""     # closed, never answered
    finally:
        if pending is not None:
            pending.close()
        server.stop()


# --------------------------------------------------------------------------
# Control API and validation
# --------------------------------------------------------------------------

def test_control_api(mock: MockServer) -> None:
    status, _, _ = request(mock, "PUT", "/_mock/scenarios/c",
                           {"steps": [], "clock": "manual",
                            "limits": {"rpm": 1, "window_ms": 100}})
    assert status == 204
    assert request(mock, "GET", "/_mock/clock/c")[2] == {
        "clock": "manual", "advanced_ms": 0}
    assert chat(mock, "c")[0] == 200
    assert chat(mock, "c")[0] == 429
    assert request(mock, "POST", "/_mock/clock/c",
                   {"advance_ms": 100})[0] == 204
    assert request(mock, "GET", "/_mock/clock/c")[2] == {
        "clock": "manual", "advanced_ms": 100}
    assert chat(mock, "c")[0] == 200
    # An unknown scenario is made (empty, on the real clock) by an advance.
    assert request(mock, "POST", "/_mock/clock/new",
                   {"advance_ms": 2.5})[0] == 204
    assert mock.clock_stats("new") == {"clock": "real", "advanced_ms": 2.5}
    # A new script starts a new clock.
    mock.script("c", [])
    assert mock.clock_stats("c") == {"clock": "real", "advanced_ms": 0}
    assert request(mock, "DELETE", "/_mock/clock/c")[0] == 405


@pytest.mark.parametrize("body", [
    {}, {"advance_ms": -1}, {"advance_ms": "5"}, {"advance_ms": True},
    {"advance_ms": None}, {"advance_ms": 5, "x": 1}, [5], "not json"])
def test_bad_advance_is_refused(mock: MockServer, body: Any) -> None:
    mock.script("b", [], clock="manual")
    status, _, doc = request(mock, "POST", "/_mock/clock/b",
                             body if body != "not json" else b"{")
    assert status == 400 and "clock" in doc["error"]["message"]
    assert mock.clock_stats("b") == {"clock": "manual", "advanced_ms": 0}
    if isinstance(body, dict) and "advance_ms" in body and len(body) == 1:
        with pytest.raises(ScriptError):
            mock.advance_clock("b", body["advance_ms"])


@pytest.mark.parametrize("clock", ["fake", 1, True, ""])
def test_bad_clock_is_refused(mock: MockServer, clock: Any) -> None:
    mock.script("k", [{"content": "kept"}])
    status, _, doc = request(mock, "PUT", "/_mock/scenarios/k",
                             {"steps": [], "clock": clock})
    assert status == 400 and "clock" in doc["error"]["message"]
    with pytest.raises(ScriptError):
        mock.script("k", [], clock=clock)
    with pytest.raises(ScriptError):
        mock.load_scenarios({"k": {"steps": [], "clock": clock}})
    assert mock.clock_stats("k") == {"clock": "real", "advanced_ms": 0}
    assert chat(mock, "k")[2]["choices"][0]["message"]["content"] == "kept"


def test_scenarios_file_clock(mock: MockServer) -> None:
    mock.load_scenarios({"f": {"steps": [], "clock": "manual",
                               "limits": {"rpm": 1, "window_ms": 50}}})
    assert mock.clock_stats("f")["clock"] == "manual"
    assert [chat(mock, "f")[0] for _ in range(2)] == [200, 429]
