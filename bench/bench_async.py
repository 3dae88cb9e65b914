"""The asyncio benchmark (issue 17): llmretry's ``acall_llm`` and
``acall_many`` next to ``AsyncOpenAI`` (on httpx2 and on aiohttp), raw
httpx / httpx2 / aiohttp, and llmretry's sync ``call_many``, all against the
same local nginx (0 ms endpoint). See bench/README.md ("asyncio benchmark");
bench/run_async.sh drives it.

    python3 bench/bench_async.py run CLIENT --base-url URL [--n 20000]
        [--conc 64] [--warmup -1] [--run I] [--shape workers|gather]
    python3 bench/bench_async.py report RESULTS [--title TEXT]

``run`` measures one client in this (fresh) process and prints one line
``RESULT client=... conc=... run=... n=... ok=... secs=... rps=... cpu_us=...
main_us=... conns=...``. The bodies are ``peers_python.body_for(i)``, built
before the window. CLIENT is

- ``llmretry-acall``: ``await client.acall_llm(body)`` per item, at most CONC
  in flight (see SHAPE), ``Client(base_url, api_key, logger=None,
  max_in_flight=max(CONC, 256))``;
- ``llmretry-acall-many``: ``await client.acall_many(bodies, limit=CONC)``;
- ``llmretry-call-many``: the sync ``client.call_many(bodies, limit=CONC)``
  (no event loop), the reference of the "≥ 0.7×" verdicts;
- ``openai-httpx``: ``AsyncOpenAI(base_url, api_key, max_retries=2,
  http_client=DefaultAsyncHttpxClient(limits=Limits(CONC, CONC)))`` (the SDK's
  default transport, httpx2 in openai ≥ 3), ``await
  client.chat.completions.create(**body)`` per item;
- ``openai-aiohttp``: the same with ``http_client=DefaultAioHttpClient(limits=
  ...)`` (``pip install openai[aiohttp]``; its transport turns
  ``max_connections`` into ``aiohttp.TCPConnector(limit=CONC)``);
- ``openai-llmretry``: ``AsyncOpenAI(max_retries=0, http_client=
  httpx2.AsyncClient(transport=llmretry.httpx2.AsyncTransport(logger=None,
  max_in_flight=max(CONC, 256))))``: the SDK on llmretry's engine (issue 30);
- ``httpx`` / ``httpx2``: a raw ``AsyncClient(limits=Limits(CONC, CONC))``,
  ``await client.post(url, json=body)``, ``raise_for_status()``,
  ``resp.json()``; ``httpx2`` is the fork the SDK runs on (for scale);
- ``aiohttp``: a raw ``ClientSession(connector=TCPConnector(limit=CONC))``,
  ``async with session.post(url, json=body)``, ``raise_for_status()``,
  ``await resp.json()``.

SHAPE (the same for every per-item client): ``workers`` (default) starts
CONC tasks that each take the next index from one shared iterator and await
the call, ``asyncio.gather``-ed; ``gather`` makes one task per item, each
holding an ``asyncio.Semaphore(CONC)`` around its call, ``asyncio.gather``-ed.

Before the window the same client runs a warm-up batch of WARMUP items
(``-1``: max(CONC, 1000)), so the CONC connections are open and the code
paths warm; then ``gc.collect()``. ``cpu_us`` is ``getrusage(RUSAGE_SELF)``
user + sys over the window ÷ N (the whole process: llmretry's engine I/O
thread included; nginx is not), ``main_us`` the event loop thread's
(``time.thread_time()``) ÷ N, ``conns`` the connections nginx accepted during
the window (``stub_status``; 0: every call reused a warm connection). Every
response is checked (``usage.total_tokens`` of the canned answer, 13); a run
with a failed item exits non-zero. ``report`` turns RESULT lines into the
markdown tables and the verdicts.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import resource
import statistics
import sys
import time
import urllib.request
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import peers_python  # noqa: E402  (body_for, API_KEY; imports no peer library)

EXPECTED_TOKENS = 13      # usage.total_tokens of nginx's canned answer
Body = Dict[str, Any]
Call = Callable[[Body], Awaitable[int]]            # one item -> total_tokens
Batch = Callable[[List[Body]], Awaitable[List[int]]]


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def nginx_accepts(base_url: str) -> int:
    """nginx's stub_status 'accepts' counter (connections accepted so far)."""
    root = base_url.split("/v1")[0].removesuffix("/slow")     # the 50 ms endpoint's too
    with urllib.request.urlopen(root + "/status", timeout=5) as r:
        lines = r.read().decode().splitlines()
    return int(lines[2].split()[0])


