"""The rate-limit benchmark (issue 18): a batch against a mock server that
enforces a request and a token limit, as a provider does. llmretry's
``call_many`` with the limits configured and with nothing configured (learned
from the x-ratelimit-* headers), next to the openai SDK's retries in threads
and a cookbook-style asyncio processor (bench/clients/cookbook_processor.py).
See bench/README.md ("Rate-limit benchmark"); bench/run_rate.sh drives it.

    python3 bench/bench_rate.py run CLIENT [--n 3000] [--block 375]
        [--rpw 100] [--tpw 16667] [--window-ms 1000] [--latency-ms 100]
        [--limit 64] [--cap-s 0] [--run I] [--timeline]
    python3 bench/bench_rate.py mockcap [--n 3000] [--limit 64]
    python3 bench/bench_rate.py report RESULTS [--title TEXT]

The provider: ``python -m llmretry.testing`` (a fresh process per run, on
its own port) with one scenario limited to RPW requests and TPW tokens per
sliding window of WINDOW ms (default 100 and 16,667 a second: the issue's 600
requests and 100,000 tokens a minute scaled up 10x, stated in the headers as
6,000 and 1,000,000 a minute), answering after LATENCY ms; a refused request
gets a 429 at once, with Retry-After / retry-after-ms.

The batch: N chat bodies with the same 200-character prompt (50 tokens as
the mock counts, ceil(chars / 4); its answers' usage says 50 prompt tokens,
so a client correcting its estimate by the usage stays exact) in blocks of
BLOCK alternating "short" (max_tokens 50: 100 tokens, the request limit
binds) and "long" (max_tokens 250: 300 tokens, the token limit binds). The
limit's pace for the batch is then T* = sum over blocks of max(items / RPW,
tokens / TPW) windows, and "the limit" in items/s is N / T* (a client may
beat it by up to one window: the first window is free).

``run`` measures one CLIENT in this (fresh) process:

- ``llmretry-rpm``: ``Client(logger=None).call_many(bodies, limit=LIMIT,
  rpm=, tpm=)`` with the provider's per-minute limits;
- ``llmretry-learned``: the same with no rpm/tpm (learned from headers);
- ``llmretry-rpm-noheaders`` (a diagnostic, not in the default rows):
  ``llmretry-rpm`` against the same limits with the mock sending no
  x-ratelimit-* headers (``rate_headers: false``), so only the configured
  rpm/tpm pace;
- ``openai-threads``: ``openai.OpenAI(max_retries=30)`` (its own retries,
  which honour retry-after-ms) shared by a ``ThreadPoolExecutor(LIMIT)``;
- ``openai-llmretry``: the same thread pool and SDK calls, the client made
  with ``max_retries=0`` and ``httpx2.Client(transport=
  llmretry.httpx2.Transport(rpm=, tpm=))`` (issue 30);
- ``cookbook``: ``cookbook_processor.process`` (aiohttp) with the same
  per-minute limits, 5 attempts, a 15 s pause after a rate-limit error.

It prints one line ``RESULT client=... run=... n=... ok=... failed=...
unfinished=... secs=... ideal_secs=... attempts=... refused=... ...``:
``attempts``/``refused`` are the mock's own totals (``/_mock/limits``);
``adm_p50``/``tok_p50`` the median requests/tokens admitted per full
second of the run (from the mock's records), the check that the mock
keeps up with the limit; ``mock_cpu`` the mock's CPU seconds. With
``--cap-s S`` the peers stop starting items after S seconds (the cookbook
processor can take many minutes); what did not finish is ``unfinished``.
``--timeline`` prints per-second admitted/refused counts to stderr.
``mockcap`` measures the same mock without limits (``call_many`` at LIMIT in
flight, 0 ms): its ceiling, to compare with the limit rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "clients"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

API_KEY = "bench-key"
SCENARIO = "rate"
PROMPT_CHARS = 200            # 50 tokens as the mock counts
SHORT_MAX, LONG_MAX = 50, 250
USAGE = {"prompt_tokens": PROMPT_CHARS // 4, "completion_tokens": 20,
         "total_tokens": PROMPT_CHARS // 4 + 20}
RECORDS_MAX = 60000           # more attempts than this: no timeline (the mock's JSON grows)
Body = Dict[str, Any]


def body_for(i: int, block: int) -> Body:
    head = f"Item {i}: answer briefly. "
    content = (head + "x" * PROMPT_CHARS)[:PROMPT_CHARS]
    long = (i // block) % 2 == 1
    return {"model": "bench-model", "messages": [{"role": "user", "content": content}],
            "max_tokens": LONG_MAX if long else SHORT_MAX}


def cost(body: Body) -> int:
    """The mock's charge: ceil(prompt chars / 4) + max_tokens."""
    return (len(body["messages"][0]["content"]) + 3) // 4 + body["max_tokens"]


