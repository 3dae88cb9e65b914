#!/usr/bin/env python3
"""BENCHMARKS.md and bench/plots/*.png from bench/results/latest.json.

    python3 bench/suite/report.py [--in FILE] [--out BENCHMARKS.md] [--plots DIR]

Every figure is a median of the runs in the file; ratios compare medians at
the same concurrency. matplotlib is pip-installed when missing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, List, Optional

ROOT = Path(__file__).resolve().parents[2]
CALL_MANY = "llmretry_call_many"
BARE = "bare_multi"

Row = dict[str, Any]


# ---------------------------------------------------------------------------
# Reading the results

class Results:
    def __init__(self, data: dict[str, Any]) -> None:
        self.d = data
        self.clients: list[Row] = data.get("clients", [])
        self.labels = {c["id"]: c.get("label", c["id"]) for c in self.clients}
        self.meds: dict[tuple[str, str, int], Row] = {
            (m["client"], m["endpoint"], m["concurrency"]): m for m in data.get("medians", [])}

    def concs(self, endpoint: str) -> list[int]:
        return sorted({k[2] for k in self.meds if k[1] == endpoint})

    def get(self, cid: str, endpoint: str, c: int, key: str) -> Optional[float]:
        m = self.meds.get((cid, endpoint, c))
        return m.get(key) if m else None

    def measured(self, endpoint: str) -> list[str]:
        """Client ids with at least one median on this endpoint, in file order."""
        have = {k[0] for k, m in self.meds.items() if k[1] == endpoint and "rps" in m}
        return [c["id"] for c in self.clients if c["id"] in have]

    def label(self, cid: str) -> str:
        return self.labels.get(cid, cid)


# ---------------------------------------------------------------------------
# Formatting

def num(v: Optional[float], digits: int = 0) -> str:
    if v is None:
        return "—"
    return f"{v:,.{digits}f}"


def ratio(a: Optional[float], b: Optional[float]) -> str:
    if a is None or b is None or b == 0:
        return "—"
    r = a / b
    if r < 0.1:
        return f"{r:.3f}×"
    return f"{r:.2f}×" if r < 10 else f"{r:.1f}×"


def table(head: list[str], rows: list[list[str]], align: Optional[str] = None) -> str:
    align = align or "l" + "r" * (len(head) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def figure_tables(r: Results, endpoint: str, key: str, fmt: Callable[[Optional[float]], str],
                  what: str, ratios: bool = True) -> str:
    """Values per client × C, then the same as ratios to call_many and bare."""
    concs = r.concs(endpoint)
    ids = r.measured(endpoint)
    head = ["client"] + [f"C={c}" for c in concs]
    out = [table(head, [[r.label(i)] + [fmt(r.get(i, endpoint, c, key)) for c in concs]
                        for i in ids])]
    if ratios:
        for base, name in ((CALL_MANY, "llmretry `call_many`"), (BARE, "the bare libcurl loop")):
            if base not in ids:
                continue
            out.append(f"\n{what} ÷ {name}'s at the same concurrency:\n")
            out.append(table(head, [[r.label(i)] + [
                ratio(r.get(i, endpoint, c, key), r.get(base, endpoint, c, key)) for c in concs]
                for i in ids]))
    return "\n".join(out)


def spread_note(r: Results, endpoint: str) -> str:
    """The largest run-to-run spread of req/s, so a reader can judge the noise."""
    worst = None
    for (cid, ep, c), m in r.meds.items():
        runs = m.get("rps_runs") or []
        if ep != endpoint or len(runs) < 2:
            continue
        s = (max(runs) - min(runs)) / m["rps"]
        if worst is None or s > worst[0]:
            worst = (s, cid, c)
    if worst is None:
        return ""
    return (f"Largest run-to-run spread (max − min over the median): {worst[0] * 100:.0f} % "
            f"({r.label(worst[1])}, C={worst[2]}); per-run values are in "
            "`bench/results/latest.json`.")


# ---------------------------------------------------------------------------
# Sections

def sec_machine(r: Results) -> str:
    m = r.d.get("machine", {})
    v = m.get("versions", {})
    opts = r.d.get("options", {})
    rows = [
        ["CPU", f"{m.get('cpu')} × {m.get('cores')} cores "
                f"({m.get('virtualization') or 'no virtualization detected'})"],
        ["RAM", f"{m.get('ram_gib')} GiB"],
        ["OS / kernel", f"{m.get('os')} ({m.get('debian_version')}), Linux {m.get('kernel')}"],
        ["llmretry", f"commit {v.get('llmretry')}"],
        ["Python / Lua / LuaJIT",
         f"{v.get('python')} / {v.get('lua5.4')} / {v.get('luajit')}"],
        ["nginx / libcurl / cJSON / wrk",
         f"{v.get('nginx')} / {v.get('libcurl')} / {v.get('libcjson')} / {v.get('wrk')}"],
        ["openai / httpx / aiohttp / tenacity",
         f"{v.get('openai')} / {v.get('httpx')} / {v.get('aiohttp')} / {v.get('tenacity')}"],
        ["run", f"{r.d.get('started')} → {r.d.get('finished')} "
                f"({r.d.get('duration_s', 0) / 60:.1f} min), "
                f"{opts.get('runs')} run(s) per row, ~{opts.get('target_seconds')} s timed per run"
                + (" — **--quick**" if opts.get("quick") else "")
                + (f" — only {', '.join(opts['only'])}" if opts.get("only") else "")],
        ["load average (1/5/15 min)", f"before {fmt_load(r.d.get('load_before'))}, "
                                      f"after {fmt_load(r.d.get('load_after'))}"],
    ]
    return table(["", ""], rows, "ll")


def fmt_load(x: Optional[list[float]]) -> str:
    return " / ".join(f"{v:.2f}" for v in x) if x else "?"


def sec_server(r: Results) -> str:
    sc = r.d.get("server_check") or {}
    srv = r.d.get("server", {})
    lines = [f"nginx {srv.get('nginx')}, one worker, access log off, keep-alive, on loopback "
             f"(`bench/nginx.conf`): `/v1/chat/completions` answers a canned chat.completion at "
             "once, `/slow/v1/chat/completions` after "
             f"{srv.get('slow_latency_s', 0.05) * 1000:.0f} ms "
             f"(`echo_sleep`). The server must not be the bottleneck: wrk against the 0 ms "
             f"endpoint should reach ≥ {sc.get('threshold', 5):.0f}× the fastest other client."]
    if "ratio" in sc:
        verdict = "**passed**" if sc["passed"] else "**not met**"
        lines.append(
            f"\nwrk's best: {num(sc['wrk_best_rps'])} req/s (C={sc['wrk_best_concurrency']}); "
            f"fastest other client: {r.label(sc['fastest_client'])}, "
            f"{num(sc['fastest_rps'])} req/s "
            f"(C={sc['fastest_concurrency']}): **{sc['ratio']:.2f}×** — {verdict}.")
        if not sc["passed"]:
            lines.append(
                f"nginx served at least {num(sc['wrk_best_rps'])} req/s; the fastest client "
                f"asked it for {100 / sc['ratio']:.0f} % of that. On "
                f"{r.d.get('machine', {}).get('cores')} cores the client, nginx's worker and "
                "everything else on the machine share the CPU, so the fastest client's figure "
                "may be somewhat low (nginx's CPU is CPU the client cannot use); the slower "
                "clients ask nginx for a small fraction of what it serves, and are not limited "
                "by it. Compare clients with each other, in this run. For the ratios to the "
                "bare loop this means: with every part on the same cores, a request costs the "
                "client's CPU plus nginx's, so a ratio reads as (the bare loop's CPU + nginx's) "
                "÷ (the client's CPU + nginx's) per request, which is nearer 1 than the clients' "
                "own costs compared (the bare loop's ÷ the client's): a ratio here is kinder to "
                "the slower client than on a machine where the server has cores of its own. "
                "The CPU per request below does not depend on the server.")
        rows = [[str(p["concurrency"]), num(p["wrk_rps"]), r.label(p["fastest"]),
                 num(p["fastest_rps"]), f"{p['ratio']:.2f}×"] for p in sc["per_concurrency"]]
        lines.append("\n" + table(["C", "wrk req/s", "fastest other client", "its req/s",
                                   "wrk ÷ it"], rows, "rrlrr"))
    else:
        lines.append("\n" + sc.get("note", "The server check did not run."))
    pre = sc.get("pre_check")
    if pre and "rps" in pre:
        lines.append(f"\nA first look before the matrix (wrk, C=64): {num(pre['rps'])} req/s.")
    return "\n".join(lines)


# The peers the headline compares call_many with: (what, which client ids).
PEERS: list[tuple[str, Callable[[Row], bool]]] = [
    ("the bare libcurl loop", lambda cl: cl["id"] == BARE),
    ("the fastest non-llmretry Python client", lambda cl: cl.get("group") == "python"),
    ("the openai SDK (fastest variant)", lambda cl: cl["id"].startswith("openai")),
    ("llmretry `map_with_concurrency` (Python)", lambda cl: cl["id"] == "llmretry_map"),
]


def sec_headline(r: Results) -> str:
    out = []
    for c in (64, 1024):
        cm = r.get(CALL_MANY, "fast", c, "rps")
        if cm is None:
            continue
        parts = []
        for what, pick in PEERS:
            rates = [(v, cl["id"]) for cl in r.clients
                     if pick(cl) and (v := r.get(cl["id"], "fast", c, "rps"))]
            if rates:
                v, cid = max(rates)
                name = what if what.startswith(("the bare", "llmretry")) \
                    else f"{what}: {r.label(cid)}"
                parts.append(f"**{ratio(cm, v)}** {name} ({num(v)})")
        out.append(f"- **0 ms server, C={c}:** `call_many` {num(cm)} req/s = "
                   + "; ".join(parts) + ".")
    for c in (64, 256):
        e = r.get(CALL_MANY, "slow", c, "efficiency")
        b = r.get(BARE, "slow", c, "efficiency")
        if e is not None:
            out.append(f"- **50 ms server, C={c}:** `call_many` {e * 100:.1f} % of the ideal "
                       f"{c / 0.05:,.0f} req/s"
                       + (f" (bare loop {b * 100:.1f} %)" if b else "") + ".")
    rss = {x["client"]: x for x in r.d.get("rss_per_call", []) if "kib_per_call" in x}
    if CALL_MANY in rss:
        x = rss[CALL_MANY]
        out.append(f"- **Memory:** `call_many` {x['kib_per_call']:.1f} KiB per call in flight "
                   f"(peak RSS at C={x['pair'][1]} against C={x['pair'][0]}, same N, 50 ms server)"
                   + (f"; bare loop {rss[BARE]['kib_per_call']:.1f} KiB" if BARE in rss else "")
                   + ".")
    cc = {x["id"]: x for x in (r.d.get("ctrl_c") or {}).get("clients", [])}
    if cc:
        out.append("- **Ctrl-C to exit:** " + "; ".join(
            f"{x['label']} {fmt_ms(x['median_s'])}" for x in cc.values()) + ".")
    rt = (r.d.get("retry_timer") or {}).get("clients", [])
    if rt:
        out.append("- **Retry timer, late by (median / p95):** " + "; ".join(
            f"{x['label']} {x['late_ms_median']:.1f} / {x['late_ms_p95']:.1f} ms"
            for x in rt if "late_ms_median" in x) + ".")
    return "\n".join(out)


def fmt_ms(s: Optional[float]) -> str:
    return "did not exit" if s is None else f"{s * 1000:.0f} ms"


def sec_efficiency(r: Results) -> str:
    concs = r.concs("slow")
    ids = r.measured("slow")
    rows = []
    for i in ids:
        cells = []
        for c in concs:
            e = r.get(i, "slow", c, "efficiency")
            cells.append("—" if e is None else f"{e * 100:.1f} %")
        rows.append([r.label(i)] + cells)
    ceil = sorted({float(m["ceiling"]) for k, m in r.meds.items()
                   if k[1] == "slow" and m.get("ceiling")})
    if ceil and min(ceil) >= 0.999:
        note = ("Every run's N is a whole number of rounds of C requests, so there is no "
                "partial last round: the ceiling of the test is 100 % less the first round's "
                "connection set-up and nginx's ~1 ms timer granularity per 50 ms round.")
    else:
        note = ("Ceiling from the partial last round: "
                + ", ".join(f"{x * 100:.1f} %" for x in ceil) + ".")
    return (table(["client"] + [f"C={c} (ideal {c / 0.05:,.0f}/s)" for c in concs], rows)
            + "\n\n" + note + " wrk runs for a fixed time, not a count.")


def sec_rss(r: Results) -> str:
    rows = []
    pair, one = (256, 1024), 1
    for x in r.d.get("rss_per_call", []):
        pair, one = x["pair"], x["one"]
        rss, reqs = x["rss_kib"], x.get("requests", {})
        rows.append([r.label(x["client"])]
                    + [num(mib(rss.get(str(c))), 1) for c in (one, *pair)]
                    + ["/".join(str(reqs.get(str(c), "?")) for c in pair),
                       num(x.get("kib_per_call"), 1), num(x.get("kib_per_call_vs_1"), 1)])
    if not rows:
        return "Not measured (needs the 50 ms runs at C=1, 256 and 1024)."
    lo, hi = pair
    return (f"(Peak RSS at C={hi} − at C={lo}) ÷ {hi - lo}: both runs make the same number "
            "of requests N, so what differs is the calls in flight. The last column is the "
            f"same against C={one}, as the issue defines it; it also counts the results a "
            "client keeps for the larger N (`call_many` returns all of them).\n\n"
            + table(["client", f"peak RSS, C={one} (MiB)", f"C={lo} (MiB)", f"C={hi} (MiB)",
                     f"N at C={lo}/{hi}", f"KiB per call in flight ({hi} vs {lo})",
                     f"({hi} vs {one})"], rows))


def mib(kib: Optional[float]) -> Optional[float]:
    return kib / 1024 if kib is not None else None


def sec_ctrlc(r: Results) -> str:
    cc = r.d.get("ctrl_c")
    if not cc:
        return "Not measured in this run."
    rows = []
    for x in cc["clients"]:
        times = [s.get("seconds") for s in x["samples"]]
        rows.append([x["label"], str(x["in_flight"]), fmt_ms(x["median_s"]),
                     " / ".join("—" if t is None else f"{t * 1000:.0f}" for t in times),
                     f"{x['exited']}/{len(x['samples'])}",
                     ", ".join(sorted({str(s.get("ended_with", s.get("error", "")))[:80]
                                       for s in x["samples"]})).replace("|", "\\|")])
    return (f"A fresh process per sample, blocked in a call to an endpoint that never answers "
            "(the mock server's `no_headers` stall); SIGINT "
            f"{cc['settle_s'] * 1000:.0f} ms after the "
            f"server saw its request(s); time until the process is gone (interpreter teardown "
            f"included), median of {cc['samples']}; a process still there after "
            f"{cc['cap_s']:.0f} s is killed and counts as not exited. "
            "`python3 bench/suite/ctrlc.py` reproduces it.\n\n"
            + table(["client", "in flight", "median", "samples (ms)", "exited", "ended with"],
                    rows, "lrrrrl"))


def sec_retry(r: Results) -> str:
    rt = r.d.get("retry_timer")
    if not rt:
        return "Not measured in this run."
    rows = []
    for x in rt["clients"]:
        if "error" in x:
            rows.append([x["label"], "—", "—", "—", "—", x["error"][:80]])
            continue
        rows.append([x["label"], str(x["attempts"]), f"{x['late_ms_median']:.2f}",
                     f"{x['late_ms_p95']:.2f}", f"{x['late_ms_max']:.2f}",
                     f"{x['scheduled_source']}: "
                     + ", ".join(f"{v:g}" for v in x["scheduled_ms_distinct"]) + " ms"])
    return (f"One call, {rt['retries']} answers of 429 with `Retry-After: {rt['retry_after']}` "
            "then a success. Actual wait k = time between the server reading attempt k and "
            "attempt k+1 (so it includes the 429's way back, the client's handling and the next "
            "request's way out); late by = actual − scheduled. "
            "`python3 bench/suite/retry_timer.py` reproduces it.\n\n"
            + table(["client", "attempts", "late by, median (ms)", "p95 (ms)", "max (ms)",
                     "scheduled wait"], rows, "lrrrrl"))


def sec_commands(r: Results) -> str:
    srv = r.d.get("server", {})
    lines = [
        "Each row is a fresh process, run from the repo root as "
        "`PYTHONPATH=python CMD --url BASE --concurrency C --requests N --warmup W`, "
        "BASE being `http://127.0.0.1:PORT/v1` for the 0 ms server and "
        "`http://127.0.0.1:PORT/slow/v1` for 50 ms, with the server started by "
        "`python3 bench/suite/server.py --port PORT` (stops on Ctrl-C); "
        "`python3 bench/suite/run.py --only ID` re-runs a client's rows with a server of its "
        f"own (this run used port {srv.get('port', '?')}). N/W of the median run:", ""]
    rows = []
    for cl in r.clients:
        cid = cl["id"]
        cells = []
        for ep in ("fast", "slow"):
            for c in r.concs(ep):
                m = r.meds.get((cid, ep, c))
                if m and m.get("command_text"):
                    argv = m["command_text"].split()
                    n = argv[argv.index("--requests") + 1]
                    w = argv[argv.index("--warmup") + 1]
                    cells.append(f"{'50 ms ' if ep == 'slow' else ''}C={c}: {n}/{w}")
        rows.append([f"`{cid}`", "`" + " ".join(cl["cmd"]) + "`", "; ".join(cells) or "—"])
    lines.append(table(["id", "CMD", "N/W per row"], rows, "lll"))
    return "\n".join(lines)


def sec_notes(r: Results) -> str:
    notes = list(r.d.get("notes", []))
    for (cid, ep, c), m in sorted(r.meds.items()):
        if m.get("errors"):
            notes.append(f"{r.label(cid)}, {'50 ms' if ep == 'slow' else '0 ms'}, C={c}: "
                         f"{len(m['errors'])} of {m['runs']} run(s) failed: {m['errors'][0][:200]}")
        where = f"{r.label(cid)}, {'50 ms' if ep == 'slow' else '0 ms'}, C={c}"
        if m.get("failed"):
            notes.append(f"{where}: {m['failed']} request(s) failed in the counted runs")
        for warning in sorted(set(m.get("warnings") or [])):
            notes.append(f"{where}: {warning}")
        # Warm-up and timed part together: a client that keeps its connections
        # opens C of them (connections are counted by nginx's stub_status).
        conns = [x for x in m.get("nginx_connections") or [] if x is not None]
        group = next((cl.get("group") for cl in r.clients if cl["id"] == cid), "")
        if conns and group != "wrk" and max(conns) > c + 1:
            notes.append(f"{where}: opened {'/'.join(map(str, conns))} connections "
                         f"(per run) for {c} in flight")
    skipped = [cl for cl in r.clients if cl.get("max_concurrency")]
    for cl in skipped:
        notes.append(f"{cl['label']}: runs up to C={cl['max_concurrency']} only "
                     "(its `max_concurrency`)")
    if not notes:
        return "No failed runs, no failed requests, no skipped clients."
    return "\n".join("- " + n.replace("|", "\\|") for n in notes)


# ---------------------------------------------------------------------------
# Plots

def ensure_matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError:
        print("report: pip installing matplotlib", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "matplotlib"], check=True)
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


GROUP_LINES = {"llmretry-python": "-", "lua": "-.", "python": ":", "c": "--"}
# Colours for the rows without a fixed style: tab10 without red, grey and black.
PALETTE = ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink",
           "tab:olive", "tab:cyan", "navy", "darkgoldenrod", "teal", "magenta", "lime"]


def style(cid: str, group: str, index: int) -> dict[str, Any]:
    if cid == CALL_MANY:
        return {"linewidth": 3, "color": "tab:red", "marker": "o"}
    if cid == BARE:
        return {"linewidth": 2, "color": "black", "linestyle": "--", "marker": "s"}
    if group == "wrk":
        return {"linewidth": 1.5, "color": "grey", "linestyle": ":", "marker": "^"}
    return {"linewidth": 1.4, "marker": ".", "color": PALETTE[index % len(PALETTE)],
            "linestyle": GROUP_LINES.get(group, "-")}


def line_plot(plt: Any, r: Results, endpoint: str, key: str, scale: float, ylabel: str,
              title: str, path: Path, logy: bool = True,
              skip: Callable[[Row], bool] = lambda cl: False) -> None:
    fig, ax = plt.subplots(figsize=(11, 5.5))
    for i, cl in enumerate(r.clients):
        if skip(cl):
            continue
        pts = [(c, r.get(cl["id"], endpoint, c, key)) for c in r.concs(endpoint)]
        pts = [(c, v * scale) for c, v in pts if v is not None]
        if pts:
            ax.plot(*zip(*pts), label=r.label(cl["id"]),
                    **style(cl["id"], cl.get("group", ""), i))
    ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    xs = r.concs(endpoint)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bar_plot(plt: Any, labels: list[str], values: list[float], xlabel: str, title: str,
             path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(labels) + 1.5))
    ax.barh(labels, values, color=["tab:red" if "llmretry" in lb else "tab:blue" for lb in labels])
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def make_plots(r: Results, plots: Path) -> list[tuple[str, Path]]:
    plt = ensure_matplotlib()
    plots.mkdir(parents=True, exist_ok=True)
    out = []
    p = plots / "rps.png"
    line_plot(plt, r, "fast", "rps", 1, "requests/s (median)",
              "Requests per second, 0 ms server", p)
    out.append(("requests/s vs concurrency", p))
    p = plots / "cpu.png"
    line_plot(plt, r, "fast", "cpu_us_per_req", 1, "CPU µs per request (client process)",
              "CPU per request, 0 ms server", p, skip=lambda cl: cl.get("group") == "wrk")
    out.append(("CPU µs per request", p))
    p = plots / "rss.png"
    line_plot(plt, r, "slow", "max_rss_kib", 1 / 1024, "peak RSS (MiB)",
              "Peak RSS of the client process, 50 ms server", p)
    out.append(("peak RSS vs concurrency", p))
    p = plots / "efficiency.png"
    line_plot(plt, r, "slow", "efficiency", 100, "% of ideal (C / 50 ms)",
              "Latency-bound efficiency, 50 ms server", p, logy=False)
    out.append(("efficiency at 50 ms", p))
    cc = [x for x in (r.d.get("ctrl_c") or {}).get("clients", []) if x.get("median_s") is not None]
    if cc:
        p = plots / "ctrl_c.png"
        bar_plot(plt, [x["label"] for x in cc], [x["median_s"] * 1000 for x in cc],
                 "ms from SIGINT to process exit (median)", "Ctrl-C latency", p)
        out.append(("Ctrl-C latency", p))
    rt = [x for x in (r.d.get("retry_timer") or {}).get("clients", []) if "late_ms" in x]
    if rt:
        p = plots / "retry_timer.png"
        fig, ax = plt.subplots(figsize=(8, 4))
        try:
            ax.boxplot([x["late_ms"] for x in rt], orientation="horizontal", whis=(5, 95))
        except TypeError:   # matplotlib < 3.10
            ax.boxplot([x["late_ms"] for x in rt], vert=False, whis=(5, 95))
        ax.set_yticks(range(1, len(rt) + 1))
        ax.set_yticklabels([x["label"] for x in rt])
        ax.set_xscale("symlog", linthresh=1)
        top = max(max(x["late_ms"]) for x in rt)
        ticks = [t for t in (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if t <= top * 1.5]
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks])
        ax.set_xlabel("actual − scheduled wait (ms); whiskers p5–p95")
        ax.set_title(f"Retry timer: {r.d['retry_timer']['retries']} retries after Retry-After: "
                     f"{r.d['retry_timer']['retry_after']}")
        ax.grid(True, axis="x", alpha=0.3)
        fig.tight_layout()
        fig.savefig(p, dpi=110)
        plt.close(fig)
        out.append(("retry-timer accuracy", p))
    return out


# ---------------------------------------------------------------------------

def render(r: Results, plots: list[tuple[str, Path]], out_dir: Path) -> str:
    def img(name: str) -> str:
        for title, p in plots:
            if p.name == name:
                return f"\n![{title}]({p.relative_to(out_dir).as_posix()})\n"
        return ""

    fast_all = r.concs("fast")
    parts = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`bench/suite/run.py`, the focused scripts, then "
        "`bench/suite/report.py`) from `bench/results/`. Every client is a separate program "
        "(`bench/clients/`, listed in `bench/clients/clients.json`) making the same chat "
        "completion request against the same local nginx, with its own retries on, in the same "
        "run; each figure is the median of the runs. Absolute numbers depend on the machine: "
        "compare the rows with each other.",
    ]
    if r.d.get("options", {}).get("quick"):
        parts.append("\n> **This is a `--quick` run** (one run per row, fewer concurrencies): "
                     "indicative only.")
    load = r.d.get("load_before") or [0]
    if load[0] > 0.5:
        parts.append("\n> The machine was not idle when the run started (load average "
                     f"{fmt_load(r.d.get('load_before'))}): other work may have shared the "
                     "cores, so the figures may be noisy.")
    parts.append(f"\n> Load average after the run: {fmt_load(r.d.get('load_after'))}. It "
                 "counts the benchmark's own runnable threads (clients with a thread per "
                 "request in flight run 1,024 of them), so it is not a sign of other work.")
    parts += [
        "\n## Headline\n", sec_headline(r),
        "\n## Machine\n", sec_machine(r),
        "\n## How to reproduce\n",
        "`make bench` (about 20 minutes; installs what is missing with apt-get and pip, then "
        "writes this file and `bench/plots/`). `python3 bench/suite/run.py --quick` is a "
        "one-run check; `--only id,id` and `--runs N` narrow it; `python3 bench/suite/report.py` "
        "re-renders this file. The exact command of each row is under "
        "[Commands](#commands).",
        "\n## The server\n", sec_server(r),
        "\n## Requests per second (0 ms server)\n",
        "Requests that succeeded ÷ the client's timed section (after start-up and warm-up), "
        f"at {', '.join(map(str, fast_all))} requests in flight.\n",
        figure_tables(r, "fast", "rps", num, "req/s"),
        "\n" + spread_note(r, "fast"),
        img("rps.png"),
        "\n## CPU per request (0 ms server)\n",
        "User + system CPU of the client process (all its threads) during the timed section ÷ "
        "requests that succeeded, in µs. nginx's CPU is not counted. For wrk this is the load "
        "generator's own cost.\n",
        figure_tables(r, "fast", "cpu_us_per_req", lambda v: num(v, 1), "CPU µs per request"),
        img("cpu.png"),
        "\n## Memory\n",
        "Peak RSS of the client process (GNU time's `%M`: its `ru_maxrss`, the largest of the "
        "process and the children it waited for, measured by a launcher that never held the "
        "runner's memory), in MiB, against the 50 ms server, where the "
        "clients make the same number of requests at a given concurrency (N="
        + ", ".join(f"{v} at C={k}"
                    for k, v in r.d.get("options", {}).get("slow_requests", {}).items())
        + "; fewer whole rounds for a client that would need more than 5 s for that: the N "
        "column below):\n",
        figure_tables(r, "slow", "max_rss_kib", lambda v: num(mib(v), 1),
                      "Peak RSS"),
        "\n**RSS per call in flight.** ",
        sec_rss(r),
        img("rss.png"),
        "\n## Latency-bound efficiency (50 ms server)\n",
        "Achieved req/s ÷ the ideal C ÷ 50 ms.\n",
        sec_efficiency(r),
        img("efficiency.png"),
        "\n## Ctrl-C latency\n", sec_ctrlc(r), img("ctrl_c.png"),
        "\n## Retry-timer accuracy\n", sec_retry(r), img("retry_timer.png"),
        "\n## Notes\n", sec_notes(r),
        "\n## Commands\n", sec_commands(r),
    ]
    parts += sec_focused(r.d.get("_results_dir"))
    return "\n".join(parts) + "\n"


# The focused benchmarks `make bench` runs after the suite: each script's
# markdown output, kept as it printed it (its own title, machine and verdicts).
FOCUSED = [
    ("core.md", "The C core against the bare libcurl loop", "bash bench/run_core.sh",
     "The engine from C (no Python), 20,000 requests at 64 in flight, and its memory per "
     "call in flight (bench/README.md, \"C core benchmark\")."),
    ("python.md", "Python: sequential CPU per call and a 32-thread pool",
     "bash bench/run_python.sh",
     "`call_llm` one at a time and `map_with_concurrency` at 32 against the openai SDK "
     "and httpx + tenacity (bench/README.md, \"Python benchmark\")."),
    ("batch.md", "Batches: call_many of 20,000 against the bare loop",
     "bash bench/run_batch.sh",
     "The batch issue's benchmark: 20,000 requests at 64 in flight and 2,000 against the "
     "50 ms endpoint (bench/README.md, \"Batch benchmark\")."),
    ("stream.md", "Streaming: stream_llm against the openai SDK and a bare libcurl SSE loop",
     "bash bench/run_stream.sh",
     "CPU per chunk, delay from the server's write to the iterator, memory per open stream "
     "at 1,000 streams and a slow consumer on a 50 MiB stream, against a local SSE server "
     "(bench/README.md, \"Streaming benchmark\")."),
    ("async.md", "asyncio: acall_llm and acall_many against AsyncOpenAI, httpx and aiohttp",
     "bash bench/run_async.sh",
     "`acall_llm` per item and `acall_many` at 64, 256 and 1,024 in flight against "
     "`AsyncOpenAI` (httpx2 and aiohttp transports), raw httpx, httpx2 and aiohttp, and "
     "the sync `call_many` (bench/README.md, \"asyncio benchmark\")."),
    ("rate.md", "Rate limits: call_many under a provider's request and token limits",
     "bash bench/run_rate.sh",
     "A batch of 3,000 against the mock enforcing 6,000 requests and 1,000,000 tokens a "
     "minute per one-second window: `call_many` with `rpm`/`tpm` and with the limits "
     "learned from the headers, the openai SDK's retries in 64 threads and a "
     "cookbook-style asyncio processor (bench/README.md, \"Rate-limit benchmark\")."),
    ("shared.md", "Shared budgets: processes on one key against one limit",
     "bash bench/run_shared.sh",
     "1 to 16 processes (and two groups of four through one Redis, two machines' worth) "
     "running `call_many` against the mock enforcing 50 requests in any second, each pacing "
     "itself or sharing its budget through shm or Redis; and what sharing costs when the "
     "limit is far from binding (bench/bench_shared.py)."),
    ("openresty.md", "OpenResty: a gateway at 1,000 concurrent clients",
     "bash bench/run_openresty.sh",
     "Calls/s and latency through one nginx worker calling the 50 ms endpoint for each of "
     "1,000 concurrent downstream clients: `llmretry.openresty` against a cosocket client "
     "in a retry loop, as gateways do today (bench/README.md, \"OpenResty benchmark\")."),
    ("otel.md", "OpenTelemetry", "bash bench/run_otel.sh",
     "What `llmretry.otel` costs: `call_many` of 20,000 with the instrumentation off, on "
     "(OpenTelemetry's SDK, spans and metrics made and dropped), and split into llmretry's "
     "own share and each signal's (docs/observability.md)."),
    ("sdk.md", "The openai SDK on llmretry's transport", "bash bench/run_sdk.sh",
     "`AsyncOpenAI` over `llmretry.httpx2.AsyncTransport` (the SDK's retries off) against "
     "`AsyncOpenAI` with its default transport (httpx2) and with aiohttp, at C=64 and 256, "
     "against nginx's 0 ms and 50 ms endpoints (docs/openai-sdk.md)."),
    ("cluster.md", "Ray Data: llmretry.ray against ray.data.llm and an openai-SDK UDF",
     "bash bench/run_cluster.sh",
     "3,000 rows on a 2-actor Ray job against the mock enforcing 100 requests in any second "
     "per key, without and with an 8 s outage: `llmretry.ray.map_calls` with a shared "
     "budget, Ray's `HttpRequestProcessorConfig` with `qps` = the limit / the actors, and a "
     "hand-written `map_batches` UDF with the openai SDK in 16 threads "
     "(bench/README.md, \"Cluster benchmark\")."),
]


def sec_focused(results_dir: Optional[str]) -> List[str]:
    d = Path(results_dir) if results_dir else ROOT / "bench/results"
    found = [(f, t, c, why) for f, t, c, why in FOCUSED if (d / f).is_file()]
    if not found:
        return []
    out = ["\n## Focused benchmarks\n",
           "Run by `make bench` after the suite, each its own script with its own peers and "
           "verdicts; their output as printed (the files in `bench/results/`)."]
    for name, title, cmd, why in found:
        out += [f"\n### {title}\n", f"{why} Reproduce: `{cmd}`.\n",
                (d / name).read_text().strip()]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--in", dest="src", default=str(ROOT / "bench/results/latest.json"))
    ap.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    ap.add_argument("--plots", default=str(ROOT / "bench/plots"))
    ap.add_argument("--no-plots", action="store_true")
    a = ap.parse_args()
    r = Results(json.loads(Path(a.src).read_text()))
    r.d["_results_dir"] = str(Path(a.src).resolve().parent)
    out = Path(a.out).resolve()
    plots = [] if a.no_plots else make_plots(r, Path(a.plots).resolve())
    out.write_text(render(r, plots, out.parent))
    print(f"report: wrote {out}" + (f" and {len(plots)} plots" if plots else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
