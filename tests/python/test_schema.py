"""Structured outputs through the Python surface (issue 31,
docs/structured-outputs.md): the rules live in the core (tests/c/test_schema.c,
tests/vectors/schema/); here each is shown to reach Python users intact: the
``schema=`` option in every form, errors before any I/O, ``validation_errors``
and :class:`RefusalError`, and the same behaviour through call_many, asyncio
and a stream whose chunks were read."""

from __future__ import annotations

import asyncio
import json
import pickle
from typing import Any, Dict, List

import pytest

import llmretry
from conftest import FAST, SECRET_KEY

PERSON: Dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"], "additionalProperties": False,
}
BODY = {"model": "gpt-test", "messages": [{"role": "user", "content": "SECRET-PROMPT-schema"}]}
GOOD = '{"name": "Ann", "age": 3}'
BAD = '{"name": "Ann", "age": -1}'


def with_format(schema: Dict[str, Any]) -> Dict[str, Any]:
    return dict(BODY, response_format={"type": "json_schema",
                                       "json_schema": {"name": "p", "schema": schema}})


@pytest.fixture
def sclient() -> Any:
    c = llmretry.Client(api_key=SECRET_KEY, logger=None, **FAST)
    yield c
    c.close()


@pytest.mark.parametrize("form", ["dict", "str", "bytes"])
def test_schema_option_in_every_form(sclient: Any, scen: Any, form: str) -> None:
    """A dict, JSON text or bytes: the same schema, the same verdict."""
    schema: Any = {"dict": PERSON, "str": json.dumps(PERSON),
                   "bytes": json.dumps(PERSON).encode()}[form]
    scen.script([{"content": BAD}, {"content": "Here:\n```json\n" + GOOD + "\n```"}])
    res = sclient.call_llm(BODY, base_url=scen.url, schema=schema)
    assert res.meta.attempts == 2
    assert res.data["choices"][0]["message"]["content"].endswith("```")


def test_mismatch_carries_validation_errors(sclient: Any, scen: Any) -> None:
    scen.script([], after={"content": '{"name": 7, "age": "x", "more": 1}'})
    events: List[Dict[str, Any]] = []
    with pytest.raises(llmretry.InvalidResponseError) as info:
        sclient.call_llm(BODY, base_url=scen.url, schema=PERSON, max_retries=1,
                         logger=events.append)
    err = info.value
    assert err.validation_errors == [
        {"path": "$.name", "message": "expected string"},
        {"path": "$.age", "message": "expected integer"},
        {"path": "$.more", "message": "property not allowed (additionalProperties is false)"},
    ]
    assert err.reason == "retries_exhausted" and err.attempts == 2
    assert "$.name: expected string (and 2 more)" in err.message
    assert [e["validation_path"] for e in events if e["event"] == "llm_request_error"] == \
        ["$.name", "$.name"]
    # The answer's values appear nowhere: not in the error, not in events.
    assert '"x"' not in err.message and "more\": 1" not in json.dumps(events)
    # The errors survive pickling (a batch's worker process hands them back).
    again = pickle.loads(pickle.dumps(err))
    assert again.validation_errors == err.validation_errors
    assert err.as_dict()["validation_errors"] == err.validation_errors


def test_refusal_is_not_retried(sclient: Any, scen: Any) -> None:
    refusal = {"id": "c1", "object": "chat.completion", "created": 1, "model": "gpt-test",
               "choices": [{"index": 0, "finish_reason": "stop", "message": {
                   "role": "assistant", "content": None, "refusal": "No, sorry."}}]}
    scen.script([{"body": refusal}, {"content": GOOD}])
    with pytest.raises(llmretry.RefusalError) as info:
        sclient.call_llm(with_format(PERSON), base_url=scen.url)
    err = info.value
    assert isinstance(err, llmretry.LLMError) and err.kind == "refusal"
    assert err.reason == "not_retryable" and err.attempts == 1
    assert "No, sorry." in (err.body_preview or "") and "No, sorry." not in err.message
    assert err.validation_errors is None
    assert len(scen.requests()) == 1


