"""The core's rules, kept nowhere else: the shared vectors of
tests/vectors/rules/ (also run by tests/c/test_rules.c and
tests/lua/rules_spec.lua). The token estimate through the binding, with the
core's own count and with a host tokenizer standing in for tiktoken (a token
a word) the way _tokens hands it over; the extra headers' rule through the
``headers`` option; the body sent for a dict (stream_bodies) as the mock
server receives it from stream_llm, call_llm and call_many."""

from __future__ import annotations

import json
import sys
import types
from typing import Any, Dict, List

import pytest

import llmretry
from llmretry import _llmretry, _tokens
from llmretry._bodies import _core_url

from conftest import SECRET_KEY, VECTOR_DIR, Scenario

CASES: List[Dict[str, Any]] = json.loads(
    (VECTOR_DIR / "rules" / "token_estimates.json").read_text())["cases"]
HEADERS: List[Dict[str, Any]] = json.loads(
    (VECTOR_DIR / "rules" / "headers.json").read_text())["cases"]
STREAM_BODIES: List[Dict[str, Any]] = [
    c for c in json.loads((VECTOR_DIR / "rules" / "stream_bodies.json").read_text())["cases"]
    if "body" in c]


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
    assert _core_url({"endpoint": "embeddings"}) == "/embeddings"
    assert _core_url({"url": "http://h/v1/embeddings", "endpoint": "chat"}) == \
        "http://h/v1/embeddings"
    assert _core_url({}) is None


@pytest.mark.parametrize("case", HEADERS, ids=[repr(c["name"] + ": " + c["value"]) for c in HEADERS])
def test_headers_by_the_cores_rule(case: Dict[str, Any]) -> None:
    headers = {"X-First": "ok", case["name"]: case["value"]}
    if case["error"] is None:
        llmretry.Client(api_key="k", logger=None, headers=headers).close()
        return
    with pytest.raises(ValueError) as info:
        llmretry.Client(api_key="k", logger=None, headers=headers)
    message = str(info.value)
    if case["error"] == "name":
        assert message.startswith("headers: the name of header #1 is invalid")
        assert not case["name"] or case["name"] not in message
    else:
        assert message == (f'headers["{case["name"]}"] must not contain CR, LF, NUL or other '
                           f"control characters")


@pytest.mark.parametrize("case", STREAM_BODIES, ids=[c["name"] for c in STREAM_BODIES])
def test_a_dict_is_sent_as_the_core_says(case: Dict[str, Any], scen: Scenario) -> None:
    body = json.loads(json.dumps(case["body"]))
    opts: Dict[str, Any] = dict(base_url=scen.url, endpoint=case["endpoint"], api_key=SECRET_KEY,
                                logger=None, max_retries=0, timeout_ms=5000)
    if case["streamed"]:
        with llmretry.stream_llm(body, **opts) as s:
            list(s)
    else:
        llmretry.call_llm(body, **opts)
        if case["endpoint"] != "responses":
            # A batch's items follow the same rule (per item: its options
            # are shared).
            llmretry.call_many([body], **opts)
    assert body == case["body"], "the caller's dict was changed"
    sent = [json.loads(rec["body"]) for rec in scen.requests()]
    assert sent and all(b == case["sent"] for b in sent), sent