def ideal_seconds(bodies: List[Body], block: int, rpw: int, tpw: int, window_s: float) -> float:
    """T*: each block at the pace of whichever limit binds it."""
    total = 0.0
    for start in range(0, len(bodies), block):
        part = bodies[start:start + block]
        total += max(len(part) / rpw, sum(cost(b) for b in part) / tpw) * window_s
    return total


# ---------------------------------------------------------------------------
# The mock provider, in a process of its own

class Mock:
    def __init__(self, limits: Optional[Dict[str, Any]], latency_ms: float) -> None:
        after: Dict[str, Any] = {"usage": USAGE, "content": "ok"}
        if latency_ms:
            after["delay_ms"] = latency_ms
        script: Dict[str, Any] = {"steps": [], "after": after}
        if limits is not None:
            script["limits"] = limits
        self._file = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        json.dump({SCENARIO: script}, self._file)
        self._file.close()
        self._cpu0 = _children_cpu()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmretry.testing", "--port", "0",
             "--scenarios", self._file.name], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self.root = f"http://127.0.0.1:{self.port}"
        self.base_url = f"{self.root}/s/{SCENARIO}/v1"
        self.cpu = 0.0

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.root + path, timeout=120) as resp:
            return json.load(resp)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        self.cpu = _children_cpu() - self._cpu0
        os.unlink(self._file.name)


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# ---------------------------------------------------------------------------
# The clients: each returns (ok, failed, unfinished)

Outcome = Tuple[int, int, int]


def _good(data: Any) -> bool:
    try:
        return data["choices"][0]["message"]["content"] == "ok"
    except (KeyError, IndexError, TypeError):
        return False


def run_llmretry(bodies: List[Body], url: str, args: argparse.Namespace,
                 rpm: int, tpm: int) -> Outcome:
    import llmretry
    client = llmretry.Client(api_key=API_KEY, base_url=url, logger=None)
    try:
        limits = {"rpm": rpm, "tpm": tpm} if rpm else {}
        out = client.call_many(bodies, limit=args.limit, **limits)
    finally:
        client.close()
    ok = sum(1 for r in out if not isinstance(r, BaseException) and _good(r.data))
    return ok, len(bodies) - ok, 0


def run_openai(bodies: List[Body], url: str, args: argparse.Namespace,
               rpm: int = 0, tpm: int = 0, transport: bool = False) -> Outcome:
    import openai
    from _common import sdk_limits    # bench/clients: the pool sized to the threads
    if transport:
        # The same SDK code on llmretry's engine (issue 30): its retries off,
        # the provider's limits configured on the transport.
        import httpx2
        import llmretry.httpx2
        engine = llmretry.httpx2.Transport(logger=None, rpm=rpm, tpm=tpm,
                                           max_in_flight=max(args.limit, 256))
        client = openai.OpenAI(base_url=url, api_key=API_KEY, max_retries=0,
                               http_client=httpx2.Client(transport=engine))
    else:
        client = openai.OpenAI(base_url=url, api_key=API_KEY, max_retries=args.openai_retries,
                               http_client=openai.DefaultHttpxClient(
                                   limits=sdk_limits(args.limit)))
    stop_at = time.monotonic() + args.cap_s if args.cap_s else math.inf

    def one(body: Body) -> Optional[bool]:
        if time.monotonic() >= stop_at:
            return None                 # not started before the cap
        try:
            r = client.chat.completions.create(**body)
            return r.choices[0].message.content == "ok"
        except openai.APIError:
            return False

    try:
        with ThreadPoolExecutor(args.limit) as pool:
            done = list(pool.map(one, bodies))
    finally:
        client.close()
    ok = sum(1 for d in done if d)
    unfinished = sum(1 for d in done if d is None)
    return ok, len(bodies) - ok - unfinished, unfinished


