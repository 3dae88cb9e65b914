"""The Files and Batch APIs' HTTP calls, each under llmretry's retry policy
and a deadline (llmretry.batch_api).

The engine sends one kind of request: a POST of a JSON body, whose answer
is JSON. So the two calls of that kind (create a batch, cancel one) are
made by the engine (``Client.call_llm`` with ``url=``), with everything a
call gets there: retries, Retry-After, the endpoint's rate budget and
breaker, events. The others are not that kind: an upload is a multipart
body, retrieving a batch and downloading a file are GETs (a file's content
is JSON Lines, not JSON), deleting a file is a DELETE. Those go through
:meth:`Api.request` here, on the standard library's HTTP client, under the
same policy the engine applies (docs/reliability.md): the same options
(``timeout_ms`` per attempt, ``max_retries``, ``base_delay_ms``,
``max_delay_ms``, ``jitter``, ``max_retry_after_ms``, ``call_deadline_ms``
for each call), the same retryable statuses (408, 429, 500-599 but 501 and
505) and network failures, the server's Retry-After read by the core's
parser, the request id sent as ``X-Client-Request-Id``, and the same typed
errors (:mod:`llmretry.errors`) carrying it. The key is sent as
``Authorization: Bearer`` and is never in an error.
"""

from __future__ import annotations

import json
import os
import random
import socket
import time
import urllib.error
import urllib.request
import uuid
from typing import Any, Dict, Mapping, Optional, Tuple

from . import _llmretry
from .errors import (DeadlineExceededError, HTTPStatusError, InvalidResponseError, LLMError,
                     NetworkError, RequestTimeoutError)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_RETRYABLE = frozenset([408, 429] + [s for s in range(500, 600) if s not in (501, 505)])

# The policy options this layer applies, with the engine's built-in values.
POLICY_DEFAULTS: Dict[str, Any] = {
    "timeout_ms": 60000, "max_retries": 3, "base_delay_ms": 800, "max_delay_ms": 30000,
    "jitter": "additive", "max_retry_after_ms": 120000, "call_deadline_ms": 600000,
}


def _preview(body: bytes) -> str:
    return body[:500].decode("utf-8", "replace")


def _error_code(body: bytes) -> Optional[str]:
    try:
        err = json.loads(body).get("error") or {}
        code = err.get("code") or err.get("type")
        return code if isinstance(code, str) and len(code) <= 64 else None
    except (ValueError, AttributeError):
        return None


def _message(body: bytes) -> str:
    try:
        msg = json.loads(body)["error"]["message"]
        return msg if isinstance(msg, str) else ""
    except (ValueError, KeyError, TypeError):
        return ""


