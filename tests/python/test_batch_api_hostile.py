"""The Batch API against a hostile server (issue 35; the standard "nothing a
server sends escapes as a foreign exception or kills a batch"): a server
speaking the Files and Batch APIs whose batch objects and result files are
wrong in every way a broken or hostile provider could make them. Each item
still ends as a Result or an LLMError naming what was wrong; nothing raises
ValueError, KeyError, AttributeError or RecursionError; no request goes to a
path the server's ids would smuggle in."""

from __future__ import annotations

import http.server
import json
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

import llmretry
from llmretry import batch_api
from llmretry.errors import LLMError

Answer = Tuple[int, bytes]


class Hostile:
    """A Files/Batch API server: uploads and batch creation answer sanely,
    the batch object (``batch``) and the output file's bytes (``output``)
    are what the test says. Every request's method and path is kept."""

    def __init__(self, batch: Callable[[], Any], output: bytes,
                 create: Optional[Callable[[], Any]] = None) -> None:
        self.batch = batch
        self.output = output
        self.create = create or (lambda: {"id": "batch_1", "status": "validating"})
        self.seen: List[Tuple[str, str]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def _reply(self, status: int, body: bytes,
                       ctype: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _any(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                outer.seen.append((self.command, self.path))
                status, body = outer.answer(self.command, self.path)
                self._reply(status, body)

            do_GET = do_POST = do_DELETE = _any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, method: str, path: str) -> Answer:
        if method == "POST" and path == "/v1/files":
            return 200, b'{"id": "file-in", "object": "file"}'
        if method == "POST" and path == "/v1/batches":
            return 200, json.dumps(self.create()).encode()
        if method == "GET" and path.startswith("/v1/batches/"):
            return 200, json.dumps(self.batch()).encode()
        if method == "GET" and path == "/v1/files/file-out/content":
            return 200, self.output
        if method == "DELETE" and path.startswith("/v1/files/"):
            return 200, b'{"deleted": true}'
        return 404, b'{"error": {"message": "no such path"}}'

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> "Hostile":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def _bodies(n: int) -> List[Dict[str, Any]]:
    return [{"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]}
            for i in range(n)]


def _line(i: int, body: Any, status: int = 200) -> bytes:
    return json.dumps({"id": f"r{i}", "custom_id": str(i),
                       "response": {"status_code": status, "request_id": f"req-{i}",
                                    "body": body}}).encode()


def _answer(text: str = "ok", usage: Any = None) -> Dict[str, Any]:
    doc: Dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion", "model": "m",
                           "choices": [{"index": 0, "finish_reason": "stop", "message":
                                        {"role": "assistant", "content": text}}]}
    if usage is not None:
        doc["usage"] = usage
    return doc


def _completed(**over: Any) -> Callable[[], Dict[str, Any]]:
    doc = {"id": "batch_1", "object": "batch", "status": "completed",
           "output_file_id": "file-out", "error_file_id": None,
           "request_counts": {"total": 3, "completed": 3, "failed": 0}}
    doc.update(over)
    return lambda: doc


def _run(server: Hostile, n: int,
         bodies: Optional[List[Dict[str, Any]]] = None) -> llmretry.BatchResult:
    """batch_api.run, in a thread given 30 s: a server whose batch never
    reads as ended must not make it poll forever."""
    out: Dict[str, Any] = {}

    def go() -> None:
        try:
            out["res"] = batch_api.run(bodies or _bodies(n), base_url=server.base_url,
                                       api_key="sk-hostile", poll_interval_ms=1,
                                       max_poll_interval_ms=5, max_retries=0, logger=None)
        except BaseException as exc:    # re-raised on the test's thread
            out["exc"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "batch_api.run still polling after 30 s"
    if "exc" in out:
        raise out["exc"]
    res: llmretry.BatchResult = out["res"]
    return res


HOSTILE_LINES = [
    b"not json at all",
    b"[1, 2, 3]",
    b'"a string"',
    b"null",
    b"[" * 100000 + b"]" * 100000,                # nesting past any parser's limit
    b'{"custom_id": "1"',                # cut short
    b'{"custom_id": ["1"], "response": 5}',
    b'{"custom_id": "1", "response": {"status_code": "200", "body": {}}}',
    b"\xff\xfe\x00 not utf-8",
]


def test_undecodable_and_foreign_lines_fail_only_their_items() -> None:
    """Garbage lines in the output file are passed over: the item with a
    good line succeeds, the others fail as not answered, none raises."""
    out = b"\n".join(HOSTILE_LINES + [_line(0, _answer("fine"))]) + b"\n"
    with Hostile(_completed(), out) as server:
        res = _run(server, 3)
    assert len(res) == 3
    assert not isinstance(res[0], BaseException), res[0]
    assert res[0].data["choices"][0]["message"]["content"] == "fine"
    for item in res[1:]:
        assert isinstance(item, LLMError), item
        assert any(words in str(item) for words in
                   ("no line for it", "could not be read", "no HTTP status")), item
    assert res.summary.ok == 1 and res.summary.failed == 2


@pytest.mark.parametrize("usage", [
    {"prompt_tokens": "many", "completion_tokens": 1},
    {"prompt_tokens": {"a": 1}, "completion_tokens": [1]},
    {"prompt_tokens": 1e300, "completion_tokens": -2},
    {"prompt_tokens": True, "total_tokens": "x"},
    "usage",
])
def test_a_usage_of_the_wrong_types_is_no_usage(usage: Any) -> None:
    out = _line(0, _answer("fine", usage)) + b"\n"
    with Hostile(_completed(), out) as server:
        res = _run(server, 1)
    assert not isinstance(res[0], BaseException), res[0]
    assert res[0].meta.usage is None or all(
        type(v) is int for v in res[0].meta.usage.values()), res[0].meta.usage


@pytest.mark.parametrize("body", [[1, 2], "text", None, 5])
def test_a_2xx_line_whose_body_is_not_an_object_is_a_failure(body: Any) -> None:
    """A success carries what was asked for: a 200 line with no answer
    object is an invalid response, not a Result holding a string."""
    out = _line(0, body) + b"\n"
    with Hostile(_completed(), out) as server:
        res = _run(server, 1)
    assert isinstance(res[0], llmretry.InvalidResponseError), res[0]


@pytest.mark.parametrize("over", [
    {"status": 7},
    {"status": None},
    {"status": ["completed"]},
])
def test_a_batch_with_no_readable_status_is_a_typed_error(over: Dict[str, Any]) -> None:
    """A batch object whose status is not a string: an InvalidResponseError
    naming the batch (never an endless wait or a TypeError)."""
    with Hostile(_completed(**over), b"") as server:
        with pytest.raises(llmretry.InvalidResponseError, match="batch_1"):
            _run(server, 2)


@pytest.mark.parametrize("over", [
    {"request_counts": "lots"},
    {"request_counts": {"total": "x", "completed": [1], "failed": None}},
    {"request_counts": {"total": 1e300, "completed": -5}},
    {"errors": "broken"},
    {"errors": {"data": "x"}},
    {"errors": {"data": [5, "y"]}},
])
def test_odd_counts_and_errors_do_not_raise(over: Dict[str, Any]) -> None:
    out = _line(0, _answer("fine")) + b"\n"
    with Hostile(_completed(**over), out) as server:
        res = _run(server, 2)
    assert not isinstance(res[0], BaseException), res[0]
    assert isinstance(res[1], LLMError)


@pytest.mark.parametrize("over", [
    {"status": "failed", "errors": "broken"},
    {"status": "failed", "errors": {"data": [5]}},
    {"status": "failed", "errors": {"data": [{"message": ["x"], "line": "two"}]}},
    {"status": "expired", "output_file_id": None},
])
def test_items_of_an_odd_failed_batch_fail_with_its_status(over: Dict[str, Any]) -> None:
    with Hostile(_completed(**over), b"") as server:
        res = _run(server, 2)
    for item in res:
        assert isinstance(item, LLMError), item
        assert over["status"] in str(item) or "failed" in str(item), item


@pytest.mark.parametrize("file_id", ["../batches/batch_1/cancel", "file-out?x=1", 42,
                                     {"id": "file-out"}, "a" * 5000, ""])
def test_a_file_id_that_is_not_an_id_is_never_requested(file_id: Any) -> None:
    """The server's ids become request paths: one that is not a plain id
    (a path, a query, another type) is refused, not followed."""
    with Hostile(_completed(output_file_id=file_id), b"") as server:
        try:
            res = _run(server, 1)
        except llmretry.InvalidResponseError as exc:
            assert "output_file_id" in str(exc), exc
        else:
            assert isinstance(res[0], LLMError), res[0]
        paths = [p for _, p in server.seen]
    ours = "/v1/batches?limit=100"          # the list read after the create
    assert all(p in ("/v1/files", "/v1/batches", ours) or p.startswith("/v1/batches/batch_1")
               or p == "/v1/files/file-in" for p in paths), paths
    assert not any("cancel" in p or "?" in p or ".." in p for p in paths if p != ours), paths


@pytest.mark.parametrize("created", [{}, {"id": 5}, {"id": "../files/file-in"}, [1]])
def test_a_created_batch_with_no_plain_id_is_a_typed_error(created: Any) -> None:
    with Hostile(_completed(), b"", create=lambda: created) as server:
        with pytest.raises(llmretry.InvalidResponseError, match="batch id|JSON object"):
            _run(server, 1)
        paths = [p for _, p in server.seen]
    assert not any(".." in p for p in paths), paths


# A line's answer is judged by the core as an attempt's (docs/batch-api.md,
# "What a result line holds"): the rules of docs/reliability.md's "A 200
# that is not an answer" and docs/security.md's screen apply to it.

PROMPT = "the itinerary of the secret harbour visit"


@pytest.mark.parametrize("body, kind, status", [
    ({"error": {"code": 502, "message": "Provider returned error"}},
     llmretry.HTTPStatusError, 502),
    ({"id": "x", "choices": None, "error": {"message": "rate limited", "type": "rate_limit_exceeded"}},
     llmretry.HTTPStatusError, 429),
    ({"id": "x", "object": "chat.completion", "choices": []}, llmretry.InvalidResponseError, 200),
    ({"id": "x", "choices": [{"index": 0, "finish_reason": "error",
                              "message": {"role": "assistant", "content": "Hal"}}]},
     llmretry.HTTPStatusError, 500),
])
def test_a_200_line_that_is_not_an_answer_fails_its_item(body: Any, kind: type,
                                                         status: int) -> None:
    """A 200 whose body is an error, or holds no answer, is no Result:
    the item fails (to be re-run) with what the body stands for."""
    out = _line(0, body) + b"\n" + _line(1, _answer("fine")) + b"\n"
    with Hostile(_completed(), out) as server:
        res = _run(server, 2)
    assert isinstance(res[0], kind), res[0]
    assert res[0].status == status and res[0].request_id == "req-0", res[0]
    assert res[1].data["choices"][0]["message"]["content"] == "fine"
    assert res.summary.ok == 1 and res.summary.failed == 1


def test_an_error_line_that_echoes_the_prompt_or_key_does_not_show_it() -> None:
    """A provider's message quoting the item's prompt (or the key) is
    withheld, as in an HTTP error of a call; a message that does not is
    shown, quoted."""
    bodies = [{"model": "m", "messages": [{"role": "user", "content": PROMPT}]},
              {"model": "m", "messages": [{"role": "user", "content": "q1"}]},
              {"model": "m", "messages": [{"role": "user", "content": "q2"}]}]
    out = b"\n".join([
        _line(0, {"error": {"message": f"Invalid content: {PROMPT}", "code": "bad_content"}},
              400),
        _line(1, {"error": {"message": "Incorrect API key: sk-hostile", "code": "bad_key"}}, 401),
        _line(2, {"error": {"message": "max_tokens is too large", "code": "bad_max"}}, 400),
    ]) + b"\n"
    with Hostile(_completed(), out) as server:
        res = _run(server, 3, bodies)
    for item in res[:2]:
        assert isinstance(item, llmretry.HTTPStatusError), item
        shown = f"{item} {item!r}"
        assert PROMPT not in shown and "sk-hostile" not in shown, shown
        assert "withheld" in str(item), item
    assert res[0].status == 400 and res[0].error_code == "bad_content"
    assert isinstance(res[2], llmretry.HTTPStatusError)
    assert '"max_tokens is too large"' in str(res[2]) and res[2].error_code == "bad_max"


@pytest.mark.parametrize("rid", ["req\r\nX-Evil: 1", "r" * 5000, "", None, 7])
def test_an_odd_request_id_on_a_line_still_judges_it(rid: Any) -> None:
    """The line's request id is the provider's: one the core would not
    send (control bytes, 5,000 characters) or none leaves the answer judged
    under an id of the core's own."""
    line = json.dumps({"id": "r0", "custom_id": "0", "response": {
        "status_code": 200, "request_id": rid, "body": _answer("fine")}}).encode()
    with Hostile(_completed(), line + b"\n") as server:
        res = _run(server, 1)
    assert isinstance(res[0], llmretry.Result), res[0]
    assert res[0].meta.request_id and "\n" not in res[0].meta.request_id


TOKEN = "Project-Nightjar-launch-codes-7731"      # a prompt that is a token


def _prompt_bodies() -> List[Dict[str, Any]]:
    return [{"model": "m", "messages": [{"role": "user", "content": PROMPT}]},
            {"model": "m", "messages": [{"role": "user", "content": TOKEN}]}]


def test_a_failed_batch_whose_message_quotes_an_item_does_not_show_it() -> None:
    """A batch's own error (failed validation) may quote any of its lines:
    screened against every item's request and the key, its code too."""
    errors = {"data": [{"message": f"Invalid content on line 1: {PROMPT}", "line": 1,
                        "code": TOKEN}]}
    with Hostile(_completed(status="failed", errors=errors), b"") as server:
        res = _run(server, 2, _prompt_bodies())
    for item in res:
        assert isinstance(item, batch_api.BatchAPIError), item
        shown = f"{item} {item!r} {item.as_dict()}"
        assert "itinerary" not in shown and "Nightjar" not in shown, shown
        assert "withheld" in str(item) and "line 1" in str(item) and item.error_code == "invalid_code", item
    errors = {"data": [{"message": "Model m does not support batches", "code": "bad_model"}]}
    with Hostile(_completed(status="failed", errors=errors), b"") as server:
        res = _run(server, 2, _prompt_bodies())
    assert "Model m does not support batches" in str(res[0]) and res[0].error_code == "bad_model"


def test_a_line_error_that_quotes_its_item_or_the_key_does_not_show_it() -> None:
    """A line with no answer, only an error (not run): its message and
    code pass the same screen; a plain one is shown as it came."""
    out = b"\n".join([
        json.dumps({"custom_id": "0", "response": None, "error": {
            "code": "batch_expired", "message": f"Skipped: {PROMPT}"}}).encode(),
        json.dumps({"custom_id": "1", "response": None, "error": {
            "code": TOKEN, "message": "Not run within the window (key sk-hostile)"}}).encode(),
    ]) + b"\n"
    with Hostile(_completed(status="expired"), out) as server:
        res = _run(server, 2, _prompt_bodies())
    for item in res:
        assert isinstance(item, LLMError), item
        shown = f"{item} {item!r} {item.as_dict()}"
        assert "itinerary" not in shown and "sk-hostile" not in shown, shown
        assert "Nightjar" not in shown, shown
        assert "withheld" in str(item), item
    assert res[0].kind == "batch_expired" and res[1].kind == "batch_expired"
    long = "z" * 5000
    out = json.dumps({"custom_id": "0", "response": None,
                      "error": {"code": "batch_cancelled", "message": long}}).encode() + b"\n"
    with Hostile(_completed(status="cancelled"), out) as server:
        res = _run(server, 1)
    assert str(res[0]).startswith("z" * 300 + "...") and len(str(res[0])) < 400, str(res[0])


def test_a_line_that_does_not_match_its_items_schema_fails_it() -> None:
    """A body's response_format json_schema holds the batch's answer to it
    as it holds a realtime call's: a mismatch fails the item (with where),
    a match is a Result."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    bodies = [{"model": "m", "messages": [{"role": "user", "content": f"q{i}"}],
               "response_format": {"type": "json_schema",
                                   "json_schema": {"name": "s", "schema": schema,
                                                   "strict": True}}} for i in range(3)]
    out = b"\n".join([_line(0, _answer('{"a": 1}')), _line(1, _answer('{"a": "one"}')),
                      _line(2, _answer("not json"))]) + b"\n"
    with Hostile(_completed(), out) as server:
        res = _run(server, 3, bodies)
    assert isinstance(res[0], llmretry.Result), res[0]
    for item, where in ((res[1], "$.a"), (res[2], "$")):
        assert isinstance(item, llmretry.InvalidResponseError), item
        assert item.validation_errors and item.validation_errors[0]["path"] == where, item
    assert res.summary.ok == 1 and res.summary.failed == 2
