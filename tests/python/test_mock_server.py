"""Tests of the fault-injecting mock server itself (llmretry.testing)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from llmretry.testing import MockServer

# Python only (the mock server, the type checker, version files): the
# sanitizer and pipe-notifier passes skip it (tools/check.sh, pipe-notifier-test.sh).
pytestmark = pytest.mark.pure_python

CHAT = "/v1/chat/completions"
PYTHON_DIR = Path(__file__).resolve().parents[2] / "python"


@pytest.fixture
def mock() -> Iterator[MockServer]:
    with MockServer() as server:
        yield server


def chat_path(name: Optional[str] = None) -> str:
    return CHAT if name is None else f"/s/{name}{CHAT}"


def request(mock: MockServer, method: str, path: str, body: Any = None,
            headers: Optional[Dict[str, str]] = None,
            timeout: float = 10.0) -> Tuple[int, Dict[str, str], bytes]:
    """One request on a new connection: (status, lower-case headers, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", mock.port, timeout=timeout)
    try:
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


def post_chat(mock: MockServer, name: Optional[str] = None, body: Any = None,
              **kw: Any) -> Tuple[int, Dict[str, str], bytes]:
    if body is None:
        body = {"model": "gpt-test", "messages": [{"role": "user",
                                                   "content": "secret"}]}
    return request(mock, "POST", chat_path(name), body,
                   {"Content-Type": "application/json"}, **kw)


def raw_chat(mock: MockServer, name: str, body: bytes = b'{"model": "m"}',
             timeout: float = 10.0) -> socket.socket:
    """Send a chat request on a raw socket and return the socket."""
    sock = socket.create_connection(("127.0.0.1", mock.port), timeout=timeout)
    sock.sendall(
        f"POST {chat_path(name)} HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"\r\n".encode() + body)
    return sock


def read_all(sock: socket.socket) -> bytes:
    chunks: List[bytes] = []
    while True:
        data = sock.recv(65536)
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def recv_until(sock: socket.socket, marker: bytes,
               start: bytes = b"") -> bytes:
    """Receive until ``marker`` is in the data; fail on EOF."""
    data = start
    while marker not in data:
        chunk = sock.recv(65536)
        assert chunk, f"EOF before {marker!r}; got {data!r}"
        data += chunk
    return data


def split_response(raw: bytes) -> Tuple[int, Dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


# --------------------------------------------------------------------------
# Basics and control API
# --------------------------------------------------------------------------

def test_health_and_urls(mock: MockServer) -> None:
    status, headers, body = request(mock, "GET", "/_mock/health")
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert json.loads(body) == {"ok": True}
    assert mock.base_url == f"http://127.0.0.1:{mock.port}/v1"
    assert mock.scenario_url("a b") == \
        f"http://127.0.0.1:{mock.port}/s/a%20b/v1"


def test_default_success_body(mock: MockServer) -> None:
    status, headers, body = post_chat(mock)
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert int(headers["content-length"]) == len(body)
    doc = json.loads(body)
    assert doc["id"].startswith("chatcmpl-mock-")
    assert doc["object"] == "chat.completion"
    assert isinstance(doc["created"], int)
    assert abs(doc["created"] - time.time()) < 60
    assert doc["model"] == "gpt-test"
    assert doc["system_fingerprint"] == "fp_mock"
    assert doc["choices"] == [{"index": 0, "message": {
        "role": "assistant", "content": "ok"}, "finish_reason": "stop"}]
    assert doc["usage"] == {"prompt_tokens": 12, "completion_tokens": 3,
                            "total_tokens": 15}
    assert b"secret" not in body  # the prompt is never echoed


def test_model_defaults_to_mock_model(mock: MockServer) -> None:
    for payload in (b"not json", b"[1, 2]", b'{"model": 5}', b""):
        _, _, body = request(mock, "POST", CHAT, payload)
        assert json.loads(body)["model"] == "mock-model"


def test_ids_increase(mock: MockServer) -> None:
    ids = [json.loads(post_chat(mock)[2])["id"] for _ in range(3)]
    nums = [int(i.rsplit("-", 1)[1]) for i in ids]
    assert nums == sorted(nums) and len(set(nums)) == 3


def test_any_chat_path_and_404(mock: MockServer) -> None:
    mock.script("x", [{"status": 201}])
    assert request(mock, "POST", "/s/x/chat/completions", b"{}")[0] == 201
    assert request(mock, "POST", "/foo/chat/completions?a=1", b"{}")[0] == 200
    assert mock.requests("default")[0]["path"] == "/foo/chat/completions?a=1"
    status, headers, body = request(mock, "POST", "/v1/moderations", b"{}")
    assert status == 404
    assert headers["content-type"] == "application/json"
    assert "message" in json.loads(body)["error"]
    assert request(mock, "GET", "/nope")[0] == 404
    assert request(mock, "GET", "/_mock/nope")[0] == 404
    assert request(mock, "GET", CHAT)[0] == 405
    assert request(mock, "POST", "/_mock/health", b"")[0] == 405
    assert mock.requests("default") == [mock.requests("default")[0]]


def error_of(body: bytes) -> Dict[str, Any]:
    """An OpenAI-shaped error body's "error" object, all four keys there."""
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["type"] == "invalid_request_error"
    return err  # type: ignore[no-any-return]


def test_strict_refuses_a_path_that_is_not_an_openai_route() -> None:
    good = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with MockServer(strict=True) as strict:
        strict.script("x", [{"status": 201}])
        for path in ("/vi/chat/completions", "/s/x/vi/chat/completions",
                     "/foo/chat/completions", "/chat/completions",
                     "/v1/v1/chat/completions", "/s/x/chat/completions"):
            status, headers, body = request(strict, "POST", path, good)
            assert status == 404, path
            assert headers["content-type"] == "application/json"
            err = error_of(body)
            assert err["message"] == f"Invalid URL (POST {path})"
            assert err["param"] is None and err["code"] is None
        # Refused: not recorded, no step consumed.
        assert strict.requests("x") == [] and strict.requests("default") == []
        assert request(strict, "POST", "/s/x/v1/chat/completions", good)[0] == 201
        assert request(strict, "POST", "/v1/chat/completions?api-version=1", good)[0] == 200
        assert request(strict, "POST", "/v1/responses", {"model": "m", "input": "hi"})[0] == 200
        assert request(strict, "GET", CHAT)[0] == 405         # as without strict
        assert request(strict, "GET", "/_mock/health")[0] == 200
        assert len(strict.requests("default")) == 2 and len(strict.requests("x")) == 1
    # Without strict= (the default), any path ending in /chat/completions.
    with MockServer() as lenient:
        assert request(lenient, "POST", "/vi/chat/completions", b"{}")[0] == 200


@pytest.mark.parametrize("path,body,param,code", [
    (CHAT, {"messages": [{"role": "user", "content": "hi"}]}, "model",
     "missing_required_parameter"),
    (CHAT, {"model": "m"}, "messages", "missing_required_parameter"),
    (CHAT, {"model": "m", "messages": None}, "messages", "missing_required_parameter"),
    (CHAT, {"model": "m", "messages": "hi"}, "messages", "invalid_type"),
    (CHAT, {"model": 3, "messages": [{"role": "user", "content": "hi"}]}, "model",
     "invalid_type"),
    (CHAT, {"model": "m", "messages": []}, "messages", "empty_array"),
    (CHAT, b"not json", None, None),
    (CHAT, [1, 2], None, None),
    ("/s/x" + CHAT, {"model": "m", "stream": True}, "messages",
     "missing_required_parameter"),
    ("/v1/responses", {"input": "hi"}, "model", "missing_required_parameter"),
])
def test_strict_refuses_a_chat_body_openai_refuses(path: str, body: Any,
                                                    param: Optional[str],
                                                    code: Optional[str]) -> None:
    with MockServer(strict=True) as strict:
        strict.script("x", [{"status": 201}])
        status, headers, raw = request(strict, "POST", path, body)
        assert status == 400 and headers["content-type"] == "application/json"
        err = error_of(raw)
        assert (err["param"], err["code"]) == (param, code), err
        if param is not None:
            assert f"'{param}'" in err["message"]
        assert strict.requests("x") == [] and strict.requests("default") == []
    # The same request is answered by a mock without strict=.
    with MockServer() as lenient:
        lenient.script("x", [{"status": 201}])
        assert request(lenient, "POST", path, body)[0] in (200, 201)


def test_control_put_get_delete(mock: MockServer) -> None:
    script = {"steps": [{"status": 500}, {"status": 502}],
              "after": {"status": 503}}
    status, _, body = request(mock, "PUT", "/_mock/scenarios/ctl", script)
    assert (status, body) == (204, b"")
    statuses = [post_chat(mock, "ctl")[0] for _ in range(4)]
    assert statuses == [500, 502, 503, 503]

    status, _, body = request(mock, "GET", "/_mock/requests/ctl")
    assert status == 200
    records = json.loads(body)
    assert [r["step"] for r in records] == [0, 1, -1, -1]
    assert [r["index"] for r in records] == [0, 1, 2, 3]

    assert request(mock, "DELETE", "/_mock/requests/ctl")[0] == 204
    assert json.loads(request(mock, "GET", "/_mock/requests/ctl")[2]) == []
    # DELETE keeps the cursor
    assert post_chat(mock, "ctl")[0] == 503
    assert mock.requests("ctl")[0]["index"] == 4

    # PUT resets the cursor and the records
    request(mock, "PUT", "/_mock/scenarios/ctl", {"steps": [{"status": 418}]})
    assert mock.requests("ctl") == []
    assert post_chat(mock, "ctl")[0] == 418
    assert post_chat(mock, "ctl")[0] == 200  # default after: plain success


def test_bad_scripts_rejected_and_previous_kept(mock: MockServer) -> None:
    mock.script("keep", [{"status": 500}])
    for bad in (b"not json", b"[]", b'{"steps": {}}', b'{"steps": [1]}',
                b'{"steps": [{"fault": "explode"}]}',
                b'{"steps": [{"status": "500"}]}',
                b'{"steps": [{"delay_ms": -1}]}',
                b'{"steps": [{"idle_close_ms": "5"}]}',
                b'{"steps": [{"headers": {"a": [1]}}]}',
                b'{"steps": [], "after": 3}'):
        status, _, body = request(mock, "PUT", "/_mock/scenarios/keep", bad)
        assert status == 400, bad
        assert "error" in json.loads(body)
    assert post_chat(mock, "keep")[0] == 500
    with pytest.raises(ValueError):
        mock.script("keep", [{"fault": "nope"}])
    with pytest.raises(ValueError):
        mock.script("keep", [{"status": True}])


def test_unknown_scenario_is_plain_success_and_recorded(
        mock: MockServer) -> None:
    assert post_chat(mock, "never-scripted")[0] == 200
    records = mock.requests("never-scripted")
    assert len(records) == 1 and records[0]["step"] == -1
    assert mock.requests("other") == []
    assert json.loads(request(mock, "GET", "/_mock/requests/zzz")[2]) == []


def test_python_api_script_after_and_clear(mock: MockServer) -> None:
    mock.script("p", [{"status": 500}], after={"status": 429})
    assert [post_chat(mock, "p")[0] for _ in range(3)] == [500, 429, 429]
    records = mock.requests("p")
    records[0]["step"] = 99  # a copy
    assert mock.requests("p")[0]["step"] == 0
    mock.clear("p")
    assert mock.requests("p") == []
    mock.load_scenarios({"q": {"steps": [{"status": 504}]}})
    assert post_chat(mock, "q")[0] == 504


def test_route_by_model(mock: MockServer) -> None:
    # One URL, a script per model: "m-400" rows get the "perm" scenario,
    # "m-503" ones "down"; every other model this scenario's own steps.
    mock.script("perm", [], after={"status": 400})
    mock.load_scenarios({"down": {"steps": [{"status": 503}], "after": {"content": "back"}}})
    mock.script("mixed", [{"status": 429}], route={"m-400": "perm", "m-503": "down"})

    def send(model: Any) -> int:
        return post_chat(mock, "mixed", {"model": model, "messages": []})[0]

    assert [send("m-400"), send("m-503"), send("other"), send("m-503"), send("m-400"),
            send(None), send("other")] == [400, 503, 429, 200, 400, 200, 200]
    assert [json.loads(r["body"])["model"] for r in mock.requests("perm")] == ["m-400"] * 2
    assert [r["step"] for r in mock.requests("down")] == [0, -1]
    assert [r["step"] for r in mock.requests("mixed")] == [0, -1, -1]
    # One hop only; a body that is not an object is not routed.
    mock.script("down", [], after={"status": 503}, route={"m-503": "perm"})
    assert send("m-503") == 503
    status, _, _ = request(mock, "POST", chat_path("mixed"), b"[1]",
                           {"Content-Type": "application/json"})
    assert status == 200 and len(mock.requests("mixed")) == 4
    for bad in (b'{"route": []}', b'{"route": {"m": ""}}', b'{"route": {"m": 3}}'):
        status, _, body = request(mock, "PUT", "/_mock/scenarios/mixed", bad)
        assert status == 400 and b"route" in body, bad
    with pytest.raises(ValueError, match="route"):
        mock.script("mixed", [], route={"": "x"})


# --------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------

def test_record_fields(mock: MockServer) -> None:
    sock = socket.create_connection(("127.0.0.1", mock.port), timeout=10)
    body = '{"model": "m", "x": "é"}'.encode()
    before = time.time()
    sock.sendall(
        b"POST /s/rec/v1/chat/completions?q=1 HTTP/1.1\r\nHost: h\r\n"
        b"X-Client-Request-Id: abc\r\nX-Dup: 1\r\nX-Dup: 2\r\n"
        b"Authorization: Bearer k\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    status, _, _ = split_response(recv_until(sock, b'"usage"'))
    assert status == 200
    after = time.time()
    (rec,) = mock.requests("rec")
    assert set(rec) == {"index", "time", "method", "path", "headers", "body",
                        "client_port", "connection", "step", "outage"}
    assert rec["index"] == 0 and rec["step"] == -1
    assert before - 1 <= rec["time"] <= after + 1
    assert rec["method"] == "POST"
    assert rec["path"] == "/s/rec/v1/chat/completions?q=1"
    assert rec["headers"]["x-client-request-id"] == "abc"
    assert rec["headers"]["authorization"] == "Bearer k"
    assert rec["headers"]["x-dup"] == "1, 2"
    assert rec["headers"]["content-length"] == str(len(body))
    assert all(k == k.lower() for k in rec["headers"])
    assert rec["body"] == body.decode()
    assert rec["client_port"] == sock.getsockname()[1]
    assert rec["connection"] >= 1
    sock.close()
    # The JSON form matches the Python form.
    assert json.loads(request(mock, "GET", "/_mock/requests/rec")[2]) == \
        [rec]


def test_record_time_is_the_arrival_not_the_read(mock: MockServer) -> None:
    """A request that waits in the kernel for a busy handler is timed at its
    arrival: the second request on a connection comes 100 ms after the
    first, while the mock still delays the first's answer by 600 ms."""
    from llmretry.testing._connection import _STAMP_SPACE
    if not _STAMP_SPACE:
        pytest.skip("the kernel's receive times are Linux's (on x86 and arm)")
    mock.script("late", [{"delay_ms": 600}, {}])
    sock = socket.create_connection(("127.0.0.1", mock.port), timeout=10)
    req = (b"POST /s/late/v1/chat/completions HTTP/1.1\r\nHost: h\r\n"
           b"Content-Length: 2\r\n\r\n{}")
    try:
        sock.sendall(req)
        time.sleep(0.1)
        sock.sendall(req)
        first = recv_until(sock, b'"usage"')
        rest = first.split(b'"usage"', 1)[1]
        if b'"usage"' not in rest:
            recv_until(sock, b'"usage"')
    finally:
        sock.close()
    first_rec, second_rec = mock.requests("late")
    gap = second_rec["time"] - first_rec["time"]
    assert 0.05 <= gap < 0.45, f"the second request was timed {gap:.3f} s after the first"


def test_records_before_step_is_executed(mock: MockServer) -> None:
    mock.script("early", [{"fault": "no_headers", "stall_ms": 5000}])
    sock = raw_chat(mock, "early")
    deadline = time.monotonic() + 5
    while not mock.requests("early") and time.monotonic() < deadline:
        time.sleep(0.01)
    records = mock.requests("early")
    assert len(records) == 1 and records[0]["step"] == 0
    sock.close()


def test_connection_ids_and_keep_alive(mock: MockServer) -> None:
    start = mock.connections_accepted
    conn = http.client.HTTPConnection("127.0.0.1", mock.port, timeout=10)
    for _ in range(3):
        conn.request("POST", chat_path("ka"), body=b"{}")
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.getheader("Connection") is None
        resp.read()
    conn2 = http.client.HTTPConnection("127.0.0.1", mock.port, timeout=10)
    conn2.request("POST", chat_path("ka"), body=b"{}")
    conn2.getresponse().read()
    conn.request("POST", chat_path("ka"), body=b"{}")
    conn.getresponse().read()
    conn.close()
    conn2.close()
    ids = [r["connection"] for r in mock.requests("ka")]
    assert ids[0] == ids[1] == ids[2] == ids[4]
    assert ids[3] > ids[0]
    assert mock.connections_accepted == start + 2
    status, _, body = request(mock, "GET", "/_mock/connections")
    assert status == 200
    assert json.loads(body) == {"accepted": start + 3}
    assert mock.connections_accepted == start + 3


def test_idle_close_ms(mock: MockServer) -> None:
    """idle_close_ms: a request in time keeps the connection; one that
    idles that long is closed (FIN), and its record says so."""
    mock.script("idle", [{"idle_close_ms": 10000}, {"idle_close_ms": 50}, {}])
    conn = http.client.HTTPConnection("127.0.0.1", mock.port, timeout=10)
    for _ in range(2):
        conn.request("POST", chat_path("idle"), body=b"{}")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Connection") is None
        resp.read()
    assert conn.sock is not None
    assert conn.sock.recv(1) == b""     # the FIN, after 50 ms of idling
    conn.close()
    # The record says so once the FIN is out, so just after it: wait for it.
    end = time.monotonic() + 10
    while not mock.requests("idle")[1]["idle_closed"] and time.monotonic() < end:
        time.sleep(0.01)
    recs = mock.requests("idle")
    assert recs[0]["connection"] == recs[1]["connection"]
    assert [r["idle_closed"] for r in recs] == [False, True]
    assert post_chat(mock, "idle")[0] == 200
    assert "idle_closed" not in mock.requests("idle")[2]


def test_connection_close_and_http10(mock: MockServer) -> None:
    status, headers, _ = post_chat(mock)  # http.client: keep-alive
    assert "connection" not in headers
    sock = socket.create_connection(("127.0.0.1", mock.port), timeout=10)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.0\r\n"
                 b"Content-Length: 2\r\n\r\n{}")
    raw = read_all(sock)  # the server closes after an HTTP/1.0 response
    status, headers, body = split_response(raw)
    assert status == 200 and headers["connection"] == "close"
    assert json.loads(body)["object"] == "chat.completion"
    sock.close()
    sock = socket.create_connection(("127.0.0.1", mock.port), timeout=10)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nConnection: close"
                 b"\r\nContent-Length: 2\r\n\r\n{}")
    status, headers, _ = split_response(read_all(sock))
    assert status == 200 and headers["connection"] == "close"
    sock.close()


def test_expect_100_continue(mock: MockServer) -> None:
    mock.script("exp", [{"status": 200, "content": "continued"}])
    body = b'{"model": "m"}'
    sock = socket.create_connection(("127.0.0.1", mock.port), timeout=10)
    sock.sendall(b"POST /s/exp/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                 b"Expect: 100-continue\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode())
    interim = recv_until(sock, b"\r\n\r\n")
    assert interim.startswith(b"HTTP/1.1 100")
    assert mock.requests("exp") == []  # the body has not been sent yet
    sock.sendall(body)
    resp = recv_until(sock, b'"usage"', interim.partition(b"\r\n\r\n")[2])
    status, _, payload = split_response(resp)
    assert status == 200
    assert json.loads(payload)["choices"][0]["message"]["content"] == \
        "continued"
    assert mock.requests("exp")[0]["body"] == body.decode()
    sock.close()


def test_chunked_request_body(mock: MockServer) -> None:
    sock = socket.create_connection(("127.0.0.1", mock.port), timeout=10)
    sock.sendall(b"POST /s/chunk/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n"
                 b"5\r\n{\"mod\r\n9\r\nel\": \"c\"}\r\n0\r\n\r\n")
    resp = recv_until(sock, b'"usage"')
    assert json.loads(split_response(resp)[2])["model"] == "c"
    assert mock.requests("chunk")[0]["body"] == '{"model": "c"}'
    sock.close()


# --------------------------------------------------------------------------
# Step fields
# --------------------------------------------------------------------------

def test_status_headers_and_shortcuts(mock: MockServer) -> None:
    mock.script("h", [{
        "status": 429,
        "retry_after": 2,
        "retry_after_ms": "1500",
        "should_retry": True,
        "ratelimit_reset_requests": "6m0s",
        "ratelimit_reset_tokens": 1.5,
        "headers": {"X-Custom": "v", "X-Num": 7, "X-Null": None,
                    "x-should-retry": "garbage"},
    }, {"retry_after": "Wed, 21 Oct 2015 07:28:00 GMT",
        "headers": {"Content-Type": "text/plain"}},
        {"retry_after": None, "should_retry": False}])
    status, headers, body = post_chat(mock, "h")
    assert status == 429
    assert headers["retry-after"] == "2"
    assert headers["retry-after-ms"] == "1500"
    assert headers["x-should-retry"] == "garbage"  # headers win
    assert headers["x-ratelimit-reset-requests"] == "6m0s"
    assert headers["x-ratelimit-reset-tokens"] == "1.5"
    assert headers["x-custom"] == "v" and headers["x-num"] == "7"
    assert "x-null" not in headers
    assert json.loads(body) == {"error": {"message": "mock error 429",
                                          "type": "server_error",
                                          "code": None}}
    status, headers, _ = post_chat(mock, "h")
    assert status == 200
    assert headers["retry-after"] == "Wed, 21 Oct 2015 07:28:00 GMT"
    assert headers["content-type"] == "text/plain"
    _, headers, _ = post_chat(mock, "h")
    assert "retry-after" not in headers
    assert headers["x-should-retry"] == "false"


def test_error_code_and_bodies(mock: MockServer) -> None:
    mock.script("e", [
        {"status": 429, "error_code": "insufficient_quota"},
        {"status": 500, "body": "<html>oops</html>"},
        {"status": 400, "body": {"error": {"message": "m", "code": 1}}},
        {"status": 200, "body": "not json at all"},
        {"status": 200, "body": [1, 2]},
        {"status": 200, "error_code": "ignored"},
        {"status": 204},
    ])
    status, _, body = post_chat(mock, "e")
    assert status == 429
    assert json.loads(body) == {"error": {"message": "mock error 429",
                                          "type": "insufficient_quota",
                                          "code": "insufficient_quota"}}
    assert post_chat(mock, "e")[::2] == (500, b"<html>oops</html>")
    status, _, body = post_chat(mock, "e")
    assert status == 400
    assert json.loads(body) == {"error": {"message": "m", "code": 1}}
    assert post_chat(mock, "e")[::2] == (200, b"not json at all")
    assert post_chat(mock, "e")[::2] == (200, b"[1, 2]")
    status, _, body = post_chat(mock, "e")
    assert json.loads(body)["object"] == "chat.completion"
    status, headers, body = post_chat(mock, "e")
    assert (status, body) == (204, b"")
    assert "content-length" not in headers


def test_success_body_fields(mock: MockServer) -> None:
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    mock.script("s", [{"content": "hello", "model": "other", "usage": usage,
                       "system_fingerprint": "fp_x"},
                      {"content": None, "usage": None}])
    doc = json.loads(post_chat(mock, "s")[2])
    assert doc["choices"][0]["message"]["content"] == "hello"
    assert doc["model"] == "other"
    assert doc["usage"] == usage
    assert doc["system_fingerprint"] == "fp_x"
    doc = json.loads(post_chat(mock, "s")[2])
    assert doc["choices"][0]["message"]["content"] is None
    assert doc["usage"] is None


def test_delay_ms(mock: MockServer) -> None:
    mock.script("d", [{"delay_ms": 300}, {}])
    t0 = time.monotonic()
    assert post_chat(mock, "d")[0] == 200
    assert time.monotonic() - t0 >= 0.28
    t0 = time.monotonic()
    post_chat(mock, "d")
    assert time.monotonic() - t0 < 0.25


# --------------------------------------------------------------------------
# Faults
# --------------------------------------------------------------------------

def test_fault_reset(mock: MockServer) -> None:
    mock.script("r", [{"fault": "reset"}])
    sock = raw_chat(mock, "r")
    with pytest.raises(ConnectionResetError):
        data = sock.recv(1024)
        # Should the RST not surface on the first recv, the next one fails.
        assert data == b""
        sock.recv(1024)
    sock.close()
    assert post_chat(mock, "r")[0] == 200  # the server survives
    assert [r["step"] for r in mock.requests("r")] == [0, -1]


def test_fault_close(mock: MockServer) -> None:
    mock.script("c", [{"fault": "close"}])
    sock = raw_chat(mock, "c")
    assert read_all(sock) == b""
    sock.close()
    mock.script("c", [{"fault": "close"}])
    with pytest.raises(http.client.RemoteDisconnected):
        post_chat(mock, "c")


def test_fault_no_headers(mock: MockServer) -> None:
    mock.script("n", [{"fault": "no_headers", "stall_ms": 400}])
    sock = raw_chat(mock, "n")
    t0 = time.monotonic()
    assert read_all(sock) == b""  # nothing, then a close
    elapsed = time.monotonic() - t0
    assert 0.35 <= elapsed < 5
    sock.close()


def test_fault_no_headers_default_stall_is_long(mock: MockServer) -> None:
    mock.script("n", [{"fault": "no_headers"}])
    sock = raw_chat(mock, "n", timeout=0.5)
    with pytest.raises(socket.timeout):
        sock.recv(1024)
    sock.close()


def test_fault_stall_body(mock: MockServer) -> None:
    mock.script("sb", [{"fault": "stall_body", "stall_ms": 500,
                        "content": "x" * 200}])
    sock = raw_chat(mock, "sb")
    t0 = time.monotonic()
    first = recv_until(sock, b"\r\n\r\n")
    head_time = time.monotonic() - t0
    raw = first + read_all(sock)
    elapsed = time.monotonic() - t0
    assert head_time < 0.4
    assert 0.45 <= elapsed < 5
    status, headers, body = split_response(raw)
    assert status == 200
    length = int(headers["content-length"])
    assert length > 200
    assert len(body) == length // 2
    sock.close()


def test_fault_truncate(mock: MockServer) -> None:
    mock.script("t", [{"fault": "truncate", "status": 500}])
    sock = raw_chat(mock, "t")
    t0 = time.monotonic()
    status, headers, body = split_response(read_all(sock))
    assert time.monotonic() - t0 < 2
    assert status == 500
    full = json.dumps({"error": {"message": "mock error 500",
                                 "type": "server_error", "code": None}})
    assert int(headers["content-length"]) == len(full)
    assert body == full.encode()[:len(full) // 2]
    sock.close()
    mock.script("t", [{"fault": "truncate"}])
    with pytest.raises(http.client.IncompleteRead):
        post_chat(mock, "t")


def test_fault_invalid_json(mock: MockServer) -> None:
    mock.script("ij", [{"fault": "invalid_json"},
                       {"fault": "invalid_json", "status": 502,
                        "body": "ignored"}])
    status, headers, body = post_chat(mock, "ij")
    assert (status, body) == (200, b'{"choices": [ not json')
    assert int(headers["content-length"]) == len(body)
    with pytest.raises(ValueError):
        json.loads(body)
    assert post_chat(mock, "ij")[::2] == (502, b'{"choices": [ not json')


@pytest.mark.parametrize("size", [1000, 300_000, 3 * 1024 * 1024 + 7])
def test_fault_huge(mock: MockServer, size: int) -> None:
    mock.script("big", [{"fault": "huge", "size": size}])
    status, headers, body = post_chat(mock, "big", timeout=30)
    assert status == 200
    assert int(headers["content-length"]) == size
    assert len(body) == size
    doc = json.loads(body)
    assert doc["object"] == "chat.completion"
    assert doc["model"] == "gpt-test"
    content = doc["choices"][0]["message"]["content"]
    assert content.startswith("ok")
    assert set(content[2:]) <= {"x"}


def test_fault_huge_default_size_and_clamp(mock: MockServer) -> None:
    mock.script("big", [{"fault": "huge"}, {"fault": "huge", "size": 10}])
    _, headers, body = post_chat(mock, "big", timeout=60)
    assert int(headers["content-length"]) == 64 * 1024 * 1024 == len(body)
    del body
    _, headers, body = post_chat(mock, "big")
    assert int(headers["content-length"]) == len(body) > 10
    assert json.loads(body)["choices"][0]["message"]["content"] == "ok"


def test_fault_trickle(mock: MockServer) -> None:
    mock.script("tr", [{"fault": "trickle", "interval_ms": 2,
                        "body": "0123456789" * 10}, {"status": 201}])
    sock = raw_chat(mock, "tr")
    t0 = time.monotonic()
    raw = b""
    reads = 0
    while not raw.endswith(b"0123456789" * 10):
        data = sock.recv(65536)
        assert data
        raw += data
        reads += 1
    elapsed = time.monotonic() - t0
    status, headers, body = split_response(raw)
    assert status == 200 and body == b"0123456789" * 10
    n = len(raw)
    assert elapsed >= (n - 1) * 0.002 * 0.9
    assert reads > 10  # it really did arrive in pieces
    # keep-alive: the connection is still usable
    sock.sendall(b"POST /s/tr/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Length: 2\r\n\r\n{}")
    resp = recv_until(sock, b'"usage"')
    assert split_response(resp)[0] == 201
    ids = [r["connection"] for r in mock.requests("tr")]
    assert ids[0] == ids[1]
    sock.close()


def test_fault_trickle_default_interval(mock: MockServer) -> None:
    mock.script("tr", [{"fault": "trickle"}])
    sock = raw_chat(mock, "tr")
    t0 = time.monotonic()
    assert sock.recv(1024) == b"H"
    sock.settimeout(0.5)
    with pytest.raises(socket.timeout):  # the next byte is ~1 s away
        sock.recv(1024)
    sock.settimeout(5)
    assert sock.recv(1024) == b"T"
    assert time.monotonic() - t0 >= 0.8
    sock.close()


def test_delay_then_fault(mock: MockServer) -> None:
    mock.script("df", [{"delay_ms": 300, "fault": "close"}])
    sock = raw_chat(mock, "df")
    t0 = time.monotonic()
    assert read_all(sock) == b""
    assert time.monotonic() - t0 >= 0.28
    sock.close()


# --------------------------------------------------------------------------
# Load and lifecycle
# --------------------------------------------------------------------------

def test_many_concurrent_connections(mock: MockServer) -> None:
    mock.script("conc", [], after={"delay_ms": 200})
    results: List[int] = []
    lock = threading.Lock()

    def worker() -> None:
        status = post_chat(mock, "conc", timeout=20)[0]
        with lock:
            results.append(status)

    threads = [threading.Thread(target=worker) for _ in range(120)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    elapsed = time.monotonic() - t0
    assert results == [200] * 120
    assert elapsed < 10  # concurrent: far less than 120 * 0.2 s
    records = mock.requests("conc")
    assert len(records) == 120
    assert sorted(r["index"] for r in records) == list(range(120))
    assert len({r["connection"] for r in records}) == 120


def test_many_sequential_keep_alive_requests(mock: MockServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", mock.port, timeout=10)
    t0 = time.monotonic()
    for _ in range(2000):
        conn.request("POST", chat_path("seq"), body=b'{"model": "m"}',
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
    elapsed = time.monotonic() - t0
    conn.close()
    assert elapsed < 15  # Nagle/delayed-ACK stalls would make this ~80 s
    assert len({r["connection"] for r in mock.requests("seq")}) == 1


@pytest.mark.parametrize("step", [
    {"fault": "no_headers"},
    {"fault": "stall_body"},
    {"fault": "trickle", "interval_ms": 10000},
    {"delay_ms": 30000},
    {"idle_close_ms": 30000},
])
def test_stop_is_prompt_while_stalled(step: Dict[str, Any]) -> None:
    before = set(threading.enumerate())
    server = MockServer().start()
    server.script("stall", [step])
    sock = raw_chat(server, "stall")
    idle = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    deadline = time.monotonic() + 5
    while len(server.requests("stall")) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    # Recorded, the handler goes on into its stall; nothing tells when it is
    # in: a margin, so stop() meets the stall and not the steps before it.
    time.sleep(0.1)
    t0 = time.monotonic()
    server.stop()
    assert time.monotonic() - t0 < 1.0
    # The server's threads, the stalled one included, end promptly.
    deadline = time.monotonic() + 2
    while set(threading.enumerate()) - before and \
            time.monotonic() < deadline:
        time.sleep(0.01)
    assert set(threading.enumerate()) - before == set()
    # Connections are closed promptly.
    sock.settimeout(3)
    t0 = time.monotonic()
    read_all(sock)
    idle.settimeout(3)
    assert idle.recv(10) == b""
    assert time.monotonic() - t0 < 2
    sock.close()
    idle.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2)
    server.stop()  # idempotent


def test_context_manager_stops() -> None:
    with MockServer() as server:
        port = server.port
        assert post_chat(server)[0] == 200
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
    with pytest.raises(RuntimeError):
        server.start()


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def start_cli(*args: str) -> Tuple[subprocess.Popen, int]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PYTHON_DIR) + os.pathsep + \
        env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmretry.testing", "--port", "0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip().isdigit(), (line, proc.stderr.read()
                                    if proc.poll() is not None else b"")
    return proc, int(line)


def test_cli_strict() -> None:
    proc, port = start_cli("--strict")
    try:
        base = f"http://127.0.0.1:{port}"
        for path, body, status in (("/vi/chat/completions", b"{}", 404),
                                   ("/v1/chat/completions", b'{"model": "m"}', 400)):
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(urllib.request.Request(base + path, data=body),
                                       timeout=10)
            assert info.value.code == status
            assert set(json.load(info.value)["error"]) == {"message", "type", "param", "code"}
        ok = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
        with urllib.request.urlopen(urllib.request.Request(base + CHAT, data=ok),
                                    timeout=10) as r:
            assert json.load(r)["choices"][0]["message"]["content"] == "ok"
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_port_serve_and_signal(sig: int, tmp_path: Path) -> None:
    scenarios = tmp_path / "s.json"
    scenarios.write_text(json.dumps(
        {"pre": {"steps": [{"status": 503}], "after": {"status": 202}}}))
    proc, port = start_cli("--host", "127.0.0.1", "--scenarios",
                           str(scenarios))
    try:
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(base + "/_mock/health", timeout=10) as r:
            assert json.load(r) == {"ok": True}
        url = base + "/s/pre/v1/chat/completions"
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(urllib.request.Request(url, data=b"{}"),
                                   timeout=10)
        assert info.value.code == 503
        with urllib.request.urlopen(urllib.request.Request(url, data=b"{}"),
                                    timeout=10) as r:
            assert r.status == 202
        # A client stalled on the server must not delay the exit.
        req = urllib.request.Request(
            base + "/_mock/scenarios/st", method="PUT",
            data=json.dumps({"steps": [{"fault": "no_headers"}]}).encode())
        urllib.request.urlopen(req, timeout=10).close()
        stalled = socket.create_connection(("127.0.0.1", port), timeout=10)
        stalled.sendall(b"POST /s/st/v1/chat/completions HTTP/1.1\r\n"
                        b"Content-Length: 2\r\n\r\n{}")
        end = time.monotonic() + 10             # the server holds it (recorded first)
        while time.monotonic() < end:
            with urllib.request.urlopen(base + "/_mock/requests/st", timeout=10) as r:
                if json.loads(r.read()):
                    break
            time.sleep(0.01)
        else:
            raise AssertionError("the stalled request never reached the server")
        t0 = time.monotonic()
        proc.send_signal(sig)
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - t0 < 3
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.read() == b""  # nothing but the port
        assert proc.stderr.read() == b""
        stalled.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_each_api_path_answers_in_its_shape(mock: MockServer) -> None:
    """/embeddings, /responses and /completions answer as those APIs do
    (issue 32): one vector per input and usage without completion tokens."""
    mock.script("api", [{"usage": {"prompt_tokens": 4, "total_tokens": 4},
                         "embedding": [1.5]}, {}, {}, {}])
    got = [json.loads(request(mock, "POST", "/s/api/v1/" + path, payload)[2])
           for path, payload in (("embeddings", b'{"model": "e", "input": ["a", "b", "c"]}'),
                                 ("embeddings", b'{"input": "a"}'),
                                 ("responses", b'{"model": "r", "input": "hi"}'),
                                 ("completions", b'{"model": "c", "prompt": "hi"}'))]
    assert got[0]["object"] == "list" and got[0]["model"] == "e"
    assert [d["index"] for d in got[0]["data"]] == [0, 1, 2]
    assert got[0]["data"][2] == {"object": "embedding", "index": 2, "embedding": [1.5]}
    assert got[0]["usage"] == {"prompt_tokens": 4, "total_tokens": 4}
    assert len(got[1]["data"]) == 1 and got[1]["data"][0]["embedding"] == [0.0, 0.25, -0.5]
    assert got[1]["usage"] == {"prompt_tokens": 8, "total_tokens": 8}
    assert got[2]["object"] == "response" and got[2]["status"] == "completed"
    assert got[2]["output"][0]["content"][0] == {"type": "output_text", "text": "ok",
                                                 "annotations": []}
    assert got[2]["usage"] == {"input_tokens": 12, "output_tokens": 3, "total_tokens": 15}
    assert got[3]["object"] == "text_completion" and got[3]["choices"][0]["text"] == "ok"
    assert [r["path"] for r in mock.requests("api")] == [
        "/s/api/v1/embeddings", "/s/api/v1/embeddings", "/s/api/v1/responses",
        "/s/api/v1/completions"]


def test_repr_says_where_it_serves() -> None:
    """A MockServer's repr names its base URL once started, and its state
    before and after (the default object repr said nothing)."""
    server = MockServer(strict=True)
    assert repr(server) == "MockServer(not started, strict=True)"
    with server:
        assert repr(server) == (f"MockServer(base_url='http://127.0.0.1:{server.port}/v1', "
                                "strict=True)")
    assert repr(server) == "MockServer(stopped, strict=True)"
    with MockServer() as plain:
        assert repr(plain) == f"MockServer(base_url={plain.base_url!r})"
