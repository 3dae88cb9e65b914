"""Exceptions by status (issue 32 item 1): an ``http_status`` failure is the
HTTPStatusError subclass openai-python names for its status, on every path
that raises or returns one (sync, asyncio, streams, batches), and pickles
back to the same class with the same fields."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any, Dict, List

import pytest

import llmretry
import llmretry.errors
from conftest import FAST, SECRET_KEY, Scenario, secret_body

# status -> the class it must raise (openai-python's names)
BY_STATUS = {
    400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError",
    404: "NotFoundError", 409: "ConflictError", 422: "UnprocessableEntityError",
    429: "RateLimitError", 500: "InternalServerError", 503: "InternalServerError",
    418: "HTTPStatusError",
}


def opts(scen: Scenario, **kw: Any) -> Dict[str, Any]:
    # max_retries=0: the first answer is the last (429 and 5xx are retried)
    o: Dict[str, Any] = dict(FAST, base_url=scen.url, api_key=SECRET_KEY, logger=None,
                             max_retries=0)
    o.update(kw)
    return o


@pytest.mark.parametrize("name", sorted(set(BY_STATUS.values()) - {"HTTPStatusError"}))
def test_classes_are_exported_http_status_errors(name: str) -> None:
    cls = getattr(llmretry, name)
    assert cls is getattr(llmretry.errors, name)
    assert name in llmretry.__all__ and name in llmretry.errors.__all__
    assert issubclass(cls, llmretry.HTTPStatusError) and cls.kind == "http_status"
    assert cls.__doc__


@pytest.mark.parametrize("status", sorted(BY_STATUS))
def test_call_llm_raises_the_class_of_the_status(scen: Scenario, status: int) -> None:
    scen.script([{"status": status, "error_code": "some_code"}])
    with pytest.raises(llmretry.HTTPStatusError) as info:
        llmretry.call_llm(secret_body("st"), **opts(scen))
    err = info.value
    assert type(err).__name__ == BY_STATUS[status], repr(err)
    assert (err.kind, err.status, err.error_code) == ("http_status", status, "some_code")
    assert err.request_id and err.request_id in str(err)
    # pickled (multiprocessing, Ray, Dask): the same class, the same fields
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert back.as_dict() == err.as_dict()
    assert str(back) == str(err) and repr(back) == repr(err)


def test_other_kinds_keep_their_class_whatever_the_status(scen: Scenario) -> None:
    """A deadline hit after 429s is a DeadlineExceededError, not a
    RateLimitError: the status picks a class for ``http_status`` only."""
    out = llmretry.errors.error_from_outcome({"kind": "deadline_exceeded", "status": 429,
                                               "message": "m"})
    assert type(out) is llmretry.DeadlineExceededError


def test_stream_raises_the_class_of_the_status(scen: Scenario) -> None:
    scen.script([{"status": 401}])
    with pytest.raises(llmretry.AuthenticationError) as info:
        with llmretry.stream_llm(secret_body("st", stream=True), **opts(scen)) as s:
            list(s.text_deltas())
    assert info.value.status == 401


def test_asyncio_raises_the_class_of_the_status(scen: Scenario) -> None:
    scen.script([{"status": 404}, {"status": 429}])

    async def main() -> List[BaseException]:
        got: List[BaseException] = []
        try:
            await llmretry.acall_llm(secret_body("a"), **opts(scen))
        except llmretry.LLMError as exc:
            got.append(exc)
        try:
            async with llmretry.astream_llm(secret_body("b", stream=True), **opts(scen)) as s:
                async for _ in s.text_deltas():
                    pass
        except llmretry.LLMError as exc:
            got.append(exc)
        return got

    got = asyncio.run(main())
    assert [type(e).__name__ for e in got] == ["NotFoundError", "RateLimitError"]


def test_batch_failures_carry_the_class_of_the_status(scen: Scenario) -> None:
    scen.script([{"status": 403}, {}, {"status": 422}, {"status": 500}])
    bodies = [secret_body(f"b{i}") for i in range(4)]
    out = llmretry.call_many(bodies, limit=1, **opts(scen))
    assert [type(v).__name__ for v in out] == [
        "PermissionDeniedError", "Result", "UnprocessableEntityError", "InternalServerError"]
    assert [i for i, _ in out.errors()] == [0, 2, 3]

    scen.script([{"status": 409}, {}])
    out = asyncio.run(llmretry.acall_many(bodies[:2], limit=1, **opts(scen)))
    assert [type(v).__name__ for v in out] == ["ConflictError", "Result"]
