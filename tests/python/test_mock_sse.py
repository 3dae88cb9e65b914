"""Tests of the mock server's SSE streams (llmretry.testing, its _sse.py).

A raw HTTP/1.1 client on a socket reads every response, so that the HTTP
chunks (how the server wrote), the terminating 0-length chunk (a clean end)
and the line ends are seen exactly as sent.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
from conftest import wait_until

from llmretry.testing import MockServer, ScriptError

# Python only (the mock server, the type checker, version files): the
# sanitizer and pipe-notifier passes skip it (tools/check.sh, pipe-notifier-test.sh).
pytestmark = pytest.mark.pure_python

CHAT = "/v1/chat/completions"
LE = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}
STREAM_BODY = {"model": "gpt-test", "stream": True,
               "messages": [{"role": "user", "content": "secret"}]}


@pytest.fixture
def mock() -> Iterator[MockServer]:
    with MockServer() as server:
        yield server


def chat_path(name: Optional[str]) -> str:
    return CHAT if name is None else f"/s/{name}{CHAT}"


class Raw:
    """A raw HTTP client connection that reads chunked bodies by hand."""

    def __init__(self, mock: MockServer, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", mock.port),
                                             timeout=timeout)
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def post(self, name: Optional[str], body: Any = None,
             version: str = "HTTP/1.1") -> None:
        if body is None:
            body = {"model": "gpt-test", "messages": []}
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.sock.sendall(
            f"POST {chat_path(name)} {version}\r\nHost: x\r\n"
            f"Content-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode() + data)

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise EOFError(f"EOF; buffered {self.buf!r}")
        self.buf += data

    def _take(self, count: int) -> bytes:
        while len(self.buf) < count:
            self._fill()
        out, self.buf = self.buf[:count], self.buf[count:]
        return out

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._fill()
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def head(self) -> Tuple[int, Dict[str, str]]:
        status = int(self._line().split()[1])
        headers: Dict[str, str] = {}
        while True:
            line = self._line().decode("latin-1")
            if not line:
                return status, headers
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()

    def chunk(self) -> Optional[bytes]:
        """One HTTP chunk's payload; None for the terminating chunk."""
        size = int(self._line().split(b";")[0], 16)
        if size == 0:
            assert self._line() == b""
            return None
        data = self._take(size)
        assert self._take(2) == b"\r\n"
        return data

    def chunks(self) -> Tuple[List[bytes], bool]:
        """(chunk payloads, whether the terminating chunk came) until EOF."""
        out: List[bytes] = []
        while True:
            try:
                data = self.chunk()
            except EOFError:
                return out, False
            if data is None:
                return out, True
            out.append(data)

    def until_eof(self) -> bytes:
        while True:
            try:
                self._fill()
            except EOFError:
                out, self.buf = self.buf, b""
                return out

    def body_length(self, length: int) -> bytes:
        return self._take(length)


def post_stream(mock: MockServer, name: str, body: Any = None
                ) -> Tuple[int, Dict[str, str], List[bytes], bool]:
    """POST once on a new connection: (status, headers, chunks, terminated).

    ``terminated``: the 0-length chunk came (else the server closed first).
    """
    raw = Raw(mock)
    try:
        raw.post(name, body)
        status, headers = raw.head()
        chunks, terminated = raw.chunks()
        return status, headers, chunks, terminated
    finally:
        raw.close()


def post_json(mock: MockServer, name: str, body: Any = None
              ) -> Tuple[int, Dict[str, str], bytes]:
    """POST once, read a Content-Length body: (status, headers, body)."""
    raw = Raw(mock)
    try:
        raw.post(name, body)
        status, headers = raw.head()
        length = int(headers.get("content-length", "0"))
        return status, headers, raw.body_length(length)
    finally:
        raw.close()


def stream(mock: MockServer, name: str, step: Any, body: Any = None
           ) -> Tuple[int, Dict[str, str], List[bytes], bool]:
    """Script the one step ``step`` and POST once (see post_stream)."""
    mock.script(name, [step])
    return post_stream(mock, name, body)


def events(body: bytes, le: bytes = b"\n") -> List[bytes]:
    """The events of an SSE body (split at blank lines; all complete)."""
    assert body.endswith(le + le), body[-40:]
    return body[:-2 * len(le)].split(le + le)


def data_docs(evts: List[bytes]) -> List[Any]:
    """The data of ``data: `` events: JSON documents, or "[DONE]"."""
    out = []
    for event in evts:
        assert event.startswith(b"data: "), event
        payload = event[len(b"data: "):]
        out.append(payload.decode() if payload == b"[DONE]"
                   else json.loads(payload))
    return out


def contents(docs: List[Any]) -> List[Any]:
    return [d["choices"][0]["delta"].get("content") for d in docs
            if isinstance(d, dict) and d.get("choices")]


wait_for = wait_until          # conftest's poll


# --------------------------------------------------------------------------
# Shape, headers and records
# --------------------------------------------------------------------------

