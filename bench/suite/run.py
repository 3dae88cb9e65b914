#!/usr/bin/env python3
"""The benchmark suite: every client of bench/clients/clients.json against a
local nginx, at several concurrencies, several runs each; then the extra
measurements (Ctrl-C latency, retry-timer accuracy). Writes
bench/results/latest.json (raw runs and medians); bench/suite/report.py turns
it into BENCHMARKS.md. Stdlib only. `make bench` runs both.

    python3 bench/suite/run.py [--quick] [--only id,id] [--runs N]

The client contract (invocation, output line) is in bench/suite/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import select
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402
from mockserver import python_env  # noqa: E402
from server import SLOW_LATENCY_S, Nginx, apt_install, log, version  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONCURRENCIES = [1, 8, 64, 256, 1024]
# The 50 ms endpoint: 64 and 256 for efficiency; 1, 256 and 1024 for the
# memory per call in flight. The same N for every client (whole rounds of C,
# so no partial last round), and the same N at 256 and 1024: a client that
# keeps every result (call_many returns them all) grows with N too, and equal
# N leaves only the calls in flight to differ.
SLOW_REQUESTS = {1: 12, 64: 16 * 64, 256: 4096, 1024: 4096}
SLOW_CONCURRENCIES = list(SLOW_REQUESTS)
RSS_PAIR = (256, 1024)
QUICK_CONCURRENCIES = [1, 64, 1024]
PILOT_REQUESTS = 200
MAX_RUN_S = 5.0     # the 50 ms runs are cut to fit this (see Sizer)
WARMUP_S = 0.5
# A run whose timed part took longer than this is not repeated (a client
# far too slow at this C: one run shows it, three would blow the budget).
ONE_RUN_S = 6.0
MAX_REQUESTS = 2_000_000
GNU_TIME = "/usr/bin/time"   # Debian package "time"

Record = dict[str, Any]


# ---------------------------------------------------------------------------
# Running one client process

def command(client: Record, base: str, c: int, n: int, w: int) -> list[str]:
    return list(client["cmd"]) + ["--url", base, "--concurrency", str(c),
                                  "--requests", str(n), "--warmup", str(w)]


def command_text(argv: list[str]) -> str:
    """The row's command as a user would type it at the repo root."""
    return "PYTHONPATH=python " + " ".join(shlex.quote(a) for a in argv)