def run_cookbook(bodies: List[Body], url: str, args: argparse.Namespace,
                 rpm: int, tpm: int) -> Outcome:
    import cookbook_processor
    results, tally = asyncio.run(cookbook_processor.process(
        bodies, url + "/chat/completions", api_key=API_KEY,
        max_requests_per_minute=float(rpm), max_tokens_per_minute=float(tpm),
        deadline_s=args.cap_s or None))
    ok = sum(1 for r in results if isinstance(r, dict) and _good(r))
    unfinished = sum(1 for r in results if r is None)
    print(f"cookbook: {tally}", file=sys.stderr)
    return ok, len(bodies) - ok - unfinished, unfinished


# ---------------------------------------------------------------------------
# run / mockcap

def per_second(records: List[Dict[str, Any]]) -> List[Tuple[int, int, int]]:
    """(admitted, tokens admitted, refused) per second since the first request."""
    if not records:
        return []
    t0 = records[0]["time"]
    bins: List[List[int]] = []
    for r in records:
        k = int(r["time"] - t0)
        while len(bins) <= k:
            bins.append([0, 0, 0])
        if r.get("rate_limited"):
            bins[k][2] += 1
        else:
            bins[k][0] += 1
            bins[k][1] += r.get("tokens_charged", 0)
    return [tuple(b) for b in bins]  # type: ignore[misc]


def cmd_run(args: argparse.Namespace) -> int:
    window_s = args.window_ms / 1000.0
    per_minute = 60.0 / window_s
    rpm, tpm = round(args.rpw * per_minute), round(args.tpw * per_minute)
    bodies = [body_for(i, args.block) for i in range(args.n)]
    ideal = ideal_seconds(bodies, args.block, args.rpw, args.tpw, window_s)
    mock = Mock({"rpm": args.rpw, "tpm": args.tpw, "window_ms": args.window_ms,
                 "retry_after": True,
                 "rate_headers": args.client != "llmretry-rpm-noheaders"}, args.latency_ms)
    try:
        cpu0, t0 = _self_cpu(), time.perf_counter()
        if args.client in ("llmretry-rpm", "llmretry-rpm-noheaders"):
            ok, failed, unfinished = run_llmretry(bodies, mock.base_url, args, rpm, tpm)
        elif args.client == "llmretry-learned":
            ok, failed, unfinished = run_llmretry(bodies, mock.base_url, args, 0, 0)
        elif args.client == "openai-threads":
            ok, failed, unfinished = run_openai(bodies, mock.base_url, args)
        elif args.client == "openai-llmretry":
            ok, failed, unfinished = run_openai(bodies, mock.base_url, args, rpm, tpm,
                                                transport=True)
        else:
            ok, failed, unfinished = run_cookbook(bodies, mock.base_url, args, rpm, tpm)
        secs = time.perf_counter() - t0
        cpu = _self_cpu() - cpu0
        stats = mock.get(f"/_mock/limits/{SCENARIO}")
        attempts = stats["admitted"] + stats["refused"]
        bins: List[Tuple[int, int, int]] = []
        if attempts <= RECORDS_MAX:
            bins = per_second(mock.get(f"/_mock/requests/{SCENARIO}"))
    finally:
        mock.stop()
    # The full seconds of the run (not the first or last, partial ones).
    full = bins[1:-1] if len(bins) > 2 else bins
    adm = statistics.median(b[0] for b in full) if full else -1
    tok = statistics.median(b[1] for b in full) if full else -1
    adm_max = max(b[0] for b in full) if full else -1
    tok_max = max(b[1] for b in full) if full else -1
    if args.timeline:
        print(f"{args.client} run {args.run}: second admitted tokens refused", file=sys.stderr)
        for k, (a, t, r) in enumerate(bins):
            print(f"  {k:4d} {a:5d} {t:7d} {r:6d}", file=sys.stderr)
    print(f"RESULT client={args.client} run={args.run} n={args.n} ok={ok} failed={failed} "
          f"unfinished={unfinished} secs={secs:.3f} ideal_secs={ideal:.3f} "
          f"attempts={attempts} refused={stats['refused']} admitted={stats['admitted']} "
          f"tokens={stats['tokens']} rpw={args.rpw} tpw={args.tpw} window_ms={args.window_ms:g} "
          f"limit={args.limit} cap_s={args.cap_s:g} adm_p50={adm:g} tok_p50={tok:g} adm_max={adm_max} tok_max={tok_max} "
          f"cpu_s={cpu:.2f} mock_cpu_s={mock.cpu:.2f}", flush=True)
    return 0


