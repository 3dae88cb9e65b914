"""The Batch API's files, line by line: the input (its lines, custom ids and
parts) and what the output and error files' lines become (a Result or an
error per item). batch_api.py runs the jobs."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from .errors import _ERROR_BY_KIND, LLMError

#: The endpoints the Batch API serves (a batch's ``endpoint``).
ENDPOINTS = ("/v1/chat/completions", "/v1/embeddings", "/v1/responses", "/v1/completions")
_SHORT = {"chat": "/v1/chat/completions", "embeddings": "/v1/embeddings",
          "responses": "/v1/responses", "completions": "/v1/completions"}


# ---------------------------------------------------------------------------
# The input: lines, custom ids, parts


def _endpoint_of(endpoint: Optional[str]) -> str:
    ep = _SHORT.get(endpoint or "chat", endpoint or "")
    if ep not in ENDPOINTS:
        raise ValueError(f"endpoint {endpoint!r}: the Batch API serves only "
                         f"{', '.join(ENDPOINTS)} (or chat, embeddings, responses, "
                         f"completions)")
    return ep


def _lines_of(bodies: Sequence[Any], endpoint: Optional[str]
              ) -> Tuple[str, List[bytes], List[str], List[str]]:
    """The endpoint, each item's batch line (bytes, no newline), custom id and
    model; ValueError/TypeError naming the first bad item, before any upload.

    An item is a request body, or a batch line ``{"custom_id", "body",
    "url"?, "method"?}`` whose custom id is kept (they must be unique)."""
    ep: Optional[str] = _endpoint_of(endpoint) if endpoint is not None else None
    lines: List[Dict[str, Any]] = []
    cids: List[str] = []
    models: List[str] = []
    seen: Dict[str, int] = {}
    for i, item in enumerate(bodies):
        where = f"bodies[{i}]"
        if not isinstance(item, dict):
            raise TypeError(f"{where}: a body is a dict, not {type(item).__name__}")
        if "custom_id" in item and "body" in item:
            cid, body, url = item["custom_id"], item["body"], item.get("url")
            if not isinstance(cid, str) or not cid:
                raise ValueError(f"{where}: custom_id must be a non-empty string")
            if item.get("method", "POST") != "POST":
                raise ValueError(f"{where}: the Batch API sends POST requests only")
            if url is not None:
                if url not in ENDPOINTS:
                    raise ValueError(f"{where}: url {url!r}: the Batch API serves only "
                                     f"{', '.join(ENDPOINTS)}")
                if ep is not None and url != ep:
                    raise ValueError(f"{where}: url {url!r} differs from the batch's "
                                     f"endpoint {ep}")
                ep = url
        else:
            cid, body = str(i), item
        if not isinstance(body, dict):
            raise TypeError(f"{where}: a body is a dict, not {type(body).__name__}")
        if cid in seen:
            raise ValueError(f"{where}: custom_id {cid!r} is also bodies[{seen[cid]}]'s "
                             f"(custom ids must be unique)")
        seen[cid] = i
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise ValueError(f"{where}: the Batch API needs each body's model")
        if body.get("stream"):
            raise ValueError(f"{where}: the Batch API does not stream (drop \"stream\")")
        cids.append(cid)
        models.append(model)
        lines.append(body)      # encoded below, once the endpoint is known
    ep = ep or "/v1/chat/completions"
    try:
        encoded = [json.dumps({"custom_id": c, "method": "POST", "url": ep, "body": b},
                              ensure_ascii=False, separators=(",", ":")).encode("utf-8")
                   for c, b in zip(cids, lines)]
    except (TypeError, ValueError) as exc:
        raise TypeError(f"a body cannot be sent as JSON: {exc}") from None
    return ep, encoded, cids, models


def _parts(lines: Sequence[bytes], models: Sequence[str], max_lines: int,
           max_bytes: int, indices: Optional[Iterable[int]] = None
           ) -> List[Tuple[str, List[int]]]:
    """The batches to make of these items (default all): (model, indices),
    one model each (in order of first appearance), each within max_lines
    lines and max_bytes bytes."""
    groups: Dict[str, List[int]] = {}
    for i in (range(len(models)) if indices is None else indices):
        groups.setdefault(models[i], []).append(i)
    parts: List[Tuple[str, List[int]]] = []
    for model, indices in groups.items():
        cur: List[int] = []
        size = 0
        for i in indices:
            n = len(lines[i]) + 1
            if n > max_bytes:
                raise ValueError(f"bodies[{i}]: its batch line is {n} bytes, over the "
                                 f"limit of {max_bytes} bytes for one input file")
            if cur and (len(cur) >= max_lines or size + n > max_bytes):
                parts.append((model, cur))
                cur, size = [], 0
            cur.append(i)
            size += n
        if cur:
            parts.append((model, cur))
    return parts


def _ranges(indices: Sequence[int]) -> List[List[int]]:
    """Sorted indices as [first, last] ranges (the record's form)."""
    out: List[List[int]] = []
    for i in indices:
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


def _indices(ranges: Iterable[Sequence[int]]) -> List[int]:
    return [i for a, b in ranges for i in range(a, b + 1)]


def _fingerprint(cids: Sequence[str], lines: Sequence[bytes]) -> str:
    h = hashlib.sha256()
    for line in lines:
        h.update(hashlib.sha256(line).digest())
    return h.hexdigest()


# ---------------------------------------------------------------------------
# Output and error lines


def _error_of(record: Mapping[str, Any]) -> LLMError:
    """A failures-file record's error again (a resumed run's earlier failure)."""
    err = record.get("error") or {}
    cls = _ERROR_BY_KIND.get(str(err.get("kind")), LLMError)
    return cls(str(err.get("message") or "failed in an earlier run"), kind=err.get("kind"),
               status=err.get("status"), request_id=err.get("request_id"),
               attempts=err.get("attempts") or 0)
