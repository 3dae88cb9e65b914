"""The mock's Files and Batch APIs (``/v1/files``, ``/v1/batches``): see
tests/mock_protocol.md ("Batch API") and llmretry.testing's docstring.

A store of uploaded files and batches, kept in memory by the mock server.
Time does not pass by itself: a batch moves through its status machine
only when a test says so (``POST /_mock/batches/<id>/advance``), or, with
``PUT /_mock/batches {"auto": ...}``, each time a client retrieves it.

    validating -> in_progress -> finalizing -> completed
    validating -> failed                 (the input file did not validate)
    any running status -> expired        (the first K lines done)
    any running status -> cancelling -> cancelled

Each output line echoes its body's ``model``. A line whose body has
``"mock_status": N`` (N not 2xx) ends in the error file with that status.
Stdlib only, like the rest of the mock.
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import parse_qs

# The endpoints the Batch API serves.
ENDPOINTS = ("/v1/chat/completions", "/v1/embeddings", "/v1/responses",
             "/v1/completions")
RUNNING = ("validating", "in_progress", "finalizing", "cancelling")
TERMINAL = ("completed", "failed", "expired", "cancelled")
_NEXT = {"validating": "in_progress", "in_progress": "finalizing",
         "finalizing": "completed", "cancelling": "cancelled"}

# /v1/files[/<id>[/content]], /v1/batches[/<id>[/cancel]], with or without
# a /s/<scenario> prefix (the store is the server's, not a scenario's).
_API = re.compile(r"^(?:/s/[^/]+)?/v1/(files|batches)(?:/([^/]+))?(?:/(content|cancel))?$")
_CONTROL = re.compile(r"^/_mock/batches(?:/([^/]+)/advance)?$")

Reply = Tuple[int, str, bytes]     # status, content type, body


def handles(path: str) -> bool:
    """Whether a request path is the Files or Batch API's or its control's."""
    return bool(_API.match(path) or _CONTROL.match(path))


def _json(status: int, doc: Any) -> Reply:
    return status, "application/json", json.dumps(doc).encode("utf-8")


def _error(status: int, message: str, code: Optional[str] = None) -> Reply:
    return _json(status, {"error": {"message": message, "type": "invalid_request_error",
                                    "param": None, "code": code}})


class BadInput(ValueError):
    """The input file does not validate: the batch fails with these errors."""

    def __init__(self, errors: List[Dict[str, Any]]) -> None:
        super().__init__(errors[0]["message"])
        self.errors = errors


def _multipart(content_type: str, body: bytes) -> Dict[str, Tuple[Optional[str], bytes]]:
    """The parts of a multipart/form-data body: name -> (filename, data)."""
    m = re.search(r'boundary="?([^";]+)"?', content_type)
    if not m:
        raise ValueError("no multipart boundary")
    delim = b"--" + m.group(1).encode("latin-1")
    parts: Dict[str, Tuple[Optional[str], bytes]] = {}
    for chunk in body.split(delim)[1:]:
        if chunk.startswith(b"--"):
            break
        head, sep, data = chunk.partition(b"\r\n\r\n")
        if not sep:
            raise ValueError("a part without a head")
        if data.endswith(b"\r\n"):
            data = data[:-2]
        disposition = head.decode("latin-1")
        name = re.search(r'\bname="([^"]*)"', disposition)
        filename = re.search(r'\bfilename="([^"]*)"', disposition)
        if name:
            parts[name.group(1)] = (filename.group(1) if filename else None, data)
    return parts


def _answer(endpoint: str, body: Dict[str, Any], n: int) -> Dict[str, Any]:
    """A line's 2xx body for its endpoint, echoing the body's model."""
    model = body.get("model")
    usage = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    if endpoint == "/v1/embeddings":
        return {"object": "list", "model": model,
                "data": [{"object": "embedding", "index": 0, "embedding": [0.5, -0.25, float(n)]}],
                "usage": {"prompt_tokens": 4, "total_tokens": 4}}
    if endpoint == "/v1/responses":
        return {"id": f"resp_mock_{n}", "object": "response", "status": "completed",
                "model": model,
                "output": [{"type": "message", "role": "assistant",
                            "content": [{"type": "output_text", "text": "ok"}]}],
                "usage": {"input_tokens": 12, "output_tokens": 3, "total_tokens": 15}}
    return {"id": f"chatcmpl-mock-{n}", "object": "chat.completion",
            "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                         "finish_reason": "stop"}],
            "usage": usage}


class Store:
    """The server's files and batches (every method takes the lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.files: Dict[str, Dict[str, Any]] = {}
        self.content: Dict[str, bytes] = {}
        self.batches: Dict[str, Dict[str, Any]] = {}
        self.lines: Dict[str, List[Tuple[str, Dict[str, Any]]]] = {}
        self.auto: Any = None
        self.fail = 0           # the next this many API requests answer 503
        self.create_delay_ms = 0    # a create is made (and listed) this late
        self.lost_creates = 0   # the next this many creates are made, then answered 503
        self.counter = 0
        self.lists = 0          # GET /batches pages served

    def _id(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}-mock{self.counter:06d}"

    def _new_file(self, name: str, purpose: str, data: bytes) -> Dict[str, Any]:
        meta: Dict[str, Any] = {"id": self._id("file"), "object": "file", "bytes": len(data),
                "created_at": int(time.time()), "filename": name, "purpose": purpose,
                "status": "processed"}
        self.files[meta["id"]] = meta
        self.content[meta["id"]] = data
        return meta

    # -- requests -------------------------------------------------------------

    def handle(self, method: str, path: str, content_type: str, body: bytes,
               query: str = "") -> Reply:
        with self.lock:
            delay = self.create_delay_ms
        api = _API.match(path)
        if delay and method == "POST" and api and api.groups() == ("batches", None, None):
            # Outside the lock: the batch is not listed meanwhile, as a
            # create a client gave up on may still be made after.
            time.sleep(delay / 1000.0)
        with self.lock:
            m = _CONTROL.match(path)
            if m:
                return self._control(method, m.group(1), body)
            m = _API.match(path)
            assert m is not None
            if self.fail > 0:       # a transient failure, for the client's retries
                self.fail -= 1
                return _json(503, {"error": {"message": "mock: temporarily unavailable",
                                             "type": "server_error", "param": None,
                                             "code": None}})
            kind, ident, action = m.groups()
            if kind == "files":
                return self._files(method, ident, action, content_type, body)
            return self._batches(method, ident, action, body, query)

    def _files(self, method: str, ident: Optional[str], action: Optional[str],
               content_type: str, body: bytes) -> Reply:
        if ident is None:
            if method == "GET":
                return _json(200, {"object": "list", "data": list(self.files.values())})
            if method != "POST":
                return _error(405, f"method {method} not allowed")
            if not content_type.lower().startswith("multipart/form-data"):
                return _error(400, "an upload is multipart/form-data")
            try:
                parts = _multipart(content_type, body)
            except ValueError as exc:
                return _error(400, f"bad multipart body: {exc}")
            if "file" not in parts or "purpose" not in parts:
                return _error(400, "an upload needs the parts file and purpose")
            purpose = parts["purpose"][1].decode("utf-8", "replace")
            if purpose != "batch":
                return _error(400, f"purpose {purpose!r}: the mock takes 'batch'")
            return _json(200, self._new_file(parts["file"][0] or "upload.jsonl",
                                             purpose, parts["file"][1]))
        if ident not in self.files:
            return _error(404, f"No such File object: {ident}")
        if action == "content" and method == "GET":
            return 200, "application/octet-stream", self.content[ident]
        if action is None and method == "GET":
            return _json(200, self.files[ident])
        if action is None and method == "DELETE":
            del self.files[ident]
            del self.content[ident]
            return _json(200, {"id": ident, "object": "file", "deleted": True})
        return _error(405, f"method {method} not allowed")

    def _batches(self, method: str, ident: Optional[str], action: Optional[str],
                 body: bytes, query: str = "") -> Reply:
        if ident is None:
            if method == "GET":
                return self._list(query)
            if method != "POST":
                return _error(405, f"method {method} not allowed")
            return self._create(body)
        batch = self.batches.get(ident)
        if batch is None:
            return _error(404, f"No such Batch object: {ident}")
        if action == "cancel" and method == "POST":
            if batch["status"] in TERMINAL:
                return _error(400, f"batch {ident} is {batch['status']}: it cannot be cancelled")
            if batch["status"] != "cancelling":
                batch["status"] = "cancelling"
                batch["cancelling_at"] = int(time.time())
            return _json(200, batch)
        if action is None and method == "GET":
            if self.auto is not None and batch["status"] not in TERMINAL:
                self._advance(batch, self.auto if isinstance(self.auto, dict) else {})
            return _json(200, batch)
        return _error(405, f"method {method} not allowed")

    def _list(self, query: str) -> Reply:
        """GET /batches: the newest first, ``limit`` (1-100, 20 by default)
        a page, from the one ``after`` names, as the API pages."""
        args = parse_qs(query)
        try:
            limit = int(args.get("limit", ["20"])[0])
        except ValueError:
            return _error(400, "limit: not a number")
        if not 1 <= limit <= 100:
            return _error(400, "limit: 1 to 100")
        data = sorted(self.batches.values(), key=lambda b: b["id"], reverse=True)
        after = args.get("after", [None])[0]
        if after is not None:
            ids = [b["id"] for b in data]
            if after not in ids:
                return _error(400, f"after: no such batch {after!r}")
            data = data[ids.index(after) + 1:]
        self.lists += 1
        page = data[:limit]
        return _json(200, {"object": "list", "data": page, "has_more": len(data) > limit,
                           "first_id": page[0]["id"] if page else None,
                           "last_id": page[-1]["id"] if page else None})

    def _create(self, body: bytes) -> Reply:
        try:
            doc = json.loads(body)
        except ValueError:
            return _error(400, "the body is not JSON")
        if not isinstance(doc, dict):
            return _error(400, "the body is not a JSON object")
        file_id = doc.get("input_file_id")
        if file_id not in self.files:
            return _error(400, f"input_file_id {file_id!r}: no such file")
        if doc.get("endpoint") not in ENDPOINTS:
            return _error(400, f"endpoint {doc.get('endpoint')!r}: one of {', '.join(ENDPOINTS)}")
        if doc.get("completion_window") != "24h":
            return _error(400, "completion_window: only '24h'")
        batch = {"id": self._id("batch"), "object": "batch", "endpoint": doc["endpoint"],
                 "errors": None, "input_file_id": file_id, "completion_window": "24h",
                 "status": "validating", "output_file_id": None, "error_file_id": None,
                 "created_at": int(time.time()), "in_progress_at": None,
                 "expires_at": int(time.time()) + 86400, "finalizing_at": None,
                 "completed_at": None, "failed_at": None, "expired_at": None,
                 "cancelling_at": None, "cancelled_at": None,
                 "request_counts": {"total": 0, "completed": 0, "failed": 0},
                 "metadata": doc.get("metadata")}
        self.batches[batch["id"]] = batch
        if self.lost_creates > 0:   # made, its answer lost (a gateway's 503)
            self.lost_creates -= 1
            return _json(503, {"error": {"message": "mock: the answer was lost",
                                         "type": "server_error", "param": None, "code": None}})
        return _json(200, batch)

    # -- the status machine ---------------------------------------------------

    def _validate(self, batch: Dict[str, Any]) -> List[Tuple[str, Dict[str, Any]]]:
        """The input file's (custom_id, body) lines, or BadInput naming the
        first bad line (1-based)."""
        data = self.content.get(batch["input_file_id"])
        if data is None:
            raise BadInput([{"code": "missing_file", "line": None,
                             "message": "the input file was deleted"}])
        out: List[Tuple[str, Dict[str, Any]]] = []
        seen = set()
        models = set()
        for n, raw in enumerate(data.splitlines(), 1):
            if not raw.strip():
                continue
            def bad(code: str, message: str, n: int = n) -> BadInput:
                return BadInput([{"code": code, "line": n, "param": None,
                                  "message": f"line {n}: {message}"}])
            try:
                line = json.loads(raw)
            except ValueError:
                raise bad("invalid_json_line", "not JSON") from None
            if not isinstance(line, dict) or not isinstance(line.get("body"), dict):
                raise bad("invalid_request", "a line is an object with a body object")
            cid = line.get("custom_id")
            if not isinstance(cid, str) or not cid:
                raise bad("missing_custom_id", "custom_id must be a non-empty string")
            if cid in seen:
                raise bad("duplicate_custom_id", f"duplicate custom_id {cid!r}")
            seen.add(cid)
            if line.get("method") != "POST":
                raise bad("invalid_method", "method must be POST")
            if line.get("url") != batch["endpoint"]:
                raise bad("mismatched_url", f"url {line.get('url')!r} is not the "
                                            f"batch's endpoint {batch['endpoint']}")
            models.add(line["body"].get("model"))
            if len(models) > 1:
                raise bad("mismatched_model", "a batch file must use one model")
            out.append((cid, line["body"]))
        if not out:
            raise BadInput([{"code": "empty_file", "line": None,
                             "message": "the input file has no lines"}])
        return out

    def _advance(self, batch: Dict[str, Any], doc: Dict[str, Any]) -> None:
        now = int(time.time())
        status = batch["status"]
        to = doc.get("to")
        if to is None:
            to = _NEXT[status]
        if status == "validating" and to != "cancelled":
            try:
                self.lines[batch["id"]] = self._validate(batch)
            except BadInput as exc:
                batch.update(status="failed", failed_at=now,
                             errors={"object": "list", "data": exc.errors})
                return
            batch["request_counts"]["total"] = len(self.lines[batch["id"]])
            batch["in_progress_at"] = now
        if to in ("in_progress", "finalizing", "cancelling"):
            batch["status"] = to
            batch[f"{to}_at"] = now
        elif to == "completed":
            self._finish(batch, len(self.lines[batch["id"]]), "completed")
        elif to == "expired":
            self._finish(batch, int(doc.get("completed", 0)), "expired")
        elif to == "cancelled":
            # Work done before the cancel is kept, as the API does; the mock's is none.
            self._finish(batch, int(doc.get("completed", 0)), "cancelled")
        elif to == "failed":
            batch.update(status="failed", failed_at=now, errors={"object": "list", "data": [
                {"code": "mock_failed", "line": None, "message": "failed by the test"}]})

    def _finish(self, batch: Dict[str, Any], done: int, status: str) -> None:
        """Write the output and error files: the first ``done`` lines ran,
        the rest are the status's per-line errors."""
        lines = self.lines.get(batch["id"], [])
        out: List[bytes] = []
        err: List[bytes] = []
        failed = 0
        for n, (cid, body) in enumerate(lines):
            rid = f"req_mock_{batch['id']}_{n}"
            if n < done:
                code = body.get("mock_status")
                if isinstance(code, int) and not 200 <= code < 300:
                    failed += 1
                    err.append(json.dumps({"id": f"batch_req_{n}", "custom_id": cid, "response": {
                        "status_code": code, "request_id": rid,
                        "body": {"error": {"message": f"mock error {code}",
                                           "type": "invalid_request_error", "code": None}}},
                        "error": None}).encode())
                    continue
                out.append(json.dumps({"id": f"batch_req_{n}", "custom_id": cid, "response": {
                    "status_code": 200, "request_id": rid,
                    "body": _answer(batch["endpoint"], body, n)}, "error": None}).encode())
            else:
                code = "batch_expired" if status == "expired" else "batch_cancelled"
                err.append(json.dumps({"id": f"batch_req_{n}", "custom_id": cid,
                                       "response": None, "error": {
                                           "code": code,
                                           "message": f"This request was not run: the batch "
                                                      f"was {status}."}}).encode())
        if out:
            batch["output_file_id"] = self._new_file(f"{batch['id']}_output.jsonl",
                                                     "batch_output", b"\n".join(out) + b"\n")["id"]
        if err:
            batch["error_file_id"] = self._new_file(f"{batch['id']}_error.jsonl",
                                                    "batch_output", b"\n".join(err) + b"\n")["id"]
        batch["request_counts"] = {"total": len(lines), "completed": len(out),
                                   "failed": failed}
        batch["status"] = status
        batch[f"{status}_at"] = int(time.time())

    def advance(self, batch_id: str, **doc: Any) -> Dict[str, Any]:
        """What ``POST /_mock/batches/<id>/advance`` does, for Python tests."""
        status, _, body = self.handle("POST", f"/_mock/batches/{batch_id}/advance", "",
                                      json.dumps(doc).encode())
        if status != 200:
            raise ValueError(json.loads(body)["error"]["message"])
        out: Dict[str, Any] = json.loads(body)
        return out

    def _control(self, method: str, ident: Optional[str], body: bytes) -> Reply:
        try:
            doc = json.loads(body or b"{}")
        except ValueError:
            return _error(400, "the body is not JSON")
        if not isinstance(doc, dict):
            return _error(400, "the body is not a JSON object")
        if ident is None:
            if method != "PUT":
                return _error(405, f"method {method} not allowed (allowed: PUT)")
            auto, fail = doc.get("auto"), doc.get("fail", 0)
            lag, lost = doc.get("create_delay_ms", 0), doc.get("lost_creates", 0)
            if auto not in (None, True) and not (isinstance(auto, dict) and self._good(auto)):
                return _error(400, "auto: null, true or an advance ({\"to\": ...})")
            for name, n in (("fail", fail), ("create_delay_ms", lag), ("lost_creates", lost)):
                if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                    return _error(400, f"{name}: an integer >= 0")
            self.auto, self.fail = auto, fail
            self.create_delay_ms, self.lost_creates = lag, lost
            return 204, "", b""
        if method != "POST":
            return _error(405, f"method {method} not allowed (allowed: POST)")
        batch = self.batches.get(ident)
        if batch is None:
            return _error(404, f"No such Batch object: {ident}")
        if not self._good(doc):
            return _error(400, "advance: {} or {\"to\": completed|failed|cancelled|expired, "
                               "\"completed\": K}")
        if batch["status"] in TERMINAL:
            return _error(409, f"batch {ident} is already {batch['status']}")
        self._advance(batch, doc)
        return _json(200, batch)

    @staticmethod
    def _good(doc: Dict[str, Any]) -> bool:
        if set(doc) - {"to", "completed"}:
            return False
        k = doc.get("completed", 0)
        return (doc.get("to") in (None, "completed", "failed", "cancelled", "expired")
                and isinstance(k, int) and not isinstance(k, bool) and k >= 0)
