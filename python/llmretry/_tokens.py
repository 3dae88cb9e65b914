"""Token estimates for the engine's tpm budget, with tiktoken when the host
has it (and its encoding files: they are downloaded on first use, so an
offline machine falls back too). The rule (which texts are the prompt, the
completion's bound) is the core's (llmretry_estimate_tokens); tiktoken only
counts each text. Without it the core estimates (prompt characters / 4);
the response's usage corrects the charge only for the core's own estimate."""

from __future__ import annotations

import importlib
import threading
from typing import Callable, List, Optional

from . import _llmretry

__all__ = ["estimate_tokens"]

_lock = threading.Lock()
_count: Optional[Callable[[str], int]] = None
_tried = False


def _counter() -> Optional[Callable[[str], int]]:
    global _count, _tried
    if _tried:
        return _count
    with _lock:
        if not _tried:
            try:
                # Imported by name: an optional dependency, unknown to the
                # type checker where it is not installed.
                tiktoken = importlib.import_module("tiktoken")
                encode: Callable[[str], List[int]] = tiktoken.get_encoding("o200k_base").encode
                _count = lambda text: len(encode(text))  # noqa: E731
            except Exception:       # not installed, no encoding files, offline
                _count = None
            _tried = True
    return _count


def estimate_tokens(url: Optional[str], payload: bytes) -> int:
    """Tokens the encoded body is charged against tpm (prompt + completion
    bound, the core's rule) counted with tiktoken; 0 (the core estimates)
    when tiktoken cannot count."""
    count = _counter()
    if count is None:
        return 0
    return _llmretry.estimate_tokens(url, payload, count) or 0

