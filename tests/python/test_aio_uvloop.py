"""llmretry's asyncio API on uvloop (issue 17).

uvloop is the event loop of many async web services (uvicorn picks it when it
is installed); it implements add_reader with libuv, not with selectors, so the
engine channel that each loop watches must work there too. Every test runs its
coroutine in a fresh uvloop loop (``uvloop.run``), against the session's mock
server.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Awaitable, Callable, Dict, List, Tuple, TypeVar

import pytest
# tools/ensure-deps.sh installs uvloop (>= 0.18, for uvloop.run): not
# installed is an error here, never a skip.
import uvloop

import llmretry
from conftest import FAST, SECRET_KEY, Scenario, secret_body

T = TypeVar("T")


def run_on_uvloop(main: Callable[[], Awaitable[T]]) -> T:
    async def checked() -> T:
        # The loop really is uvloop's (not a silently kept default policy).
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        return await main()
    return uvloop.run(checked())


def opts(scen: Scenario, **kw: Any) -> Dict[str, Any]:
    return dict(FAST, base_url=scen.url, api_key=SECRET_KEY, logger=None, **kw)


def content(res: Any) -> str:
    return res.data["choices"][0]["message"]["content"]


def test_50_concurrent_calls(scen: Scenario) -> None:
    # Each answer waits 300 ms: one at a time they would take 15 s.
    scen.script([], after={"delay_ms": 300, "content": "fifty"})

    async def main() -> List[Any]:
        return await asyncio.gather(*(llmretry.acall_llm(secret_body(f"c{i}"), **opts(scen))
                                      for i in range(50)))

    t0 = time.monotonic()
    results = run_on_uvloop(main)
    wall = time.monotonic() - t0
    assert len(results) == 50 and all(content(r) == "fifty" for r in results)
    assert all(r.meta.attempts == 1 for r in results)
    assert len({r.meta.request_id for r in results}) == 50
    # Each body went out once (no call lost, none sent twice).
    sent = sorted(json.loads(r["body"])["messages"][1]["content"] for r in scen.requests())
    assert sent == sorted(f"SECRET-PROMPT-c{i}" for i in range(50))
    assert wall < 5.0, f"50 calls of 300 ms took {wall:.2f} s: not concurrent"


def test_stream_read_to_the_end(scen: Scenario) -> None:
    scen.script([{"stream": {"chunks": 5, "delay_ms": 20}, "content": "hello world"}])

    async def main() -> Any:
        texts: List[str] = []
        async with llmretry.astream_llm(secret_body("s"), **opts(scen)) as s:
            async for text in s.text_deltas():
                texts.append(text)
            res = await s.result()
        return texts, res

    texts, res = run_on_uvloop(main)
    assert "".join(texts) == "hello world"
    assert len([t for t in texts if t]) == 5
    assert content(res) == "hello world"
    assert res.meta.stream is True and res.meta.attempts == 1
    assert scen.requests()[0]["client_gone"] is False


def test_acall_many_of_20(scen: Scenario) -> None:
    # One transient failure in the batch: retried, and the batch still all ok.
    scen.script([{"status": 503, "retry_after": "0"}], after={"delay_ms": 20})
    bodies = [secret_body(f"b{i}") for i in range(20)]

    async def main() -> Any:
        return await llmretry.acall_many(bodies, limit=4, **opts(scen))

    out = run_on_uvloop(main)
    assert out.summary.ok == 20 and out.summary.failed == 0, out.summary
    assert len(out) == 20 and all(content(r) == "ok" for r in out)
    assert len(scen.requests()) == 21


def test_cancelled_call_raises_and_closes_the_connection(scen: Scenario) -> None:
    # A streaming body (acall_llm assembles it), so that the mock watches the
    # connection while it holds the first event back, and records client_gone.
    # The call's own timeouts are far away: only the cancel can close it.
    scen.script([{"stream": {"first_delay_ms": 30000}}])
    body = secret_body("cancel", stream=True)
    slow = opts(scen, max_retries=0, timeout_ms=60000, idle_timeout_ms=60000)

    def gone() -> bool:
        return bool(scen.requests()[0].get("client_gone"))

    async def main() -> Tuple[float, float]:
        task = asyncio.ensure_future(llmretry.acall_llm(body, **slow))
        end = time.monotonic() + 10
        while not scen.requests() and time.monotonic() < end:
            await asyncio.sleep(0.02)
        assert scen.requests(), "the call never reached the server"
        await asyncio.sleep(0.2)  # the response headers are in, the mock waits
        assert not task.done() and not gone()
        t0 = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        cancel_s = time.monotonic() - t0
        # Seen from inside the loop: nothing (loop shutdown, a timeout) but
        # the cancel itself can have closed the connection by then.
        while not gone() and time.monotonic() - t0 < 3.0:
            await asyncio.sleep(0.02)
        gone_s = time.monotonic() - t0
        # The loop and the default client still work after the cancel.
        res = await llmretry.acall_llm(secret_body("next"), **opts(scen.sub("after")))
        assert content(res) == "ok"
        return cancel_s, gone_s

    cancel_s, gone_s = run_on_uvloop(main)
    assert cancel_s < 1.0, f"the cancel took {cancel_s:.2f} s to raise"
    assert gone(), "the mock must see the cancelled call's connection closed"
    assert gone_s < 3.0
    assert len(scen.requests()) == 1, "a cancelled call is not retried"
