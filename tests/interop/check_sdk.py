"""The openai SDK on llmretry's transport against LiteLLM's proxy (issue 30):
a server nobody here wrote, through the SDK's own client, types and errors.

Run by tools/interop.sh (``make interop``). Each check prints one line; the
script exits 1 when any fails. Usage: check_sdk.py BASE_URL
"""

from __future__ import annotations

import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List

import httpx2
import openai

import llmretry.httpx2
from interop_util import Checks

KEY = "sk-1234"
checks = Checks()
check = checks.check


class Events:
    def __init__(self) -> None:
        self.seen: List[Dict[str, Any]] = []

    def __call__(self, ev: Dict[str, Any]) -> None:
        self.seen.append(ev)

    def count(self, name: str) -> int:
        return sum(1 for e in self.seen if e["event"] == name)


def given_up(events: Events) -> str:
    """What the calls that gave up went through: per call, each attempt's
    status and the delay after it (ms, its source), then the reason."""
    out = []
    for ev in events.seen:
        if ev["event"] != "llm_request_gave_up":
            continue
        steps = []
        for e in events.seen:
            if e["request_id"] != ev["request_id"]:
                continue
            if e["event"] == "llm_request_failed":
                steps.append(str(e["status"]))
            elif e["event"] == "llm_retry_scheduled":
                steps.append(f"+{e['delay_ms']}ms {e['delay_source']}")
        out.append(f"{ev['reason']} after {ev['attempts']} attempts in {ev['total_ms']} ms: "
                   f"{', '.join(steps)}")
    return "; ".join(out[:3]) or "no call gave up"


def sdk(base_url: str, **options: Any) -> openai.OpenAI:
    transport = llmretry.httpx2.Transport(base_delay_ms=200, max_delay_ms=2000, **options)
    return openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0,
                         http_client=httpx2.Client(transport=transport))


def main(base_url: str) -> int:
    msgs: Any = [{"role": "user", "content": "hi"}]

    def plain() -> str:
        events = Events()
        with sdk(base_url, logger=events) as client:
            raw = client.chat.completions.with_raw_response.create(model="fake-ok",
                                                                   messages=msgs)
            completion = raw.parse()
        text = completion.choices[0].message.content
        assert text == "hello from litellm", text
        assert events.count("llm_request_started") == 1, events.seen
        assert KEY not in repr(events.seen)
        return f"1 request, status {raw.status_code}, usage {completion.usage}"

    def server_error_typed() -> str:
        events = Events()
        with sdk(base_url, logger=events, max_retries=2) as client:
            try:
                client.chat.completions.create(model="fake-500", messages=msgs)
            except openai.InternalServerError as exc:
                assert exc.status_code == 500, exc
            else:
                raise AssertionError("no InternalServerError")
        n = events.count("llm_request_started")
        assert n == 3, f"{n} requests for max_retries=2"
        return "the SDK's InternalServerError after 3 requests (llmretry's retries)"

    def stream() -> str:
        with sdk(base_url) as client:
            chunks = client.chat.completions.create(model="fake-ok", messages=msgs, stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "hello from litellm", repr(text)
        return "the SDK's Stream parsed the transport's bytes"

    def models_list() -> str:
        # A GET of JSON is a call on the engine (one attempt here), and the
        # SDK parses the proxy's list as it would without llmretry.
        events = Events()
        with sdk(base_url, logger=events) as client:
            ids = sorted(m.id for m in client.models.list())
        assert "fake-ok" in ids, ids
        assert events.count("llm_request_succeeded") == 1, events.seen
        return f"{len(ids)} models through the engine ({', '.join(ids[:3])}, ...)"

    def async_many() -> str:
        async def run() -> List[str]:
            transport = llmretry.httpx2.AsyncTransport(max_in_flight=64)
            async with openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0,
                                          http_client=httpx2.AsyncClient(
                                              transport=transport)) as client:
                outs = await asyncio.gather(*(
                    client.chat.completions.create(model="fake-ok", messages=msgs)
                    for _ in range(50)))
            return [o.choices[0].message.content or "" for o in outs]

        texts = asyncio.run(run())
        assert texts == ["hello from litellm"] * 50, set(texts)
        return "50 AsyncOpenAI calls at once on one AsyncTransport"

    def rate_limited() -> str:
        # LiteLLM's rpm limit answers 429s naming no wait: nothing is
        # configured, the transport slows the endpoint down, no call fails.
        # (LiteLLM counts per calendar minute: check_litellm.py's batch may
        # have used some of this one's, so the first wave can overflow it
        # and the rest of the minute is refused.)
        events = Events()
        with sdk(base_url, logger=events) as client:
            def one(i: int) -> str:
                try:
                    return client.chat.completions.create(
                        model="fake-limited-60",
                        messages=[{"role": "user", "content": f"n{i}"}]
                    ).choices[0].message.content or ""
                except openai.APIError as exc:
                    return f"{type(exc).__name__} {getattr(exc, 'status_code', '')}"
            with ThreadPoolExecutor(16) as pool:
                texts = list(pool.map(one, range(150)))
        lost = [t for t in texts if t != "limited"]
        assert not lost, f"{150 - len(lost)} of 150 ok; {lost[:2]}; {given_up(events)}"
        return (f"150 of 150 through 16 SDK threads, {events.count('llm_request_started')} "
                f"requests")

    check("plain", plain)
    check("server_error_typed", server_error_typed)
    check("stream", stream)
    check("models_list", models_list)
    check("async_many", async_many)
    check("rate_limited", rate_limited)
    return checks.summary("openai SDK")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
