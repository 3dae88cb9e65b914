"""The streaming benchmark: ``llmretry.stream_llm`` next to the openai SDK's
sync and async streaming, against the local SSE server (bench/sse_server.py).
See bench/README.md ("Streaming benchmark"); bench/run_stream.sh drives it and
bench/stream_report.py makes the tables.

    python3 bench/bench_stream.py MEASURE CLIENT --base-url URL [options]

One measurement of one client in this (fresh) process, printed as one line
``RESULT client=... mode=MEASURE key=value ...``; a failed or short stream
exits non-zero. MEASURE and its clients:

- ``cpu`` (llmretry, llmretry-text, openai, openai-async): a warm-up stream
  of 200 chunks (connection open, code warm), then one of ``--chunks``
  (20,000) from the ``fast`` stream (prebuilt, written at once). CPU =
  ``getrusage(RUSAGE_SELF)`` user + sys over the second stream, the whole
  process (llmretry's engine I/O thread included; the server is another
  process) ÷ chunks read; ``main_us`` is the reading thread's share
  (``time.thread_time()``).
- ``latency`` (llmretry, openai, openai-async): after the warm-up, a
  ``paced`` stream of ``--paced`` chunks, one every ``--every-ms``; each
  chunk's content is the server's ``time.monotonic_ns()`` at its write; the
  client takes ``time.monotonic_ns()`` as soon as its iterator yields the
  chunk: delay = receive - send (CLOCK_MONOTONIC, one clock for both
  processes). Median, p99, mean, max, and the CPU per chunk at that pace.
- ``rss`` (llmretry, openai-async): VmRSS after the warm-up (gc collected),
  then ``--streams`` (1,000) ``hold`` streams opened at once, one chunk read
  from each (the server holds the rest), VmRSS again: the difference ÷
  streams. llmretry: ``Client(max_in_flight=streams+16)``, all
  ``stream_llm`` calls and the first reads from this one thread (the calls
  run on the engine; chunks wait in the mailboxes). openai: ``AsyncOpenAI``
  with ``streams`` tasks (its connection limit raised to streams+64). The
  server's count of held streams at that moment is recorded; then
  ``/release`` and every stream is read to its end and checked.
- ``slow`` (llmretry, openai): a ``big`` stream of ``--big-mib`` MiB of
  content in chunks of ``--big-size`` bytes. Read the first chunk, stop
  reading for ``--pause`` s (the server could send everything meanwhile),
  then read slowly (``--slow-sleep-ms`` every 10 chunks). VmRSS is sampled
  every 10 ms from a thread; reported as growth over the RSS before the
  stream: after the pause, the peak while reading, and after the result
  (llmretry's ``s.result()`` holds the assembled chat.completion: its content
  is the whole 50 MiB, by design).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import sys
import threading
import time
import urllib.request
from typing import Any, Dict, List, Tuple

API_KEY = "sk-bench"
WARM = "fast-200"
MESSAGES = [{"role": "user", "content": "Say ok."}]
USAGE = {"include_usage": True}


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def server_root(base_url: str) -> str:
    return base_url.rsplit("/v1", 1)[0]


def server_status(base_url: str) -> Dict[str, int]:
    with urllib.request.urlopen(server_root(base_url) + "/status", timeout=10) as r:
        return json.loads(r.read())      # type: ignore[no-any-return]


def server_release(base_url: str) -> None:
    req = urllib.request.Request(server_root(base_url) + "/release", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()


def body(model: str) -> Dict[str, Any]:
    return {"model": model, "messages": MESSAGES}


def emit(client: str, mode: str, **kv: Any) -> None:
    cells = " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in kv.items())
    print(f"RESULT client={client} mode={mode} {cells}", flush=True)


def fail(msg: str) -> int:
    print(f"bench_stream: {msg}", file=sys.stderr)
    return 1


# ---------------------------------------------------------------------------
# The clients, each as "read one stream": (chunks, content chars)

def llmretry_client(a: argparse.Namespace, **kw: Any) -> Any:
    import llmretry
    return llmretry.Client(base_url=a.base_url, api_key=API_KEY, **kw)


def llmretry_read(client: Any, model: str, text: bool = False) -> Tuple[int, int]:
    import llmretry
    n = chars = 0
    with llmretry.stream_llm(body(model), client=client) as s:
        if text:
            for t in s.text_deltas():
                n += 1
                chars += len(t)
        else:
            for chunk in s:
                n += 1
                choices = chunk.get("choices")
                if choices:
                    c = choices[0]["delta"].get("content")
                    if c:
                        chars += len(c)
        res = s.result()
    if len(res.data["choices"][0]["message"]["content"]) != chars:
        raise RuntimeError("assembled content differs from the chunks read")
    return n, chars


def openai_client(a: argparse.Namespace) -> Any:
    import openai
    return openai.OpenAI(base_url=a.base_url, api_key=API_KEY, max_retries=2)


def openai_create(client: Any, model: str) -> Any:
    return client.chat.completions.create(model=model, messages=MESSAGES, stream=True,
                                          stream_options=USAGE)


def openai_read(client: Any, model: str) -> Tuple[int, int]:
    n = chars = 0
    for chunk in openai_create(client, model):
        n += 1
        if chunk.choices:
            c = chunk.choices[0].delta.content
            if c:
                chars += len(c)
    return n, chars


def async_client(a: argparse.Namespace, connections: int = 0) -> Any:
    import openai
    kw: Dict[str, Any] = {}
    if connections:
        # The SDK's default limit is 1,000 connections: raise it for the
        # rss measurement (1,000 streams, plus the warm-up's).
        # Limits is httpx's (or httpx2's, as this SDK version bundles): take
        # the type from the SDK's own default rather than naming the package.
        from openai._constants import DEFAULT_CONNECTION_LIMITS as lim
        limits = type(lim)(max_connections=connections, max_keepalive_connections=connections)
        kw["http_client"] = openai.DefaultAsyncHttpxClient(limits=limits)
    return openai.AsyncOpenAI(base_url=a.base_url, api_key=API_KEY, max_retries=2, **kw)


async def async_read(client: Any, model: str) -> Tuple[int, int]:
    n = chars = 0
    async for chunk in await client.chat.completions.create(
            model=model, messages=MESSAGES, stream=True, stream_options=USAGE):
        n += 1
        if chunk.choices:
            c = chunk.choices[0].delta.content
            if c:
                chars += len(c)
    return n, chars


# ---------------------------------------------------------------------------
# (a) CPU per chunk

def cmd_cpu(a: argparse.Namespace) -> int:
    model = f"fast-{a.chunks}"
    want = a.chunks + (0 if a.client == "llmretry-text" else 2)   # + finish, usage

    def window(read: Any) -> Tuple[int, int, float, float, float]:
        gc.collect()
        c0, m0, t0 = cpu_s(), time.thread_time(), time.perf_counter()
        n, chars = read()
        return (n, chars, time.perf_counter() - t0, cpu_s() - c0, time.thread_time() - m0)

    if a.client in ("llmretry", "llmretry-text"):
        client = llmretry_client(a)
        text = a.client == "llmretry-text"
        llmretry_read(client, WARM, text)
        n, chars, secs, cpu, main = window(lambda: llmretry_read(client, model, text))
    elif a.client == "openai":
        client = openai_client(a)
        openai_read(client, WARM)
        n, chars, secs, cpu, main = window(lambda: openai_read(client, model))
    else:
        async def go() -> Tuple[int, int, float, float, float]:
            client = async_client(a)
            await async_read(client, WARM)
            gc.collect()
            c0, m0, t0 = cpu_s(), time.thread_time(), time.perf_counter()
            n, chars = await async_read(client, model)
            out = (n, chars, time.perf_counter() - t0, cpu_s() - c0, time.thread_time() - m0)
            await client.close()
            return out
        n, chars, secs, cpu, main = asyncio.run(go())
    if n != want or chars != 3 + 4 * (a.chunks - 1):
        return fail(f"{a.client}: {n} chunks and {chars} chars, expected {want} and "
                    f"{3 + 4 * (a.chunks - 1)}")
    emit(a.client, "cpu", chunks=n, secs=secs, cpu_s=cpu,
         cpu_us_per_chunk=cpu * 1e6 / n, main_us_per_chunk=main * 1e6 / n)
    return 0


# ---------------------------------------------------------------------------
# (b) delay from the server's write to the iterator's yield

def quantiles(delays_ns: List[int]) -> Dict[str, float]:
    d = sorted(delays_ns)
    n = len(d)
    med = d[n // 2] if n % 2 else (d[n // 2 - 1] + d[n // 2]) / 2
    return {"median_us": med / 1e3, "p99_us": d[round((n - 1) * 0.99)] / 1e3,
            "mean_us": sum(d) / n / 1e3, "max_us": d[-1] / 1e3}


def cmd_latency(a: argparse.Namespace) -> int:
    model = f"paced-{a.paced}-{a.every_ms}"
    got: List[Tuple[int, str]] = []     # (receive ns, content)
    now = time.monotonic_ns
    if a.client == "llmretry":
        import llmretry
        client = llmretry_client(a)
        llmretry_read(client, WARM)
        c0 = cpu_s()
        with llmretry.stream_llm(body(model), client=client) as s:
            for chunk in s:
                t = now()
                ch = chunk.get("choices")
                got.append((t, ch[0]["delta"].get("content") or "" if ch else ""))
            s.result()
        cpu = cpu_s() - c0
    elif a.client == "openai":
        client = openai_client(a)
        openai_read(client, WARM)
        c0 = cpu_s()
        for chunk in openai_create(client, model):
            t = now()
            got.append((t, chunk.choices[0].delta.content or "" if chunk.choices else ""))
        cpu = cpu_s() - c0
    else:
        async def go() -> float:
            client = async_client(a)
            await async_read(client, WARM)
            c0 = cpu_s()
            async for chunk in await client.chat.completions.create(
                    model=model, messages=MESSAGES, stream=True, stream_options=USAGE):
                t = now()
                got.append((t, chunk.choices[0].delta.content or "" if chunk.choices else ""))
            out = cpu_s() - c0
            await client.close()
            return out
        cpu = asyncio.run(go())
    delays = [t - int(c) for t, c in got if c.isdigit()]
    if len(delays) != a.paced or len(got) != a.paced + 2:
        return fail(f"{a.client}: {len(got)} chunks, {len(delays)} stamped; expected "
                    f"{a.paced + 2} and {a.paced}")
    emit(a.client, "latency", chunks=len(got), stamped=len(delays), **quantiles(delays),
         cpu_us_per_chunk=cpu * 1e6 / len(got))
    return 0


# ---------------------------------------------------------------------------
# (c) memory per open stream

HOLD_MORE = 10                  # chunks the server sends after the release
HOLD_CHUNKS = 1 + HOLD_MORE + 2  # + finish, usage


def cmd_rss(a: argparse.Namespace) -> int:
    model = f"hold-{HOLD_MORE}"
    if a.client == "llmretry":
        client = llmretry_client(a, max_in_flight=a.streams + 16)
        llmretry_read(client, WARM)
        gc.collect()
        before = rss_kib()
        t0 = time.perf_counter()
        streams = [client.stream_llm(body(model)) for _ in range(a.streams)]
        iters = [iter(s) for s in streams]
        for it in iters:
            next(it)
        opened = time.perf_counter() - t0
        during = rss_kib()
        held = server_status(a.base_url)["held"]
        server_release(a.base_url)
        counts = []
        for s, it in zip(streams, iters):
            counts.append(1 + sum(1 for _ in it))
            s.result()
            s.close()
    else:
        async def go() -> Tuple[int, int, int, float, List[int]]:
            client = async_client(a, connections=a.streams + 64)
            await async_read(client, WARM)
            gc.collect()
            b = rss_kib()
            all_open, release = asyncio.Event(), asyncio.Event()
            opened_n = [0]

            async def one() -> int:
                stream = await client.chat.completions.create(
                    model=model, messages=MESSAGES, stream=True, stream_options=USAGE)
                it = stream.__aiter__()
                await it.__anext__()
                opened_n[0] += 1
                if opened_n[0] == a.streams:
                    all_open.set()
                await release.wait()
                return 1 + sum([1 async for _ in it])

            t = time.perf_counter()
            tasks = [asyncio.create_task(one()) for _ in range(a.streams)]
            await asyncio.wait_for(all_open.wait(), 120)
            op = time.perf_counter() - t
            d = rss_kib()
            h = server_status(a.base_url)["held"]
            server_release(a.base_url)
            release.set()
            c = await asyncio.gather(*tasks)
            await client.close()
            return b, d, h, op, list(c)
        before, during, held, opened, counts = asyncio.run(go())
    bad = [c for c in counts if c != HOLD_CHUNKS]
    if len(counts) != a.streams or bad:
        return fail(f"{a.client}: {len(bad)} of {len(counts)} streams not {HOLD_CHUNKS} chunks")
    emit(a.client, "rss", streams=a.streams, ok=len(counts), held=held, rss_before_kib=before,
         rss_open_kib=during, kib_per_stream=(during - before) / a.streams, open_secs=opened)
    return 0


# ---------------------------------------------------------------------------
# 50 MiB to a slow consumer

class Sampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = rss_kib()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.01):
            self.peak = max(self.peak, rss_kib())


def cmd_slow(a: argparse.Namespace) -> int:
    size = a.big_size
    total = a.big_mib << 20
    model = f"big-{total}-{size}"
    sleep = a.slow_sleep_ms / 1000.0
    if a.client == "llmretry":
        import llmretry
        # max_response_bytes (default 32 MiB) bounds the whole stream's
        # bytes, so a 50 MiB stream needs it raised; stream_buffer_bytes
        # (the unread chunks' bound) stays at its default.
        client = llmretry_client(a, max_response_bytes=4 * total)
        llmretry_read(client, WARM)

        def start() -> Any:
            s = llmretry.stream_llm(body(model), client=client)
            return s, iter(s)

        def content(chunk: Any) -> str:
            ch = chunk.get("choices")
            return (ch[0]["delta"].get("content") or "") if ch else ""
    else:
        client = openai_client(a)
        openai_read(client, WARM)

        def start() -> Any:
            st = openai_create(client, model)
            return st, iter(st)

        def content(chunk: Any) -> str:
            return (chunk.choices[0].delta.content or "") if chunk.choices else ""
    gc.collect()
    before = rss_kib()
    sampler = Sampler()
    sampler.start()
    t0 = time.perf_counter()
    s, it = start()
    chars = len(content(next(it)))
    time.sleep(a.pause)
    paused = rss_kib()
    n = 1
    half_at = (total // size) // 2
    half = last = 0
    for chunk in it:
        n += 1
        chars += len(content(chunk))
        if n % 10 == 0:
            time.sleep(sleep)
        if n == half_at:
            half = rss_kib()
        if content(chunk) == "":            # the finish and usage chunks
            last = rss_kib()
    # For llmretry the loop's end (the iterator's) builds the Result; the
    # sampler's peak so far is the reading's.
    peak_reading = sampler.peak
    if a.client == "llmretry":
        res = s.result()
        if len(res.data["choices"][0]["message"]["content"]) != chars:
            return fail("llmretry: assembled content differs from the chunks read")
        del res
    after = rss_kib()
    s.close()
    del s, it
    gc.collect()
    freed = rss_kib()
    secs = time.perf_counter() - t0
    sampler.stop.set()
    sampler.join()
    if chars != total:
        return fail(f"{a.client}: read {chars} content bytes, expected {total}")
    emit(a.client, "slow", chunks=n, content_mib=total / 2**20, rss_before_kib=before,
         grow_paused_kib=paused - before, grow_half_kib=half - before,
         grow_last_kib=last - before, grow_peak_kib=max(peak_reading, paused, last) - before,
         grow_result_kib=after - before, grow_freed_kib=freed - before, secs=secs)
    return 0


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("measure", choices=["cpu", "latency", "rss", "slow"])
    ap.add_argument("client", choices=["llmretry", "llmretry-text", "openai", "openai-async"])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--chunks", type=int, default=20000)
    ap.add_argument("--paced", type=int, default=500)
    ap.add_argument("--every-ms", type=int, default=20)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--big-mib", type=int, default=50)
    ap.add_argument("--big-size", type=int, default=4096)
    ap.add_argument("--pause", type=float, default=1.0)
    ap.add_argument("--slow-sleep-ms", type=float, default=4.0)
    a = ap.parse_args(argv)
    allowed = {"cpu": {"llmretry", "llmretry-text", "openai", "openai-async"},
               "latency": {"llmretry", "openai", "openai-async"},
               "rss": {"llmretry", "openai-async"}, "slow": {"llmretry", "openai"}}
    if a.client not in allowed[a.measure]:
        return fail(f"{a.measure} does not measure {a.client}")
    return {"cpu": cmd_cpu, "latency": cmd_latency, "rss": cmd_rss,
            "slow": cmd_slow}[a.measure](a)


if __name__ == "__main__":
    sys.exit(main())
