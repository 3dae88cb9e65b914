"""response_model=Model (pydantic v2, issue 31): the model's strict schema
checked by the core, pydantic validating each answer (its own validators
too, a rejection retried), the instance at result.parsed, across call_llm,
acall_llm, stream_llm, call_many and a client default."""

from __future__ import annotations

import asyncio
import json
from typing import Any, List, Optional

import pydantic
import pytest

import llmretry
from conftest import FAST, SECRET_KEY

BODY = {"model": "gpt-test", "messages": [{"role": "user", "content": "SECRET-PROMPT-model"}]}


class Item(pydantic.BaseModel):
    name: str
    qty: int = 1


class Order(pydantic.BaseModel):
    id: int
    items: List[Item]
    note: Optional[str] = None

    @pydantic.field_validator("id")
    @classmethod
    def positive(cls, v: int) -> int:
        if v <= 0:
            raise ValueError("id must be positive")
        return v


GOOD = json.dumps({"id": 7, "items": [{"name": "tea", "qty": 2}], "note": None})


@pytest.fixture
def mclient() -> Any:
    c = llmretry.Client(api_key=SECRET_KEY, logger=None, **FAST)
    yield c
    c.close()


def test_strict_schema() -> None:
    s = llmretry.strict_schema(Order)
    assert s["additionalProperties"] is False and s["required"] == ["id", "items", "note"]
    item = s["$defs"]["Item"]
    assert item["required"] == ["name", "qty"] and item["additionalProperties"] is False
    assert "default" not in json.dumps(s)
    assert {"type": "null"} in s["properties"]["note"]["anyOf"]
    with pytest.raises(TypeError, match="pydantic BaseModel subclass"):
        llmretry.strict_schema(dict)


def test_parsed_after_schema_and_pydantic_retries(mclient: Any, scen: Any) -> None:
    """A missing field fails the core's schema check; a negative id fails
    pydantic's validator; both are retried; the third answer is parsed."""
    scen.script([{"content": '{"id": 7, "items": [{"name": "tea"}], "note": null}'},
                 {"content": json.dumps({"id": -1, "items": [], "note": "SECRET-ANSWER"})},
                 {"content": GOOD}])
    events: List[Any] = []
    res = mclient.call_llm(BODY, base_url=scen.url, response_model=Order,
                           logger=events.append)
    assert isinstance(res.parsed, Order) and res.parsed.items[0].qty == 2
    assert res.meta.attempts == 3
    errors = [e for e in events if e["event"] == "llm_request_error"]
    assert errors[0]["validation_path"] == "$.items[0].qty"
    assert "$.id: Value error, id must be positive" in errors[1]["error_message"]
    assert "SECRET-ANSWER" not in json.dumps(events)


def test_rejection_exhausted(mclient: Any, scen: Any) -> None:
    scen.script([], after={"content": json.dumps({"id": 0, "items": [], "note": None})})
    with pytest.raises(llmretry.InvalidResponseError) as info:
        mclient.call_llm(BODY, base_url=scen.url, response_model=Order, max_retries=1)
    assert "id must be positive" in info.value.message and info.value.attempts == 2


def test_every_entry_point(mclient: Any, scen: Any) -> None:
    scen.script([], after={"content": GOOD})
    out = mclient.call_many([BODY] * 3, limit=2, base_url=scen.url, response_model=Order)
    assert [r.parsed.id for r in out] == [7, 7, 7]

    async def main() -> Any:
        return await mclient.acall_llm(BODY, base_url=scen.url, response_model=Order)
    assert asyncio.run(main()).parsed.id == 7

    with mclient.stream_llm(dict(BODY, stream=True), base_url=scen.url,
                            response_model=Order) as s:
        text = "".join(s.text_deltas())
        assert json.loads(text)["id"] == 7
        assert s.result().parsed.id == 7

    c = llmretry.Client(api_key=SECRET_KEY, logger=None, response_model=Order)
    try:
        assert c.call_llm(BODY, base_url=scen.url).parsed.id == 7
        plain = c.call_llm(BODY, base_url=scen.url, response_model=None)
        assert plain.parsed is None and plain.data["choices"][0]["message"]["content"] == GOOD
    finally:
        c.close()
    assert mclient.call_llm(BODY, base_url=scen.url).parsed is None


def test_argument_errors(mclient: Any, scen: Any) -> None:
    with pytest.raises(TypeError, match="pydantic BaseModel subclass"):
        mclient.call_llm(BODY, base_url=scen.url, response_model=dict)
    with pytest.raises(TypeError, match="cannot be combined"):
        mclient.call_llm(BODY, base_url=scen.url, response_model=Order, validate=bool)

    class Tagged(pydantic.BaseModel):
        pair: tuple[int, int]
    with pytest.raises(ValueError, match="unsupported keyword 'prefixItems'"):
        mclient.call_llm(BODY, base_url=scen.url, response_model=Tagged)
    assert scen.requests() == []


def test_repair_names_pydantic_errors(mclient: Any, scen: Any) -> None:
    scen.script([{"content": json.dumps({"id": -1, "items": [], "note": None})},
                 {"content": GOOD}])
    res = mclient.call_llm(BODY, base_url=scen.url, response_model=Order, repair=True)
    assert res.parsed.id == 7
    note = json.loads(scen.requests()[1]["body"])["messages"][-1]["content"]
    assert "$.id: Value error, id must be positive" in note