# ---------------------------------------------------------------------------
# The shape every per-item client runs in

def limited(call: Call, conc: int, shape: str) -> Batch:
    """A batch runner: ``call`` over the bodies, at most ``conc`` at once."""
    async def workers(bodies: List[Body]) -> List[int]:
        out = [-1] * len(bodies)
        todo = iter(range(len(bodies)))   # shared: each worker takes the next index

        async def worker() -> None:
            for i in todo:
                out[i] = await call(bodies[i])

        await asyncio.gather(*(worker() for _ in range(min(conc, len(bodies)))))
        return out

    async def gathered(bodies: List[Body]) -> List[int]:
        sem = asyncio.Semaphore(conc)

        async def one(body: Body) -> int:
            async with sem:
                return await call(body)

        return list(await asyncio.gather(*(one(b) for b in bodies)))

    return workers if shape == "workers" else gathered


# ---------------------------------------------------------------------------
# Clients: each gives (batch, aclose) made inside the running loop

def _tokens(value: Any) -> int:
    import llmretry
    if isinstance(value, llmretry.Result):
        return value.data["usage"]["total_tokens"]   # type: ignore[no-any-return]
    return -1   # an exception in the batch's results


async def make_client(name: str, base_url: str, conc: int,
                      shape: str) -> Tuple[Batch, Callable[[], Awaitable[None]]]:
    if name.startswith("llmretry-"):
        import llmretry

        client = llmretry.Client(base_url=base_url, api_key=peers_python.API_KEY,
                                 logger=None, max_in_flight=max(conc, 256))

        async def close_llmretry() -> None:
            client.close()

        if name == "llmretry-acall":
            acall = client.acall_llm

            async def call(body: Body) -> int:
                return (await acall(body)).data["usage"]["total_tokens"]  # type: ignore
            return limited(call, conc, shape), close_llmretry
        if name == "llmretry-acall-many":
            async def batch(bodies: List[Body]) -> List[int]:
                out = await client.acall_many(bodies, limit=conc)
                return [_tokens(r) for r in out]
            return batch, close_llmretry

        async def batch_sync(bodies: List[Body]) -> List[int]:
            # Blocks the loop for the whole batch, as a sync caller would.
            out = client.call_many(bodies, limit=conc)
            return [_tokens(r) for r in out]
        return batch_sync, close_llmretry

    if name == "openai-llmretry":
        # The SDK on llmretry's engine (issue 30): the transport of the
        # SDK's own httpx flavour, the SDK's retries off (llmretry's policy
        # retries), at most CONC in flight as for the other rows.
        import httpx2
        import openai
        import llmretry.httpx2

        transport = llmretry.httpx2.AsyncTransport(logger=None, max_in_flight=max(conc, 256))
        oa = openai.AsyncOpenAI(base_url=base_url, api_key=peers_python.API_KEY, max_retries=0,
                                http_client=httpx2.AsyncClient(transport=transport))
        create = oa.chat.completions.create

        async def call_sdk_llmretry(body: Body) -> int:
            return (await create(**body)).usage.total_tokens  # type: ignore[union-attr]
        return limited(call_sdk_llmretry, conc, shape), oa.close

    if name.startswith("openai-"):
        import httpx2
        import openai

        limits = httpx2.Limits(max_connections=conc, max_keepalive_connections=conc)
        http_client = (openai.DefaultAsyncHttpxClient(limits=limits) if name == "openai-httpx"
                       else openai.DefaultAioHttpClient(limits=limits))
        oa = openai.AsyncOpenAI(base_url=base_url, api_key=peers_python.API_KEY,
                                max_retries=2, http_client=http_client)
        create = oa.chat.completions.create

        async def call_openai(body: Body) -> int:
            return (await create(**body)).usage.total_tokens  # type: ignore[union-attr]
        return limited(call_openai, conc, shape), oa.close

    url = base_url + "/chat/completions"
    headers = {"Authorization": f"Bearer {peers_python.API_KEY}"}
    if name in ("httpx", "httpx2"):
        hx: Any = __import__(name)
        ac = hx.AsyncClient(headers=headers, timeout=hx.Timeout(60.0),
                            limits=hx.Limits(max_connections=conc,
                                             max_keepalive_connections=conc))
        post = ac.post

        async def call_httpx(body: Body) -> int:
            resp = await post(url, json=body)
            resp.raise_for_status()
            return resp.json()["usage"]["total_tokens"]  # type: ignore[no-any-return]
        return limited(call_httpx, conc, shape), ac.aclose

    if name == "aiohttp":
        import aiohttp

        session = aiohttp.ClientSession(
            headers=headers, timeout=aiohttp.ClientTimeout(total=60),
            connector=aiohttp.TCPConnector(limit=conc))
        spost = session.post

        async def call_aiohttp(body: Body) -> int:
            async with spost(url, json=body) as resp:
                resp.raise_for_status()
                return (await resp.json())["usage"]["total_tokens"]  # type: ignore
        return limited(call_aiohttp, conc, shape), session.close

    raise SystemExit(f"unknown client {name}")