def test_an_answer_with_text_after_its_json(sclient: Any, scen: Any) -> None:
    """response_format asks for JSON as it is: text after the value fails;
    the schema option finds the JSON (extract_json) and accepts it."""
    scen.script([], after={"content": GOOD + " -- hope this helps"})
    with pytest.raises(llmretry.InvalidResponseError) as info:
        sclient.call_llm(with_format(PERSON), base_url=scen.url, max_retries=0)
    assert info.value.validation_errors == [{"path": "$", "message": "the answer is not JSON"}]
    assert sclient.call_llm(BODY, base_url=scen.url, schema=PERSON).meta.attempts == 1


def test_without_a_schema_nothing_changes(sclient: Any, scen: Any) -> None:
    """No schema, no response_format: an answer that is not JSON is fine."""
    scen.script([{"content": "not json at all"}])
    res = sclient.call_llm(BODY, base_url=scen.url)
    assert res.meta.attempts == 1


@pytest.mark.parametrize("schema, part", [
    ({"type": "object", "properties": {"x": {"oneOf": [{}]}}},
     "unsupported keyword 'oneOf' at $.properties.x"),
    ({"type": "strin"}, "unknown type"),
    ("{not json", "schema is not valid JSON"),
    ({"$ref": "#/$defs/nope"}, "does not resolve"),
])
def test_bad_schema_raises_before_io(sclient: Any, scen: Any, schema: Any, part: str) -> None:
    with pytest.raises(ValueError, match="schema") as info:
        sclient.call_llm(BODY, base_url=scen.url, schema=schema)
    assert part in str(info.value)
    with pytest.raises(ValueError) as info:
        sclient.call_llm(with_format(schema if isinstance(schema, dict) else {"oneOf": []}),
                         base_url=scen.url)
    assert "response_format.json_schema.schema:" in str(info.value)
    assert scen.requests() == []


def test_schema_type_errors(sclient: Any, scen: Any) -> None:
    with pytest.raises(TypeError, match="schema must be a dict, JSON text or None"):
        sclient.call_llm(BODY, base_url=scen.url, schema=[1])
    with pytest.raises(TypeError, match="schema cannot be encoded"):
        sclient.call_llm(BODY, base_url=scen.url, schema={"const": object()})
    # A client default, overridden per call (None: no schema).
    scen.script([], after={"content": "plain text"})
    c = llmretry.Client(api_key=SECRET_KEY, logger=None, schema=PERSON, max_retries=0)
    try:
        with pytest.raises(llmretry.InvalidResponseError):
            c.call_llm(BODY, base_url=scen.url)
        assert c.call_llm(BODY, base_url=scen.url, schema=None).meta.attempts == 1
    finally:
        c.close()


def test_call_many_and_asyncio_share_the_schema(sclient: Any, scen: Any) -> None:
    scen.script([{"content": GOOD}, {"content": BAD}, {"content": GOOD}],
                after={"content": GOOD})
    out = sclient.call_many([BODY] * 3, limit=1, base_url=scen.url, schema=PERSON,
                            max_retries=0, adaptive=False)
    assert out.summary.failed == 1
    [(index, err)] = out.errors()
    assert index == 1 and err.validation_errors == [{"path": "$.age", "message": "must be >= 0"}]

    async def main() -> Any:
        return await sclient.acall_llm(with_format(PERSON), base_url=scen.url)
    scen.script([{"content": BAD}, {"content": GOOD}])
    res = asyncio.run(main())
    assert res.meta.attempts == 2