def wait_child(pid: int, timeout: float) -> Optional[tuple[int, Any]]:
    """os.wait4 with a timeout (pidfd); None when the child is still running."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = -1
    if fd >= 0:
        try:
            ready = select.select([fd], [], [], timeout)[0]
        finally:
            os.close(fd)
        if not ready:
            return None
        _, status, usage = os.wait4(pid, 0)
        return status, usage
    end = time.monotonic() + timeout     # no pidfd: poll
    while time.monotonic() < end:
        got, status, usage = os.wait4(pid, os.WNOHANG)
        if got:
            return status, usage
        time.sleep(0.02)
    return None


def run_process(argv: list[str], timeout: float) -> Record:
    """Run a client: exit code, wall time, peak RSS, its whole CPU, stdout
    and stderr.

    Peak RSS comes from GNU time (the client's ru_maxrss from wait4: the
    largest of the process and the children it waited for), not from our own
    wait4: a child forked from this Python process starts with its RSS
    (~25 MiB), and ru_maxrss keeps that high-water mark across exec."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as rss:
        t0 = time.monotonic()
        proc = subprocess.Popen([GNU_TIME, "-f", "%M", "-o", rss.name, *argv], cwd=ROOT,
                                env=python_env(), stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            got = wait_child(proc.pid, timeout)
        except BaseException:   # Ctrl-C of the runner: the client has its own session
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        timed_out = got is None
        if got is None:
            os.killpg(proc.pid, signal.SIGKILL)
            got = wait_child(proc.pid, 30)
        status, usage = got if got is not None else (0, None)
        proc.returncode = os.waitstatus_to_exitcode(status) if usage else -9
        wall = time.monotonic() - t0
        try:   # helpers the client left behind (a wrapper's child) go too
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", "replace")
        stderr = err.read().decode("utf-8", "replace")
        lines = rss.read().split()   # "Command exited with non-zero status 3" first, maybe
        max_rss = int(lines[-1]) if lines and lines[-1].isdigit() else None
    return {"exit_code": proc.returncode, "timed_out": timed_out,
            "wall_total_s": round(wall, 3), "max_rss_kib": max_rss,
            "process_cpu_s": round(usage.ru_utime + usage.ru_stime, 3) if usage else None,
            "stdout": stdout, "stderr": stderr}


def parse_result(stdout: str) -> Optional[Record]:
    """The contract's last stdout line, or None when it is not there."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        return None
    try:
        res = json.loads(lines[-1])
    except ValueError:
        return None
    keys = ("ok", "failed", "seconds", "cpu_seconds")
    if not isinstance(res, dict) or not all(isinstance(res.get(k), (int, float)) for k in keys):
        return None
    return res


def run_client(client: Record, endpoint: str, base: str, c: int, n: int, w: int,
               expected_s: float, nginx: Optional[Nginx]) -> Record:
    argv = command(client, base, c, n, w)
    conns0 = nginx.accepted() if nginx else None
    load1 = machine.load_average()[0]
    proc = run_process(argv, timeout=60 + 10 * expected_s)
    conns1 = nginx.accepted() if nginx else None
    rec: Record = {
        "client": client["id"], "endpoint": endpoint, "concurrency": c,
        "requests": n, "warmup": w, "command": argv, "command_text": command_text(argv),
        "load1_before": load1, **{k: v for k, v in proc.items() if k not in ("stdout", "stderr")},
        # Connections the client opened: the runner's second look at /status
        # is one more (each look is a fresh connection, counted at once).
        "nginx_connections": (conns1 - conns0 - 1
                              if conns0 is not None and conns1 is not None else None),
    }
    res = parse_result(proc["stdout"])
    if proc["exit_code"] == 3:
        rec["error"] = "skipped by the client (exit 3): " + tail(proc["stderr"])
        rec["skipped"] = True
    elif proc["timed_out"]:
        rec["error"] = f"no exit within {60 + 10 * expected_s:.0f} s (killed)"
    elif proc["exit_code"] != 0 or res is None:
        rec["error"] = (f"exit {proc['exit_code']}, last line not the result: "
                        + tail(proc["stderr"] or proc["stdout"]))
    else:
        rec.update({k: res[k] for k in ("ok", "failed", "seconds", "cpu_seconds")})
        if res["ok"] <= 0 or res["seconds"] <= 0:
            rec["error"] = "no request succeeded: " + tail(proc["stderr"])
        else:
            rec["rps"] = res["ok"] / res["seconds"]
            rec["cpu_us_per_req"] = res["cpu_seconds"] / res["ok"] * 1e6
            if endpoint == "slow":
                rec["efficiency"] = rec["rps"] / (c / SLOW_LATENCY_S)
        # wrk runs for a time, not a count; every other client must account
        # for each of its N requests.
        if client.get("group") != "wrk" and res["ok"] + res["failed"] != n:
            rec["warning"] = f"ok + failed = {res['ok'] + res['failed']}, not N = {n}"
    return rec


def tail(text: str, lines: int = 4) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])[-600:]


def fmt_error(rec: Record) -> str:
    return str(rec.get("error", ""))[:200]


# ---------------------------------------------------------------------------
# Sizing: N per (client, endpoint, C) so a run takes ~target seconds

class Sizer:
    """N and W per (client, endpoint, C), from the rates seen so far.

    0 ms: N = rate × target (at least C, so that C can be in flight), W = N/4.
    50 ms: N from SLOW_REQUESTS, cut to whole rounds that fit in MAX_RUN_S at
    the client's 0 ms rate (the same N at both RSS_PAIR concurrencies), and
    W = C (one round: every connection open), capped at ~WARMUP_S of work.
    A client too slow for that still runs: a run takes at least C requests."""

    def __init__(self, target_s: float) -> None:
        self.target_s = target_s
        self.rates: dict[tuple[str, str, int], list[float]] = {}

    def note(self, rec: Record) -> None:
        if "rps" in rec:
            self.rates.setdefault((rec["client"], rec["endpoint"], rec["concurrency"]),
                                  []).append(rec["rps"])

    def rate(self, cid: str, endpoint: str, c: int) -> Optional[float]:
        """Best guess of the client's req/s: its own runs at this point, else
        the nearest lower concurrency. For the 50 ms endpoint only the 0 ms
        figures count (so N is the same in every run), capped by the ideal."""
        if endpoint == "slow":
            fast = self.rate(cid, "fast", c)
            ideal = c / SLOW_LATENCY_S
            return min(0.9 * ideal, fast) if fast else 0.9 * ideal
        own = self.rates.get((cid, endpoint, c))
        if own:
            return statistics.median(own)
        lower = [k for k in self.rates if k[0] == cid and k[1] == endpoint and k[2] < c]
        if lower:
            return statistics.median(self.rates[max(lower, key=lambda k: k[2])])
        return None

    def slow_requests(self, cid: str, c: int) -> int:
        n = SLOW_REQUESTS.get(c) or math.ceil(self.target_s / SLOW_LATENCY_S) * c
        group = RSS_PAIR if c in RSS_PAIR else (c,)
        rate = min(self.rate(cid, "slow", x) or 200.0 for x in group)
        step = max(group)
        while n > step and n / rate > MAX_RUN_S:
            n -= step
        return n

    def size(self, cid: str, endpoint: str, c: int) -> tuple[int, int, float]:
        """(N, W, expected seconds)."""
        rate = self.rate(cid, endpoint, c) or 200.0
        if endpoint == "slow":
            n = self.slow_requests(cid, c)
            w = max(1, min(c, int(rate * WARMUP_S)))
        else:
            n = min(MAX_REQUESTS, max(int(rate * self.target_s), c, 50))
            w = max(1, n // 4)   # connections open, JIT and caches warm
        return n, w, (n + w) / rate


# ---------------------------------------------------------------------------
# Medians and the derived figures

def medians(runs: list[Record]) -> list[Record]:
    groups: dict[tuple[str, str, int], list[Record]] = {}
    for r in runs:
        if r.get("pilot"):
            continue
        groups.setdefault((r["client"], r["endpoint"], r["concurrency"]), []).append(r)
    out = []
    for (cid, endpoint, c), rs in groups.items():
        good = [r for r in rs if "rps" in r and not r.get("error")]
        row: Record = {"client": cid, "endpoint": endpoint, "concurrency": c,
                       "runs": len(rs), "good_runs": len(good),
                       "errors": [r["error"] for r in rs if r.get("error")]}
        if good:
            for key in ("rps", "cpu_us_per_req", "max_rss_kib", "efficiency"):
                vals = [r[key] for r in good if r.get(key) is not None]
                if vals:
                    row[key] = statistics.median(vals)
                    row[key + "_runs"] = vals
            row["failed"] = sum(r["failed"] for r in good)
            row["requests"] = [r["requests"] for r in good]
            row["command_text"] = good[len(good) // 2]["command_text"]
            row["nginx_connections"] = [r["nginx_connections"] for r in good]
            row["warnings"] = [r["warning"] for r in good if r.get("warning")]
            if endpoint == "slow":
                n = good[0]["requests"]
                row["ceiling"] = n / (math.ceil(n / c) * c)
        out.append(row)
    return out


def median_of(meds: list[Record], cid: str, endpoint: str, c: int, key: str) -> Optional[float]:
    for m in meds:
        if (m["client"], m["endpoint"], m["concurrency"]) == (cid, endpoint, c):
            return m.get(key)
    return None


def server_check(clients: list[Record], meds: list[Record], pre: Optional[Record]) -> Record:
    """wrk against the 0 ms endpoint against the fastest other client."""
    wrk = [cl["id"] for cl in clients if cl.get("group") == "wrk"]
    others = [cl["id"] for cl in clients if cl.get("group") != "wrk"]
    check: Record = {"threshold": 5.0, "pre_check": pre}
    if not wrk:
        check["note"] = "no wrk client in clients.json: the server was not checked"
        return check
    per_c: list[Record] = []
    for c in sorted({m["concurrency"] for m in meds if m["endpoint"] == "fast"}):
        w = median_of(meds, wrk[0], "fast", c, "rps")
        rows = [(v, o) for o in others if (v := median_of(meds, o, "fast", c, "rps"))]
        if w and rows:
            top_rps, top = max(rows)
            per_c.append({"concurrency": c, "wrk_rps": w, "fastest": top,
                          "fastest_rps": top_rps, "ratio": w / top_rps})
    check["per_concurrency"] = per_c
    if per_c:
        best_wrk = max(per_c, key=lambda p: float(p["wrk_rps"]))
        best_other = max(per_c, key=lambda p: float(p["fastest_rps"]))
        ratio = best_wrk["wrk_rps"] / best_other["fastest_rps"]
        check.update({"wrk_best_rps": best_wrk["wrk_rps"],
                      "wrk_best_concurrency": best_wrk["concurrency"],
                      "fastest_client": best_other["fastest"],
                      "fastest_rps": best_other["fastest_rps"],
                      "fastest_concurrency": best_other["concurrency"], "ratio": ratio,
                      "passed": ratio >= check["threshold"]})
    return check


def rss_per_call(clients: list[Record], meds: list[Record], slow_concs: list[int]) -> list[Record]:
    """Peak RSS per call in flight, 50 ms endpoint, medians: (RSS at 1024 −
    at 256) / 768, both with the same N; and (RSS at 1024 − at 1) / 1023, as
    the issue puts it, which also counts the results of the larger N."""
    lo, hi = RSS_PAIR
    one = min(slow_concs)
    out = []
    for cl in clients:
        rss = {c: median_of(meds, cl["id"], "slow", c, "max_rss_kib") for c in (one, lo, hi)}
        top = rss[hi]
        if top is None:
            continue
        row: Record = {"client": cl["id"], "rss_kib": {str(c): v for c, v in rss.items()},
                       "requests": {str(c): (m.get("requests") or [None])[0]
                                    for m in meds for c in (one, lo, hi)
                                    if (m["client"], m["endpoint"], m["concurrency"])
                                    == (cl["id"], "slow", c)},
                       "pair": [lo, hi], "one": one}
        low, base = rss[lo], rss[one]
        if low is not None:
            row["kib_per_call"] = (top - low) / (hi - lo)
        if base is not None and one < hi:
            row["kib_per_call_vs_1"] = (top - base) / (hi - one)
        out.append(row)
    return out


# ---------------------------------------------------------------------------
# Set-up

def load_clients(path: Path, only: Optional[set[str]]) -> list[Record]:
    clients: list[Record] = json.loads(path.read_text())
    if only:
        unknown = only - {c["id"] for c in clients}
        if unknown:
            sys.exit(f"--only: no client {', '.join(sorted(unknown))} in {path}")
        clients = [c for c in clients if c["id"] in only]
    return clients


def setup(skip: bool) -> Optional[str]:
    """bench/clients/setup.sh, and the Python extension when missing.
    Returns a note when something did not work (the run goes on)."""
    note = None
    if not Path(GNU_TIME).exists():
        apt_install(["time"])
    probe = subprocess.run([sys.executable, "-c", "import llmretry._llmretry"],
                           env=python_env(), capture_output=True)
    if probe.returncode != 0:
        log("== the Python extension is missing: make build-python")
        subprocess.run(["make", "--no-print-directory", "build-python"], cwd=ROOT, check=True)
    script = ROOT / "bench" / "clients" / "setup.sh"
    if skip:
        return None
    if not script.exists():
        return "bench/clients/setup.sh is missing: clients were not set up"
    log("== bench/clients/setup.sh")
    res = subprocess.run(["bash", str(script)], cwd=ROOT, env=python_env())
    if res.returncode != 0:
        note = f"bench/clients/setup.sh exited {res.returncode}; some clients may fail"
        log("WARNING: " + note)
    return note


def raise_fd_limit() -> int:
    """1024 connections per client (and nginx's) need more than 1024 fds."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536
    for target in ((max(hard, want), max(hard, want)), (hard, hard)):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, target)
            break
        except (ValueError, OSError):
            continue
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# ---------------------------------------------------------------------------
# The matrix

def rotate(items: list[Record], k: int) -> list[Record]:
    k %= max(1, len(items))
    return items[k:] + items[:k]


def short(rec: Record) -> str:
    if rec.get("error"):
        return "ERROR " + fmt_error(rec)
    s = (f"{rec['rps']:>10,.0f} req/s  {rec['cpu_us_per_req']:7.1f} CPU-us/req  "
         f"{(rec['max_rss_kib'] or 0) / 1024:6.1f} MiB  {rec['seconds']:.2f} s")
    if rec.get("failed"):
        s += f"  {rec['failed']} FAILED"
    if "efficiency" in rec:
        s += f"  {rec['efficiency'] * 100:.1f} % of ideal"
    return s


def run_matrix(clients: list[Record], nginx: Nginx, plan: list[tuple[str, list[int]]],
               runs: int, sizer: Sizer, out: list[Record], notes: list[str]) -> dict[str, str]:
    """Every client × endpoint × C × run, interleaved: for each C, the runs
    go round by round over the clients (order rotating each round), so noise
    from other work spreads over all of them. Returns clients that dropped out."""
    dropped: dict[str, str] = {}
    bases = {"fast": nginx.base_fast, "slow": nginx.base_slow}
    for cl in clients:   # pilot: does it work, and how fast is it at C=1
        if cl.get("group") == "wrk":
            continue
        rec = run_client(cl, "fast", bases["fast"], 1, PILOT_REQUESTS, 20, 30, nginx)
        rec["pilot"] = True
        out.append(rec)
        if rec.get("error"):
            dropped[cl["id"]] = "pilot run failed: " + rec["error"]
            log(f"   {cl['id']}: pilot FAILED, dropped: {rec['error'][:300]}")
        else:
            sizer.note(dict(rec, concurrency=0))   # a guess for C=1, not a result
            log(f"   {cl['id']}: pilot {rec['rps']:,.0f} req/s")
    broken: set[tuple[str, str, int]] = set()
    once: set[tuple[str, str, int]] = set()
    for endpoint, concs in plan:
        for c in concs:
            log(f"== {endpoint} endpoint, C={c}: {runs} round(s), load {machine.load_average()[0]}")
            for r in range(runs):
                for cl in rotate(clients, r):
                    cid = cl["id"]
                    if cid in dropped or (cid, endpoint, c) in broken or \
                            (cid, endpoint, c) in once:
                        continue
                    if c > cl.get("max_concurrency", c):
                        continue
                    n, w, expected = sizer.size(cid, endpoint, c)
                    rec = run_client(cl, endpoint, bases[endpoint], c, n, w, expected, nginx)
                    rec["run"] = r + 1
                    out.append(rec)
                    sizer.note(rec)
                    log(f"   {cid:<28} C={c:<5} N={n:<8} run {r + 1}: {short(rec)}")
                    if rec.get("skipped"):
                        dropped[cid] = rec["error"]
                    elif rec.get("timed_out"):
                        broken.add((cid, endpoint, c))
                    elif rec.get("seconds", 0) > ONE_RUN_S and r + 1 < runs:
                        once.add((cid, endpoint, c))
                        where = "0 ms" if endpoint == "fast" else "50 ms"
                        notes.append(f"{cl.get('label', cid)}, {where}, C={c}: 1 run only "
                                     f"(its first took {rec['seconds']:.0f} s)")
    return dropped


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="1 run, 0 ms concurrencies 1/64/1024, short runs, fewer extra samples")
    ap.add_argument("--only", help="comma-separated client ids (clients.json)")
    ap.add_argument("--runs", type=int, help="runs per row (default 3; 1 with --quick)")
    ap.add_argument("--target-seconds", type=float,
                    help="timed part of each run (default 1.0; 0.5 with --quick)")
    ap.add_argument("--clients", default=str(ROOT / "bench/clients/clients.json"))
    ap.add_argument("--out", default=str(ROOT / "bench/results/latest.json"))
    ap.add_argument("--port", type=int, default=int(os.environ.get("LLMRETRY_BENCH_PORT", 0)),
                    help="nginx port (default: a free one)")
    ap.add_argument("--no-setup", action="store_true", help="do not run bench/clients/setup.sh")
    ap.add_argument("--no-matrix", action="store_true", help="only the extra measurements")
    ap.add_argument("--no-extras", action="store_true", help="no Ctrl-C / retry-timer runs")
    args = ap.parse_args()

    # SIGTERM unwinds like Ctrl-C: nginx and the running client are stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    runs = args.runs or (1 if args.quick else 3)
    target = args.target_seconds or (0.5 if args.quick else 1.0)
    concs = QUICK_CONCURRENCIES if args.quick else CONCURRENCIES
    slow_concs = SLOW_CONCURRENCIES   # short runs: the same with --quick
    only = set(args.only.split(",")) if args.only else None

    t_start = time.time()
    result: Record = {
        "schema": 1,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
        "options": {"quick": args.quick, "only": sorted(only) if only else None,
                    "runs": runs, "target_seconds": target, "concurrencies": concs,
                    "slow_concurrencies": slow_concs, "slow_requests": SLOW_REQUESTS,
                    "slow_latency_s": SLOW_LATENCY_S},
        "notes": [],
    }
    note = setup(args.no_setup)
    if note:
        result["notes"].append(note)
    result["fd_limit"] = raise_fd_limit()
    result["machine"] = machine.describe()
    result["load_before"] = machine.load_average()
    log(f"== load average before: {result['load_before']}")
    if result["load_before"][0] > 0.5:
        log("WARNING: other work shares these cores: figures will be noisy")

    runs_out: list[Record] = []
    result["runs"] = runs_out
    if not args.no_matrix:
        clients = load_clients(Path(args.clients), only)
        result["clients"] = clients
        with Nginx(args.port or None) as nginx:
            result["server"] = {"nginx": version(nginx.binary), "port": nginx.port,
                                "workers": 1, "fast_base": nginx.base_fast,
                                "slow_base": nginx.base_slow,
                                "slow_latency_s": SLOW_LATENCY_S}
            log(f"== nginx {result['server']['nginx']} on port {nginx.port}, "
                f"ulimit -n {result['fd_limit']}")
            pre = None
            wrk = [cl for cl in clients if cl.get("group") == "wrk"]
            if wrk:   # a first look before the long matrix
                pre = run_client(wrk[0], "fast", nginx.base_fast, 64, 300_000, 0, 3, nginx)
                pre["pilot"] = True
                runs_out.append(pre)
                log(f"== server check (wrk, C=64): {short(pre)}")
            sizer = Sizer(target)
            plan = [("fast", concs), ("slow", slow_concs)]
            dropped = run_matrix(clients, nginx, plan, runs, sizer, runs_out, result["notes"])
        for cid, why in dropped.items():
            result["notes"].append(f"{cid}: {why}")
        meds = medians(runs_out)
        result["medians"] = meds
        result["server_check"] = server_check(clients, meds, pre)
        result["rss_per_call"] = rss_per_call(clients, meds, slow_concs)
        sc = result["server_check"]
        if "ratio" in sc:
            log(f"== server check: wrk {sc['wrk_best_rps']:,.0f} req/s = {sc['ratio']:.2f}x "
                f"the fastest client ({sc['fastest_client']}, {sc['fastest_rps']:,.0f} req/s)")

    if not args.no_extras:
        import ctrlc
        import retry_timer
        result["ctrl_c"] = ctrlc.measure(samples=3 if args.quick else 5, only=only)
        result["retry_timer"] = retry_timer.measure(retries=20 if args.quick else 100, only=only)

    result["load_after"] = machine.load_average()
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result["duration_s"] = round(time.time() - t_start, 1)
    log(f"== load average after: {result['load_after']}; took {result['duration_s']:.0f} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    log(f"== wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
