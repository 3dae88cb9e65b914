"""The Python benchmark: llmretry against the openai SDK and httpx + tenacity,
all against the same local nginx. See bench/README.md; bench/run_python.sh
drives it.

    python3 bench/bench_python.py run CLIENT MODE --base-url URL [--n 2000]
        [--conc 32] [--warmup 1000] [--run I]
    python3 bench/bench_python.py report RESULTS [--title TEXT]

``run`` measures one client in this (fresh) process and prints one line
``RESULT client=... mode=... run=... n=... ok=... secs=... rps=... cpu_us=...
conns=...``. MODE ``seq``: N calls one after the other; ``conc``: N items
at most CONC at once (llmretry: ``map_with_concurrency`` or ``call_many``;
the Python peers: a ``ThreadPoolExecutor(CONC)`` made for the batch, as
application code does). Before the measured window the same mode runs
WARMUP items (connections open, code paths warm). ``cpu_us`` is
``getrusage(RUSAGE_SELF)`` user + sys over the window ÷ N: the whole
process, so llmretry's I/O thread and every pool thread are counted; nginx
is not. ``conns`` is how many connections nginx accepted during the window
(its ``stub_status``), to see keep-alive at work.

``report`` turns RESULT lines into the markdown tables. (The seed's Node
client, measured here until issue 21, is not part of this repository: see
bench/README.md.)
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import peers_python  # noqa: E402

EXPECTED_TOKENS = 13      # usage.total_tokens of nginx's canned answer


# ---------------------------------------------------------------------------
# Clients: each gives call(i) -> total_tokens, and optionally a batch runner.

Call = Callable[[int], int]
Batch = Callable[[int, int, int], List[int]]      # (start, count, conc) -> tokens


def _thread_pool_batch(call: Call) -> Batch:
    def batch(start: int, count: int, conc: int) -> List[int]:
        with ThreadPoolExecutor(conc) as pool:
            return list(pool.map(call, range(start, start + count)))
    return batch


def make_client(name: str, base_url: str) -> Tuple[Call, Batch, Callable[[], None]]:
    if name in ("llmretry", "llmretry-nolog", "llmretry-callmany"):
        import llmretry

        if name == "llmretry-nolog":
            client = llmretry.Client(base_url=base_url, api_key=peers_python.API_KEY,
                                     logger=None)
        else:   # the default logger: logging.getLogger("llmretry") + NullHandler
            client = llmretry.Client(base_url=base_url, api_key=peers_python.API_KEY)
        call_llm = llmretry.call_llm
        body_for = peers_python.body_for

        def call(i: int) -> int:
            return call_llm(body_for(i), client=client).data["usage"]["total_tokens"]

        if name == "llmretry-callmany":
            def batch(start: int, count: int, conc: int) -> List[int]:
                out = client.call_many([body_for(i) for i in range(start, start + count)],
                                       limit=conc)
                return [r.data["usage"]["total_tokens"] if isinstance(r, llmretry.Result)
                        else -1 for r in out]
        else:
            def worker(i: int, _index: int) -> int:
                return call_llm(body_for(i), client=client).data["usage"]["total_tokens"]

            def batch(start: int, count: int, conc: int) -> List[int]:
                return llmretry.map_with_concurrency(range(start, start + count), conc,
                                                     worker)
        return call, batch, client.close
    call, close = peers_python.PEERS[name](base_url)
    return call, _thread_pool_batch(call), close


def nginx_accepts(base_url: str) -> int:
    """nginx's stub_status 'accepts' counter (connections accepted so far)."""
    root = base_url.split("/v1")[0]
    with urllib.request.urlopen(root + "/status", timeout=5) as r:
        lines = r.read().decode().splitlines()
    return int(lines[2].split()[0])


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    ru = resource.getrusage(who)
    return ru.ru_utime + ru.ru_stime


