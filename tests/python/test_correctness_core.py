"""What the core decides once for every host (issue 13, the correctness
round), seen from Python: request ids, caller headers, the text of HTTP
errors, usage counts and what a valid 2xx body is. The Lua twin is
tests/lua/correctness_core_spec.lua."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Iterator, List

import pytest

import llmretry
from conftest import SECRET_KEY, Scenario, run_call, secret_body


class RawServer:
    """Answers every request with the same bytes, then closes: what the mock
    server cannot send (invalid UTF-8, control characters in an error)."""

    def __init__(self, response: bytes) -> None:
        self.response = response
        self.requests: List[bytes] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                while len(body) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    body += chunk
                self.requests.append(head)
                conn.sendall(self.response)

    def close(self) -> None:
        self.sock.close()


def response(status: str, body: bytes) -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


@pytest.fixture
def raw() -> Iterator[List[RawServer]]:
    servers: List[RawServer] = []
    yield servers
    for s in servers:
        s.close()


def test_request_id_up_to_256_bytes_whole_longer_refused(scen: Scenario) -> None:
    rid = "r" * 256
    out = run_call(scen, [{}], request_id=rid, max_retries=0)
    assert out.ok, out.error
    assert out.result.meta.request_id == rid
    assert scen.requests()[0]["headers"]["x-client-request-id"] == rid
    with pytest.raises(ValueError, match="request_id"):
        llmretry.call_llm(secret_body("rid"), base_url=scen.url, api_key=SECRET_KEY,
                          request_id=rid + "r")
    assert len(scen.requests()) == 1


@pytest.mark.parametrize("name", ["Content-Length", "transfer-encoding", "HOST"])
def test_framing_headers_refused_naming_the_header(scen: Scenario, name: str) -> None:
    with pytest.raises(ValueError) as info:
        llmretry.call_llm(secret_body("hdr"), base_url=scen.url, api_key=SECRET_KEY,
                          headers={name: "1"})
    assert name.lower() in str(info.value).lower()
    assert scen.requests() == []


def test_authorization_beside_api_key_refused(scen: Scenario) -> None:
    with pytest.raises(ValueError, match="Authorization") as info:
        llmretry.call_llm(secret_body("auth"), base_url=scen.url, api_key=SECRET_KEY,
                          headers={"Authorization": "Bearer other-SECRET"})
    assert "other-SECRET" not in str(info.value)
    assert scen.requests() == []


def test_tab_in_a_header_value_is_sent_as_in_lua(scen: Scenario) -> None:
    out = run_call(scen, [{}], headers={"X-Tab": "a\tb"}, max_retries=0)
    assert out.ok, out.error
    assert scen.requests()[0]["headers"]["x-tab"] == "a\tb"
    with pytest.raises(ValueError, match="control characters"):
        llmretry.call_llm(secret_body("ctl"), base_url=scen.url, api_key=SECRET_KEY,
                          headers={"X-A": "a\x01b"})


def test_error_text_escaped_and_names_the_path(raw: List[RawServer]) -> None:
    body = (b'{"error": {"message": "no\\nINFO forged line\\r\\u001b[0m", '
            b'"code": "c\\nINFO forged line"}}')
    srv = RawServer(response("400 Bad Request", body))
    raw.append(srv)
    with pytest.raises(llmretry.LLMError) as info:
        llmretry.call_llm(secret_body("esc"), max_retries=0, api_key=SECRET_KEY,
                          url=f"http://127.0.0.1:{srv.port}/v1/chat/completions?sig=Q-SECRET")
    text = str(info.value)
    assert "\n" not in text and "\r" not in text and "\x1b" not in text
    # The code is free text, not a token: replaced; the message is escaped.
    assert text.startswith('HTTP 400 from /v1/chat/completions (invalid_code): '
                           '"no\\nINFO forged line\\r\\x1b[0m"; gave up'), text
    assert "Q-SECRET" not in text
    assert info.value.error_code == "invalid_code"


def test_invalid_utf8_2xx_is_an_invalid_response(raw: List[RawServer]) -> None:
    body = b'{"id": "x", "choices": [{"message": {"content": "caf\xe9"}}]}'
    srv = RawServer(response("200 OK", body))
    raw.append(srv)
    events: List[dict] = []
    with pytest.raises(llmretry.InvalidResponseError) as info:
        llmretry.call_llm(secret_body("utf8"), base_url=f"http://127.0.0.1:{srv.port}/v1",
                          api_key=SECRET_KEY, max_retries=1, base_delay_ms=10,
                          logger=events.append)
    assert info.value.attempts == 2 and info.value.reason == "retries_exhausted"
    names = [e["event"] for e in events]
    assert "llm_request_succeeded" not in names
    assert names.count("llm_request_error") == 2


def test_absurd_usage_counts_are_not_summed(scen: Scenario) -> None:
    out = run_call(scen, [{"usage": {"prompt_tokens": -5, "completion_tokens": 2.5,
                                     "total_tokens": 1e16}}], max_retries=0)
    assert out.ok, out.error
    assert out.result.meta.usage == {"prompt_tokens": 0, "completion_tokens": 0,
                                     "total_tokens": 0}
    assert out.result.data["usage"]["prompt_tokens"] == -5     # the raw usage stays


def test_default_openai_endpoint_without_key_fails_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        llmretry.call_llm(secret_body("nokey"))
    assert time.monotonic() - t0 < 1.0


# ---------------------------------------------------------------------------
# What a server's error may show (issue 27): its code only as a short token,
# its message unless that echoes the request. The Lua twin is in
# tests/lua/correctness_core_spec.lua, the C one in tests/c/test_raw.c.

CODE_PROMPT = "SECRET-PROMPT-code"      # secret_body("code")'s user message


def shown(out: Any) -> str:
    """Everything a user or a log sees of a failed call but the raw
    body_preview (which docs/security.md says may hold what the server
    echoed)."""
    err = out.error
    fields = {k: v for k, v in err.as_dict().items() if k != "body_preview"}
    events = [{k: v for k, v in e.items() if k != "body_preview"} for e in out.events.events]
    return f"{err} {err!r} {fields} {events}"


@pytest.mark.parametrize("code", ["c" * 200_000, "not a token", CODE_PROMPT,
                                  f"echo: {CODE_PROMPT}", "x" * 65],
                         ids=["200KB", "spaces", "prompt", "prompt-spaces", "65-bytes"])
@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
def test_error_code_that_is_not_a_short_token_is_replaced(scen: Scenario, code: str,
                                                          stream: bool) -> None:
    if stream:
        steps = [{"stream": {"end": "error_event", "after": 0, "error_code": code,
                             "error_message": "bad"}}]
        out = run_call(scen, steps, body=secret_body("code", stream=True), max_retries=0)
    else:
        steps = [{"status": 400, "body": {"error": {"message": "bad", "code": code}}}]
        out = run_call(scen, steps, body=secret_body("code"), max_retries=0)
    assert out.error is not None and out.error.error_code == "invalid_code"
    assert [e["error_code"] for e in out.events.of("llm_request_failed")] == ["invalid_code"]
    text = shown(out)
    for secret in (code[:64], CODE_PROMPT, "not a token"):
        assert secret not in text, f"{secret[:40]!r} in {text[:400]!r}"
    if not stream:
        assert '(invalid_code): "bad"; gave up' in str(out.error)


def test_error_code_that_is_a_token_is_kept(scen: Scenario) -> None:
    code = "Zz09_.:-" + "a" * 56
    out = run_call(scen, [{"status": 400, "body": {"error": {"message": "m", "code": code}}}],
                   max_retries=0)
    assert out.error is not None and out.error.error_code == code
    assert f"({code}): \"m\"" in str(out.error)


def test_provider_message_is_in_the_error_not_the_events(scen: Scenario) -> None:
    said = "Invalid value for 'temperature': must be <= 2."
    out = run_call(scen, [{"status": 400, "body": {"error": {
        "message": said, "type": "invalid_request_error", "code": None}}}], max_retries=0)
    assert out.error is not None
    assert str(out.error).startswith(
        f'HTTP 400 from /s/{scen.name}/v1/chat/completions (invalid_request_error): "{said}"; '
        f'gave up after 1 attempt: not retryable'), str(out.error)
    events = [{k: v for k, v in e.items() if k != "body_preview"} for e in out.events.events]
    assert "temperature" not in repr(events)
    # Cut to 300 bytes.
    out = run_call(scen, [{"status": 422, "body": {"detail": "d" * 1000}}], max_retries=0)
    assert out.error is not None and f': "{"d" * 300}..."; gave up' in str(out.error)


@pytest.mark.parametrize("said,withheld", [
    (f"unknown input {CODE_PROMPT[2:18]}", True),     # 16 bytes of the prompt
    (f"unknown input {CODE_PROMPT[2:17]}", False),    # 15: shown
    (f"cannot use {SECRET_KEY}", True),               # the key
])
def test_provider_message_echoing_the_request_is_withheld(scen: Scenario, said: str,
                                                          withheld: bool) -> None:
    out = run_call(scen, [{"status": 400, "body": {"error": {"message": said}}}],
                   body=secret_body("code"), max_retries=0)
    assert out.error is not None
    text = shown(out)
    if withheld:
        assert ("(the server's message is withheld because it echoes the request)"
                in str(out.error)), str(out.error)
        assert "unknown input" not in text and "cannot use" not in text
    else:
        assert f': "{said}"; gave up' in str(out.error)
    assert SECRET_KEY not in text and CODE_PROMPT not in text


def test_a_message_whose_escapes_would_quote_the_prompt_is_withheld(scen: Scenario) -> None:
    """The message as shown is screened, not only as sent: a tab before
    "he harbour plan" is shown as \\t, and "\\the harbour plan" quotes 16
    bytes of the prompt the server did not send (found by fuzz_response)."""
    body = {"model": "gpt-test", "messages": [{"role": "user",
                                               "content": "the harbour plan at dawn"}]}
    said = "unknown input \the harbour plan\\"     # 15 bytes of the prompt as sent
    out = run_call(scen, [{"status": 400, "body": {"error": {"message": said}}}],
                   body=body, max_retries=0)
    assert out.error is not None
    assert ("(the server's message is withheld because it echoes the request)"
            in str(out.error)), str(out.error)
    assert "harbour" not in str(out.error)