CLIENTS = ["llmretry-acall", "llmretry-acall-many", "llmretry-call-many", "openai-httpx",
           "openai-aiohttp", "openai-llmretry", "httpx", "httpx2", "aiohttp"]


async def run_async(args: argparse.Namespace) -> int:
    batch, aclose = await make_client(args.client, args.base_url, args.conc, args.shape)
    body_for = peers_python.body_for
    warmup = max(args.conc, 1000) if args.warmup < 0 else args.warmup
    if warmup:
        warm = await batch([body_for(i) for i in range(warmup)])
        if any(t != EXPECTED_TOKENS for t in warm):
            print(f"FAILED warm-up of {args.client}: "
                  f"{sum(t != EXPECTED_TOKENS for t in warm)} bad", file=sys.stderr)
            return 1
    bodies = [body_for(i) for i in range(warmup, warmup + args.n)]
    gc.collect()                       # the warm-up's garbage goes before the window
    conns0 = nginx_accepts(args.base_url)
    cpu0, main0, t0 = cpu_seconds(), time.thread_time(), time.perf_counter()
    tokens = await batch(bodies)
    secs = time.perf_counter() - t0
    cpu, main = cpu_seconds() - cpu0, time.thread_time() - main0
    conns = nginx_accepts(args.base_url) - conns0 - 1   # less the status request's own
    await aclose()
    n = args.n
    ok = sum(1 for t in tokens if t == EXPECTED_TOKENS)
    print(f"RESULT client={args.client} conc={args.conc} run={args.run} n={n} ok={ok} "
          f"secs={secs:.4f} rps={n / secs:.0f} cpu_us={cpu * 1e6 / n:.2f} "
          f"main_us={main * 1e6 / n:.2f} conns={conns} warmup={warmup} shape={args.shape}",
          flush=True)
    return 0 if ok == n else 1


def cmd_run(args: argparse.Namespace) -> int:
    return asyncio.run(run_async(args))


# ---------------------------------------------------------------------------
# The report