def cmd_run(args: argparse.Namespace) -> int:
    call, batch, close = make_client(args.client, args.base_url)

    def work(start: int, count: int) -> List[int]:
        if args.mode == "seq":
            return [call(i) for i in range(start, start + count)]
        return batch(start, count, args.conc)

    warm = work(0, args.warmup) if args.warmup else []
    if any(t != EXPECTED_TOKENS for t in warm):
        print(f"FAILED warm-up of {args.client}", file=sys.stderr)
        return 1
    conns0 = nginx_accepts(args.base_url)
    cpu0 = cpu_seconds()
    t0 = time.perf_counter()
    tokens = work(args.warmup, args.n)
    secs = time.perf_counter() - t0
    cpu = cpu_seconds() - cpu0
    conns = nginx_accepts(args.base_url) - conns0 - 1   # less the status request's own
    close()
    ok = sum(1 for t in tokens if t == EXPECTED_TOKENS)
    print(f"RESULT client={args.client} mode={args.mode} run={args.run} n={args.n} "
          f"conc={args.conc if args.mode == 'conc' else 1} ok={ok} secs={secs:.4f} "
          f"rps={args.n / secs:.0f} cpu_us={cpu * 1e6 / args.n:.1f} conns={conns}",
          flush=True)
    return 0 if ok == args.n else 1


# ---------------------------------------------------------------------------
# The report

LABELS = {
    "llmretry": "llmretry `call_llm` (Client, default logger)",
    "llmretry-nolog": "llmretry `call_llm` (Client, `logger=None`)",
    "llmretry-callmany": "llmretry `Client.call_many` (extra, for scale)",
    "openai": "openai SDK {openai} (`max_retries=2`)",
    "httpx-tenacity": "httpx {httpx} + tenacity {tenacity}",
}
CONC_LABELS = {
    "llmretry": "llmretry `map_with_concurrency` → `call_llm` (default logger)",
    "llmretry-nolog": "llmretry `map_with_concurrency` → `call_llm` (`logger=None`)",
    "openai": "openai SDK {openai}, `ThreadPoolExecutor({conc})`",
    "httpx-tenacity": "httpx + tenacity, `ThreadPoolExecutor({conc})`, 1 shared Client",
}


def parse_results(path: str) -> List[Dict[str, Any]]:
    rows = []
    with open(path) as f:
        for line in f:
            if not line.startswith("RESULT "):
                continue
            row: Dict[str, Any] = dict(kv.split("=", 1) for kv in line.split()[1:])
            for k in ("run", "n", "conc", "ok", "rps", "conns"):
                row[k] = int(float(row[k]))
            for k in ("secs", "cpu_us"):
                row[k] = float(row[k])
            rows.append(row)
    return rows


