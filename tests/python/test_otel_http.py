"""llmretry.otel and the calls that are not a model's generation: the Batch
API's own requests (files, batches, their lists and cancels) and the SDK's
GETs through llmretry.httpx. Each is an HTTP client span named by its
method, with no gen_ai.* attribute (not "chat", nor a file id as the
response's), and none of the GenAI metrics; its attempts and retries are
still told."""

from __future__ import annotations

import io
from typing import Any, Dict

import httpx
import openai
import pytest

import llmretry
import llmretry.httpx
import llmretry.otel
from conftest import SECRET_KEY, Scenario
from llmretry import batch_api
from test_otel import Telemetry, attempt_events, tel  # noqa: F401 (tel: the fixture)

GENAI_METRICS = ("gen_ai.client.operation.duration", "gen_ai.client.token.usage",
                 "gen_ai.client.operation.time_to_first_chunk")


def _genai(span: Any) -> Dict[str, Any]:
    return {k: v for k, v in span.attributes.items() if k.startswith(("gen_ai.", "openai."))}


def test_the_sdks_get_is_an_http_span(tel: Telemetry, scen: Scenario) -> None:
    store = scen.server.batch_api()
    transport = llmretry.httpx.Transport(max_retries=2, base_delay_ms=1)
    with openai.OpenAI(api_key=SECRET_KEY, base_url=scen.url, max_retries=0,
                       http_client=httpx.Client(transport=transport)) as client:
        f = client.files.create(file=("in.jsonl", io.BytesIO(b"")), purpose="batch")
        store.fail = 1
        try:
            assert client.files.retrieve(f.id).id == f.id
        finally:
            store.fail = 0
    (span,) = tel.llm_spans()
    assert span.name == "GET"
    assert _genai(span) == {}
    assert span.attributes["http.request.method"] == "GET"
    assert span.attributes["server.address"] == "127.0.0.1"
    assert span.attributes["llmretry.attempts"] == 2
    assert [e["http.response.status_code"] for e in attempt_events(span)] == [503, 200]
    metrics = tel.metrics()
    assert not any(metrics.get(name) for name in GENAI_METRICS), metrics.keys()
    assert tel.total("llmretry.retries") == 1


def test_a_batch_api_job_is_http_spans_and_its_items_are_not_chat_calls(
        tel: Telemetry, scen: Scenario) -> None:
    store = scen.server.batch_api()
    store.auto = True
    bodies = [{"model": "gpt-b", "messages": [{"role": "user", "content": f"q{i}"}]}
              for i in range(2)]
    out = batch_api.run(bodies, base_url=scen.url, api_key=SECRET_KEY, logger=None,
                        poll_interval_ms=5, max_poll_interval_ms=20)
    assert [r.data["id"] for r in out] == ["chatcmpl-mock-0", "chatcmpl-mock-1"]
    spans = tel.llm_spans()
    names = sorted({s.name for s in spans})
    # Upload, create; polls, the result file; the files deleted at the end.
    assert names == ["DELETE", "GET", "POST"], names
    assert [s.name for s in spans if _genai(s)] == []
    assert all(s.attributes["http.request.method"] == s.name for s in spans)
    metrics = tel.metrics()
    assert not any(metrics.get(name) for name in GENAI_METRICS), metrics.keys()


def test_a_chat_call_is_still_a_chat_span(tel: Telemetry, scen: Scenario) -> None:
    # The control: the same client, a generation endpoint.
    with llmretry.Client(api_key=SECRET_KEY, base_url=scen.url) as client:
        client.call_llm({"model": "gpt-c", "messages": [{"role": "user", "content": "x"}]})
    (span,) = tel.llm_spans()
    assert span.name == "chat gpt-c"
    assert span.attributes["gen_ai.operation.name"] == "chat"
    assert "http.request.method" not in span.attributes
    assert tel.metrics().get("gen_ai.client.operation.duration")
