"""The public surface: names, exception hierarchy, docstrings, call_many."""

from __future__ import annotations

import inspect
import pickle
import time
from pathlib import Path
from typing import Any, List

import pytest

import llmretry
import llmretry.errors
from conftest import FAST, SECRET_KEY, Events, Scenario, secret_body

PUBLIC = ["Client", "Result", "Meta", "CallOptions", "BatchOptions", "call_llm", "call_llm_with_deadline", "call_many",
          "map_with_concurrency", "extract_json", "assert_shape", "log_usage", "jsonl_logger",
          "LLMError", "HTTPStatusError", "RequestTimeoutError", "NetworkError",
          "InvalidResponseError", "DeadlineExceededError", "ResponseTooLargeError",
          "CallCancelledError", "ShapeError"]


@pytest.mark.parametrize("name", PUBLIC)
def test_public_name_has_a_docstring(name: str) -> None:
    obj = getattr(llmretry, name)
    assert inspect.getdoc(obj), f"llmretry.{name} has no docstring"
    assert name in llmretry.__all__


def test_py_typed_and_version() -> None:
    assert (Path(llmretry.__file__).parent / "py.typed").exists()
    assert isinstance(llmretry.__version__, str) and llmretry.__version__


@pytest.mark.parametrize("cls,bases", [
    ("HTTPStatusError", ()),
    ("RequestTimeoutError", (TimeoutError,)),
    ("NetworkError", (ConnectionError,)),
    ("InvalidResponseError", ()),
    ("DeadlineExceededError", (TimeoutError,)),
    ("ResponseTooLargeError", ()),
    ("CallCancelledError", ()),
])
def test_exception_hierarchy(cls: str, bases: tuple) -> None:
    c = getattr(llmretry, cls)
    assert c is getattr(llmretry.errors, cls)
    assert issubclass(c, llmretry.LLMError) and issubclass(c, Exception)
    for b in bases:
        assert issubclass(c, b)
    assert not issubclass(c, ValueError)


def test_shape_error_is_value_error() -> None:
    assert issubclass(llmretry.ShapeError, ValueError)
    assert not issubclass(llmretry.ShapeError, llmretry.LLMError)


def test_errors_are_picklable_across_processes(scen: Scenario) -> None:
    scen.script([{"status": 429, "retry_after": "30", "error_code": "rate_limit_exceeded"}])
    with pytest.raises(llmretry.HTTPStatusError) as info:
        llmretry.call_llm(secret_body("pickle"), base_url=scen.url, api_key=SECRET_KEY,
                          logger=None, max_retry_after_ms=1000, **{k: v for k, v in FAST.items()
                                                                   if k != "max_retry_after_ms"})
    err = info.value
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is llmretry.RateLimitError
    assert (back.kind, back.status, back.reason, back.retry_after_ms, back.error_code) == (
        "http_status", 429, "retry_after_too_long", 30000, "rate_limit_exceeded")
    assert str(back) == str(err) and repr(back) == repr(err)


# ---------------------------------------------------------------------------
# call_many (docs/python.md)
# ---------------------------------------------------------------------------

def test_call_many_ordered_with_failures_in_place(scen: Scenario) -> None:
    """The mock echoes each body's model, so order is checkable; odd items
    are rejected by validate (not retried) and must sit in their place."""
    scen.script([], after={"delay_ms": 50})
    bodies = [secret_body(f"many{i}", model=f"m{i}") for i in range(8)]
    events = Events()

    def validate(data: Any) -> Any:
        return int(data["model"][1:]) % 2 == 0  # False rejects the odd ones

    t0 = time.monotonic()
    out = llmretry.call_many(bodies, limit=4, base_url=scen.url, api_key=SECRET_KEY,
                             logger=events, validate=validate, retry_invalid_response=False,
                             **{k: v for k, v in FAST.items()})
    took = time.monotonic() - t0
    assert len(out) == 8
    for i, r in enumerate(out):
        if i % 2 == 0:
            assert isinstance(r, llmretry.Result), f"item {i}: {r!r}"
            assert r.data["model"] == f"m{i}" and r.meta.model == f"m{i}"
        else:
            assert isinstance(r, llmretry.InvalidResponseError), f"item {i}: {r!r}"
            assert r.model == f"m{i}" and r.reason == "not_retryable"
    assert took < 8 * 0.05, f"limit 4 did not run calls concurrently ({took:.2f} s)"
    assert len(scen.requests()) == 8
    per_call = [e for e in events.events if e["event"] != "llm_batch_summary"]
    assert len({e["request_id"] for e in per_call}) == 8
    assert {e["model"] for e in per_call} == {f"m{i}" for i in range(8)}


def test_call_many_http_failures_in_place(scen: Scenario) -> None:
    scen.script([{"status": 400}, {}, {"status": 404}], after={})
    out = llmretry.call_many([secret_body(f"h{i}") for i in range(3)], limit=1,
                             base_url=scen.url, api_key=SECRET_KEY, logger=None, **FAST)
    assert isinstance(out[0], llmretry.HTTPStatusError) and out[0].status == 400
    assert isinstance(out[1], llmretry.Result) and out[1].meta.status == 200
    assert isinstance(out[2], llmretry.HTTPStatusError) and out[2].status == 404


def test_call_many_bad_body_raises_before_any_call(scen: Scenario) -> None:
    with pytest.raises(TypeError, match="body"):
        llmretry.call_many([secret_body("x"), 42], base_url=scen.url, api_key=SECRET_KEY)
    with pytest.raises(TypeError):
        llmretry.call_many([secret_body("x")], base_url=scen.url, bogus_option=1)
    assert scen.requests() == []


def test_call_many_empty(scen: Scenario) -> None:
    assert llmretry.call_many([], base_url=scen.url) == []
    assert scen.requests() == []


def test_call_many_checks_every_body_before_any_request(scen: Scenario) -> None:
    """A bad str body late in a batch raises before the first request."""
    bodies: List[Any] = [secret_body(f"ok{i}") for i in range(300)]
    bodies[200] = '{"model": "x", "messages": ['          # not JSON
    with pytest.raises(ValueError, match=r"bodies\[200\]"):
        llmretry.call_many(bodies, limit=4, base_url=scen.url, api_key=SECRET_KEY,
                           logger=None, **FAST)
    assert scen.requests() == []


def test_pool_reporter_failure_stops_the_pool_even_with_return_exceptions() -> None:
    """run_pool: an on_result that raises stops the pool and is raised."""
    from llmretry import _llmretry

    started: List[int] = []

    def worker(item: int, i: int) -> int:
        started.append(i)
        return i

    def report(i: int, value: Any, failed: bool) -> None:
        if i == 2:
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        _llmretry.run_pool(list(range(50)), 1, worker, True, on_result=report)
    assert len(started) < 50
