"""Each model on a key is an endpoint of its own: providers limit models
apart and say so per model (OpenAI's limits; a gateway's, LiteLLM's
included, whose x-ratelimit-* are the answering model's). So one model's
learned limit, 429 pause and breaker leave the other models of the same URL
and key alone. Before, one call to a model limited to 10 a minute paced
every model of that gateway at 10 (tests/interop/check_litellm.py's
"models limited apart": 20 calls of another model went from 0.1 s to 122 s).

The gateway here is one mock scenario routing each model to a scenario of
its own (the mock's ``route``): one URL, one key, per-model limits."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import pytest

import llmretry
from conftest import FAST, SECRET_KEY
from test_shared import shm_store


def body(model: str) -> Dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}]}


def gateway(scen: Any, **slow_limits: Any) -> Tuple[str, Any, Any]:
    """One URL serving "m-slow" (a scenario of its own, limited as given)
    and "m-fast" (another, unlimited): the URL and the two scenarios."""
    slow, fast = scen.sub("slow"), scen.sub("fast")
    if slow_limits:
        scen.server.script(slow.name, [], None, limits=slow_limits)
    scen.server.script(scen.name, [], None, route={"m-slow": slow.name, "m-fast": fast.name})
    return scen.url, slow, fast


def by_model(client: llmretry.Client) -> Dict[Any, Dict[str, Any]]:
    return {s["model"]: s for s in client.endpoint_stats()}


def test_a_models_learned_limit_paces_that_model_alone(scen: Any) -> None:
    # 2 a minute, said in every answer's x-ratelimit-limit-requests.
    url, slow, fast = gateway(scen, rpm=2, window_ms=60000)
    with llmretry.Client(api_key=SECRET_KEY, logger=None, base_url=url, **FAST) as client:
        client.call_llm(body("m-slow"))
        # A call of the same model waits ~30 s for its turn: past its deadline.
        with pytest.raises(llmretry.DeadlineExceededError) as ei:
            client.call_llm(body("m-slow"), deadline_ms=300)
        assert ei.value.attempts == 0 and "rate budget" in str(ei.value)
        # Another model of the gateway is not paced by it.
        metas = [client.call_llm(body("m-fast"), deadline_ms=3000).meta for _ in range(5)]
        stats = by_model(client)
    assert [m.attempts for m in metas] == [1] * 5
    assert len(fast.requests()) == 5 and len(slow.requests()) == 1
    assert set(stats) == {"m-slow", "m-fast"}
    assert stats["m-slow"]["rpm"] == 2 and stats["m-fast"]["rpm"] == 0
    assert stats["m-slow"]["url"] == stats["m-fast"]["url"]


def test_a_429_of_one_model_pauses_that_model_alone(scen: Any) -> None:
    url, slow, fast = gateway(scen)
    slow.script([{"status": 429, "retry_after": "30"}])
    with llmretry.Client(api_key=SECRET_KEY, logger=None, base_url=url, **FAST) as client:
        with pytest.raises(llmretry.RateLimitError):
            client.call_llm(body("m-slow"), max_retries=0)
        # Its named wait (30 s) holds that model's calls ...
        with pytest.raises(llmretry.DeadlineExceededError):
            client.call_llm(body("m-slow"), deadline_ms=300)
        # ... and not the other model's.
        res = client.call_llm(body("m-fast"), deadline_ms=3000)
    assert res.meta.attempts == 1
    assert len(slow.requests()) == 1 and len(fast.requests()) == 1


def test_a_breaker_per_model_sends_a_fallback_on_the_same_gateway_at_once(scen: Any) -> None:
    """A model that is down on a gateway, with a fallback to another model
    of that gateway: its breaker opens after its own failures, and the
    calls after go to the fallback without trying it. With one breaker for
    the URL, the fallback's successes reset the count after every failure:
    it never opened, and every call paid a request to the dead model."""
    url, slow, fast = gateway(scen)
    slow.script([], after={"status": 500})
    with llmretry.Client(api_key=SECRET_KEY, logger=None, base_url=url, breaker_failures=2,
                         breaker_cooldown_ms=60000, max_retries=0,
                         fallbacks=[{"model": "m-fast"}]) as client:
        metas = [client.call_llm(body("m-slow")).meta for _ in range(5)]
        stats = by_model(client)
    assert [m.target for m in metas] == [1] * 5
    assert len(slow.requests()) == 2 and len(fast.requests()) == 5
    assert stats["m-slow"]["breaker"] == "open" and stats["m-slow"]["short_circuited"] == 3
    assert stats["m-fast"]["breaker"] == "closed"


def test_a_shared_store_keeps_each_models_limit_apart(scen: Any) -> None:
    """Two engines on one shm store: the limit the first learned for m-slow
    (kept in the store, where every process reads it) does not pace the
    second's m-slow's neighbour m-fast."""
    url, slow, fast = gateway(scen, rpm=2, window_ms=60000)
    with shm_store() as spec:
        with llmretry.Client(api_key=SECRET_KEY, logger=None, base_url=url, shared=spec,
                             **FAST) as first:
            first.call_llm(body("m-slow"))
        with llmretry.Client(api_key=SECRET_KEY, logger=None, base_url=url, shared=spec,
                             **FAST) as second:
            metas = [second.call_llm(body("m-fast"), deadline_ms=3000).meta for _ in range(3)]
            stats = by_model(second)
    assert [m.attempts for m in metas] == [1] * 3
    assert len(slow.requests()) == 1 and len(fast.requests()) == 3
    assert list(stats) == ["m-fast"] and stats["m-fast"]["rpm"] == 0


def test_calls_that_name_no_model_are_one_endpoint(scen: Any) -> None:
    with llmretry.Client(api_key=SECRET_KEY, logger=None, base_url=scen.url, **FAST) as client:
        for _ in range(2):
            client.call_llm({"messages": [{"role": "user", "content": "hi"}]})
        stats = client.endpoint_stats()
    assert len(stats) == 1 and stats[0]["model"] is None and stats[0]["requests"] == 2


def test_a_key_has_at_most_64_models(scen: Any) -> None:
    """The model comes from the body, which a gateway's downstream clients
    write: made-up names past the 64th share the URL and key's endpoint
    without a model, rather than using up the engine's 256 endpoints (and a
    shared store's slots) before the real models have theirs."""
    with llmretry.Client(api_key=SECRET_KEY, logger=None, base_url=scen.url, **FAST) as client:
        for i in range(70):
            client.call_llm(body(f"made-up-{i}"))
        client.call_llm(body("made-up-3"))             # one of the 64: its own again
        stats = client.endpoint_stats()
    models = [s["model"] for s in stats]
    assert models == [f"made-up-{i}" for i in range(64)] + [None], models
    assert stats[3]["requests"] == 2 and stats[64]["requests"] == 6


