"""Run benchmark clients the way the suite's runner does and check the
contract (bench/clients/README.md). bench/clients/smoke.sh starts the servers
and calls this; it also serves for quick figures by hand.

    python3 bench/clients/smoke.py --url BASE [--cases 8x200,1024x2000]
        [--warmup W] [--only ID,ID] [--expect-fail | --status-url URL]
    python3 bench/clients/smoke.py --retry-mock ROOT [--only ID,ID]

For every client of clients.json and every case CxN it runs
``CMD --url BASE --concurrency C --requests N --warmup W`` (cwd = the repo,
PYTHONPATH=<repo>/python) in a fresh process, takes its peak RSS from GNU
time (see run_client) and checks: exit 0, a last stdout line that is the
contract's JSON object, and ok == N, failed == 0 (wrk: ok > 0, failed == 0,
as it runs for a time). With ``--expect-fail`` (BASE answers 404) the check
is the other way round: exit 0, ok == 0 and every request failed. With
``--status-url`` (nginx's stub_status, BASE a slow endpoint) it also checks
that C requests were in flight at once. With ``--retry-mock ROOT`` (the mock
server of ``llmretry.testing``) it checks instead that every client with
retries retries: C=1, N=3, each request answered 503 once. A client that
exits 3 is reported as skipped. Prints a table; exits 1 when a check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKIPPED = 3
TIMEOUT_S = 600
NO_RETRIES = {"bare_multi", "wrk"}   # the ceilings: no policy by design
GNU_TIME = "/usr/bin/time"      # Debian's package "time" (setup.sh installs it)


def load_clients() -> List[Dict[str, Any]]:
    with open(os.path.join(ROOT, "bench", "clients", "clients.json")) as f:
        return json.load(f)  # type: ignore[no-any-return]


def run_client(entry: Dict[str, Any], url: str, conc: int, n: int,
               warmup: int) -> Tuple[int, str, str, int]:
    """(exit code, stdout, stderr, peak RSS KiB) of one run.

    The peak RSS comes from GNU time (``%M``), not from this process's
    ``os.wait4``: a child's ru_maxrss starts at the RSS of the process it
    was forked from (Linux carries the old memory's high-water mark across
    exec), so a client forked from this Python process would never show
    less than this process's RSS. GNU time is small, and forks the client.
    """
    cmd = list(entry["cmd"]) + ["--url", url, "--concurrency", str(conc),
                                "--requests", str(n), "--warmup", str(warmup)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with tempfile.NamedTemporaryFile("r") as rss_file:
        proc = subprocess.Popen([GNU_TIME, "-q", "-o", rss_file.name, "-f", "%M"] + cmd,
                                cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)     # time and the client
            out, err = proc.communicate()
        text = rss_file.read().strip().splitlines()
        rss = int(text[-1]) if text and text[-1].isdigit() else 0
    return (proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"), rss)


def parse_result(stdout: str) -> Optional[Dict[str, Any]]:
    lines = stdout.strip().splitlines()
    if not lines:
        return None
    try:
        res = json.loads(lines[-1])
    except ValueError:
        return None
    if not isinstance(res, dict) or set(res) != {"ok", "failed", "seconds", "cpu_seconds"}:
        return None
    if not all(isinstance(res[k], int) and not isinstance(res[k], bool) and res[k] >= 0
               for k in ("ok", "failed")):
        return None
    if not all(isinstance(res[k], (int, float)) and res[k] >= 0
               for k in ("seconds", "cpu_seconds")):
        return None
    return res


def check(entry: Dict[str, Any], rc: int, res: Optional[Dict[str, Any]], n: int,
          expect_fail: bool) -> str:
    """'' when the run meets the contract, else what is wrong."""
    if rc != 0:
        return f"exit code {rc}"
    if res is None:
        return "the last stdout line is not the contract's JSON object"
    timed = entry["id"] == "wrk"       # runs for a time, not a count
    if expect_fail:
        if res["ok"] != 0 or res["failed"] == 0 or (not timed and res["failed"] != n):
            return f"expected every request to fail, got ok={res['ok']} failed={res['failed']}"
        return ""
    if res["failed"] != 0 or (res["ok"] != n if not timed else res["ok"] == 0):
        return f"ok={res['ok']} failed={res['failed']} (expected ok={n if not timed else '>0'})"
    if res["seconds"] <= 0:
        return "seconds is 0"
    return ""


class InFlight:
    """The peak number of requests nginx is working on, from its stub_status
    ("Writing", less the status request itself), sampled every 20 ms."""

    def __init__(self, status_url: str) -> None:
        self.url = status_url
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            with urllib.request.urlopen(self.url, timeout=5) as r:
                line = r.read().decode().splitlines()[3]    # Reading: a Writing: b Waiting: c
            self.peak = max(self.peak, int(line.split()[3]) - 1)

    def __enter__(self) -> "InFlight":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


RETRY_N = 3     # requests of the retry check, each failing once with a 503


def script_retries(mock: str, name: str) -> None:
    """Script the mock's scenario ``name``: one at a time, every request
    first gets a 503 (Retry-After: 0), then its retry succeeds."""
    steps = [{"status": 503, "retry_after": "0"}, {}] * RETRY_N
    req = urllib.request.Request(f"{mock}/_mock/scenarios/{name}", method="PUT",
                                 data=json.dumps({"steps": steps}).encode(),
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=5).close()


def mock_requests(mock: str, name: str) -> int:
    with urllib.request.urlopen(f"{mock}/_mock/requests/{name}", timeout=5) as r:
        return len(json.load(r))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="")
    p.add_argument("--cases", default="8x200,1024x2000")
    p.add_argument("--warmup", type=int, default=-1,
                   help="warm-up requests (default: C, so every connection opens)")
    p.add_argument("--only", default="", help="comma-separated client ids")
    p.add_argument("--expect-fail", action="store_true")
    p.add_argument("--retry-mock", default="",
                   help="root URL of llmretry.testing's mock server: check instead that "
                        "each client retries (C=1, N=3, each request failing once)")
    p.add_argument("--status-url", default="",
                   help="nginx stub_status: check that C requests were in flight at once "
                        "(against a slow endpoint); wrk may then complete none")
    a = p.parse_args()
    if not a.url and not a.retry_mock:
        p.error("--url or --retry-mock is needed")
    if a.retry_mock:
        return retry_check(a.retry_mock, set(filter(None, a.only.split(","))))
    cases = [tuple(int(x) for x in c.split("x")) for c in a.cases.split(",")]
    only = set(filter(None, a.only.split(",")))
    clients = [e for e in load_clients() if not only or e["id"] in only]
    if only - {e["id"] for e in clients}:
        p.error(f"unknown client ids: {sorted(only - {e['id'] for e in clients})}")

    problems: List[str] = []
    print("| client | C | N | ok | failed | req/s | CPU µs/req | peak RSS MiB | "
          + ("peak in flight | " if a.status_url else "") + "result |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if a.status_url else "")
          + "---|")
    for conc, n in cases:
        for e in clients:
            if conc > e.get("max_concurrency", conc):
                print(f"| {e['id']} | {conc} | {n} | | | | | | not run: max_concurrency "
                      f"{e['max_concurrency']} |", flush=True)
                continue
            warmup = conc if a.warmup < 0 else a.warmup
            inflight = ""
            if a.status_url:
                with InFlight(a.status_url) as watch:
                    rc, out, err, rss = run_client(e, a.url, conc, n, warmup)
                inflight = f"{watch.peak} | "
            else:
                rc, out, err, rss = run_client(e, a.url, conc, n, warmup)
            if rc == SKIPPED:
                print(f"| {e['id']} | {conc} | {n} | | | | | | skipped (exit 3) |", flush=True)
                sys.stderr.write(err[-2000:])
                continue
            res = parse_result(out)
            if a.status_url and e["id"] == "wrk" and res and res["failed"] == 0:
                why = "" if rc == 0 else f"exit code {rc}"   # a time-boxed run may end early
            else:
                why = check(e, rc, res, n, a.expect_fail)
            if not why and a.status_url and watch.peak < conc:
                why = f"at most {watch.peak} requests in flight, not {conc}"
            if why:
                problems.append(f"{e['id']} C={conc} N={n}: {why}")
                sys.stderr.write(f"--- {e['id']} C={conc} N={n}: {why}; its stderr (tail):\n"
                                 f"{err[-3000:]}\n--- stdout (tail):\n{out[-1000:]}\n")
            if res and res["ok"] and res["seconds"] > 0:
                rps = f"{res['ok'] / res['seconds']:,.0f}"
                cpu = f"{res['cpu_seconds'] / res['ok'] * 1e6:,.1f}"
            else:
                rps = cpu = "-"
            print(f"| {e['id']} | {conc} | {n} | {res['ok'] if res else '?'} | "
                  f"{res['failed'] if res else '?'} | {rps} | {cpu} | {rss / 1024:.1f} | "
                  f"{inflight}{'FAIL' if why else 'ok'} |", flush=True)
    for line in problems:
        print("FAILED: " + line, file=sys.stderr)
    return 1 if problems else 0


def retry_check(mock: str, only: set[str]) -> int:
    """Every client that has retries gets each of its RETRY_N requests
    through a 503 by retrying: ok == N, and the mock saw 2N requests."""
    problems = []
    print("| client | ok | failed | requests the server saw | result |")
    print("|---|---:|---:|---:|---|")
    for e in load_clients():
        if (only and e["id"] not in only) or e["id"] in NO_RETRIES:
            continue
        script_retries(mock, e["id"])
        rc, out, err, _rss = run_client(e, f"{mock}/s/{e['id']}/v1", 1, RETRY_N, 0)
        if rc == SKIPPED:
            print(f"| {e['id']} | | | | skipped (exit 3) |", flush=True)
            continue
        res = parse_result(out)
        seen = mock_requests(mock, e["id"])
        why = check(e, rc, res, RETRY_N, False)
        if not why and seen != 2 * RETRY_N:
            why = f"the server saw {seen} requests, not {2 * RETRY_N}"
        if why:
            problems.append(f"{e['id']} retries: {why}")
            sys.stderr.write(f"--- {e['id']}: {why}; its stderr (tail):\n{err[-3000:]}\n")
        print(f"| {e['id']} | {res['ok'] if res else '?'} | {res['failed'] if res else '?'} | "
              f"{seen} | {'FAIL' if why else 'ok'} |", flush=True)
    for line in problems:
        print("FAILED: " + line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
