"""What llmretry does against llama-cpp-python's server (nobody here wrote it).

Run by tools/interop.sh (``make interop``) against
``python -m llama_cpp.server`` on the tiny random-weight model of
tools/interop_tiny_gguf.py, started with ``--n_ctx 512``. The model talks
nonsense, but real nonsense: the tokens, usage counts, SSE framing and
errors are llama.cpp's and its server's. Requests are counted from the
server's uvicorn access log. Each check prints one line; the script exits 1
when any fails. Usage: check_llama.py BASE_URL ACCESS_LOG
"""

from __future__ import annotations

import http.client
import json
import sys
import time
import urllib.parse
from typing import Any, Dict

import llmretry
from interop_util import AccessLog, Checks

MODEL = "tiny"
N_CTX = 512


def body(text: str = "hello world", **extra: Any) -> Dict[str, Any]:
    b: Dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": text}],
                         "max_tokens": 16, "temperature": 0, "seed": 7}
    b.update(extra)
    return b


def content(res: llmretry.Result) -> str:
    return res.data["choices"][0]["message"]["content"]


def main(base_url: str, access_log: str) -> int:
    checks = Checks()
    log = AccessLog(access_log)
    # No key: the server wants none (llmretry sends no Authorization then).
    client = llmretry.Client(base_url=base_url, api_key="", logger=None,
                             base_delay_ms=100, max_delay_ms=500)
    plain: Dict[str, Any] = {}

    def plain_calls() -> str:
        a = client.call_llm(body())
        b = client.call_llm(body())
        assert a.meta.attempts == 1 and not a.meta.stream, a.meta
        usage = a.meta.usage
        assert usage is not None and usage["prompt_tokens"] > 0, usage
        plain.update(text=content(a), usage=usage, same=content(a) == content(b),
                     finish=a.data["choices"][0]["finish_reason"])
        return (f"{usage}, finish_reason {plain['finish']}, "
                f"{'deterministic' if plain['same'] else 'NOT deterministic'} at temperature 0")

    def streamed_call() -> str:
        mark = log.mark()
        res = client.call_llm(body(stream=True))
        m = res.meta
        assert m.stream is True and m.chunks > 1, m
        assert m.attempts == 1 and m.resends == 0, m
        got = content(res)
        if plain.get("same"):
            assert got == plain["text"], f"stream {got!r} != plain {plain['text']!r}"
            assert res.data["choices"][0]["finish_reason"] == plain["finish"], res.data
        else:
            assert got, "empty content"
        # llama-cpp-python 0.3.36 ignores stream_options and sends no usage
        # in a stream; a later one that does must count as its plain call.
        if m.usage is not None:
            assert m.usage["prompt_tokens"] == plain["usage"]["prompt_tokens"] > 0, m.usage
        sent = log.since(mark, 1)
        assert sent == [200], f"the server received {sent}"
        same = "equal to the plain call" if plain.get("same") else "non-empty"
        usage = m.usage if m.usage is not None else "none (the server sends none)"
        return f"{m.chunks} chunks, content {same}, usage {usage}, 1 request"

    def raw_stream() -> str:
        # What the server sends, read without llmretry.
        url = urllib.parse.urlsplit(base_url)
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        payload = json.dumps(body(stream=True, stream_options={"include_usage": True}))
        conn.request("POST", url.path + "/chat/completions", payload,
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        ctype = resp.getheader("Content-Type", "")
        raw = resp.read()
        conn.close()
        assert resp.status == 200 and ctype.startswith("text/event-stream"), (resp.status, ctype)
        ends = "CRLF" if b"\r\n" in raw else "CR" if b"\r" in raw else "LF"
        data = [line[len(b"data: "):] for line in raw.replace(b"\r\n", b"\n").split(b"\n")
                if line.startswith(b"data: ")]
        assert data and data[-1] == b"[DONE]", raw[-200:]
        docs = [json.loads(d) for d in data[:-1]]
        with_usage = sum(1 for d in docs if d.get("usage"))
        empty = sum(1 for d in docs for ch in d.get("choices", [])
                    if ch.get("delta", {}).get("content") == "")
        comments = sum(1 for line in raw.split(b"\n") if line.startswith(b":"))
        return (f"{ctype}, {ends} line ends, {len(docs)} chunks then [DONE], "
                f"{with_usage} with usage, {empty} empty content deltas, {comments} comments")

    long_prompt = " ".join(["hello"] * N_CTX)

    def over_context_plain() -> str:
        mark = log.mark()
        try:
            client.call_llm(body(long_prompt), max_retries=2)
        except llmretry.HTTPStatusError as exc:
            assert (exc.status, exc.attempts) == (400, 1), repr(exc)
            assert exc.error_code == "context_length_exceeded", exc.error_code
            sent = log.since(mark, 1)
            assert sent == [400], f"the server received {sent}"
            return f"HTTP 400 {exc.error_code}, not retried"
        raise AssertionError("no error")

    def over_context_streamed() -> str:
        # The server starts the event stream, then generation fails at once:
        # 200 text/event-stream, an empty chunked body. A stream cut before
        # its first event, retried; nothing tells it from a transient cut.
        mark = log.mark()
        try:
            client.call_llm(body(long_prompt, stream=True), max_retries=2)
        except llmretry.LLMError as exc:
            assert (exc.kind, exc.status, exc.attempts) == ("network", 200, 3), repr(exc)
            assert "stream ended after 0 chunks" in str(exc), str(exc)
            sent = log.since(mark, 3)
            assert sent == [200] * 3, f"the server received {sent}"
            return f"{exc.attempts} attempts (3 requests), {str(exc)[:80]}..."
        raise AssertionError("no error")

    def idle_keepalive() -> str:
        # uvicorn closes a kept-alive connection idle for 5 s: the next
        # stream must not pay an attempt for it, in either mode.
        out = []
        for mode in ("safe", "unsafe"):
            c = llmretry.Client(base_url=base_url, api_key="", logger=None, retry_mode=mode)
            try:
                c.call_llm(body(stream=True))
                time.sleep(6.5)
                mark = log.mark()
                res = c.call_llm(body(stream=True))
                assert res.meta.attempts == 1, f"{mode}: {res.meta.attempts} attempts"
                sent = log.since(mark, 1 + res.meta.resends)
                assert len(sent) == 1 + res.meta.resends, f"{mode}: the server received {sent}"
                out.append(f"{mode}: 1 attempt, {res.meta.resends} re-sends, "
                           f"{len(sent)} request(s)")
            finally:
                c.close()
        return "; ".join(out)

    def openai_sdk() -> str:
        # The openai SDK on llmretry.httpx against a server nobody here wrote:
        # its answers as the SDK reads them without llmretry, its stream's
        # label (with a charset) kept, and an empty stream an error, where
        # the SDK alone reads it as an empty answer.
        import httpx
        import openai
        import llmretry.httpx
        sdk = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0,
                            http_client=httpx.Client(transport=llmretry.httpx.Transport(
                                max_retries=1, base_delay_ms=100)))
        try:
            b = body()
            whole = sdk.chat.completions.create(**b)
            assert whole.usage is not None and whole.usage.prompt_tokens > 0, whole.usage
            stream = sdk.chat.completions.create(**b, stream=True)
            label = stream.response.headers["content-type"]
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            assert label.startswith("text/event-stream;"), label
            assert text == whole.choices[0].message.content, (text, whole)
            mark = log.mark()
            try:
                list(sdk.chat.completions.create(**body(long_prompt), stream=True))
            except openai.APIConnectionError as exc:
                cause = str(exc.__cause__)
                assert "stream ended after 0 chunks" in cause, cause
                assert log.since(mark, 2) == [200] * 2
            else:
                raise AssertionError("an empty stream read as an answer")
            # A GET of JSON is a call on the engine too: the server's list as
            # the SDK parses it.
            models = [m.id for m in sdk.models.list()]
            assert models == ["tiny"], models
            return (f"usage {whole.usage.total_tokens} tokens; the stream ({label}) says what "
                    f"the whole answer said; an empty stream: APIConnectionError after 2 "
                    f"requests; models.list() {models}")
        finally:
            sdk.close()

    checks.check("plain calls: real usage", plain_calls)
    checks.check("a streamed call", streamed_call)
    checks.check("what the server streams", raw_stream)
    checks.check("a prompt over n_ctx: a 400, not retried", over_context_plain)
    checks.check("a prompt over n_ctx with stream: true: an empty stream", over_context_streamed)
    checks.check("a stream after the 5 s keep-alive timeout", idle_keepalive)
    checks.check("the openai SDK on llmretry.httpx", openai_sdk)

    def asyncio_calls() -> str:
        # The asyncio surface against a real model server: a stream read on
        # the loop, its text equal to the plain call's at temperature 0.
        import asyncio

        async def run() -> str:
            mark = log.mark()
            async with client.astream_llm(body()) as s:
                texts = [t async for t in s.text_deltas()]
                res = await s.result()
            if plain.get("same"):
                assert "".join(texts) == plain["text"], (texts, plain["text"])
            assert content(res) == "".join(texts), res.data
            many = await asyncio.gather(*(client.acall_llm(body()) for _ in range(3)))
            if plain.get("same"):
                assert all(content(r) == plain["text"] for r in many)
            sent = log.since(mark, 4)
            assert sent == [200] * 4, f"the server received {sent}"
            return f"astream {len(texts)} deltas, 3 gathered acall_llm, 4 requests"
        return asyncio.run(run())

    checks.check("astream_llm and acall_llm under asyncio", asyncio_calls)

    def preempted_streams() -> str:
        # Issue 27, item 2: the server's default interrupt_requests ends a
        # stream a newer request pre-empts with a role-only chunk and [DONE]
        # (no content, no finish_reason). That is a cut stream, retried, and
        # never a success with no answer.
        import asyncio

        async def run() -> str:
            mark = log.mark()
            out = await client.acall_many([body(f"hello {i}", stream=True) for i in range(40)],
                                          limit=4)
            ok = [v for v in out if isinstance(v, llmretry.Result)]
            empty = [v for v in ok if not content(v)
                     or v.data["choices"][0].get("finish_reason") is None]
            assert not empty, f"{len(empty)} successes without an answer: {empty[0].data}"
            bad = [v for v in out if not isinstance(v, llmretry.Result)
                   and getattr(v, "kind", None) not in ("network", "stream_interrupted")]
            assert not bad, f"unexpected failures: {bad[:2]!r}"
            s = out.summary
            sent = log.since(mark, s.attempts)
            assert len(sent) == s.attempts, f"{s.attempts} attempts, {len(sent)} requests"
            return (f"{s.ok} ok with an answer, {s.failed} failed as cut streams, "
                    f"{s.attempts} attempts for 40 items")
        return asyncio.run(run())

    checks.check("streams pre-empted by interrupt_requests are not empty successes",
                 preempted_streams)

    # Issue 31. llama-cpp-python 0.3.36 constrains its answer by a JSON Schema
    # given its own way, {"type": "json_object", "schema": ...} (it answers
    # OpenAI's {"type": "json_schema", ...} with a 500 from its request
    # validation), so the core checks the answer through the schema option.
    point = {"type": "object", "properties": {"a": {"type": "integer"}},
             "required": ["a"], "additionalProperties": False}

    def constrained(i: int) -> Dict[str, Any]:
        return body(f"hello {i}", max_tokens=64,
                    response_format={"type": "json_object", "schema": point})

    def schema_batch() -> str:
        mark = log.mark()
        out = client.call_many([constrained(i) for i in range(8)], limit=2, schema=point)
        s = out.summary
        lost = [repr(v)[:160] for v in out if not isinstance(v, llmretry.Result)]
        assert s.ok == 8 and s.attempts == 8, f"{s}; {lost[:2]}"
        for v in out:
            assert isinstance(v.data["choices"][0]["message"]["content"], str)
        sent = log.since(mark, 8)
        assert sent == [200] * 8, f"the server received {sent}"
        return f"8 of 8 valid at the first attempt, {s.total_tokens} tokens"

    def wrong_server_schema() -> str:
        # The server is held to `point`, the caller asks for another shape:
        # every answer is a mismatch the core catches and retries, and the
        # tokens of each attempt are counted.
        other = {"type": "object", "properties": {"b": {"type": "string"}},
                 "required": ["b"], "additionalProperties": False}
        mark = log.mark()
        try:
            client.call_llm(constrained(1), schema=other, max_retries=2)
        except llmretry.InvalidResponseError as exc:
            assert exc.attempts == 3, repr(exc)
            paths = {e["path"] for e in exc.validation_errors}
            assert "$.b" in paths, exc.validation_errors
            total = exc.usage_total
            assert total and total["prompt_tokens"] > 0, total
            sent = log.since(mark, 3)
            assert sent == [200] * 3, f"the server received {sent}"
            return (f"3 attempts, errors at {sorted(paths)}, usage_total {total}")
        raise AssertionError("no error")

    checks.check("a batch constrained by the server's grammar passes the schema", schema_batch)
    checks.check("a server held to another schema: caught, retried, tokens counted",
                 wrong_server_schema)
    client.close()
    return checks.summary("llama.cpp")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