def test_a_429_of_one_model_holds_a_batchs_items_of_that_model_alone(scen: Any) -> None:
    """A batch's items wait out a 429's named pause only when they go to the
    model that was refused. Before, the pause was the batch's: one model's
    30 s held every item of every model, and here the m-fast items waited
    past their 5 s deadline."""
    url, slow, fast = gateway(scen)
    slow.script([], after={"status": 429, "retry_after": "30"})
    bodies = [body("m-slow")] + [body("m-slow"), body("m-fast")] * 4 + [body("m-fast")] * 8
    with llmretry.Client(api_key=SECRET_KEY, logger=None, base_url=url,
                         **{**FAST, "max_retries": 0}) as client:
        out = client.call_many(bodies, limit=4, adaptive=False, call_deadline_ms=5000)
    slow_items = [i for i, b in enumerate(bodies) if b["model"] == "m-slow"]
    fast_items = [i for i, b in enumerate(bodies) if b["model"] == "m-fast"]
    assert [out[i].meta.attempts for i in fast_items] == [1] * 12
    assert len(fast.requests()) == 12
    # The refused model: its first wave was sent, then its items waited out
    # their deadlines without a request.
    sent = len(slow.requests())
    assert 1 <= sent <= 4 and out.summary.ok == 12 and out.summary.pauses >= 1
    errors = [out[i] for i in slow_items]
    assert sum(isinstance(x, llmretry.RateLimitError) for x in errors) == sent
    held = [x for x in errors if isinstance(x, llmretry.DeadlineExceededError)]
    assert len(held) == 5 - sent
    assert all(x.attempts == 0 and "pause" in str(x) for x in held), held


