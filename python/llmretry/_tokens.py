"""Token estimates for the engine's tpm budget, with tiktoken when the host
has it (and its encoding files: they are downloaded on first use, so an
offline machine falls back too). Without it the core estimates (prompt
characters / 4); either way the response's usage corrects the charge
only for the core's own estimate."""

from __future__ import annotations

import importlib
import threading
from typing import Any, Callable, List, Optional

__all__ = ["estimate_tokens"]

_COMPLETION_DEFAULT = 256          # the core's, when the body bounds nothing
_lock = threading.Lock()
_encode: Optional[Callable[[str], List[int]]] = None
_tried = False


def _encoder() -> Optional[Callable[[str], List[int]]]:
    global _encode, _tried
    if _tried:
        return _encode
    with _lock:
        if not _tried:
            try:
                # Imported by name: an optional dependency, unknown to the
                # type checker where it is not installed.
                tiktoken = importlib.import_module("tiktoken")
                _encode = tiktoken.get_encoding("o200k_base").encode
            except Exception:       # not installed, no encoding files, offline
                _encode = None
            _tried = True
    return _encode


def _texts(value: Any, out: List[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, list):
        for item in value:
            _texts(item, out)
    elif isinstance(value, dict):
        for key in ("content", "text"):
            if key in value:
                _texts(value[key], out)


def estimate_tokens(body: Any) -> int:
    """Tokens a dict body is charged against tpm (prompt + completion bound)
    with tiktoken; 0 (the core estimates) when tiktoken cannot count."""
    encode = _encoder()
    if encode is None or not isinstance(body, dict):
        return 0
    texts: List[str] = []
    for key in ("messages", "input", "prompt"):
        _texts(body.get(key), texts)
    try:
        prompt = sum(len(encode(t)) for t in texts)
    except Exception:               # a tokenizer that fails on some text
        return 0
    for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        limit = body.get(key)
        if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0:
            return prompt + limit
    return prompt + _COMPLETION_DEFAULT
