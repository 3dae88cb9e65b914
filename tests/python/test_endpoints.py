"""The ``endpoint`` option (issue 32): the API path appended to base_url,
``url`` still winning, from a call, a client or a policy (as is ``url``), and
each API's usage counted: embeddings' prompt tokens alone, the Responses
API's input/output tokens, in ``meta.usage`` and a batch's totals."""

from __future__ import annotations

import json
from typing import Any, Dict, List

import pytest

import llmretry
from conftest import SECRET_KEY, Scenario

FAST: Dict[str, Any] = dict(api_key=SECRET_KEY, base_delay_ms=10, jitter="none",
                            timeout_ms=5000, logger=None)
EMBED: Dict[str, Any] = {"model": "text-embedding-3-small",
                         "input": ["SECRET-PROMPT-a", "SECRET-PROMPT-b"]}


def paths(scen: Scenario) -> List[str]:
    return [r["path"] for r in scen.requests()]


def test_embeddings_call_and_its_usage(scen: Scenario) -> None:
    res = llmretry.call_llm(EMBED, base_url=scen.url, endpoint="embeddings", **FAST)
    assert paths(scen) == [f"/s/{scen.name}/v1/embeddings"]
    assert res.data["object"] == "list" and len(res.data["data"]) == 2
    assert res.meta.usage == {"prompt_tokens": 8, "completion_tokens": 0, "total_tokens": 8}


def test_embeddings_batch_totals(scen: Scenario) -> None:
    # One retried item: its failed attempt had no usage; the batch counts 3 answers.
    scen.script([{"status": 503}], after={"usage": {"prompt_tokens": 5, "total_tokens": 5}})
    batch = llmretry.call_many([EMBED] * 3, base_url=scen.url, endpoint="embeddings",
                               limit=2, **FAST)
    assert [isinstance(r, llmretry.Result) for r in batch] == [True] * 3
    assert set(paths(scen)) == {f"/s/{scen.name}/v1/embeddings"} and len(paths(scen)) == 4
    assert (batch.summary.prompt_tokens, batch.summary.completion_tokens,
            batch.summary.total_tokens) == (15, 0, 15)


def test_responses_call_and_its_usage(scen: Scenario) -> None:
    res = llmretry.call_llm({"model": "m", "input": "SECRET-PROMPT-r"}, base_url=scen.url,
                            endpoint="responses", **FAST)
    assert paths(scen) == [f"/s/{scen.name}/v1/responses"]
    assert res.data["object"] == "response"
    assert res.data["output"][0]["content"][0]["text"] == "ok"
    assert res.meta.usage == {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}


def test_completions_and_the_default(scen: Scenario) -> None:
    res = llmretry.call_llm({"model": "m", "prompt": "SECRET-PROMPT-c"}, base_url=scen.url,
                            endpoint="completions", **FAST)
    assert res.data["object"] == "text_completion" and res.data["choices"][0]["text"] == "ok"
    llmretry.call_llm({"model": "m", "messages": []}, base_url=scen.url, **FAST)
    llmretry.call_llm({"model": "m", "messages": []}, base_url=scen.url,
                      endpoint="chat/completions", **FAST)
    base = f"/s/{scen.name}/v1"
    assert paths(scen) == [base + "/completions", base + "/chat/completions",
                           base + "/chat/completions"]


def test_url_wins(scen: Scenario) -> None:
    llmretry.call_llm(EMBED, url=scen.url + "/embeddings?v=1", endpoint="responses", **FAST)
    with llmretry.Client(endpoint="responses", url=scen.url + "/embeddings") as c:
        c.call_llm(EMBED, **FAST)
    assert paths(scen) == [f"/s/{scen.name}/v1/embeddings?v=1", f"/s/{scen.name}/v1/embeddings"]


def test_a_bad_endpoint_is_refused_before_any_io(scen: Scenario) -> None:
    with pytest.raises(ValueError, match='endpoint must be one of "chat/completions", '
                                         '"completions", "embeddings", "responses"'):
        llmretry.call_llm(EMBED, base_url=scen.url, endpoint="/v1/embeddings", **FAST)
    assert paths(scen) == []


def test_endpoint_and_url_from_a_policy(scen: Scenario) -> None:
    other = scen.sub("other")
    pols = {"embed": {"endpoint": "embeddings", "base_url": scen.url},
            "whole": {"url": other.url + "/embeddings"}}
    with llmretry.Client(policies=pols, base_url=scen.url, **FAST) as c:
        c.call_llm(EMBED, policy="embed")
        c.call_llm(EMBED, policy="whole")                       # a policy's url beats...
        c.call_llm(EMBED, policy="embed", endpoint="responses")  # explicit beats the policy
        c.call_llm({"model": "m", "messages": []}, policy="whole",
                   base_url=scen.url)                            # ...and a call's base_url it
    assert paths(scen) == [f"/s/{scen.name}/v1/embeddings", f"/s/{scen.name}/v1/responses",
                           f"/s/{scen.name}/v1/chat/completions"]
    assert paths(other) == [f"/s/{other.name}/v1/embeddings"]
    assert llmretry.load_policies({"p": {"url": scen.url + "/x"}})["p"].settings == {
        "url": scen.url + "/x"}


def test_a_fallback_base_url_gets_the_endpoint(scen: Scenario) -> None:
    other = scen.sub("fb")
    scen.script([], after={"status": 500})
    res = llmretry.call_llm(EMBED, base_url=scen.url, endpoint="embeddings", max_retries=0,
                            fallbacks=[{"base_url": other.url}], **FAST)
    assert res.meta.usage["prompt_tokens"] == 8
    assert paths(other) == [f"/s/{other.name}/v1/embeddings"]


def test_a_responses_stream_batch_gets_no_stream_options(scen: Scenario) -> None:
    """stream_options is Chat Completions' field: a batch to endpoint
    "responses" leaves it out, as one to a url ending in /responses does."""
    scen.script([], after={"stream": {"api": "responses", "chunks": ["o", "k"]}})
    body = {"model": "m", "input": "SECRET-PROMPT-s", "stream": True}
    batch = llmretry.call_many([body, body], base_url=scen.url, endpoint="responses", **FAST)
    assert [isinstance(r, llmretry.Result) for r in batch] == [True, True]
    for rec in scen.requests():
        assert rec["path"].endswith("/responses")
        assert "stream_options" not in json.loads(rec["body"])
    assert batch.summary.prompt_tokens == 24 and batch.summary.completion_tokens == 6


def test_an_embeddings_call_is_not_charged_completion_tokens(scen: Scenario) -> None:
    """The token estimate of an embeddings call is its input alone (no
    completion bound): with 100 tokens left in the server's minute, a short
    input goes at once; charged the default 256 completion tokens it would
    wait for the reset (60 s), past its 3 s deadline."""
    limits = {"x-ratelimit-limit-tokens": "1000", "x-ratelimit-remaining-tokens": "100",
              "x-ratelimit-reset-tokens": "60s"}
    usage = {"prompt_tokens": 2, "total_tokens": 2}
    scen.script([], after={"headers": limits, "usage": usage})
    with llmretry.Client(base_url=scen.url, endpoint="embeddings", **FAST) as c:
        c.call_llm({"model": "e", "input": "SECRET-PROMPT-1"})       # learns the limits
        res = c.call_llm({"model": "e", "input": "SECRET-PROMPT-2"}, deadline_ms=3000)
    assert res.meta.usage == {"prompt_tokens": 2, "completion_tokens": 0, "total_tokens": 2}
    assert len(scen.requests()) == 2