def _fmt(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def _per_run(rows: Dict[int, Dict[str, Any]], base: Dict[int, Dict[str, Any]],
             key: str) -> List[float]:
    return [rows[r][key] / base[r][key] for r in sorted(rows) if r in base]


def cmd_report(args: argparse.Namespace) -> int:
    rows = parse_results(args.results)
    vers = dict(peers_python.versions())
    by: Dict[Tuple[str, str], Dict[int, Dict[str, Any]]] = {}
    for row in rows:
        by.setdefault((row["mode"], row["client"]), {})[row["run"]] = row
    verdicts = []
    if args.title:
        print(args.title)
        print()
    for mode in ("seq", "conc"):
        clients = [c for c in LABELS if (mode, c) in by]
        if not clients:
            continue
        base = by.get((mode, "openai"), {})
        any_row = next(iter(by[(mode, clients[0])].values()))
        n, conc = any_row["n"], any_row["conc"]
        runs = max(len(by[(mode, c)]) for c in clients)
        if mode == "seq":
            print(f"**(1) Sequential calls**, {n:,} calls after a warm-up, 0 ms server, "
                  f"median of {runs} runs (per-run figures in run order; ratios pair run *i* "
                  f"with the openai SDK's run *i*)")
        else:
            print(f"**(2) Concurrency {conc}**, {n:,} items after a warm-up, 0 ms server, "
                  f"median of {runs} runs")
        print()
        print("| client | req/s | runs | × openai req/s (per run) | CPU µs/call | runs "
              "| CPU ÷ openai (per run) | nginx conns |")
        print("|---|---:|---|---|---:|---|---|---:|")
        for c in clients:
            rr = by[(mode, c)]
            label = (CONC_LABELS.get(c) if mode == "conc" else None) or LABELS[c]
            label = label.format(conc=conc, **vers)
            rps = statistics.median(r["rps"] for r in rr.values())
            cpu = statistics.median(r["cpu_us"] for r in rr.values())
            runs_rps = "/".join(_fmt(rr[r]["rps"]) for r in sorted(rr))
            runs_cpu = "/".join(_fmt(rr[r]["cpu_us"], 0) for r in sorted(rr))
            if base and c != "openai":
                pr = _per_run(rr, base, "rps")
                pc = _per_run(rr, base, "cpu_us")
                r_rps = (f"{statistics.median(pr):.2f}× "
                         f"({'/'.join(f'{x:.2f}' for x in pr)})") if pr else "—"
                r_cpu = (f"{statistics.median(pc):.2f} "
                         f"({'/'.join(f'{x:.2f}' for x in pc)})") if pc else "—"
            else:
                r_rps, r_cpu = ("1.00×", "1.00") if base else ("—", "—")
            conns = statistics.median(r["conns"] for r in rr.values())
            print(f"| {label} | {_fmt(rps)} | {runs_rps} | {r_rps} | {_fmt(cpu, 1)} | "
                  f"{runs_cpu} | {r_cpu} | {conns:.0f} |")
            if c == "llmretry" and base:
                if mode == "conc":
                    pr = _per_run(rr, base, "rps")
                    m = statistics.median(pr)
                    verdicts.append(
                        f"- Target (2) llmretry ≥ 3× the openai SDK's throughput at "
                        f"concurrency {conc}: **{'met' if m >= 3 else 'NOT met'}** "
                        f"({m:.2f}× median of per-run ratios; per run "
                        f"{'/'.join(f'{x:.2f}' for x in pr)}; ratio of medians "
                        f"{rps / statistics.median(r['rps'] for r in base.values()):.2f}×).")
                else:
                    pc = _per_run(rr, base, "cpu_us")
                    m = statistics.median(pc)
                    verdicts.append(
                        f"- Target (1) llmretry ≤ 1/3 of the openai SDK's CPU per sequential "
                        f"call: **{'met' if m <= 1 / 3 else 'NOT met'}** ({m:.2f} of it, "
                        f"median of per-run ratios; per run "
                        f"{'/'.join(f'{x:.2f}' for x in pc)}; ratio of medians "
                        f"{cpu / statistics.median(r['cpu_us'] for r in base.values()):.2f}).")
        print()
    for v in verdicts:
        print(v)
    bad = [r for r in rows if r["ok"] != r["n"]]
    if bad:
        print(f"\n{len(bad)} runs had failed calls: "
              + ", ".join(f"{r['client']}/{r['mode']}/{r['run']}" for r in bad))
        return 1
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run")
    run.add_argument("client", choices=["llmretry", "llmretry-nolog", "llmretry-callmany",
                                        *peers_python.PEERS])
    run.add_argument("mode", choices=["seq", "conc"])
    run.add_argument("--base-url", required=True)
    run.add_argument("--n", type=int, default=2000)
    run.add_argument("--conc", type=int, default=32)
    run.add_argument("--run", type=int, default=1)
    run.add_argument("--warmup", type=int, default=1000)
    rep = sub.add_parser("report")
    rep.add_argument("results")
    rep.add_argument("--title", default="")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        return cmd_run(args)
    return cmd_report(args)


if __name__ == "__main__":
    sys.exit(main())
