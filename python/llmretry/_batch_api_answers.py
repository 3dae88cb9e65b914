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

from ._client import Meta, Result
from .errors import HTTPStatusError, InvalidResponseError, LLMError

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


def usage_of(doc: Any) -> Optional[Dict[str, int]]:
    """An answer's usage (Chat Completions' or Responses' names) as whole
    numbers; None when it has none that is one."""
    u = doc.get("usage") if isinstance(doc, dict) else None
    if not isinstance(u, dict):
        return None
    prompt = u.get("prompt_tokens", u.get("input_tokens"))
    completion = u.get("completion_tokens", u.get("output_tokens"))
    total = u.get("total_tokens")
    if not any(type(v) is int and v >= 0 for v in (prompt, completion, total)):
        return None
    p, c = _count(prompt), _count(completion)
    return {"prompt_tokens": p, "completion_tokens": c,
            "total_tokens": total if type(total) is int and total >= 0 else p + c}


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and value else None


def line_value(line: Dict[str, Any], model: str, status: str) -> Tuple[Any, bool]:
    """An output or error file line as (Result or LLMError, failed)."""
    resp = line.get("response")
    if isinstance(resp, dict):
        code = resp.get("status_code")
        code = code if type(code) is int else None
        body = resp.get("body")
        rid = _text(resp.get("request_id"))
        if code is None:
            return InvalidResponseError("the batch's line for it has no HTTP status code",
                                        attempts=1, request_id=rid, reason="not_retryable",
                                        model=model), True
        if 200 <= code < 300:
            if not isinstance(body, dict):
                # A success carries what was asked for.
                return InvalidResponseError(
                    f"HTTP {code} in the batch with no answer object (a "
                    f"{type(body).__name__})", status=code, attempts=1, request_id=rid,
                    reason="not_retryable", model=model), True
            usage = usage_of(body)
            meta = Meta(0, 1, 0, 0, code, usage, rid or "", model, _text(body.get("model")),
                        _text(body.get("system_fingerprint")), usage_total=usage)
            return Result(body, meta), False
        detail = body.get("error") if isinstance(body, dict) else None
        message = _text(detail.get("message")) if isinstance(detail, dict) else None
        ecode = _text(detail.get("code")) if isinstance(detail, dict) else None
        return HTTPStatusError(f"HTTP {code} in the batch" + (f": {message}" if message else ""),
                               status=code, attempts=1, request_id=rid,
                               reason="not_retryable", model=model, error_code=ecode), True
    found = line.get("error")
    err: Dict[str, Any] = found if isinstance(found, dict) else {}
    kind = _text(err.get("code")) or f"batch_{status}"
    return LLMError(_text(err.get("message")) or f"not run: the batch was {status}",
                    kind=kind, model=model, reason="not_retryable"), True


def not_run(status: str, batch: Dict[str, Any], batch_id: str, model: str,
            unreadable: int = 0) -> LLMError:
    """The error of an item its batch never answered for (``unreadable``:
    lines of its result files that could not be read, one of which may
    have been its)."""
    if status == "failed":
        from .batch_api import BatchAPIError     # batch_api imports this module
        errs = batch.get("errors")
        data = errs.get("data") if isinstance(errs, dict) else None
        first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
        msg = _text(first.get("message")) or "the batch failed"
        line = first.get("line")
        where = f" (line {line} of its input file)" if type(line) is int else ""
        return BatchAPIError(f"batch {batch_id} failed validation{where}: {msg}",
                             error_code=_text(first.get("code")), model=model,
                             reason="not_retryable")
    why = f"batch {batch_id} was {status} with no line for it"
    if unreadable:
        why += f" ({unreadable} lines of its result files could not be read)"
    return LLMError(f"not run: {why}", kind=f"batch_{status}", model=model,
                    reason="not_retryable")
