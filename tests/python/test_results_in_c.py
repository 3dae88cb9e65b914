"""Successes built in C (bindings/python/results.c) are the same Results the
package builds in Python, whichever way a batch is recorded."""

from __future__ import annotations

import gc
import pickle
import warnings
from typing import Any, Dict, List

import pytest

import llmretry
from conftest import FAST, SECRET_KEY, Scenario, secret_body
from llmretry import _bodies, _results


def opts(scen: Scenario, **kw: Any) -> Dict[str, Any]:
    base: Dict[str, Any] = dict(base_url=scen.url, api_key=SECRET_KEY, logger=None, **FAST)
    base.update(kw)
    return base


def python_built(out: Dict[str, Any]) -> llmretry.Result:
    """What the package makes of an outcome dict in Python."""
    value = _results._value_of(out, None)
    assert isinstance(value, llmretry.Result)
    return value


# One answer, byte for byte, for both calls: the mock's own would differ in
# "id" and, across a second's boundary, in "created".
ANSWER = {"id": "chatcmpl-c-built", "object": "chat.completion", "created": 1796634489,
          "model": "gpt-test", "system_fingerprint": "fp_1",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "héllo ✓"},
                       "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}}


def test_c_result_equals_the_python_one(scen: Scenario) -> None:
    engine = _llmretry_engine()
    try:
        body = _bodies._encode_body(secret_body("c-built"))[0]
        kw = dict(base_url=scen.url, api_key=SECRET_KEY, base_delay_ms=1, jitter="none")
        scen.script([{"status": 503}, {"body": ANSWER}])
        built = engine.call(body, as_result=True, **kw)
        scen.script([{"status": 503}, {"body": ANSWER}])
        plain = engine.call(body, **kw)
    finally:
        engine.close()
    assert type(built) is llmretry.Result and type(plain) is dict
    ref = python_built(plain)
    assert built.data == ref.data == ANSWER
    assert built.data["choices"][0]["message"]["content"] == "héllo ✓"
    m, r = built.meta, ref.meta
    for name in ("attempt", "attempts", "status", "usage", "model", "response_model",
                 "system_fingerprint"):
        assert getattr(m, name) == getattr(r, name), name
    assert (m.attempt, m.attempts, m.status) == (1, 2, 200)
    assert m.usage == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    assert m.system_fingerprint == "fp_1" and isinstance(m.request_id, str)
    assert m.duration_ms >= 0 and m.total_ms >= m.duration_ms
    # the same class, so everything a Meta does still works
    assert type(m) is llmretry.Meta and m == pickle.loads(pickle.dumps(m))
    assert m.as_dict()["usage"] == m.usage
    with pytest.raises(AttributeError):
        m.status = 500  # type: ignore[misc]
    data, meta = built
    assert meta is m and "SECRET" not in repr(built)


def _llmretry_engine() -> Any:
    from llmretry import _llmretry
    return _llmretry.Engine()


def test_meta_and_atomic_dicts_are_not_left_to_the_gc(scen: Scenario) -> None:
    """Meta and the response's all-atomic objects are untracked, as CPython's
    GC would do itself; what holds containers stays tracked, and a dict that
    is given a container later is tracked again."""
    res = llmretry.call_llm(secret_body("gc"), **opts(scen))
    assert not gc.is_tracked(res.meta)
    message = res.data["choices"][0]["message"]
    assert not gc.is_tracked(message) and not gc.is_tracked(res.data["usage"])
    assert gc.is_tracked(res.data) and gc.is_tracked(res.data["choices"])
    assert gc.is_tracked(res)
    message["tools"] = []
    assert gc.is_tracked(message)


def test_whitespace_around_the_body_is_json(scen: Scenario) -> None:
    doc = ('\n  {"id": "x", "object": "chat.completion", "choices": [{"index": 0, '
           '"message": {"role": "assistant", "content": "spaced"}, "finish_reason": "stop"}]}'
           ' \r\n\t')
    scen.script([{"body": doc}, {"body": doc}])
    res = llmretry.call_llm(secret_body("ws"), **opts(scen))
    assert res.data["choices"][0]["message"]["content"] == "spaced"
    out = llmretry.call_many([secret_body("ws2")], limit=1, **opts(scen))
    assert out[0].data == res.data


# A raw newline inside a JSON string: cJSON alone would take it, Python's
# json (strict) does not. The core judges a 2xx body for every host (it must
# be UTF-8 JSON), so this is an invalid response, retried like one.
UNPARSABLE = ('{"id": "x", "object": "chat.completion", "choices": [{"index": 0, '
              '"message": {"role": "assistant", "content": "a\nb"}, "finish_reason": "stop"}]}')