LABELS = {
    "llmretry-acall": "llmretry `await acall_llm(body)` per item",
    "llmretry-acall-many": "llmretry `acall_many(bodies, limit=CONC)`",
    "llmretry-call-many": "llmretry `call_many(bodies, limit=CONC)` (sync)",
    "openai-httpx": "`AsyncOpenAI`, default transport (httpx2)",
    "openai-aiohttp": "`AsyncOpenAI`, `DefaultAioHttpClient` (aiohttp)",
    "openai-llmretry": "`AsyncOpenAI` on `llmretry.httpx2.AsyncTransport` (SDK retries off)",
    "httpx": "raw `httpx.AsyncClient` POST + `.json()`",
    "httpx2": "raw `httpx2.AsyncClient` POST + `.json()` (the SDK's transport)",
    "aiohttp": "raw `aiohttp.ClientSession` POST + `await .json()`",
}
SDK = "openai-httpx"          # the ×/÷ columns and the 10× verdicts
SYNC = "llmretry-call-many"   # the 0.7× verdicts


def parse_results(path: str) -> List[Dict[str, Any]]:
    rows = []
    with open(path) as f:
        for line in f:
            if not line.startswith("RESULT "):
                continue
            row: Dict[str, Any] = dict(kv.split("=", 1) for kv in line.split()[1:])
            for k in ("conc", "run", "n", "ok", "rps", "conns"):
                row[k] = int(float(row[k]))
            for k in ("secs", "cpu_us", "main_us"):
                row[k] = float(row[k])
            rows.append(row)
    return rows


def _ratios(rows: Dict[int, Dict[str, Any]], base: Dict[int, Dict[str, Any]],
            key: str = "rps") -> List[float]:
    """Run i of a client against run i of base (same round, seconds apart)."""
    return [rows[r][key] / base[r][key] for r in sorted(rows) if r in base]


def _cell(pr: List[float], digits: int = 2, unit: str = "×") -> str:
    if not pr:
        return "—"
    return (f"{statistics.median(pr):.{digits}f}{unit} "
            f"({'/'.join(f'{x:.{digits}f}' for x in pr)})")


def _runs(rr: Dict[int, Dict[str, Any]], key: str, digits: int = 0) -> str:
    return "/".join(f"{rr[r][key]:,.{digits}f}" for r in sorted(rr))


