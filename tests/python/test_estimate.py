"""The token estimate is the core's rule everywhere: the shared vector
tests/vectors/rules/token_estimates.json (also run by tests/c/test_estimate.c)
through the binding, with the core's own count and with a host tokenizer
standing in for tiktoken (a token a word) the way _tokens hands it over."""

from __future__ import annotations

import json
import sys
import types
from typing import Any, Dict, List

import pytest

from llmretry import _llmretry, _tokens
from llmretry._tokens import estimate_url

from conftest import VECTOR_DIR

CASES: List[Dict[str, Any]] = json.loads(
    (VECTOR_DIR / "rules" / "token_estimates.json").read_text())["cases"]


def _payload(case: Dict[str, Any]) -> bytes:
    if "body_text" in case:
        return case["body_text"].encode()
    return json.dumps(case["body"], ensure_ascii=False, separators=(",", ":")).encode()


@pytest.fixture
def word_tokenizer(monkeypatch: Any) -> None:
    """tiktoken replaced by an encoding of one token a word."""
    fake = types.ModuleType("tiktoken")
    fake.get_encoding = lambda name: types.SimpleNamespace(  # type: ignore[attr-defined]
        encode=lambda text: text.split(" "))
    monkeypatch.setitem(sys.modules, "tiktoken", fake)
    monkeypatch.setattr(_tokens, "_tried", False)
    monkeypatch.setattr(_tokens, "_count", None)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_cores_own_estimate(case: Dict[str, Any]) -> None:
    assert _llmretry.estimate_tokens(case["url"], _payload(case), None) == case["chars"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_a_tokenizer_counts_the_cores_texts(case: Dict[str, Any], word_tokenizer: None) -> None:
    assert _tokens.estimate_tokens(case["url"], _payload(case)) == case["words"]


def test_a_failing_tokenizer_leaves_the_estimate_to_the_core() -> None:
    def fails(text: str) -> int:
        raise RuntimeError("no encoding")
    assert _llmretry.estimate_tokens(None, b'{"prompt": "a"}', fails) is None
    assert _llmretry.estimate_tokens(None, b'{"prompt": "a"}', lambda t: -3) is None


def test_the_url_of_an_endpoint_call() -> None:
    """endpoint="embeddings" is charged as the core charges its url."""
    assert estimate_url({"endpoint": "embeddings"}) == "/embeddings"
    assert estimate_url({"url": "http://h/v1/embeddings", "endpoint": "chat"}) == \
        "http://h/v1/embeddings"
    assert estimate_url({}) is None
