"""Tests of the mock server's outages (llmretry.testing, "Outages").

The mock is driven with raw http.client requests and sockets so that it is
tested on its own. Windows are timed on a manual clock that the tests
advance (``clock="manual"``, ``advance_clock``), so nothing sleeps through
one; the other timed parts wait for a state change with a generous deadline
and never assert how fast anything was.
"""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any, Callable, Dict, Iterator, Tuple

import pytest
from conftest import wait_until

from llmretry.testing import MockServer, ScriptError

# Python only (the mock server, the type checker, version files): the
# sanitizer and pipe-notifier passes skip it (tools/check.sh, pipe-notifier-test.sh).
pytestmark = pytest.mark.pure_python

Response = Tuple[int, Any]
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def mock() -> Iterator[MockServer]:
    with MockServer() as server:
        yield server


def request(mock: MockServer, method: str, path: str,
            body: Any = None) -> Response:
    """One request on a new connection: (status, JSON body or None)."""
    conn = http.client.HTTPConnection("127.0.0.1", mock.port, timeout=10)
    try:
        data = None if body is None else json.dumps(body)
        conn.request(method, path, body=data,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, json.loads(raw) if raw else None
    finally:
        conn.close()


def chat(mock: MockServer, name: str) -> Response:
    return request(mock, "POST", f"/s/{name}/v1/chat/completions", BODY)


def content(body: Any) -> Any:
    return body["choices"][0]["message"]["content"]


def raw_chat(mock: MockServer, name: str,
             timeout: float = 10.0) -> socket.socket:
    """Send a chat request on a raw socket and return the socket."""
    body = json.dumps(BODY).encode()
    sock = socket.create_connection(("127.0.0.1", mock.port), timeout=timeout)
    sock.sendall(f"POST /s/{name}/v1/chat/completions HTTP/1.1\r\n"
                 f"Host: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                 + body)
    return sock


def wait_for(condition: Callable[[], bool], what: str,
             deadline_s: float = 10.0) -> None:
    """Poll ``condition`` (conftest's wait_until); fail after ``deadline_s``."""
    assert wait_until(condition, deadline_s), f"timed out waiting for {what}"


# --------------------------------------------------------------------------
# Modes
# --------------------------------------------------------------------------

def test_503_answers_every_request_without_consuming_steps(
        mock: MockServer) -> None:
    mock.script("s", [{"content": "first"}, {"content": "second"}])
    mock.outage("s")
    for _ in range(3):
        status, body = chat(mock, "s")
        assert status == 503
        assert body["error"]["type"] == "server_error"
        assert "outage" in body["error"]["message"]
    mock.end_outage("s")
    # The script resumes where it was: nothing was used while down.
    assert [content(chat(mock, "s")[1]) for _ in range(2)] == \
        ["first", "second"]
    records = mock.requests("s")
    assert [r["outage"] for r in records] == [True] * 3 + [False] * 2
    assert [r["step"] for r in records] == [None] * 3 + [0, 1]
    assert [r["index"] for r in records] == list(range(5))


def test_503_keeps_the_connection_usable(mock: MockServer) -> None:
    mock.outage("k")
    conn = http.client.HTTPConnection("127.0.0.1", mock.port, timeout=10)
    try:
        for _ in range(2):
            conn.request("POST", "/s/k/v1/chat/completions",
                         body=json.dumps(BODY))
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 503
    finally:
        conn.close()
    assert len({r["connection"] for r in mock.requests("k")}) == 1


def test_reset_aborts_the_connection(mock: MockServer) -> None:
    mock.outage("r", mode="reset")
    sock = raw_chat(mock, "r")
    with pytest.raises(ConnectionResetError):
        data = sock.recv(1024)
        # Should the RST not surface on the first recv, the next one fails.
        assert data == b""
        sock.recv(1024)
    sock.close()
    assert mock.requests("r")[0]["outage"] is True


def test_close_closes_without_an_answer(mock: MockServer) -> None:
    mock.outage("c", mode="close")
    sock = raw_chat(mock, "c")
    assert sock.recv(1024) == b""
    sock.close()
    with pytest.raises(http.client.RemoteDisconnected):
        chat(mock, "c")
    assert [r["outage"] for r in mock.requests("c")] == [True, True]


def test_hang_answers_nothing_until_the_client_goes_away(
        mock: MockServer) -> None:
    mock.outage("h", mode="hang")
    sock = raw_chat(mock, "h", timeout=0.5)
    with pytest.raises(socket.timeout):
        sock.recv(1024)
    # Still held after the outage ends: the hung request is never answered.
    mock.end_outage("h")
    with pytest.raises(socket.timeout):
        sock.recv(1024)
    (record,) = mock.requests("h")
    assert record["outage"] is True and record["client_gone"] is False
    sock.close()
    wait_for(lambda: mock.requests("h")[0]["client_gone"],
             "the server to notice the client left")
    assert content(chat(mock, "h")[1]) == "ok"


def test_stop_ends_a_hung_request() -> None:
    server = MockServer().start()
    server.outage("h", mode="hang")
    sock = raw_chat(server, "h", timeout=10)
    wait_for(lambda: len(server.requests("h")) == 1, "the request")
    server.stop()
    try:
        assert sock.recv(1024) == b""
    except ConnectionResetError:
        pass
    sock.close()
    # stop() ended it, not the client.
    assert server.requests("h")[0]["client_gone"] is False


# --------------------------------------------------------------------------
# Ending it
# --------------------------------------------------------------------------

def test_for_ms_ends_by_itself(mock: MockServer) -> None:
    mock.script("f", [{"content": "back"}], clock="manual")
    mock.outage("f", for_ms=1500)
    assert chat(mock, "f")[0] == 503
    mock.advance_clock("f", 1499)
    assert chat(mock, "f")[0] == 503
    mock.advance_clock("f", 1)
    assert mock.outage_stats("f")["down"] is False
    status, body = chat(mock, "f")
    assert status == 200 and content(body) == "back"


def test_a_new_outage_replaces_the_previous_one(mock: MockServer) -> None:
    mock.outage("x", mode="503", for_ms=60000)
    mock.outage("x", mode="close")
    assert mock.outage_stats("x")["mode"] == "close"
    mock.end_outage("x")
    assert mock.outage_stats("x")["down"] is False
    assert chat(mock, "x")[0] == 200


def test_a_new_script_ends_a_manual_outage(mock: MockServer) -> None:
    mock.outage("n")
    assert chat(mock, "n")[0] == 503
    mock.script("n", [])
    assert chat(mock, "n")[0] == 200
    assert mock.outage_stats("n") == {"down": False, "mode": None,
                                      "during": 0, "outside": 1}


# --------------------------------------------------------------------------
# Scripted window
# --------------------------------------------------------------------------

def test_scripted_window_goes_down_and_comes_back(mock: MockServer) -> None:
    mock.script("w", [{"content": "a"}, {"content": "b"}],
                outage={"mode": "503", "from_ms": 300, "to_ms": 1500},
                clock="manual")
    seen = []

    def answer() -> None:
        status, body = chat(mock, "w")
        seen.append(content(body) if status == 200 else status)

    # The first request starts the window's clock, so it is before the
    # window (at 0).
    answer()
    mock.advance_clock("w", 299)
    assert mock.outage_stats("w")["down"] is False
    mock.advance_clock("w", 1)                 # 300: the window opens
    assert mock.outage_stats("w")["down"] is True
    answer()
    mock.advance_clock("w", 1199)              # 1499: still in it
    answer()
    mock.advance_clock("w", 1)                 # 1500: over
    answer()
    assert seen == ["a", 503, 503, "b"]
    assert mock.outage_stats("w") == {"down": False, "mode": None,
                                      "during": 2, "outside": 2}


def test_scripted_window_starts_at_the_first_request(
        mock: MockServer) -> None:
    mock.script("t", [], outage={"mode": "close", "to_ms": 400},
                clock="manual")
    # Longer than the window: timed from the PUT it would be over by now.
    mock.advance_clock("t", 600)
    assert mock.outage_stats("t")["down"] is True
    with pytest.raises(http.client.RemoteDisconnected):
        chat(mock, "t")
    mock.advance_clock("t", 399)
    assert mock.outage_stats("t")["down"] is True
    mock.advance_clock("t", 1)
    assert mock.outage_stats("t")["down"] is False
    assert chat(mock, "t")[0] == 200


def test_scripted_window_without_end_stays_down(mock: MockServer) -> None:
    mock.script("d", [], outage={"mode": "503"})
    assert [chat(mock, "d")[0] for _ in range(3)] == [503] * 3
    # DELETE ends only a manual outage.
    mock.end_outage("d")
    assert chat(mock, "d")[0] == 503


def test_manual_outage_over_a_scripted_window(mock: MockServer) -> None:
    mock.script("m", [], outage={"mode": "503", "from_ms": 60000})
    mock.outage("m", mode="close")
    with pytest.raises(http.client.RemoteDisconnected):
        chat(mock, "m")
    mock.end_outage("m")
    assert chat(mock, "m")[0] == 200


# --------------------------------------------------------------------------
# Records, counts, isolation
# --------------------------------------------------------------------------

def test_counts_split_by_outage_and_survive_clearing_records(
        mock: MockServer) -> None:
    mock.script("c", [])
    chat(mock, "c")
    mock.outage("c")
    chat(mock, "c")
    chat(mock, "c")
    assert mock.outage_stats("c") == {"down": True, "mode": "503",
                                      "during": 2, "outside": 1}
    mock.end_outage("c")
    chat(mock, "c")
    assert [r["outage"] for r in mock.requests("c")] == \
        [False, True, True, False]
    mock.clear("c")
    assert mock.outage_stats("c") == {"down": False, "mode": None,
                                      "during": 2, "outside": 2}


def test_other_scenarios_are_unaffected(mock: MockServer) -> None:
    mock.script("down", [{"content": "x"}])
    mock.script("up", [{"content": "y"}])
    mock.outage("down")
    assert chat(mock, "down")[0] == 503
    status, body = chat(mock, "up")
    assert status == 200 and content(body) == "y"
    assert request(mock, "POST", "/v1/chat/completions", BODY)[0] == 200
    assert [r["outage"] for r in mock.requests("up")] == [False]
    assert mock.outage_stats("up") == {"down": False, "mode": None,
                                       "during": 0, "outside": 1}
    assert mock.outage_stats("never-seen")["during"] == 0


def test_limits_are_not_charged_while_down(mock: MockServer) -> None:
    mock.script("l", [], limits={"rpm": 1})
    mock.outage("l")
    assert [chat(mock, "l")[0] for _ in range(3)] == [503] * 3
    assert mock.limit_stats("l") == {"admitted": 0, "refused": 0,
                                     "tokens": 0}
    assert all(r["rate_limited"] is False and r["tokens_charged"] == 0
               for r in mock.requests("l"))
    mock.end_outage("l")
    assert chat(mock, "l")[0] == 200       # the one slot was still free


# --------------------------------------------------------------------------
# Control API and validation
# --------------------------------------------------------------------------

def test_control_api(mock: MockServer) -> None:
    assert request(mock, "PUT", "/_mock/outage/api",
                   {"mode": "503", "for_ms": 60000}) == (204, None)
    assert chat(mock, "api")[0] == 503
    assert request(mock, "GET", "/_mock/outage/api") == \
        (200, {"down": True, "mode": "503", "during": 1, "outside": 0})
    assert request(mock, "DELETE", "/_mock/outage/api") == (204, None)
    assert chat(mock, "api")[0] == 200
    # An empty body is a 503 outage until DELETE.
    assert request(mock, "PUT", "/_mock/outage/api")[0] == 204
    assert mock.outage_stats("api")["mode"] == "503"
    # The scripted window comes with the scenario's PUT.
    assert request(mock, "PUT", "/_mock/scenarios/api",
                   {"steps": [], "outage": {"mode": "close"}})[0] == 204
    assert mock.outage_stats("api")["mode"] == "close"


@pytest.mark.parametrize("body", [
    {"mode": "502"}, {"mode": None}, {"for_ms": 0}, {"for_ms": -5},
    {"for_ms": "10"}, {"mode": "503", "for": 10}, [1]])
def test_bad_outage_is_refused(mock: MockServer, body: Any) -> None:
    status, error = request(mock, "PUT", "/_mock/outage/b", body)
    assert status == 400 and "outage" in error["error"]["message"]
    assert mock.outage_stats("b")["down"] is False


@pytest.mark.parametrize("outage", [
    {"mode": "down"}, {"from_ms": -1}, {"to_ms": 0},
    {"from_ms": 500, "to_ms": 500}, {"to": 100}, {"to_ms": "1"}, "503"])
def test_bad_scripted_window_is_refused(mock: MockServer,
                                        outage: Any) -> None:
    mock.script("b", [{"content": "kept"}])
    with pytest.raises(ScriptError):
        mock.script("b", [], outage=outage)
    status, _ = request(mock, "PUT", "/_mock/scenarios/b",
                        {"steps": [], "outage": outage})
    assert status == 400
    assert content(chat(mock, "b")[1]) == "kept"   # previous script kept


def test_python_helpers_validate(mock: MockServer) -> None:
    with pytest.raises(ScriptError):
        mock.outage("v", mode="timeout")
    with pytest.raises(ScriptError):
        mock.outage("v", for_ms=0)
    with pytest.raises(ScriptError):
        mock.outage("v", for_ms=True)
    assert mock.outage_stats("v")["down"] is False


def test_scenarios_file_outage(mock: MockServer) -> None:
    mock.load_scenarios({"f": {"steps": [], "outage": {"mode": "503"}}})
    assert chat(mock, "f")[0] == 503


def test_records_outside_an_outage_carry_the_flag(mock: MockServer) -> None:
    chat(mock, "plain")
    rec: Dict[str, Any] = mock.requests("plain")[0]
    assert rec["outage"] is False and rec["step"] == -1
