"""What a Batch API server says, checked before llmretry.batch_api uses it:
the ids it names (they become request paths), its Batch objects, and the
lines of its output and error files.

A provider's answers are data from the network like any other: a broken or
hostile server may send a status that is not a string, counts that are not
numbers, an id holding ``../`` or a query, result lines that are not JSON.
None of it may escape as a foreign exception or end a job: an answer that
cannot be used is an :class:`~llmretry.InvalidResponseError` naming what
was wrong, and a result line that cannot be read leaves its item failed as
not answered (to be resumed or re-run), never lost.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional, Tuple

from . import _llmretry
from ._results import _result_of
from .errors import InvalidResponseError, LLMError

#: A batch's statuses once it has ended: nothing more will run.
TERMINAL = ("completed", "failed", "expired", "cancelled")

# The ids the API hands out ("batch_abc123", "file-abc123"): letters,
# digits and a few separators; never a path, a query or a space.
_PLAIN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}")


def plain_id(value: Any, what: str) -> str:
    """``value`` if it is an id that can go into a request path, else an
    InvalidResponseError naming ``what``."""
    if isinstance(value, str) and _PLAIN_ID.fullmatch(value) and ".." not in value:
        return value
    shown = f"{type(value).__name__} of {len(value)} characters" if isinstance(value, str) \
        else type(value).__name__
    raise InvalidResponseError(f"{what} is not a plain id (a {shown}): not followed",
                               reason="not_retryable")


def _count(value: Any) -> int:
    return value if type(value) is int and value >= 0 else 0


def checked_batch(doc: Dict[str, Any], batch_id: str) -> Dict[str, Any]:
    """A Batch object as the server sent it, with the fields batch_api reads
    made safe: ``status`` a string (else InvalidResponseError: whether the
    batch has ended cannot be told), ``request_counts`` whole numbers (0
    for what is not one), ``output_file_id``/``error_file_id`` plain ids or
    None."""
    status = doc.get("status")
    if not isinstance(status, str):
        raise InvalidResponseError(f"GET /batches/{batch_id}: the batch's status is not a "
                                   f"string ({type(status).__name__})", reason="not_retryable")
    out = dict(doc)
    rc = doc.get("request_counts")
    rc = rc if isinstance(rc, dict) else {}
    out["request_counts"] = {k: _count(rc.get(k)) for k in ("total", "completed", "failed")}
    for key in ("output_file_id", "error_file_id"):
        fid = doc.get(key)
        out[key] = plain_id(fid, f"batch {batch_id}'s {key}") if fid else None
    return out


def parse_lines(raw: str) -> Tuple[List[Dict[str, Any]], int]:
    """A result file's JSON Lines: the lines that are JSON objects, and how
    many others there were (not JSON, cut short, nested past the parser's
    limit, or not an object)."""
    out: List[Dict[str, Any]] = []
    bad = 0
    for text in raw.splitlines():
        if not text.strip():
            continue
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):
            bad += 1
            continue
        if isinstance(doc, dict):
            out.append(doc)
        else:
            bad += 1
    return out, bad


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and value else None


# What an error shows of a provider's free text (docs/security.md, "What an
# error shows of the server's text"): 300 characters, screened by the core.
WITHHELD = "(the server's message is withheld because it echoes the request)"
_SHOWN_CHARS = 300
_CHECKED_BYTES = 512            # what llmretry_text_quotes looks at
_CODE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


class LineJudge:
    """One batch's result lines judged by the core as it judges an
    attempt's answer (``_llmretry.judge_answer``): a 200 whose body is an
    error or holds no answer is a failure, an error's message that quotes
    the item's prompt or a credential is withheld, usage and models are
    read. The request each line answers (the item's body, the key and
    headers that would have gone with it) is what the screen compares
    against; the batch's own texts (a line's or the batch's error) pass the
    same screen (``shown``)."""

    def __init__(self, url: str, api_key: Optional[str], headers: Dict[str, str],
                 lines: List[bytes], indices: List[int]) -> None:
        self._options: Dict[str, Any] = {"url": url}
        if api_key:
            self._options["api_key"] = api_key
        if headers:
            self._options["headers"] = headers
        # Every header's value counts as a secret here: withholding a
        # message that quotes a non-secret header costs nothing.
        self._secrets = [v for v in [api_key, *headers.values()] if isinstance(v, str) and v]
        self._lines = lines
        self._indices = indices
        self._shown: Dict[Tuple[str, Optional[int]], str] = {}

    def _request(self, i: int) -> bytes:
        return json.dumps(json.loads(self._lines[i]).get("body")).encode("utf-8")

    def __call__(self, i: int, code: int, body: Any, rid: Optional[str]) -> Tuple[Any, bool]:
        request = self._request(i)
        answer = json.dumps(body).encode("utf-8")
        options = dict(self._options)
        if rid is not None:
            options["request_id"] = rid
        try:
            out = _llmretry.judge_answer(code, answer, request, **options)
        except ValueError:
            # A request id the core would not send (control bytes, too
            # long): the answer is judged under one of its own.
            options.pop("request_id", None)
            out = _llmretry.judge_answer(code, answer, request, **options)
        try:
            return _result_of(out, None), False
        except LLMError as exc:
            return exc, True

    def shown(self, text: str, i: Optional[int] = None) -> str:
        """The batch's ``text`` (a line's error, item ``i``'s; None: the
        batch's, which may quote any of its items) as an error may show
        it: cut to 300 characters, or WITHHELD when that quotes a request
        or a credential."""
        key = (text, i)
        if key not in self._shown:
            cut = text[:_SHOWN_CHARS]
            raw = cut.encode("utf-8", "replace")
            while len(raw) > _CHECKED_BYTES:        # show only what was checked
                cut = cut[:len(cut) * _CHECKED_BYTES // len(raw)]
                raw = cut.encode("utf-8", "replace")
            items = self._indices if i is None else [i]
            quotes = any(_llmretry.text_quotes(raw, self._request(k), self._secrets)
                         for k in items) or _llmretry.text_quotes(raw, b"", self._secrets)
            self._shown[key] = WITHHELD if quotes else cut + ("..." if cut != text else "")
        return self._shown[key]

    def code(self, value: Any, fallback: str, i: Optional[int] = None) -> str:
        """A code the batch gives (item ``i``'s line's, or the batch's) as
        a kind: a short token that quotes nothing, else ``fallback``."""
        if isinstance(value, str) and _CODE.fullmatch(value) and self.shown(value, i) == value:
            return value
        return fallback


def line_value(line: Dict[str, Any], model: str, status: str, judge: LineJudge,
               i: int) -> Tuple[Any, bool]:
    """An output or error file line of item ``i`` as (Result or LLMError,
    failed), judged by ``judge`` (its batch's)."""
    resp = line.get("response")
    if isinstance(resp, dict):
        code = resp.get("status_code")
        code = code if type(code) is int else None
        rid = _text(resp.get("request_id"))
        if code is None:
            return InvalidResponseError("the batch's line for it has no HTTP status code",
                                        attempts=1, request_id=rid, reason="not_retryable",
                                        model=model), True
        return judge(i, code, resp.get("body"), rid)
    found = line.get("error")
    err: Dict[str, Any] = found if isinstance(found, dict) else {}
    kind = judge.code(err.get("code"), f"batch_{status}", i)
    message = _text(err.get("message"))
    return LLMError(judge.shown(message, i) if message else f"not run: the batch was {status}",
                    kind=kind, model=model, reason="not_retryable"), True


def not_run(status: str, batch: Dict[str, Any], batch_id: str, model: str,
            judge: LineJudge, unreadable: int = 0) -> LLMError:
    """The error of an item its batch never answered for (``unreadable``:
    lines of its result files that could not be read, one of which may
    have been its); a failed batch's message and code pass ``judge``'s
    screen (its batch's)."""
    if status == "failed":
        from .batch_api import BatchAPIError     # batch_api imports this module
        errs = batch.get("errors")
        data = errs.get("data") if isinstance(errs, dict) else None
        first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
        said, code = _text(first.get("message")), first.get("code")
        msg = judge.shown(said) if said else "the batch failed"
        line = first.get("line")
        where = f" (line {line} of its input file)" if type(line) is int else ""
        return BatchAPIError(f"batch {batch_id} failed validation{where}: {msg}",
                             error_code=judge.code(code, "invalid_code")
                             if isinstance(code, str) and code else None, model=model,
                             reason="not_retryable")
    why = f"batch {batch_id} was {status} with no line for it"
    if unreadable:
        why += f" ({unreadable} lines of its result files could not be read)"
    return LLMError(f"not run: {why}", kind=f"batch_{status}", model=model,
                    reason="not_retryable")