def test_usage_total_counts_every_attempt(sclient: Any, scen: Any) -> None:
    """meta.usage stays the successful attempt's; usage_total, the batch
    summary and log_usage count the invalid answers' tokens too (the mock
    bills 12 + 3 per answer)."""
    one = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    two = {k: 2 * v for k, v in one.items()}
    scen.script([{"content": BAD}, {"content": GOOD}])
    res = sclient.call_llm(BODY, base_url=scen.url, schema=PERSON)
    assert res.meta.usage == one and res.meta.usage_total == two
    assert res.meta.as_dict()["usage_total"] == two
    assert pickle.loads(pickle.dumps(res.meta)).usage_total == two
    logged: List[Dict[str, Any]] = []
    llmretry.log_usage(res.meta, logger=logged.append)
    assert logged[0]["total_tokens"] == 30

    scen.script([{"content": BAD}, {"content": GOOD}, {"content": BAD}, {"content": BAD}])
    out = sclient.call_many([BODY, BODY], limit=1, base_url=scen.url, schema=PERSON,
                            max_retries=1, adaptive=False)
    assert out.summary.ok == 1 and out.summary.failed == 1
    [(_, err)] = out.errors()
    assert err.usage_total == two
    assert out.summary.total_tokens == 60 and out.summary.prompt_tokens == 48


def test_a_read_stream_that_does_not_match_ends_as_invalid(sclient: Any, scen: Any) -> None:
    """Once chunks were read nothing is retried: the whole answer's mismatch
    ends the call as invalid_response (not a broken stream)."""
    # Chunks 300 ms apart: the first is read (the commit point) before the
    # answer is whole; an answer read whole before that would be retried.
    scen.script([{"content": BAD, "stream": {"chunks": 3, "delay_ms": 300}}],
                after={"content": GOOD})
    body = dict(with_format(PERSON), stream=True)
    pieces: List[str] = []
    with pytest.raises(llmretry.InvalidResponseError) as info:
        with sclient.stream_llm(body, base_url=scen.url) as s:
            for piece in s.text_deltas():
                pieces.append(piece)
            s.result()
    assert "".join(pieces) == BAD
    assert info.value.validation_errors == [{"path": "$.age", "message": "must be >= 0"}]
    assert info.value.attempts == 1 and len(scen.requests()) == 1


def test_repair_sends_the_failed_answer_and_its_errors(sclient: Any, scen: Any) -> None:
    """repair=True: the retry's body is the call's own with the failed answer
    (as the assistant's) and one user message naming the errors; a second
    retry starts from the call's body again (one failed answer at most)."""
    scen.script([{"content": BAD}, {"content": '{"name": "Ann"}'}, {"content": GOOD}])
    events: List[Dict[str, Any]] = []
    res = sclient.call_llm(BODY, base_url=scen.url, schema=PERSON, repair=True,
                           logger=events.append)
    assert res.meta.attempts == 3
    sent = [json.loads(r["body"]) for r in scen.requests()]
    assert sent[0] == BODY
    for body, answer, error in ((sent[1], BAD, "- $.age: must be >= 0"),
                                (sent[2], '{"name": "Ann"}', "- $.age: required property is missing")):
        assert body["messages"][:-2] == BODY["messages"]
        assistant, user = body["messages"][-2:]
        assert assistant == {"role": "assistant", "content": answer}
        assert user["role"] == "user" and error in user["content"]
    assert [e.get("repair") for e in events if e["event"] == "llm_retry_scheduled"] == [True, True]
    # Without repair every attempt sends the same body.
    scen.script([{"content": BAD}, {"content": GOOD}])
    sclient.call_llm(BODY, base_url=scen.url, schema=PERSON)
    assert all(json.loads(r["body"]) == BODY for r in scen.requests())


def test_repair_of_a_responses_input(sclient: Any, scen: Any) -> None:
    """A Responses body's string input becomes the first message."""
    def resp(text: str) -> Dict[str, Any]:
        return {"object": "response", "output": [{"type": "message", "content": [
            {"type": "output_text", "text": text}]}]}
    body = {"model": "gpt-test", "input": "SECRET-PROMPT-responses"}
    scen.script([{"body": resp(BAD)}, {"body": resp(GOOD)}])
    sclient.call_llm(body, base_url=scen.url, endpoint="responses", schema=PERSON, repair=True)
    second = json.loads(scen.requests()[1]["body"])
    assert second["input"][0] == {"role": "user", "content": "SECRET-PROMPT-responses"}
    assert second["input"][1] == {"role": "assistant", "content": BAD}
    assert "$.age: must be >= 0" in second["input"][2]["content"]