def test_default_stream_shape(mock: MockServer) -> None:
    status, headers, chunks, terminated = stream(
        mock, "shape", {"stream": True, "content": "héllo"},
        {"model": "gpt-test"})
    assert status == 200 and terminated
    assert headers["content-type"] == "text/event-stream"
    assert headers["transfer-encoding"] == "chunked"
    assert headers["cache-control"] == "no-cache"
    assert "content-length" not in headers
    body = b"".join(chunks)
    assert b"\r" not in body
    evts = events(body)
    assert len(chunks) == len(evts)  # one write per event
    docs = data_docs(evts)
    assert docs[-1] == "[DONE]"
    chunk_docs = docs[:-1]
    assert len(chunk_docs) == 6  # one delta per code point, then finish
    first = chunk_docs[0]
    assert first["id"].startswith("chatcmpl-mock-")
    assert isinstance(first["created"], int)
    for doc in chunk_docs:
        assert set(doc) == {"id", "object", "created", "model",
                            "system_fingerprint", "choices"}
        assert doc["object"] == "chat.completion.chunk"
        assert doc["model"] == "gpt-test"
        assert doc["system_fingerprint"] == "fp_mock"
        assert (doc["id"], doc["created"]) == (first["id"], first["created"])
        assert len(doc["choices"]) == 1 and doc["choices"][0]["index"] == 0
    deltas = [d["choices"][0]["delta"] for d in chunk_docs]
    assert deltas[0] == {"role": "assistant", "content": "h"}
    assert all("role" not in d for d in deltas[1:])
    assert "".join(d["content"] for d in deltas[:-1]) == "héllo"
    assert deltas[-1] == {}
    assert [d["choices"][0]["finish_reason"] for d in chunk_docs] == \
        [None] * 5 + ["stop"]
    assert "é".encode() in body  # UTF-8 as is, not \u escapes
    assert b"secret" not in body
    (rec,) = mock.requests("shape")
    assert rec["events_sent"] == 7 and rec["client_gone"] is False


def test_stream_record_fields_from_the_start(mock: MockServer) -> None:
    mock.script("early", [{"stream": True, "delay_ms": 5000},
                          {"stream": True, "fault": "no_headers"}])
    raw = Raw(mock)
    raw.post("early", STREAM_BODY)
    assert wait_for(lambda: len(mock.requests("early")) == 1)
    (rec,) = mock.requests("early")  # still in the step's delay
    assert rec["events_sent"] == 0 and rec["client_gone"] is False
    raw.close()
    raw = Raw(mock)
    raw.post("early", STREAM_BODY)
    assert wait_for(lambda: len(mock.requests("early")) == 2)
    assert "events_sent" not in mock.requests("early")[1]  # never streams
    raw.close()


def test_step_fields_in_chunks(mock: MockServer) -> None:
    _, _, chunks, _ = stream(mock, "f", {
        "stream": {"chunks": 1}, "model": "other",
        "system_fingerprint": "fp_x"})
    for doc in data_docs(events(b"".join(chunks)))[:-1]:
        assert (doc["model"], doc["system_fingerprint"]) == ("other", "fp_x")


def test_stream_keeps_connection_and_step_headers(mock: MockServer) -> None:
    mock.script("ka", [{"stream": {"chunks": 1}, "status": 201,
                        "retry_after": "3",
                        "headers": {"Content-Type": "text/plain",
                                    "X-A": "b"}}, {}])
    raw = Raw(mock)
    raw.post("ka")
    status, headers = raw.head()
    assert status == 201
    assert headers["content-type"] == "text/plain"  # the step overrides
    assert headers["retry-after"] == "3" and headers["x-a"] == "b"
    assert "connection" not in headers
    assert raw.chunks()[1]
    raw.post("ka")  # the same connection serves the next request
    status, headers = raw.head()
    assert status == 200 and headers["content-type"] == "application/json"
    doc = json.loads(raw.body_length(int(headers["content-length"])))
    assert doc["object"] == "chat.completion"
    raw.close()
    recs = mock.requests("ka")
    assert recs[0]["connection"] == recs[1]["connection"]
    assert "events_sent" not in recs[1] and "client_gone" not in recs[1]


def test_http_client_reads_stream(mock: MockServer) -> None:
    mock.script("hc", [{"stream": {"chunks": 2}, "content": "abcd"}])
    conn = http.client.HTTPConnection("127.0.0.1", mock.port, timeout=10)
    conn.request("POST", chat_path("hc"), body=json.dumps(STREAM_BODY))
    resp = conn.getresponse()
    docs = data_docs(events(resp.read()))
    conn.close()
    assert contents(docs) == ["ab", "cd", None]