class Api:
    """One endpoint's Files and Batch APIs (base URL + key) under a policy."""

    def __init__(self, client: Any, base_url: Optional[str], api_key: Optional[str],
                 headers: Optional[Mapping[str, str]], policy: Mapping[str, Any],
                 logger: Any) -> None:
        self.client = client
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL")
                         or DEFAULT_BASE_URL).rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.headers = dict(headers or {})
        self.policy = dict(POLICY_DEFAULTS)
        self.policy.update({k: v for k, v in policy.items() if v is not None})
        self.logger = logger
        self.rng = random.Random()

    def __repr__(self) -> str:        # never the key
        return f"Api(base_url={self.base_url!r})"

    # -- JSON POSTs: the engine's -----------------------------------------------

    def post_json(self, path: str, doc: Dict[str, Any],
                  idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """POST a JSON body as an engine call; its parsed answer."""
        p = self.policy
        opts: Dict[str, Any] = {
            "url": self.base_url + path, "api_key": self.api_key, "logger": self.logger,
            "timeout_ms": p["timeout_ms"], "max_retries": p["max_retries"],
            "base_delay_ms": p["base_delay_ms"], "max_delay_ms": p["max_delay_ms"],
            "jitter": p["jitter"], "max_retry_after_ms": p["max_retry_after_ms"],
            "deadline_ms": p["call_deadline_ms"],
        }
        if self.headers:
            opts["headers"] = self.headers
        if idempotency_key is not None:
            opts["idempotency_key"] = idempotency_key
        data = self.client.call_llm(doc, **opts).data
        if not isinstance(data, dict):
            raise InvalidResponseError(f"POST {path}: the answer is not a JSON object",
                                       reason="not_retryable")
        return data

    # -- the rest: here, under the same policy -----------------------------------

    def _delay_ms(self, retry: int) -> int:
        p = self.policy
        cap = min(p["max_delay_ms"], p["base_delay_ms"] * (2 ** min(retry, 30)))
        if p["jitter"] == "full":
            return int(self.rng.uniform(0, cap))
        if p["jitter"] == "additive":
            return int(cap + self.rng.uniform(0, p["base_delay_ms"]))
        return int(cap)

    def request(self, method: str, path: str, body: Optional[bytes] = None,
                content_type: Optional[str] = None) -> bytes:
        """One call: its 2xx body, or the typed error the policy ended on."""
        p = self.policy
        request_id = str(uuid.uuid4())
        url = self.base_url + path
        start = time.monotonic()
        deadline = start + p["call_deadline_ms"] / 1000.0
        what = f"{method} {path}"
        attempt = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeadlineExceededError(f"{what}: the call's deadline passed",
                                            attempt=max(attempt - 1, 0), attempts=attempt,
                                            request_id=request_id, reason="deadline",
                                            total_ms=int((time.monotonic() - start) * 1000))
            headers = dict(self.headers)
            headers["X-Client-Request-Id"] = request_id
            if self.api_key:
                headers["Authorization"] = f"Bearer {self.api_key}"
            if content_type:
                headers["Content-Type"] = content_type
            req = urllib.request.Request(url, data=body, method=method, headers=headers)
            t0 = time.monotonic()
            status: Optional[int] = None
            wait_ms: Optional[int] = None
            fields: Dict[str, Any] = {}
            try:
                with urllib.request.urlopen(req, timeout=min(p["timeout_ms"] / 1000.0,
                                                             left)) as resp:
                    data: bytes = resp.read()
                    return data
            except urllib.error.HTTPError as exc:
                status = exc.code
                raw = exc.read() or b""
                fields = {"status": status, "body_preview": _preview(raw),
                          "error_code": _error_code(raw)}
                ra = exc.headers.get("retry-after-ms") or exc.headers.get("Retry-After")
                if ra:
                    got = _llmretry.parse_retry_after(
                        ra if exc.headers.get("retry-after-ms") is None else
                        str(float(ra) / 1000.0), int(time.time() * 1000))
                    if got > 0:
                        wait_ms = got
                        fields["retry_after_ms"] = got
                err_cls: type = HTTPStatusError
                msg = f"{what}: HTTP {status}" + (f": {_message(raw)}" if _message(raw) else "")
                retryable = status in _RETRYABLE
            except (socket.timeout, TimeoutError) as exc:
                err_cls, msg, retryable = RequestTimeoutError, f"{what}: timed out ({exc})", True
            except (urllib.error.URLError, OSError, ValueError) as exc:
                reason = getattr(exc, "reason", exc)
                if isinstance(reason, (socket.timeout, TimeoutError)):
                    err_cls, msg = RequestTimeoutError, f"{what}: timed out"
                else:
                    err_cls, msg = NetworkError, f"{what}: {reason}"
                retryable = True
            attempt += 1
            duration = int((time.monotonic() - t0) * 1000)
            total = int((time.monotonic() - start) * 1000)

            def give_up(reason: str) -> LLMError:
                err: LLMError = err_cls(msg, attempt=attempt - 1, attempts=attempt,
                               request_id=request_id, reason=reason, duration_ms=duration,
                               total_ms=total, **fields)
                return err
            if not retryable:
                raise give_up("not_retryable")
            if attempt > p["max_retries"]:
                raise give_up("retries_exhausted")
            if wait_ms is not None and wait_ms > p["max_retry_after_ms"]:
                raise give_up("retry_after_too_long")
            delay = wait_ms if wait_ms is not None else self._delay_ms(attempt - 1)
            if time.monotonic() + delay / 1000.0 >= deadline:
                raise give_up("deadline")
            time.sleep(delay / 1000.0)

    def get_json(self, path: str) -> Dict[str, Any]:
        raw = self.request("GET", path)
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise InvalidResponseError(f"GET {path}: the answer is not a JSON object",
                                       reason="not_retryable", body_preview=_preview(raw))
        return doc

    def upload(self, name: str, data: bytes) -> Dict[str, Any]:
        """POST /files, purpose batch: the File object."""
        body, ctype = multipart({"purpose": (None, b"batch")},
                                ("file", name, data, "application/jsonl"))
        raw = self.request("POST", "/files", body, ctype)
        doc = json.loads(raw)
        if not isinstance(doc, dict) or not isinstance(doc.get("id"), str):
            raise InvalidResponseError("POST /files: the answer names no file id",
                                       reason="not_retryable", body_preview=_preview(raw))
        return doc

    def delete_file(self, file_id: str) -> None:
        try:
            self.request("DELETE", f"/files/{file_id}")
        except HTTPStatusError as exc:
            if exc.status != 404:       # already gone is what was asked
                raise


def multipart(fields: Mapping[str, Tuple[Optional[str], bytes]],
              file: Tuple[str, str, bytes, str]) -> Tuple[bytes, str]:
    """A multipart/form-data body (its fields, then one file part) and its
    Content-Type."""
    boundary = "llmretry-" + uuid.uuid4().hex
    out = []
    for name, (_, value) in fields.items():
        out.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
                   .encode() + value + b"\r\n")
    fname, filename, data, ctype = file
    out.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{fname}"; '
               f'filename="{filename}"\r\nContent-Type: {ctype}\r\n\r\n'.encode())
    out.append(data)
    out.append(f"\r\n--{boundary}--\r\n".encode())
    return b"".join(out), f"multipart/form-data; boundary={boundary}"
