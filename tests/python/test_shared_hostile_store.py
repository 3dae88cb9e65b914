"""A store that is not quite Redis (docs/shared.md, "When Redis is out of
reach"): whatever a server at the Redis URL sends, or does not send, every
call works on the local budget at once, the change is reported once with
words that say what went wrong, and closing the client never waits on that
server. The servers are tests/python/fake_redis.py's."""

from __future__ import annotations

import re
import threading
from typing import Any, Dict, Iterator

import pytest

import llmretry
from fake_redis import CASES, FakeRedis, bulk, relay
from llmretry.testing import MockServer
from redis_server import RedisServer

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
# Far longer than the store's 50 ms, far shorter than a hang: a close that
# waits on a server dripping a reply never ends (its drip outlasts the test).
CLOSE_BOUND_S = 10


@pytest.fixture
def mock() -> Iterator[MockServer]:
    with MockServer() as server:
        yield server


def _strings_for_numbers(reply: bytes) -> bytes:
    """Redis's reply with each integer sent as a bulk string ("7", not 7)."""
    return re.sub(rb":(-?[0-9]+)\r\n", lambda m: bulk(m.group(1)), reply)


def _use(url: str, mock: MockServer, scen: str) -> Dict[str, Any]:
    """Three calls on a client sharing through `url`, then its close, in a
    thread: what they saw, and whether the close came back."""
    out: Dict[str, Any] = {"events": []}

    def run() -> None:
        client = llmretry.Client(base_url=mock.scenario_url(scen), shared=url, rpm=600,
                                 logger=out["events"].append)
        out["metas"] = [client.call_llm(BODY)[1] for _ in range(3)]
        out["stats"] = client.endpoint_stats()
        client.close()
        out["closed"] = True

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(CLOSE_BOUND_S)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_a_store_that_is_not_quite_redis(case: str, mock: MockServer) -> None:
    answer, says = CASES[case]
    mock.script("s", [])
    with FakeRedis(answer) as fake:
        out = _use(fake.url, mock, "s")
        assert out.get("closed"), f"the client did not close within {CLOSE_BOUND_S} s: {out}"
        names = fake.names()
    assert b"SCRIPT" in names                   # the store did talk to it
    assert [m.attempts for m in out["metas"]] == [1, 1, 1]
    assert len(mock.requests("s")) == 3
    down = [e for e in out["events"] if e["event"] == "llm_shared_unavailable"]
    assert len(down) == 1, out["events"]
    assert down[0]["shared"] == fake.url
    assert down[0]["error_message"].startswith(fake.url + ": "), down[0]
    assert says in down[0]["error_message"], down[0]
    assert not [e for e in out["events"] if e["event"] == "llm_shared_recovered"]


def test_the_fake_is_taken_for_redis_when_it_passes_redis_on(mock: MockServer) -> None:
    # The control: the same server relaying every command to a real
    # redis-server is a store that is up (no event, rounds made). Without
    # it, every case above could pass on a fake the store never accepts.
    mock.script("ok", [])
    with RedisServer() as redis, FakeRedis(relay(redis.port)) as fake:
        out = _use(fake.url, mock, "ok")
        assert out.get("closed"), out
        names = fake.names()
    assert names[0] == b"SCRIPT" and b"EVALSHA" in names, names
    assert [m.attempts for m in out["metas"]] == [1, 1, 1]
    assert not [e for e in out["events"] if e["event"].startswith("llm_shared")], out["events"]


def test_the_scripts_answer_with_strings_for_numbers(mock: MockServer) -> None:
    # Redis's own answers, of the right length, each number a string: not
    # the script's answer (a mirror made of it would read each as 0).
    mock.script("str", [])
    with RedisServer() as redis, \
            FakeRedis(relay(redis.port, _strings_for_numbers)) as fake:
        out = _use(fake.url, mock, "str")
        assert out.get("closed"), out
        names = fake.names()
    assert b"EVALSHA" in names, names
    assert [m.attempts for m in out["metas"]] == [1, 1, 1]
    down = [e for e in out["events"] if e["event"] == "llm_shared_unavailable"]
    assert len(down) == 1 and "the script failed (an unexpected reply)" in \
        down[0]["error_message"], out["events"]