def test_a_body_python_cannot_parse_is_an_error(scen: Scenario) -> None:
    scen.script([{"body": UNPARSABLE}])
    with pytest.raises(llmretry.InvalidResponseError, match="UTF-8 JSON") as info:
        llmretry.call_llm(secret_body("bad"), **opts(scen, max_retries=0))
    assert info.value.status == 200 and info.value.attempts == 1
    scen.script([{"body": UNPARSABLE}, {}])
    assert llmretry.call_llm(secret_body("bad"), **opts(scen)).meta.attempts == 2


@pytest.mark.parametrize("watched", [False, True], ids=["recorded-at-end", "item-by-item"])
def test_batch_values_and_summary_either_way(scen: Scenario, watched: bool) -> None:
    """The same batch, recorded at the end or watched item by item (a
    progress callable), gives the same values and the same summary."""
    scen.script([{}, {"status": 503}, {}, {"body": UNPARSABLE}, {"status": 400}, {}])
    seen: List[Any] = []
    extra: Dict[str, Any] = {"progress": lambda d, t, f: seen.append((d, f))} if watched else {}
    # retry_invalid_response=False: the unparsable body is not retried, so
    # each item takes the scripted step meant for it.
    out = llmretry.call_many([secret_body(f"w{i}") for i in range(5)], limit=1,
                             **opts(scen, retry_invalid_response=False, **extra))
    kinds = [type(v).__name__ for v in out]
    assert kinds == ["Result", "Result", "InvalidResponseError", "BadRequestError", "Result"]
    s = out.summary
    assert (s.items, s.ok, s.failed, s.not_started) == (5, 3, 2, 0)
    assert (s.attempts, s.retries) == (6, 1)
    # the mock's usage on each of the three successes (the unparsable
    # body has none)
    assert (s.prompt_tokens, s.completion_tokens, s.total_tokens) == (36, 9, 45)
    assert out[1].meta.attempts == 2
    if watched:
        assert seen[-1] == (5, 2) and len(seen) == 5


def test_limit_above_the_engines_cap_warns(scen: Scenario) -> None:
    client = llmretry.Client(max_in_flight=4, **opts(scen))
    try:
        with pytest.warns(RuntimeWarning, match=r"max_in_flight is 4.*Client\(max_in_flight=16\)"):
            out = client.call_many([secret_body("cap")] * 3, limit=16)
        assert out.summary.ok == 3
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            client.call_many([secret_body("cap")] * 2, limit=4)
    finally:
        client.close()


def test_meta_is_built_when_first_read(scen: Scenario) -> None:
    """A batch's Results keep their Meta's values until .meta is read (issue
    36: most callers read only .data); the Meta is then the same one every
    time, equal to the Python-built one, and a Result pickles with it."""
    usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    scen.script([{"status": 503}, {"content": "lazy", "usage": usage,
                                    "system_fingerprint": "fp_lazy"}])
    out = llmretry.call_many([secret_body("lazy")], limit=1, **opts(scen, base_delay_ms=1))
    res = out[0]
    assert type(res) is llmretry.Result
    # nothing built yet: what the Result holds is not a Meta
    assert type(res._meta) is not llmretry.Meta
    assert not gc.is_tracked(res._meta)
    m = res.meta
    assert type(m) is llmretry.Meta and res.meta is m and res._meta is m
    assert not gc.is_tracked(m)
    assert (m.attempt, m.attempts, m.status, m.usage, m.usage_total) == (1, 2, 200, usage, usage)
    assert m.model == secret_body("lazy")["model"] and m.system_fingerprint == "fp_lazy"
    assert isinstance(m.response_model, str)
    assert isinstance(m.request_id, str) and len(m.request_id) == 36
    assert m.stream is False and m.ttft_ms is None and m.chunks == 0 and m.target == 0
    # pickled with its Meta (built for the purpose when it was not yet)
    scen.script([{}])
    fresh = llmretry.call_many([secret_body("lazy2")], limit=1, **opts(scen))[0]
    back = pickle.loads(pickle.dumps(fresh))
    assert back.data == fresh.data and back.meta == fresh.meta
    assert type(back.meta) is llmretry.Meta
    back2 = pickle.loads(pickle.dumps(res))
    assert back2.meta == m and back2.data == res.data
    # A Result made in Python keeps whatever it was given
    r = llmretry.Result({"x": 1}, m)
    assert r.meta is m
    r.meta = back.meta
    assert r.meta is back.meta
    r._parsed = {"answer": 1}           # what response_model= sets: pickled too
    assert pickle.loads(pickle.dumps(r)).parsed == {"answer": 1}