def test_script_over_http_put(mock: MockServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", mock.port, timeout=10)
    conn.request("PUT", "/_mock/scenarios/put", body=json.dumps(
        {"steps": [{"stream": {"end": "no_done", "chunks": 1}}]}))
    assert conn.getresponse().status == 204
    conn.close()
    _, _, chunks, terminated = post_stream(mock, "put")
    docs = data_docs(events(b"".join(chunks)))
    assert terminated and contents(docs) == ["ok", None]


@pytest.mark.parametrize("step", [
    {"stream": 1},
    {"stream": "yes"},
    {"stream": {}, "body": "x"},
    {"stream": {}, "fault": "truncate"},
    {"stream": True, "fault": "trickle"},
    {"stream": {}, "status": 204},
    {"stream": {}, "status": 101},
    {"stream": {"end": "explode"}},
    {"stream": {"line_end": "lfcr"}},
    {"stream": {"error_style": "x"}},
    {"stream": {"framing": "gzip"}},
    {"stream": {"chunks": 0}},
    {"stream": {"chunks": "3"}},
    {"stream": {"chunks": [1]}},
    {"stream": {"chunks": [{"raw": 5}]}},
    {"stream": {"delay_ms": -1}},
    {"stream": {"first_delay_ms": "1"}},
    {"stream": {"keepalive_ms": True}},
    {"stream": {"after": -1}},
    {"stream": {"after": 1.5}},
    {"stream": {"bom": 1}},
    {"stream": {"split_writes": "yes"}},
    {"stream": {"split_writes": 0}},
    {"stream": {"usage_chunk": "yes"}},
    {"stream": {"finish_reason": 3}},
    {"stream": {"error_code": 429}},
    {"stream": {"tool_calls": {}}},
    {"stream": {"tool_calls": [{"arguments": {}}]}},
    {"stream": {"tool_calls": [{"chunks": 0}]}},
    {"stream": {"after_done": "hold"}},
    {"stream": {"after_done": "silence", "end": "drop"}},
    {"stream": {"role_only": 1}},
    {"stream": {"role_only": True, "chunks": 2}},
    {"stream": {"role_only": True, "tool_calls": []}},
    {"stream": {"api": "completions"}},
    {"stream": {"api": "responses", "tool_calls": []}},
    {"stream": {"api": "responses", "role_only": True}},
    {"stream": {"event_lines": "no"}},
])
def test_bad_stream_scripts_rejected(mock: MockServer,
                                     step: Dict[str, Any]) -> None:
    mock.script("bad", [{"status": 500}])
    with pytest.raises(ScriptError):
        mock.script("bad", [step])
    conn = http.client.HTTPConnection("127.0.0.1", mock.port, timeout=10)
    conn.request("PUT", "/_mock/scenarios/bad",
                 body=json.dumps({"steps": [step]}))
    resp = conn.getresponse()
    assert resp.status == 400 and "error" in json.loads(resp.read())
    conn.close()
    assert post_json(mock, "bad")[0] == 500  # the previous script is kept


def test_no_fault_steps_accept_stream(mock: MockServer) -> None:
    # These faults never respond: the stream is allowed and does nothing.
    mock.script("nf", [{"stream": True, "fault": "close"}, {"stream": True}])
    raw = Raw(mock)
    raw.post("nf")
    assert raw.until_eof() == b""
    raw.close()
    assert post_stream(mock, "nf")[3]


# --------------------------------------------------------------------------
# When a response streams
# --------------------------------------------------------------------------

def test_stream_true_request_gets_default_stream(mock: MockServer) -> None:
    status, headers, chunks, terminated = stream(mock, "auto", {},
                                                 STREAM_BODY)
    assert status == 200 and terminated
    assert headers["content-type"] == "text/event-stream"
    docs = data_docs(events(b"".join(chunks)))
    assert contents(docs) == ["o", "k", None] and docs[-1] == "[DONE]"
    # the same with an empty script (the plain-success after step)
    status, headers, chunks, _ = post_stream(mock, "never", STREAM_BODY)
    assert headers["content-type"] == "text/event-stream"
    assert contents(data_docs(events(b"".join(chunks)))) == ["o", "k", None]


@pytest.mark.parametrize("body", [
    {"model": "m"}, {"model": "m", "stream": False},
    {"model": "m", "stream": "true"}, {"model": "m", "stream": 1},
    [{"stream": True}], b"not json"])
def test_non_stream_requests_get_json(mock: MockServer, body: Any) -> None:
    mock.script("js", [{}])
    status, headers, data = post_json(mock, "js", body)
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(data)["object"] == "chat.completion"


@pytest.mark.parametrize("step, expect", [
    ({"status": 429, "retry_after": "1"},
     {"error": {"message": "mock error 429", "type": "server_error",
                "code": None}}),
    ({"status": 503, "error_code": "overloaded"},
     {"error": {"message": "mock error 503", "type": "overloaded",
                "code": "overloaded"}}),
    ({"stream": False}, None),
    ({"body": {"custom": 1}}, {"custom": 1}),
    ({"fault": "invalid_json"}, None),
    ({"status": 204}, None),
])
def test_stream_request_json_answers(mock: MockServer, step: Dict[str, Any],
                                     expect: Any) -> None:
    """A 429 (any non-2xx), "stream": false, a body or a fault: no stream."""
    mock.script("err", [step])
    status, headers, body = post_json(mock, "err", STREAM_BODY)
    assert status == step.get("status", 200)
    assert headers["content-type"] == "application/json"
    assert "transfer-encoding" not in headers
    if status == 204:
        assert body == b"" and "content-length" not in headers
    elif step.get("fault") == "invalid_json":
        assert body == b'{"choices": [ not json'
    elif expect is None:
        assert json.loads(body)["object"] == "chat.completion"
    else:
        assert json.loads(body) == expect
    (rec,) = mock.requests("err")
    assert "events_sent" not in rec and rec["body"] == json.dumps(STREAM_BODY)


# --------------------------------------------------------------------------
# Chunks, tool calls, usage
# --------------------------------------------------------------------------

@pytest.mark.parametrize("count, pieces", [
    (1, ["abcdefg"]), (3, ["ab", "cd", "efg"]), (9, None)])
def test_chunks_int(mock: MockServer, count: int,
                    pieces: Optional[List[str]]) -> None:
    _, _, chunks, _ = stream(mock, "n", {"stream": {"chunks": count},
                                         "content": "abcdefg"})
    got = contents(data_docs(events(b"".join(chunks))))
    assert got[-1] is None and len(got) == count + 1
    assert "".join(got[:-1]) == "abcdefg"
    if pieces is not None:
        assert got[:-1] == pieces
    else:  # more pieces than code points: some are empty, none too long
        assert all(len(p) <= 1 for p in got[:-1]) and "" in got


def test_chunks_list_strings_raw_and_objects(mock: MockServer) -> None:
    obj = {"id": "custom", "choices": [{"index": 0, "delta": {"x": 1}}]}
    _, _, chunks, terminated = stream(mock, "list", {"stream": {"chunks": [
        "Hel", {"raw": "data: not json\n\n"}, obj,
        {"raw": "event: note\nid: 3\nretry: 10\ndata: a\ndata: b\n\n"},
        "lo"]}, "content": "ignored"})
    assert terminated
    evts = events(b"".join(chunks))
    assert evts[1] == b"data: not json"
    assert json.loads(evts[2][len(b"data: "):]) == obj  # as is
    assert evts[3] == b"event: note\nid: 3\nretry: 10\ndata: a\ndata: b"
    docs = data_docs(evts[:1] + evts[4:])
    assert contents(docs) == ["Hel", "lo", None]
    assert docs[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "role" not in docs[1]["choices"][0]["delta"]
    assert docs[-1] == "[DONE]"
    assert mock.requests("list")[0]["events_sent"] == 7


def test_non_string_content_is_one_delta(mock: MockServer) -> None:
    _, _, chunks, _ = stream(mock, "ns", {"stream": True, "content": None})
    docs = data_docs(events(b"".join(chunks)))
    assert docs[0]["choices"][0]["delta"] == {"role": "assistant",
                                              "content": None}
    assert len(docs) == 3


def test_finish_reason_custom_and_none(mock: MockServer) -> None:
    _, _, chunks, _ = stream(mock, "fr", {"stream": {
        "chunks": 1, "finish_reason": "length"}})
    docs = data_docs(events(b"".join(chunks)))
    assert docs[-2]["choices"][0]["finish_reason"] == "length"
    _, _, chunks, _ = stream(mock, "fr", {"stream": {
        "chunks": 1, "finish_reason": None}})
    docs = data_docs(events(b"".join(chunks)))
    assert len(docs) == 2 and docs[-1] == "[DONE]"
    assert docs[0]["choices"][0]["finish_reason"] is None


def test_tool_calls(mock: MockServer) -> None:
    args = '{"city": "Paris", "unit": "c"}'
    _, _, chunks, _ = stream(mock, "tc", {"stream": {"tool_calls": [
        {"id": "call_1", "name": "weather", "arguments": args, "chunks": 4},
        {}]}})
    docs = data_docs(events(b"".join(chunks)))
    assert docs[-1] == "[DONE]"
    deltas = [d["choices"][0]["delta"] for d in docs[:-1]]
    assert deltas[0] == {"role": "assistant", "content": None, "tool_calls": [
        {"index": 0, "id": "call_1", "type": "function",
         "function": {"name": "weather", "arguments": ""}}]}
    merged: Dict[int, str] = {}
    names = {}
    for delta in deltas[:-1]:
        (call,) = delta["tool_calls"]
        merged[call["index"]] = merged.get(call["index"], "") + \
            call["function"]["arguments"]
        if "name" in call["function"]:
            names[call["index"]] = (call["id"], call["function"]["name"])
    assert merged == {0: args, 1: "{}"}
    assert names == {0: ("call_1", "weather"), 1: ("call_mock_1", "tool")}
    assert len(deltas) == 1 + 4 + 1 + 2 + 1
    assert docs[-2]["choices"][0]["finish_reason"] == "tool_calls"
    # with an explicit content, the content deltas come first
    _, _, chunks, _ = stream(mock, "tc", {"content": "hi", "stream": {
        "chunks": 1, "tool_calls": [{"arguments": "{}", "chunks": 1}]}})
    deltas = [d["choices"][0]["delta"]
              for d in data_docs(events(b"".join(chunks)))[:-1]]
    assert deltas[0] == {"role": "assistant", "content": "hi"}
    assert "content" not in deltas[1] and "tool_calls" in deltas[1]


def test_usage_chunk(mock: MockServer) -> None:
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    body = dict(STREAM_BODY, stream_options={"include_usage": True})
    _, _, chunks, _ = stream(mock, "u", {"usage": usage}, body)
    docs = data_docs(events(b"".join(chunks)))
    assert docs[-1] == "[DONE]"
    last = docs[-2]
    assert last["choices"] == [] and last["usage"] == usage
    assert last["object"] == "chat.completion.chunk"
    assert last["id"] == docs[0]["id"]
    assert docs[-3]["choices"][0]["finish_reason"] == "stop"
    assert all(d["usage"] is None for d in docs[:-2])
    # asked for by the step, not the request; the default usage
    _, _, chunks, _ = stream(mock, "u", {"stream": {"usage_chunk": True}})
    docs = data_docs(events(b"".join(chunks)))
    assert docs[-2]["usage"] == {"prompt_tokens": 12, "completion_tokens": 3,
                                 "total_tokens": 15}
    # refused by the step; and not asked for: no usage anywhere
    for step, req in (({"stream": {"usage_chunk": False}}, body),
                      ({"stream": True}, STREAM_BODY),
                      ({"stream": True}, dict(STREAM_BODY, stream_options={
                          "include_usage": False}))):
        _, _, chunks, _ = stream(mock, "u", step, req)
        docs = data_docs(events(b"".join(chunks)))
        assert all("usage" not in d for d in docs[:-1])
        assert all(d["choices"] for d in docs[:-1])


# --------------------------------------------------------------------------
# End modes
# --------------------------------------------------------------------------

def test_end_no_done(mock: MockServer) -> None:
    _, _, chunks, terminated = stream(mock, "nd", {"stream": {
        "end": "no_done", "chunks": 2}})
    docs = data_docs(events(b"".join(chunks)))
    assert terminated  # a clean end of the HTTP body
    assert "[DONE]" not in docs and len(docs) == 3
    assert docs[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("after, expect", [(None, 2), (0, 0), (1, 1),
                                           (3, 3), (99, 3)])
def test_end_drop(mock: MockServer, after: Optional[int],
                  expect: int) -> None:
    opts: Dict[str, Any] = {"end": "drop", "chunks": 2}
    if after is not None:
        opts["after"] = after
    status, _, chunks, terminated = stream(mock, "drop", {"stream": opts})
    assert status == 200
    assert not terminated  # closed with no 0-length chunk
    body = b"".join(chunks)
    docs = data_docs(events(body)) if body else []
    assert len(docs) == expect  # the events 1.-3., never [DONE]
    assert "[DONE]" not in docs
    if expect == 3:
        assert docs[-1]["choices"][0]["finish_reason"] == "stop"
    (rec,) = mock.requests("drop")
    assert rec["events_sent"] == expect and rec["client_gone"] is False


def test_end_drop_with_close_framing(mock: MockServer) -> None:
    mock.script("dc", [{"stream": {"end": "drop", "after": 1, "chunks": 3,
                                   "framing": "close"}, "content": "abc"}])
    raw = Raw(mock)
    raw.post("dc")
    status, headers = raw.head()
    assert status == 200 and headers["connection"] == "close"
    assert "transfer-encoding" not in headers
    assert "content-length" not in headers
    docs = data_docs(events(raw.until_eof()))  # not chunked: raw events
    raw.close()
    assert contents(docs) == ["a"]


def test_close_framing_done_and_http10(mock: MockServer) -> None:
    mock.script("cf", [{"stream": {"framing": "close", "chunks": 1}},
                       {"stream": {"chunks": 1}}])
    for version in ("HTTP/1.1", "HTTP/1.0"):
        raw = Raw(mock)
        raw.post("cf", version=version)
        status, headers = raw.head()
        assert status == 200 and headers["connection"] == "close"
        assert "transfer-encoding" not in headers
        docs = data_docs(events(raw.until_eof()))
        raw.close()
        assert contents(docs) == ["ok", None] and docs[-1] == "[DONE]"


@pytest.mark.parametrize("after_done", ["silence", "junk"])
def test_after_done_holds_the_body_open(mock: MockServer, after_done: str) -> None:
    """[DONE] (then junk), and no 0-length chunk: the connection is held,
    silent, until the client goes (or stall_ms)."""
    mock.script("hold", [{"stream": {"chunks": 1, "after_done": after_done}}])
    raw = Raw(mock, timeout=0.5)
    raw.post("hold")
    raw.head()
    got: List[bytes] = []
    with pytest.raises(socket.timeout):
        while True:
            data = raw.chunk()
            assert data is not None, "the body was ended"
            got.append(data)
    evts = events(b"".join(got))
    docs = data_docs(evts[:3])
    assert contents(docs) == ["ok", None] and docs[2] == "[DONE]"
    junk = evts[3:]
    if after_done == "junk":
        assert contents(data_docs(junk[:1])) == ["JUNK-AFTER-DONE"]
        assert junk[1:] == [b"data: not json", b"garbage"]
    else:
        assert junk == []
    rec = mock.requests("hold")[0]
    assert rec["events_sent"] == 3 and rec["client_gone"] is False
    raw.close()
    assert wait_for(lambda: mock.requests("hold")[0]["client_gone"] is True)
    # stall_ms bounds the hold: then the server closes, still unterminated.
    mock.script("hold", [{"stream": {"chunks": 1, "after_done": after_done},
                          "stall_ms": 100}])
    _, _, _, terminated = post_stream(mock, "hold")
    assert not terminated


def test_length_framing_promises_more_than_it_sends(mock: MockServer) -> None:
    mock.script("len", [{"stream": {"chunks": 2, "framing": "length"}, "stall_ms": 200}])
    raw = Raw(mock)
    raw.post("len")
    status, headers = raw.head()
    assert status == 200 and "transfer-encoding" not in headers
    body = raw.until_eof()              # after stall_ms, closed short
    raw.close()
    assert int(headers["content-length"]) > len(body) + 1000
    docs = data_docs(events(body))
    assert contents(docs) == ["o", "k", None] and docs[-1] == "[DONE]"


def test_role_only(mock: MockServer) -> None:
    _, _, chunks, terminated = stream(mock, "ro", {"stream": {"role_only": True}})
    docs = data_docs(events(b"".join(chunks)))
    assert terminated and len(docs) == 2 and docs[-1] == "[DONE]"
    (choice,) = docs[0]["choices"]
    assert choice == {"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}


@pytest.mark.parametrize("event_lines", [True, False])
def test_api_responses(mock: MockServer, event_lines: bool) -> None:
    mock.script("rs", [{"content": "Hi!", "model": "m-1",
                        "usage": {"prompt_tokens": 5, "completion_tokens": 2,
                                  "total_tokens": 7},
                        "stream": {"api": "responses", "chunks": 2,
                                   "event_lines": event_lines}}])
    raw = Raw(mock)
    raw.sock.sendall(b"POST /s/rs/v1/responses HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: 2\r\n\r\n{}")
    assert raw.head()[0] == 200
    chunks, terminated = raw.chunks()
    raw.close()
    assert terminated
    types, docs = [], []
    for event in events(b"".join(chunks)):
        lines = event.split(b"\n")
        if event_lines:
            assert lines[0].startswith(b"event: ")
            types.append(lines.pop(0)[len(b"event: "):].decode())
        assert len(lines) == 1
        docs.extend(data_docs(lines))
    want = ["response.created", "response.output_text.delta",
            "response.output_text.delta", "response.completed"]
    assert [d["type"] for d in docs] == want and "[DONE]" not in docs
    assert types == (want if event_lines else [])
    assert "".join(d["delta"] for d in docs[1:3]) == "Hi!"
    final = docs[-1]["response"]
    assert final["status"] == "completed" and final["model"] == "m-1"
    assert final["output"][0]["content"][0]["text"] == "Hi!"
    assert final["usage"] == {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}


def test_end_reset(mock: MockServer) -> None:
    mock.script("rst", [{"stream": {"end": "reset", "after": 1,
                                    "chunks": 3}}])
    raw = Raw(mock)
    raw.post("rst")
    assert raw.head()[0] == 200
    with pytest.raises(ConnectionResetError):
        while True:  # the first chunk may come, then the RST
            assert raw.chunk() is not None
    raw.close()
    assert post_json(mock, "rst")[0] == 200  # the server survives


def test_end_stall_then_close(mock: MockServer) -> None:
    mock.script("st", [{"stream": {"end": "stall", "after": 1, "chunks": 2,
                                   "stall_ms": 400}}])
    raw = Raw(mock)
    raw.post("st")
    raw.head()
    first = raw.chunk()
    t0 = time.monotonic()
    assert first is not None
    chunks, terminated = raw.chunks()
    elapsed = time.monotonic() - t0
    raw.close()
    assert chunks == [] and not terminated
    assert elapsed >= 0.35
    assert contents(data_docs(events(first))) == ["o"]
    rec = mock.requests("st")[0]
    assert rec["events_sent"] == 1 and rec["client_gone"] is False


def test_end_stall_default_is_long_and_step_stall_ms(mock: MockServer) -> None:
    mock.script("sd", [{"stream": {"end": "stall", "after": 0}}])
    raw = Raw(mock, timeout=0.5)
    raw.post("sd")
    raw.head()
    with pytest.raises(socket.timeout):
        raw.chunk()
    raw.close()
    mock.script("sd", [{"stream": {"end": "stall", "after": 0},
                        "stall_ms": 200}])
    _, _, chunks, terminated = post_stream(mock, "sd")
    assert chunks == [] and not terminated


@pytest.mark.parametrize("style", [None, "data", "event"])
def test_end_error_event(mock: MockServer, style: Optional[str]) -> None:
    opts: Dict[str, Any] = {"end": "error_event", "after": 2, "chunks": 3}
    if style is not None:
        opts["error_style"] = style
    _, _, chunks, terminated = stream(mock, "ee", {"stream": opts,
                                                   "content": "abc"})
    assert terminated
    evts = events(b"".join(chunks))
    assert contents(data_docs(evts[:2])) == ["a", "b"]
    error = evts[2]
    if style == "event":
        assert error.startswith(b"event: error\ndata: ")
        error = error[len(b"event: error\n"):]
    assert json.loads(error[len(b"data: "):]) == {"error": {
        "message": "mock stream error", "type": "server_error",
        "code": "server_error"}}
    assert len(evts) == 3  # no finish chunk, no [DONE]
    assert mock.requests("ee")[0]["events_sent"] == 3


def test_error_event_fields(mock: MockServer) -> None:
    _, _, chunks, _ = stream(mock, "ef", {"stream": {
        "end": "error_event", "after": 0, "error_code": "rate_limit_exceeded",
        "error_message": "slow down"}})
    (evt,) = events(b"".join(chunks))
    assert json.loads(evt[len(b"data: "):]) == {"error": {
        "message": "slow down", "type": "rate_limit_exceeded",
        "code": "rate_limit_exceeded"}}
    _, _, chunks, _ = stream(mock, "ef", {"stream": {
        "end": "error_event", "after": 0, "error_code": "overloaded",
        "error_type": "server_error"}})
    (evt,) = events(b"".join(chunks))
    assert json.loads(evt[len(b"data: "):])["error"]["type"] == \
        "server_error"


# --------------------------------------------------------------------------
# Wire details: line ends, BOM, keep-alives, split writes, delays
# --------------------------------------------------------------------------

@pytest.mark.parametrize("line_end", ["lf", "crlf", "cr"])
def test_line_ends_byte_exact(mock: MockServer, line_end: str) -> None:
    le = LE[line_end]
    _, _, chunks, terminated = stream(mock, "le", {"stream": {
        "line_end": line_end, "finish_reason": None,
        "keepalive_ms": 30, "first_delay_ms": 50,
        "chunks": [{"x": 1}, {"raw": "event: e\nid: 7\ndata: y\n\n"}]}})
    assert terminated
    body = b"".join(chunks)
    comment = b": keep-alive" + le + le
    assert body.startswith(comment)
    body = body[len(comment):]
    assert body == (b'data: {"x":1}' + le + le
                    + b"event: e" + le + b"id: 7" + le + b"data: y" + le + le
                    + b"data: [DONE]" + le + le)


@pytest.mark.parametrize("line_end", ["crlf", "cr"])
def test_line_ends_of_generated_chunks(mock: MockServer,
                                       line_end: str) -> None:
    le = LE[line_end]
    _, _, chunks, _ = stream(mock, "lg", {"stream": {
        "line_end": line_end, "end": "error_event", "after": 3,
        "error_style": "event", "chunks": 2}})
    body = b"".join(chunks)
    assert body.count(b"\n") == (body.count(b"\r\n") if le == b"\r\n" else 0)
    evts = events(body, le)
    assert len(evts) == 4
    assert contents(data_docs(evts[:3])) == ["o", "k", None]
    assert evts[3].startswith(b"event: error" + le + b"data: {")


def test_bom(mock: MockServer) -> None:
    _, _, chunks, _ = stream(mock, "bom", {"stream": {"bom": True,
                                                      "chunks": 1}})
    body = b"".join(chunks)
    assert body.startswith(b"\xef\xbb\xbfdata: {")
    assert body.count(b"\xef\xbb\xbf") == 1
    assert contents(data_docs(events(body[3:]))) == ["ok", None]


def test_keepalive_comments_while_waiting(mock: MockServer) -> None:
    _, _, chunks, _ = stream(mock, "kal", {"stream": {
        "chunks": 2, "first_delay_ms": 300, "delay_ms": 300,
        "keepalive_ms": 50}})
    body = b"".join(chunks)
    evts = events(body)
    comments = [e for e in evts if e == b": keep-alive"]
    data = [e for e in evts if e != b": keep-alive"]
    assert len(comments) + len(data) == len(evts)
    assert len(data) == 4  # o, k, finish, [DONE]
    # comments before the first event and between the delayed ones
    assert evts[0] == b": keep-alive"
    first_o = evts.index(data[0])
    first_k = evts.index(data[1])
    assert first_o >= 2 and first_k - first_o >= 3
    assert mock.requests("kal")[0]["events_sent"] == 4  # comments not counted
    # no keepalive_ms: no comments
    _, _, chunks, _ = stream(mock, "kal", {"stream": {"first_delay_ms": 150}})
    assert b"keep-alive" not in b"".join(chunks)


def test_a_late_wake_still_sends_the_comments_due(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A wait of 50 ms with keepalive_ms 30 carries its comment even when
    the server's thread wakes after the wait is over (a loaded machine did:
    test_line_ends_byte_exact then saw no comment)."""
    from llmretry.testing import _sse_plan, _sse_send
    opts = {"keepalive_ms": 30, "first_delay_ms": 50, "chunks": 1}
    plan = _sse_plan.Plan({}, opts, 1, "m", None, False)
    a, b = socket.socketpair()
    written: List[bytes] = []
    try:
        sender = _sse_send.Sender(plan, opts, {}, a, threading.Event(),
                                  written.append, lambda: None,
                                  lambda sent: None, chunked=False)
        # The clock reads 0 when the wait starts, then 1 s: every look at
        # it comes after the wait's end.
        clock = iter([0.0])
        monkeypatch.setattr(_sse_send.time, "monotonic",
                            lambda: next(clock, 1.0))
        sender._pause_before_event()
    finally:
        a.close()
        b.close()
    assert written == [b": keep-alive\n\n"]


def test_keepalive_comments_while_stalled(mock: MockServer) -> None:
    _, _, chunks, terminated = stream(mock, "kas", {"stream": {
        "end": "stall", "after": 1, "stall_ms": 400, "keepalive_ms": 50,
        "line_end": "crlf"}})
    assert not terminated
    body = b"".join(chunks)
    assert body.startswith(b"data: ")
    rest = body[body.index(b"\r\n\r\n") + 4:]
    assert len(rest) >= 3 * len(b": keep-alive\r\n\r\n")
    assert rest == b": keep-alive\r\n\r\n" * (
        len(rest) // len(b": keep-alive\r\n\r\n"))


@pytest.mark.parametrize("line_end", ["lf", "crlf", "cr"])
def test_split_writes(mock: MockServer, line_end: str) -> None:
    le = LE[line_end]
    # Fixed chunk objects: the same bytes whether split or not.
    step = {"stream": {"line_end": line_end, "split_delay_ms": 20,
                       "chunks": [{"n": i, "text": "é" * i} for i in range(3)]
                       + [{"raw": "event: e\ndata: x\n\n"}]}}
    _, _, whole, _ = stream(mock, "sw", step)
    step["stream"]["split_writes"] = True
    _, _, halves, _ = stream(mock, "sw", step)
    assert len(halves) == 2 * len(whole)
    assert len(whole) == 6  # 3 objects, the raw event, finish, [DONE]
    for i, event in enumerate(whole):
        first, second = halves[2 * i], halves[2 * i + 1]
        if i != 4:  # the finish chunk (its id differs)
            assert first + second == event
        line = (first + second).split(le, 1)[0]
        if line_end == "crlf":  # cut between the CR and the LF
            assert first == line + b"\r" and second.startswith(b"\n")
        else:  # cut inside the first line
            assert len(first) < len(line) and le not in first
    # a fixed split point, clamped to the event
    step["stream"]["split_writes"] = 4
    _, _, halves, _ = stream(mock, "sw", step)
    assert all(len(h) == 4 for h in halves[::2])
    step["stream"]["split_writes"] = 10 ** 6
    _, _, halves, _ = stream(mock, "sw", step)
    assert [len(h) for h in halves[1::2]] == [1] * len(whole)
    assert [a + b for a, b in zip(halves[::2], halves[1::2])][:4] == \
        whole[:4]


def test_split_writes_arrive_in_separate_reads(mock: MockServer) -> None:
    mock.script("sr", [{"stream": {"chunks": 1, "split_writes": True,
                                   "split_delay_ms": 1000}}])
    raw = Raw(mock)
    raw.post("sr")
    raw.head()
    first = raw.chunk()
    assert first is not None and first.startswith(b"data: ")
    assert raw.buf == b""  # the other half was not there yet
    raw.close()


def test_delays(mock: MockServer) -> None:
    mock.script("dl", [{"stream": {"chunks": 3, "first_delay_ms": 200,
                                   "delay_ms": 100}}])
    raw = Raw(mock)
    raw.post("dl")
    raw.head()
    t0 = time.monotonic()
    times = []
    while raw.chunk() is not None:
        times.append(time.monotonic() - t0)
    raw.close()
    assert len(times) == 5  # 3 deltas, finish, [DONE]
    assert times[0] >= 0.18
    assert times[3] - times[0] >= 0.28  # three 100 ms gaps up to the finish


# --------------------------------------------------------------------------
# Clients that go away, and stop()
# --------------------------------------------------------------------------

def test_client_gone_while_waiting(mock: MockServer,
                                   capfd: pytest.CaptureFixture) -> None:
    mock.script("gone", [{"stream": {"chunks": 50, "delay_ms": 100},
                          "content": "x" * 50}])
    raw = Raw(mock)
    raw.post("gone")
    raw.head()
    assert raw.chunk() is not None
    raw.close()
    assert wait_for(lambda: mock.requests("gone")[0]["client_gone"])
    rec = mock.requests("gone")[0]
    assert 1 <= rec["events_sent"] < 50
    assert post_json(mock, "gone")[0] == 200  # the server carries on
    assert "Traceback" not in capfd.readouterr().err


def test_client_gone_while_writing(mock: MockServer,
                                   capfd: pytest.CaptureFixture) -> None:
    # No waits: the server notices only when a write fails.
    mock.script("gw", [{"stream": {"chunks": 20000},
                        "content": "y" * 400000}])
    raw = Raw(mock)
    raw.post("gw")
    raw.head()
    raw.chunk()
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                        b"\x01\x00\x00\x00\x00\x00\x00\x00")
    raw.close()  # an RST: the next writes fail
    assert wait_for(lambda: mock.requests("gw")[0]["client_gone"])
    assert mock.requests("gw")[0]["events_sent"] < 20003
    assert post_json(mock, "gw")[0] == 200
    assert "Traceback" not in capfd.readouterr().err


def test_client_gone_while_stalled(mock: MockServer) -> None:
    mock.script("gs", [{"stream": {"end": "stall", "after": 1}}])
    raw = Raw(mock)
    raw.post("gs")
    raw.head()
    assert raw.chunk() is not None
    assert mock.requests("gs")[0]["client_gone"] is False
    raw.close()
    assert wait_for(lambda: mock.requests("gs")[0]["client_gone"])


def test_many_abandoned_streams(mock: MockServer,
                                capfd: pytest.CaptureFixture) -> None:
    mock.script("many", [], after={"stream": {"chunks": 100,
                                              "delay_ms": 5},
                                   "content": "z" * 100})
    for i in range(30):
        raw = Raw(mock)
        raw.post("many")
        raw.head()
        for _ in range(i % 3):
            raw.chunk()
        raw.close()
    assert wait_for(lambda: all(r["client_gone"]
                                for r in mock.requests("many")))
    assert "Traceback" not in capfd.readouterr().err
    assert post_stream(mock, "many")[3]


def test_stop_is_prompt_while_streaming() -> None:
    before = set(threading.enumerate())
    server = MockServer().start()
    server.script("s", [
        {"stream": {"end": "stall", "after": 1, "keepalive_ms": 20}},
        {"stream": {"chunks": 5, "delay_ms": 30000}},
        {"stream": {"chunks": 1, "split_writes": True,
                    "split_delay_ms": 30000}}])
    socks = []
    for _ in range(3):
        raw = Raw(server)
        raw.post("s")
        raw.head()
        socks.append(raw)
    assert wait_for(lambda: len(server.requests("s")) == 3)
    # Heads read, the handlers go on into their 30 s split delays; nothing
    # tells when they are in: a margin, so stop() meets the delays.
    time.sleep(0.1)
    t0 = time.monotonic()
    server.stop()
    assert time.monotonic() - t0 < 1.0
    assert wait_for(lambda: not set(threading.enumerate()) - before, 2)
    for raw in socks:
        raw.until_eof()
        raw.close()
    assert not any(r["client_gone"] for r in server.requests("s"))
