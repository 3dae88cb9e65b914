"""Every shared scenario of tests/vectors/ through llmretry.call_llm.

Mirrors tests/c/test_vectors.c: the vector's ``expect`` plus the invariants
every runner checks (tests/vectors/README.md). One test per vector file; all
run on one shared Client (one engine), as the C runner does.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

import llmretry
from conftest import (SECRET_KEY, VECTOR_DIR, Events, body_secrets, check_event_sequence,
                      check_event_shape, check_no_secrets, error_class, serialised)

OPTION_NAMES = {
    "timeout_ms", "max_retries", "base_delay_ms", "max_delay_ms", "jitter", "deadline_ms",
    "retry_mode", "retry_statuses", "max_retry_after_ms", "retry_invalid_response",
    "max_response_bytes", "idempotency_key", "request_id", "headers", "idle_timeout_ms",
    "retry_budget_ratio", "retry_budget_min", "breaker_failures", "breaker_cooldown_ms",
    "schema", "endpoint",
}
VECTOR_FILES = sorted(VECTOR_DIR.glob("*.json")) + sorted(VECTOR_DIR.glob("schema/*.json"))


def test_vectors_found() -> None:
    assert len(VECTOR_FILES) >= 18, f"only {len(VECTOR_FILES)} vectors in {VECTOR_DIR}"


@pytest.fixture(scope="module")
def vector_client() -> Iterator[llmretry.Client]:
    c = llmretry.Client()
    yield c
    c.close()


def per_retry(events: Events, name: str, field: str) -> List[Any]:
    return [e[field] for e in events.events if e["event"] == name]


@pytest.mark.parametrize("path", VECTOR_FILES,
                         ids=[str(p.relative_to(VECTOR_DIR).with_suffix("")) for p in VECTOR_FILES])
def test_vector(path: Path, server: Any, vector_client: llmretry.Client) -> None:
    vec = json.loads(path.read_text(encoding="utf-8"))
    name = vec.get("name")
    exp: Dict[str, Any] = vec.get("expect")
    script = vec.get("script")
    assert name == path.stem, "name must equal the file name"
    assert isinstance(exp, dict) and isinstance(script, dict)
    for key in ("outcome", "events", "attempts", "requests"):
        assert key in exp, f"expect lacks {key}"
    options = dict(vec.get("options", {}))
    unknown = set(options) - OPTION_NAMES
    assert not unknown, f"unknown option(s) {sorted(unknown)}"

    server.script(name, script.get("steps", []), script.get("after"))
    body = vec["body"]
    events = Events()
    if exp["outcome"] == "invalid_argument":
        # Refused before any I/O, naming the mistake.
        with pytest.raises(ValueError) as info:
            llmretry.call_llm(body, base_url=server.scenario_url(name), api_key=SECRET_KEY,
                              logger=events, client=vector_client, **options)
        assert exp["message_contains"] in str(info.value)
        assert events.names == exp["events"] == []
        assert len(server.requests(name)) == exp["requests"] == 0
        return
    t0 = time.monotonic()
    try:
        res, err = llmretry.call_llm(body, base_url=server.scenario_url(name),
                                     api_key=SECRET_KEY, logger=events,
                                     client=vector_client, **options), None
    except llmretry.LLMError as exc:
        res, err = None, exc
    wall_ms = (time.monotonic() - t0) * 1000.0

    # -- the result --------------------------------------------------------
    want_ok = exp["outcome"] == "ok"
    assert (err is None) == want_ok, f"outcome: expected {exp['outcome']}, got {err!r}"
    got = res.meta if res is not None else err
    assert got.attempts == exp["attempts"], f"attempts {got.attempts}, expected {exp['attempts']}"
    assert got.attempt == got.attempts - 1
    assert got.status == exp["status"], f"status {got.status!r}, expected {exp['status']!r}"
    assert isinstance(got.request_id, str) and got.request_id
    assert got.model == "gpt-test"
    assert got.total_ms >= got.duration_ms >= 0
    if "min_total_ms" in exp:
        assert got.total_ms >= exp["min_total_ms"], f"total_ms {got.total_ms}"
    if "max_total_ms" in exp:
        assert got.total_ms <= exp["max_total_ms"], f"total_ms {got.total_ms}"
        assert wall_ms <= exp["max_total_ms"], f"wall {wall_ms:.0f} ms"
    if "request_id" in exp:
        assert got.request_id == exp["request_id"]
    if "usage_total" in exp:
        assert got.usage_total == exp["usage_total"], f"usage_total {got.usage_total}"

    if want_ok:
        assert isinstance(res.data, dict), "data is not the parsed JSON body"
        assert res.data.get("object") == exp.get("object", "chat.completion")
        data, meta = res
        assert data is res.data and meta is res.meta
        if "usage" in exp:
            assert res.meta.usage == exp["usage"]
        if "content" in exp:
            assert res.data["choices"][0]["message"]["content"] == exp["content"]
        if "chunks" in exp:
            assert res.meta.stream and res.meta.chunks == exp["chunks"]
        if "response_model" in exp:
            assert res.meta.response_model == exp["response_model"]
        if "system_fingerprint" in exp:
            assert res.meta.system_fingerprint == exp["system_fingerprint"]
    else:
        cls = error_class(exp["error_kind"])
        assert isinstance(err, cls), f"{type(err).__name__}, expected {cls.__name__}"
        assert err.kind == exp["error_kind"]
        assert err.reason == exp["reason"], f"reason {err.reason}, expected {exp['reason']}"
        assert err.message
        if "error_code" in exp:
            assert err.error_code == exp["error_code"]
        if "retry_after_ms" in exp:
            assert err.retry_after_ms == exp["retry_after_ms"]
        if "body_preview_contains" in exp:
            assert err.body_preview and exp["body_preview_contains"] in err.body_preview
        assert err.validation_errors == exp.get("validation_errors")

    # -- the events --------------------------------------------------------
    assert events.names == exp["events"]
    if "delay_sources" in exp:
        assert per_retry(events, "llm_retry_scheduled", "delay_source") == exp["delay_sources"]
    if "delays_ms" in exp:
        assert per_retry(events, "llm_retry_scheduled", "delay_ms") == exp["delays_ms"]
    if "attempt_errors" in exp:
        assert per_retry(events, "llm_request_error", "error_kind") == exp["attempt_errors"]
    paths = [e.get("validation_path") for e in events.events if e["event"] == "llm_request_error"]
    assert paths == exp.get("validation_paths", [None] * len(paths))
    check_event_sequence(events, got.attempts, got.request_id)
    for ev in events.events:
        check_event_shape(ev)
    if err is not None:
        gave_up = events.of("llm_request_gave_up")[-1]
        assert gave_up["reason"] == err.reason
        assert gave_up["error_kind"] == err.kind
        assert gave_up["attempts"] == err.attempts
    else:
        succeeded = events.of("llm_request_succeeded")[-1]
        assert succeeded["status"] == res.meta.status
        if "usage" in exp:
            assert succeeded["usage"] == exp["usage"]
    assert set(events.threads) == {threading.get_ident()}

    secrets = body_secrets(body)
    for ev in events.events:
        check_no_secrets(secrets, json.dumps(ev, ensure_ascii=False))
    if err is not None:
        check_no_secrets(secrets, err.message, str(err), repr(err))
    else:
        check_no_secrets(secrets, repr(res), repr(res.meta))

    # -- what the server saw -------------------------------------------------
    recs = server.requests(name)
    assert len(recs) == exp["requests"], f"server saw {len(recs)} requests"
    # One attempt is one request, but for the engine's free re-sends.
    assert len(recs) == got.attempts + exp.get("resends", 0), "one attempt must be one request"
    # Sent as serialised, but a streaming dict asks for its usage (docs/streaming.md).
    sent = body
    if body.get("stream") is True and "stream_options" not in body:
        sent = dict(body, stream_options={"include_usage": True})
    want_body = serialised(sent)
    for rec in recs:
        h = rec["headers"]
        assert h.get("authorization") == f"Bearer {SECRET_KEY}"
        assert h.get("x-client-request-id") == got.request_id
        assert h.get("content-type", "").startswith("application/json")
        assert h.get("accept") == "application/json"
        assert h.get("user-agent", "").startswith("llmretry/")
        assert rec["method"] == "POST"
        assert rec["body"] == want_body
        assert json.loads(rec["body"]) == sent
        for hname, value in exp.get("request_headers", {}).items():
            assert h.get(hname) == value, f"header {hname}: {h.get(hname)!r}"
        if "idempotency_key" not in options:
            assert "idempotency-key" not in h
