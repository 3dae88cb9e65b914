"""The batch benchmark: ``llmretry.call_many`` next to the bare libcurl multi
loop, both against the same local nginx. See bench/README.md ("Batch
benchmark"); bench/run_batch.sh drives it.

    python3 bench/bench_batch.py run CLIENT --base-url URL [--n 20000]
        [--limit 64] [--warmup 0] [--run I] [--endpoint fast|slow] [--reps 1]
    python3 bench/bench_batch.py report RESULTS [--title TEXT] [--limit 64]

``run`` measures one llmretry client in this (fresh) process and prints one
line ``RESULT client=... endpoint=... run=... n=... limit=... ok=... secs=...
rps=... cpu_us=...``. CLIENT is

- ``callmany-nolog``: ``Client(logger=None).call_many(bodies, limit=LIMIT)``;
- ``callmany``: the same with the default logger (nothing passed);
- ``map``: ``map_with_concurrency(bodies, LIMIT, worker)``, ``worker(body, i)``
  calling ``call_llm(body, client=client)`` (default logger), for scale;
- ``callmany-nolog-gcoff``: ``callmany-nolog`` with the cyclic GC disabled
  (``gc.disable()``) for the window: a what-if for the CPU split table.

The bodies (``peers_python.body_for(i)``, the other benchmarks' request) are
built before the window; encoding them is part of ``call_many`` and is
counted. The client (its engine and I/O thread) is made before the window.
With ``--warmup W`` a batch of W items runs first (default 0: the measured
batch is the client's first, connection set-up included, as for the bare
loop). ``cpu_us`` is ``getrusage(RUSAGE_SELF)`` user + sys over the window
÷ N: the whole process, the engine's I/O thread included; nginx is not.
``main_us`` is the calling thread's CPU (``time.thread_time()``) ÷ N and
``gc_us`` the time the cyclic GC ran in the window (``gc.callbacks``) ÷ N.
Every result is checked (``usage.total_tokens`` of the canned answer, 13);
a run with a failed item exits non-zero. ``--reps R`` measures the same batch
R times in the process, one RESULT line each (bench/profile_batch.sh).

``report`` turns the RESULT lines of every client (these and
``bare_multi``'s, tagged by run_batch.sh) into the markdown tables and the
verdicts. (The seed's Node client, measured here until issue 21, is not part
of this repository: see bench/README.md.)
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# LLMRETRY_BENCH_TREE: another checkout's python/ folder (run_batch.sh's
# BASELINE row measures an older commit's llmretry in the same rounds).
sys.path.insert(0, os.environ.get("LLMRETRY_BENCH_TREE") or
                os.path.join(os.path.dirname(HERE), "python"))

import peers_python  # noqa: E402  (body_for, API_KEY; imports no peer library)

EXPECTED_TOKENS = 13      # usage.total_tokens of nginx's canned answer
IDEAL_LATENCY_S = 0.05    # the slow endpoint's echo_sleep


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    ru = resource.getrusage(who)
    return ru.ru_utime + ru.ru_stime


def _tokens(value: Any) -> int:
    import llmretry
    if isinstance(value, llmretry.Result):
        return value.data["usage"]["total_tokens"]   # type: ignore[no-any-return]
    return -1


def cmd_run(args: argparse.Namespace) -> int:
    import llmretry

    # The engine runs at most max_in_flight calls (default 256): sized to the
    # batch's limit so that C=1024 really has 1024 in flight, as the bare loop.
    kwargs: Dict[str, Any] = {"base_url": args.base_url, "api_key": peers_python.API_KEY,
                              "max_in_flight": max(256, args.limit)}
    if args.client.startswith("callmany-nolog"):
        kwargs["logger"] = None
    client = llmretry.Client(**kwargs)
    body_for = peers_python.body_for
    gc_off = args.client.endswith("-gcoff")   # what if the batch ran without the cyclic GC

    # The cyclic GC's time on the calling thread, from gc.callbacks.
    gc_time = [0.0, 0.0]

    def on_gc(phase: str, _info: Dict[str, Any]) -> None:
        if phase == "start":
            gc_time[1] = time.perf_counter()
        else:
            gc_time[0] += time.perf_counter() - gc_time[1]

    marks: Dict[str, float] = {}

    def window_start() -> None:
        if gc_off:
            gc.disable()
        gc_time[0] = 0.0
        marks.clear()
        marks.update(cpu0=cpu_seconds(), main0=time.thread_time(), t0=time.perf_counter())

    def window_end() -> None:
        if "t0" in marks and "secs" not in marks:
            marks["secs"] = time.perf_counter() - marks["t0"]
            marks["cpu"] = cpu_seconds() - marks["cpu0"]
            marks["main"] = time.thread_time() - marks["main0"]
            marks["gc"] = gc_time[0]
            if gc_off:
                gc.enable()

    if args.client == "map":
        call_llm = llmretry.call_llm

        def worker(body: Dict[str, Any], _index: int) -> int:
            return call_llm(body, client=client).data["usage"]["total_tokens"]  # type: ignore

        def batch(bodies: List[Dict[str, Any]], timed: bool) -> List[int]:
            if timed:
                window_start()
            out = list(llmretry.map_with_concurrency(bodies, args.limit, worker))
            if timed:
                window_end()
            return out
    else:
        def batch(bodies: List[Dict[str, Any]], timed: bool) -> List[int]:
            # Only call_many is timed; reading the results comes after the window.
            if timed:
                window_start()
            out = client.call_many(bodies, limit=args.limit)
            if timed:
                window_end()
            return [_tokens(r) for r in out]

    if args.warmup:
        warm = batch([body_for(i) for i in range(args.warmup)], False)
        if any(t != EXPECTED_TOKENS for t in warm):
            print(f"FAILED warm-up of {args.client}", file=sys.stderr)
            return 1
    gc.callbacks.append(on_gc)
    n, failed = args.n, 0
    for rep in range(args.reps):     # reps > 1: the same batch again (for profiling)
        bodies = [body_for(i) for i in range(args.warmup, args.warmup + n)]
        tokens = batch(bodies, True)
        ok = sum(1 for t in tokens if t == EXPECTED_TOKENS)
        failed += n - ok
        print(f"RESULT client={args.client}{args.tag} endpoint={args.endpoint} run={args.run} n={n} "
              f"limit={args.limit} ok={ok} secs={marks['secs']:.4f} "
              f"rps={n / marks['secs']:.0f} cpu_us={marks['cpu'] * 1e6 / n:.2f} "
              f"main_us={marks['main'] * 1e6 / n:.2f} gc_us={marks['gc'] * 1e6 / n:.2f}"
              + (f" rep={rep + 1}" if args.reps > 1 else ""), flush=True)
        del bodies, tokens
        gc.collect()                 # the previous results go before the next window
    gc.callbacks.remove(on_gc)
    client.close()
    return 0 if failed == 0 else 1


# ---------------------------------------------------------------------------
# The report

LABELS = {
    "bare": "bare libcurl multi loop + cJSON (C, `bare_multi.c`)",
    "bare-shards": "the same with connection caches of 64 transfers, as the engine's "
                   "(`LLMRETRY_BENCH_SHARDS=64`)",
    "callmany-nolog": "llmretry `call_many` (`logger=None`)",
    "callmany-nolog@baseline": "llmretry `call_many` (`logger=None`) at the baseline commit",
    "callmany": "llmretry `call_many` (default logger)",
    "map": "llmretry `map_with_concurrency` → `call_llm` (default logger; for scale)",
}
ORDER = list(LABELS)
SPLIT_LABELS = {
    "callmany-nolog": "`call_many` (`logger=None`)",
    "callmany": "`call_many` (default logger)",
    "callmany-nolog-gcoff": "what-if: `call_many` (`logger=None`), `gc.disable()` during the batch",
}
TARGET_ROWS = ("callmany-nolog", "callmany")


def parse_results(path: str) -> List[Dict[str, Any]]:
    rows = []
    with open(path) as f:
        for line in f:
            if not line.startswith("RESULT "):
                continue
            row: Dict[str, Any] = dict(kv.split("=", 1) for kv in line.split()[1:])
            if "prog" in row:           # bare_multi
                row["client"] = row.pop("prog")
            for k in ("run", "n", "ok", "rps"):
                row[k] = int(float(row[k]))
            for k in ("secs", "cpu_us", "main_us", "gc_us"):
                if k in row:
                    row[k] = float(row[k])
            row["conns"] = int(row["pconns"]) if "pconns" in row else None
            rows.append(row)
    return rows


def _fmt(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def _fmt_conns(conns: List[int]) -> str:
    return f"{statistics.median(conns):g}" if conns else "—"


def _ratios(rows: Dict[int, Dict[str, Any]], base: Dict[int, Dict[str, Any]]) -> List[float]:
    """Run i of a client against run i of base (same round, seconds apart)."""
    return [rows[r]["rps"] / base[r]["rps"] for r in sorted(rows) if r in base]


def _ratio_cell(pr: List[float], digits: int = 2) -> str:
    if not pr:
        return "—"
    return (f"{statistics.median(pr):.{digits}f}× "
            f"({'/'.join(f'{x:.{digits}f}' for x in pr)})")


def cmd_report(args: argparse.Namespace) -> int:
    rows = parse_results(args.results)
    by: Dict[Tuple[str, str], Dict[int, Dict[str, Any]]] = {}
    for row in rows:
        by.setdefault((row["endpoint"], row["client"]), {})[row["run"]] = row
    verdicts: List[str] = []
    if args.title:
        print(args.title)
        print()

    def med(rr: Dict[int, Dict[str, Any]], key: str) -> float:
        return statistics.median(r[key] for r in rr.values())

    # ---- (1) 0 ms endpoint
    clients = [c for c in ORDER if ("fast", c) in by]
    if clients:
        bare = by.get(("fast", "bare"), {})
        any_row = next(iter(by[("fast", clients[0])].values()))
        runs = max(len(by[("fast", c)]) for c in clients)
        print(f"**(1) Batch of {any_row['n']:,} requests, {args.limit} in flight, 0 ms "
              f"server**, median of {runs} interleaved runs (per-run figures in run order; "
              f"a ratio *per run* pairs run *i* with the other client's run *i* of the "
              f"same round)")
        print()
        print("| client | req/s | runs | × bare (per run) | CPU µs/req | runs | nginx conns |")
        print("|---|---:|---|---|---:|---|---:|")
        for c in clients:
            rr = by[("fast", c)]
            rps = med(rr, "rps")
            cpu = med(rr, "cpu_us")
            conns = [r["conns"] for r in rr.values() if r["conns"] is not None]
            cell = ("1.00×" if c == "bare" else
                    _ratio_cell(_ratios(rr, bare)) if bare else "—")
            print(f"| {LABELS[c]} | {_fmt(rps)} | "
                  f"{'/'.join(_fmt(rr[r]['rps']) for r in sorted(rr))} | "
                  f"{cell} | {_fmt(cpu, 1)} | "
                  f"{'/'.join(_fmt(rr[r]['cpu_us'], 1) for r in sorted(rr))} | "
                  f"{_fmt_conns(conns)} |")
        print()
        # Issue 36's goals: 0.7x the bare loop at 64 in flight, 0.85x at 1,024
        # (a limit in between is held to the lower one).
        goal = 0.85 if args.limit >= 1024 else 0.7
        for c in TARGET_ROWS:
            rr = by.get(("fast", c))
            if not rr:
                continue
            if bare:
                pr = _ratios(rr, bare)
                m = statistics.median(pr)
                verdicts.append(
                    f"- {LABELS[c]} ≥ {goal}× the bare loop: "
                    f"**{'met' if m >= goal else 'NOT met'}** "
                    f"({m:.3f}×, median of per-run ratios {'/'.join(f'{x:.2f}' for x in pr)}; "
                    f"ratio of medians {med(rr, 'rps') / med(bare, 'rps'):.2f}×; CPU per "
                    f"request {med(rr, 'cpu_us') / med(bare, 'cpu_us'):.2f}× the bare loop's).")
            sharded = by.get(("fast", "bare-shards"))
            if sharded:
                # The engine's caches of 64 beat libcurl's one cache at this
                # many in flight: against the bare loop that has them too,
                # the ratio is the policy's cost alone.
                pr = _ratios(rr, sharded)
                verdicts.append(
                    f"  - against the bare loop with the engine's connection caches: "
                    f"{statistics.median(pr):.3f}× (per run {'/'.join(f'{x:.2f}' for x in pr)}; "
                    f"CPU per request {med(rr, 'cpu_us') / med(sharded, 'cpu_us'):.2f}×).")

        base_rows = by.get(("fast", "callmany-nolog@baseline"))
        now_rows = by.get(("fast", "callmany-nolog"))
        if base_rows and now_rows:
            pr = _ratios(now_rows, base_rows)
            m = statistics.median(pr)
            verdicts.append(
                f"- {LABELS['callmany-nolog']} does not regress against the baseline commit "
                f"(≥ 0.95× its throughput in the same rounds): "
                f"**{'met' if m >= 0.95 else 'NOT met'}** ({m:.3f}×, per run "
                f"{'/'.join(f'{x:.2f}' for x in pr)}; CPU per request "
                f"{med(now_rows, 'cpu_us'):.1f} vs {med(base_rows, 'cpu_us'):.1f} µs).")

    # ---- (2) 50 ms endpoint
    clients = [c for c in ORDER if ("slow", c) in by]
    if clients:
        any_row = next(iter(by[("slow", clients[0])].values()))
        n = any_row["n"]
        runs = max(len(by[("slow", c)]) for c in clients)
        ideal = args.limit / IDEAL_LATENCY_S
        rounds = -(-n // args.limit)            # the busiest slot's requests
        ceiling = n / (rounds * IDEAL_LATENCY_S)
        print(f"**(2) Batch of {n:,} requests, {args.limit} in flight, 50 ms server**, "
              f"median of {runs} interleaved runs. Ideal {args.limit} / 0.05 s = "
              f"{ideal:,.0f} req/s; with {n:,} requests the busiest of the {args.limit} "
              f"slots serves {rounds}, so even a zero-overhead client needs "
              f"{rounds} × 50 ms: at most {ceiling:,.0f} req/s ({ceiling / ideal:.1%} of "
              f"the ideal).")
        print()
        print("| client | req/s | runs | % of ideal (per run) | CPU µs/req | nginx conns |")
        print("|---|---:|---|---|---:|---:|")
        for c in clients:
            rr = by[("slow", c)]
            rps = med(rr, "rps")
            pct = [rr[r]["rps"] / ideal * 100 for r in sorted(rr)]
            conns = [r["conns"] for r in rr.values() if r["conns"] is not None]
            print(f"| {LABELS[c]} | {_fmt(rps)} | "
                  f"{'/'.join(_fmt(rr[r]['rps']) for r in sorted(rr))} | "
                  f"{statistics.median(pct):.1f} % ({'/'.join(f'{x:.1f}' for x in pct)}) | "
                  f"{_fmt(med(rr, 'cpu_us'), 1)} | "
                  f"{_fmt_conns(conns)} |")
            if c in TARGET_ROWS:
                p = rps / ideal
                verdicts.append(
                    f"- {LABELS[c]} at 50 ms ≥ 95 % of {ideal:,.0f} req/s: "
                    f"**{'met' if p >= 0.95 else 'NOT met'}** ({p:.1%}, median; per run "
                    f"{'/'.join(f'{x:.1f}' for x in pct)} %).")
        print()
    # ---- (3) where call_many's CPU goes
    clients = [c for c in SPLIT_LABELS if ("fast", c) in by]
    if clients:
        bare = by.get(("fast", "bare"), {})
        print("**(3) Where `call_many`'s CPU goes** (0 ms server, same runs; medians, µs per "
              "request): the calling thread (`time.thread_time()`: encoding, submitting, "
              "building each result, the batch record) and within it the cyclic GC "
              "(`gc.callbacks`); the rest of the process is the engine's I/O thread.")
        print()
        print("| client | req/s | × bare (per run) | process CPU | calling thread | of which GC "
              "| I/O thread (rest) | bare loop, whole process |")
        print("|---|---:|---|---:|---:|---:|---:|---:|")
        for c in clients:
            rr = by[("fast", c)]
            io = statistics.median(r["cpu_us"] - r["main_us"] for r in rr.values())
            bare_cpu = f"{med(bare, 'cpu_us'):.1f}" if bare else "—"
            print(f"| {SPLIT_LABELS[c]} | {_fmt(med(rr, 'rps'))} | "
                  f"{_ratio_cell(_ratios(rr, bare)) if bare else '—'} | "
                  f"{med(rr, 'cpu_us'):.1f} | {med(rr, 'main_us'):.1f} | {med(rr, 'gc_us'):.1f} "
                  f"| {io:.1f} | {bare_cpu} |")
        print()
    for v in verdicts:
        print(v)
    bad = [r for r in rows if r["ok"] != r["n"]]
    if bad:
        print(f"\n{len(bad)} runs had failed calls: "
              + ", ".join(f"{r['client']}/{r['endpoint']}/{r['run']}" for r in bad))
        return 1
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run")
    run.add_argument("client", choices=["callmany-nolog", "callmany", "map",
                                        "callmany-nolog-gcoff"])
    run.add_argument("--warmup", type=int, default=0)
    run.add_argument("--reps", type=int, default=1)
    run.add_argument("--tag", default="", help="appended to the client's name (@baseline)")
    run.add_argument("--base-url", required=True)
    run.add_argument("--n", type=int, default=20000)
    run.add_argument("--limit", type=int, default=64)
    run.add_argument("--run", type=int, default=1)
    run.add_argument("--endpoint", choices=["fast", "slow"], default="fast")
    rep = sub.add_parser("report")
    rep.add_argument("results")
    rep.add_argument("--title", default="")
    rep.add_argument("--limit", type=int, default=64)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        return cmd_run(args)
    return cmd_report(args)


if __name__ == "__main__":
    sys.exit(main())
