"""The Files and Batch APIs' HTTP calls (llmretry.batch_api), each one an
engine call: the client's retries, Retry-After, the endpoint's rate budget
and breaker, the call's deadline (``call_deadline_ms``), its events and
request id, and the typed errors (:mod:`llmretry.errors`) carrying it.

The engine's ``method``, ``content_type`` and ``raw_response`` options make
the calls that are not JSON POSTs: the upload is a multipart POST, retrieving
a batch or a file is a GET, a file's content is JSON Lines (``raw_response``:
the answer as text), deleting a file is a DELETE. GETs and DELETEs are
idempotent, so retrying them is safe. A retried upload may leave a second
copy of the file on the server when the first attempt's answer was lost (the
engine retries only when the request may not have been taken, or on a
retryable status, as for any POST); the copy is an unused file, never a
second batch: creating a batch sends an Idempotency-Key.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple
from urllib.parse import urlencode

from ._batch_api_answers import plain_id
from ._llmretry import url_join, url_shown
from .errors import HTTPStatusError, InvalidResponseError

DEFAULT_BASE_URL = "https://api.openai.com/v1"

# Each call's deadline unless the caller gives one: a call is one request
# and its retries, not the batch's 24 hours.
CALL_DEADLINE_MS = 600000
# GET /batches: a page's size (the API's largest) and how many pages a search
# reads at most (a key with thousands of batches: the search gives up).
LIST_LIMIT = 100
LIST_PAGES = 20


class Api:
    """One endpoint's Files and Batch APIs (base URL + key) under a policy:
    the retry options given (``None`` or absent: the client's)."""

    def __init__(self, client: Any, base_url: Optional[str], api_key: Optional[str],
                 headers: Optional[Mapping[str, str]], policy: Mapping[str, Any],
                 logger: Any) -> None:
        self.client = client
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL")
                         or DEFAULT_BASE_URL).rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.headers = dict(headers or {})
        self.logger = logger
        self.options: Dict[str, Any] = {k: v for k, v in policy.items()
                                        if v is not None and k != "call_deadline_ms"}
        deadline = policy.get("call_deadline_ms")
        self.options["deadline_ms"] = CALL_DEADLINE_MS if deadline is None else deadline
        # False once GET /batches answered 404 or 405: the server lists no batches.
        self.has_list = True

    def __repr__(self) -> str:        # never the key, nor the URL's user info or query
        return f"Api(base_url={url_shown(self.base_url)!r})"

    def url_of(self, path: str) -> str:
        """The URL of ``path`` ("/files") on this API's base URL (before its
        query, as the core joins a base_url and an endpoint)."""
        return url_join(self.base_url, path)

    def _options(self, path: str, **more: Any) -> Dict[str, Any]:
        opts: Dict[str, Any] = dict(self.options, url=self.url_of(path),
                                    api_key=self.api_key, logger=self.logger)
        if self.headers:
            opts["headers"] = self.headers
        opts.update(more)
        return opts

    def post_json(self, path: str, doc: Dict[str, Any],
                  idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """POST a JSON body: its parsed answer."""
        more = {} if idempotency_key is None else {"idempotency_key": idempotency_key}
        data = self.client.call_llm(doc, **self._options(path, **more)).data
        if not isinstance(data, dict):
            raise InvalidResponseError(f"POST {path}: the answer is not a JSON object",
                                       reason="not_retryable")
        return data

    def request(self, method: str, path: str, body: bytes = b"",
                content_type: Optional[str] = None, raw: bool = False,
                url: Optional[str] = None) -> Any:
        """One call of any method: its answer (text with ``raw``, else the
        parsed JSON), or the typed error the policy ended on. ``url``: the
        whole URL when it has a query of the call's own."""
        more: Dict[str, Any] = {"method": method}
        if url is not None:
            more["url"] = url
        if content_type is not None:
            more["content_type"] = content_type
        if raw:
            more["raw_response"] = True
        return self.client.call_llm(body, **self._options(path, **more)).data

    def get_json(self, path: str) -> Dict[str, Any]:
        doc = self.request("GET", path)
        if not isinstance(doc, dict):
            raise InvalidResponseError(f"GET {path}: the answer is not a JSON object",
                                       reason="not_retryable")
        return doc

    def listed_batches(self, max_pages: int = LIST_PAGES) -> Iterator[Any]:
        """The batches of ``GET /batches`` as the server lists them (the
        newest first, at OpenAI), page after page while it says it has more,
        ``max_pages`` at most: the items unchecked (the caller matches them).
        An answer that is no list page is InvalidResponseError; a server with
        no list (404, 405) lists nothing."""
        after: Optional[str] = None
        for _ in range(max_pages):
            url = self.url_of("/batches")
            query = urlencode({"limit": LIST_LIMIT, **({} if after is None else {"after": after})})
            try:
                page = self.request("GET", "/batches", url=url + ("&" if "?" in url else "?")
                                    + query)
            except HTTPStatusError as exc:
                if exc.status in (404, 405):
                    self.has_list = False
                    return
                raise
            data = page.get("data") if isinstance(page, dict) else None
            if not isinstance(data, list):
                raise InvalidResponseError("GET /batches: the answer is not a list of batches",
                                           reason="not_retryable")
            yield from data
            last = data[-1].get("id") if data and isinstance(data[-1], dict) else None
            if page.get("has_more") is not True or not isinstance(last, str) or last == after:
                return
            after = plain_id(last, "GET /batches: the last batch id")

    def get_text(self, path: str) -> str:
        """A file's content as it came (JSON Lines)."""
        text: str = self.request("GET", path, raw=True)
        return text

    def upload(self, name: str, data: bytes) -> Dict[str, Any]:
        """POST /files, purpose batch: the File object."""
        body, ctype = multipart({"purpose": (None, b"batch")},
                                ("file", name, data, "application/jsonl"))
        doc = self.request("POST", "/files", body, ctype)
        if not isinstance(doc, dict):
            raise InvalidResponseError("POST /files: the answer names no file id",
                                       reason="not_retryable")
        plain_id(doc.get("id"), "POST /files: the file id")
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