def cmd_mockcap(args: argparse.Namespace) -> int:
    """The mock's own ceiling: the same server unlimited, 0 ms answers."""
    import llmretry
    mock = Mock(None, 0)
    try:
        client = llmretry.Client(api_key=API_KEY, base_url=mock.base_url, logger=None)
        bodies = [body_for(i, args.n) for i in range(args.n)]
        client.call_many(bodies[:200], limit=args.limit)     # connections open
        t0 = time.perf_counter()
        out = client.call_many(bodies, limit=args.limit)
        secs = time.perf_counter() - t0
        client.close()
    finally:
        mock.stop()
    print(f"RESULT client=mockcap n={args.n} ok={out.summary.ok} secs={secs:.3f} "
          f"rps={args.n / secs:.0f} limit={args.limit} mock_cpu_s={mock.cpu:.2f}", flush=True)
    return 0


# ---------------------------------------------------------------------------
# The report

LABELS = {
    "llmretry-rpm": "llmretry `call_many`, `rpm`/`tpm` configured",
    "llmretry-learned": "llmretry `call_many`, nothing configured (learned from headers)",
    "llmretry-rpm-noheaders": "diagnostic: llmretry `call_many`, `rpm`/`tpm` configured, "
                              "mock sending no x-ratelimit-* headers",
    "openai-threads": "openai SDK `OpenAI(max_retries=30)` in a thread pool (one thread per item in flight)",
    "openai-llmretry": "the same SDK code on `llmretry.httpx2.Transport(rpm=, tpm=)`, SDK retries off",
    "cookbook": "cookbook-style asyncio processor (aiohttp), same limits",
}
LLMRETRY_ROWS = ("llmretry-rpm", "llmretry-learned")


def parse_results(path: str) -> List[Dict[str, Any]]:
    rows = []
    with open(path) as f:
        for line in f:
            if line.startswith("RESULT "):
                row: Dict[str, Any] = dict(kv.split("=", 1) for kv in line.split()[1:])
                for k, v in row.items():
                    if k != "client":
                        row[k] = float(v)
                rows.append(row)
    return rows


def _runs(xs: List[float], fmt: str) -> str:
    return "/".join(format(x, fmt) for x in xs)