def _med(rr: Dict[int, Dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rr.values())


def cmd_report(args: argparse.Namespace) -> int:
    rows = parse_results(args.results)
    by: Dict[Tuple[int, str], Dict[int, Dict[str, Any]]] = {}
    for row in rows:
        by.setdefault((row["conc"], row["client"]), {})[row["run"]] = row
    concs = sorted({c for c, _ in by})
    if args.title:
        print(args.title)
        print()
    verdicts: List[str] = []

    # ---- one compact table: median req/s and CPU per call of every client at every C
    clients = [c for c in LABELS if any((k, c) in by for k in concs)]
    print("**Summary**: median req/s and CPU µs per call (whole process) at each "
          "concurrency C, 0 ms server")
    print()
    print("| client | " + " | ".join(f"C={k} req/s | C={k} CPU µs" for k in concs) + " |")
    print("|---|" + "---:|---:|" * len(concs))
    for c in clients:
        cells = []
        for k in concs:
            rr = by.get((k, c))
            cells += ([f"{_med(rr, 'rps'):,.0f}", f"{_med(rr, 'cpu_us'):,.1f}"] if rr
                      else ["—", "—"])
        print(f"| {LABELS[c]} | " + " | ".join(cells) + " |")
    print()

    # ---- per C: every run, the paired ratios
    for k in concs:
        cs = [c for c in LABELS if (k, c) in by]
        sdk = by.get((k, SDK), {})
        sync = by.get((k, SYNC), {})
        nruns = max(len(by[(k, c)]) for c in cs)
        shapes = sorted({r.get("shape", "?") for c in cs for r in by[(k, c)].values()})
        print(f"**C = {k}**: at most {k} calls in flight, median of {nruns} interleaved "
              f"rounds (per-run figures in run order; a ratio *per run* pairs run *i* "
              f"with the other client's run *i* of the same round; per-item shape: "
              f"{'/'.join(shapes)})")
        print()
        print("| client | n | req/s | runs | × openai-httpx (per run) | × call_many (per run) "
              "| CPU µs/call | runs | CPU ÷ openai-httpx (per run) | loop thread µs "
              "| nginx conns |")
        print("|---|---:|---:|---|---|---|---:|---|---|---:|---:|")
        for c in cs:
            rr = by[(k, c)]
            ns = sorted({r["n"] for r in rr.values()})
            x_sdk = "1.00×" if c == SDK else _cell(_ratios(rr, sdk))
            x_sync = "1.00×" if c == SYNC else _cell(_ratios(rr, sync))
            cpu_sdk = "1.00" if c == SDK else _cell(_ratios(rr, sdk, "cpu_us"), 3, "")
            print(f"| {LABELS[c]} | {'/'.join(f'{n:,}' for n in ns)} | {_med(rr, 'rps'):,.0f} "
                  f"| {_runs(rr, 'rps')} | {x_sdk} | {x_sync} | {_med(rr, 'cpu_us'):,.1f} "
                  f"| {_runs(rr, 'cpu_us', 1)} | {cpu_sdk} | {_med(rr, 'main_us'):,.1f} "
                  f"| {statistics.median(r['conns'] for r in rr.values()):g} |")
        print()

        acall = by.get((k, "llmretry-acall"))
        if acall and sdk:
            pr = _ratios(acall, sdk)
            m = statistics.median(pr)
            verdicts.append(
                f"- C={k}: llmretry `acall_llm` ≥ 10× `AsyncOpenAI` (httpx2)'s throughput: "
                f"**{'met' if m >= 10 else 'NOT met'}** ({m:.1f}×, per run "
                f"{'/'.join(f'{x:.1f}' for x in pr)}; ratio of medians "
                f"{_med(acall, 'rps') / _med(sdk, 'rps'):.1f}×).")
            pc = _ratios(acall, sdk, "cpu_us")
            m = statistics.median(pc)
            verdicts.append(
                f"- C={k}: llmretry `acall_llm`'s CPU per call ≤ 1/10 of `AsyncOpenAI` "
                f"(httpx2)'s: **{'met' if m <= 0.1 else 'NOT met'}** ({m:.3f}, 1/{1 / m:.0f}; "
                f"per run {'/'.join(f'{x:.3f}' for x in pc)}; "
                f"{_med(acall, 'cpu_us'):.1f} vs {_med(sdk, 'cpu_us'):.1f} µs).")
        for c in ("llmretry-acall", "llmretry-acall-many"):
            rr = by.get((k, c))
            if not rr or not sync:
                continue
            pr = _ratios(rr, sync)
            m = statistics.median(pr)
            verdicts.append(
                f"- C={k}: llmretry `{'acall_llm' if c == 'llmretry-acall' else 'acall_many'}` ≥ 0.7× the sync "
                f"`call_many`: **{'met' if m >= 0.7 else 'NOT met'}** ({m:.2f}×, per run "
                f"{'/'.join(f'{x:.2f}' for x in pr)}; CPU per call "
                f"{_med(rr, 'cpu_us'):.1f} vs {_med(sync, 'cpu_us'):.1f} µs).")

    print("**Verdicts** (median of the per-round ratios)")
    print()
    for v in verdicts:
        print(v)
    bad = [r for r in rows if r["ok"] != r["n"]]
    if bad:
        print(f"\n{len(bad)} runs had failed calls: "
              + ", ".join(f"{r['client']}/C={r['conc']}/{r['run']}" for r in bad))
        return 1
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run")
    run.add_argument("client", choices=CLIENTS)
    run.add_argument("--base-url", required=True)
    run.add_argument("--n", type=int, default=20000)
    run.add_argument("--conc", type=int, default=64)
    run.add_argument("--warmup", type=int, default=-1, help="-1: max(conc, 1000)")
    run.add_argument("--run", type=int, default=1)
    run.add_argument("--shape", choices=["workers", "gather"], default="workers")
    rep = sub.add_parser("report")
    rep.add_argument("results")
    rep.add_argument("--title", default="")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        return cmd_run(args)
    return cmd_report(args)


if __name__ == "__main__":
    sys.exit(main())