def test_a_batchs_held_items_start_when_their_models_pause_ends(scen: Any) -> None:
    """The items held for their model go before the batch's later items
    once the pause is over, and the batch's window never runs more than
    its limit; the other model's items went on meanwhile (they finished
    first although they come after in the input)."""
    url, slow, fast = gateway(scen)
    slow.script([{"status": 429, "retry_after": "3"}], after={"delay_ms": 20})
    fast.script([], after={"delay_ms": 20})
    bodies = [body("m-slow")] * 4 + [body("m-fast")] * 12
    order: List[int] = []
    with llmretry.Client(api_key=SECRET_KEY, logger=None, base_url=url, **FAST) as client:
        out = client.call_many(bodies, limit=2, adaptive=False,
                               on_result=lambda i, r: order.append(i))
    assert out.summary.ok == 16 and out.summary.pauses == 1
    # Items 0 and 1 were the first wave: whichever reached the mock first
    # was refused, then retried after the pause. Items 2 and 3 were held for
    # m-slow while all twelve m-fast items ran (12 x 20 ms in the one place
    # left: well inside the 3 s pause, even under ASan).
    first, last = set(order[:13]), set(order[13:])
    assert first - {0, 1} == set(range(4, 16)) and len(first & {0, 1}) == 1, order
    assert last - {0, 1} == {2, 3} and len(last & {0, 1}) == 1, order
    assert len(slow.requests()) == 5 and len(fast.requests()) == 12


def test_a_batch_holds_the_items_of_8_paused_models_and_lets_the_rest_wait_in_its_window(
        scen: Any) -> None:
    """A batch keeps apart the items of up to 8 paused models; the items of
    a ninth and tenth wait for their endpoint inside the batch's window, as
    all did before the holds. Either way nothing is sent to a paused model."""
    names = [f"m{i}" for i in range(10)]
    subs = {name: scen.sub(name) for name in names}
    for sub in subs.values():
        sub.script([], after={"status": 429, "retry_after": "30"})
    routes = {name: sub.name for name, sub in subs.items()}
    fast = scen.sub("fast")
    routes["m-fast"] = fast.name
    scen.server.script(scen.name, [], None, route=routes)
    with llmretry.Client(api_key=SECRET_KEY, logger=None, base_url=scen.url,
                         **{**FAST, "max_retries": 0}) as client:
        first = client.call_many([body(n) for n in names], limit=10)
        assert all(isinstance(x, llmretry.RateLimitError) for x in first), first
        # Every model is paused for 30 s now; the fast model is not.
        out = client.call_many([body(n) for n in names] + [body("m-fast")] * 8, limit=4,
                               adaptive=False, call_deadline_ms=2000)
    assert [r.meta.attempts for r in out[10:]] == [1] * 8
    held = out[:10]
    assert all(isinstance(x, llmretry.DeadlineExceededError) and x.attempts == 0
               for x in held), held
    in_holds = [i for i, x in enumerate(held) if "pause" in str(x)]
    in_window = [i for i, x in enumerate(held) if "rate budget" in str(x)]
    assert in_holds == list(range(8)) and in_window == [8, 9], [str(x) for x in held]
    assert len(fast.requests()) == 8
    assert [len(sub.requests()) for sub in subs.values()] == [1] * 10