def cmd_report(args: argparse.Namespace) -> int:
    rows = parse_results(args.results)
    if args.title:
        print(args.title)
        print()
    cap = [r for r in rows if r["client"] == "mockcap"]
    runs = [r for r in rows if r["client"] in LABELS]
    if not runs:
        print("no results")
        return 1
    r0 = runs[0]
    w = r0["window_ms"] / 1000.0
    limit_rate = r0["n"] / r0["ideal_secs"]
    per_min = 60.0 / w
    print(f"**Batch of {r0['n']:,.0f} chat requests against a mock enforcing "
          f"{r0['rpw']:,.0f} requests and {r0['tpw']:,.0f} tokens per sliding "
          f"{r0['window_ms']:,.0f} ms window** (stated per minute: "
          f"{r0['rpw'] * per_min:,.0f} requests, {r0['tpw'] * per_min:,.0f} tokens; the "
          f"issue's 600 and 100,000 a minute scaled up 10×). Blocks of short (100-token) "
          f"and long (300-token) requests alternate, so each limit binds in turn: at the "
          f"limit the batch takes T* = {r0['ideal_secs']:.1f} s, {limit_rate:.1f} items/s "
          f"(\"the limit\"; a client can beat it by one window's burst, ≤ "
          f"{w / r0['ideal_secs']:.1%}). {r0['limit']:.0f} in flight; median of the runs, "
          f"per-run figures in run order.")
    if cap:
        c = cap[0]
        print(f"The mock without limits serves {c['rps']:,.0f} req/s (llmretry "
              f"`call_many`, {c['limit']:.0f} in flight, 0 ms): "
              f"{c['rps'] / (r0['rpw'] / w):.0f}× the request limit, so it is not the "
              f"bottleneck at the limit.")
    print()
    print("| client | goodput items/s | % of the limit (runs) | attempts rejected (429) "
          "| time to finish s (runs) | items failed (all runs) | not finished at the cap (runs) "
          "| mock admitted per full second: requests, tokens (median / max) | client CPU s |")
    print("|---|---:|---|---|---|---:|---:|---|---:|")
    med: Dict[str, Dict[str, float]] = {}
    order = [c for c in LABELS if any(r["client"] == c for r in runs)]
    for c in order:
        rr = sorted((r for r in runs if r["client"] == c), key=lambda r: r["run"])
        good = [r["ok"] / r["secs"] for r in rr]
        share = [g / limit_rate * 100 for g in good]
        rej = [r["refused"] / r["attempts"] * 100 if r["attempts"] else 0.0 for r in rr]
        secs = [r["secs"] for r in rr]
        capped = any(r["unfinished"] for r in rr)
        med[c] = {"good": statistics.median(good), "share": statistics.median(share),
                  "rej": statistics.median(rej), "failed": sum(r["failed"] for r in rr),
                  "max_rej": max(rej)}
        adm = [r for r in rr if r["adm_p50"] >= 0]
        adm_cell = (f"{statistics.median(r['adm_p50'] for r in adm):.0f} / "
                    f"{max(r['adm_max'] for r in adm):.0f}, "
                    f"{statistics.median(r['tok_p50'] for r in adm):,.0f} / "
                    f"{max(r['tok_max'] for r in adm):,.0f}"
                    if adm else "— (too many records)")
        tries = statistics.median(r["attempts"] / max(1.0, r["ok"] + r["failed"]) for r in rr)
        secs_cell = (f"{'> ' if capped else ''}{statistics.median(secs):.1f} "
                     f"({_runs(secs, '.1f')})")
        print(f"| {LABELS[c]} | {med[c]['good']:.1f} | {med[c]['share']:.1f} % "
              f"({_runs(share, '.1f')}) | {med[c]['rej']:.2f} % ({_runs(rej, '.2f')}; "
              f"{tries:.2f} attempts/item) | "
              f"{secs_cell} | {med[c]['failed']:.0f} | "
              f"{_runs([r['unfinished'] for r in rr], '.0f')} | {adm_cell} | "
              f"{statistics.median(r['cpu_s'] for r in rr):.1f} |")
    print()
    print("Goodput: items that succeeded ÷ the client's wall time (a capped run: over "
          "its time until the cap's in-flight items ended). Rejected: the mock's "
          "429s ÷ every request it received (its `/_mock/limits` totals); attempts per "
          "item: ÷ the items that ended. Per full second (the mock's records, seconds "
          "since the first request, the first and last left out) the mock admits at "
          f"most {r0['rpw'] / w:.0f} requests and {r0['tpw'] / w:,.0f} tokens: a median "
          "below those while the batch runs is the client not sending, a maximum at "
          "them the mock keeping up.")
    print()
    cook = med.get("cookbook")
    for c in LLMRETRY_ROWS:
        m = med.get(c)
        if not m:
            continue
        ok = m["share"] >= 95 and m["rej"] <= 1 and m["failed"] == 0
        print(f"- {LABELS[c]}: ≥ 95 % of the limit with ≤ 1 % of attempts rejected: "
              f"**{'met' if ok else 'NOT met'}** ({m['share']:.1f} %, {m['rej']:.2f} % "
              f"rejected (worst run {m['max_rej']:.2f} %), {m['failed']:.0f} items failed).")
        if cook:
            print(f"- {LABELS[c]} ≥ the cookbook processor's goodput: "
                  f"**{'met' if m['good'] >= cook['good'] else 'NOT met'}** "
                  f"({m['good']:.1f} vs {cook['good']:.1f} items/s, "
                  f"{m['good'] / cook['good']:.1f}×).")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run")
    run.add_argument("client", choices=list(LABELS))
    run.add_argument("--n", type=int, default=3000)
    run.add_argument("--block", type=int, default=375)
    run.add_argument("--rpw", type=int, default=100, help="requests per window")
    run.add_argument("--tpw", type=int, default=16667, help="tokens per window")
    run.add_argument("--window-ms", type=float, default=1000)
    run.add_argument("--latency-ms", type=float, default=100)
    run.add_argument("--limit", type=int, default=64)
    run.add_argument("--cap-s", type=float, default=0, help="peers: start nothing after")
    run.add_argument("--openai-retries", type=int, default=30)
    run.add_argument("--run", type=int, default=1)
    run.add_argument("--timeline", action="store_true")
    cap = sub.add_parser("mockcap")
    cap.add_argument("--n", type=int, default=3000)
    cap.add_argument("--limit", type=int, default=64)
    rep = sub.add_parser("report")
    rep.add_argument("results")
    rep.add_argument("--title", default="")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        return cmd_run(args)
    if args.cmd == "mockcap":
        return cmd_mockcap(args)
    return cmd_report(args)


if __name__ == "__main__":
    sys.exit(main())
