"""Peak RSS of ``llmretry batch`` on a big input file (issue 18, item 5).

    python3 bench/rss_batch.py --lines N --base-url URL [--limit 64] [--resume-half]
        [--folder DIR] [--max-mb MB]

Writes an input of N one-message requests, runs ``python -m llmretry batch``
on it in a child process and prints one line::

    RESULT lines=N limit=L ok=K secs=S maxrss_mb=M [resume_maxrss_mb=R]

``maxrss_mb`` is the child's peak RSS (``ru_maxrss`` of that child alone,
from ``os.wait4``). With
``--resume-half`` a first run is stopped (SIGINT) half-way and the second
run, ``--resume``, is the one measured (``resume_maxrss_mb``): the results
file and the failures/progress files of the first run are read, merged and
sorted. The results file is checked: N lines, in input order, every one ok.
``--max-mb``: exit 1 when a measured peak is above it. bench/rss_batch.sh
runs it against the local nginx of bench/nginx.sh; tests/python/test_lazy_batch.py
runs it on 10,000 and 50,000 lines (the growth between them a line).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(os.path.dirname(HERE), "python")


def write_input(path: str, n: int) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        block: List[str] = []
        for i in range(n):
            block.append(json.dumps({"model": "gpt-4.1-mini", "messages": [
                {"role": "user", "content": f"request number {i}: say ok"}]}) + "\n")
            if len(block) >= 10000:
                fh.write("".join(block))
                block.clear()
        fh.write("".join(block))


def child_env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = PYTHON_DIR + (os.pathsep + env["PYTHONPATH"]
                                      if env.get("PYTHONPATH") else "")
    env.setdefault("OPENAI_API_KEY", "sk-bench")
    return env


def check_results(path: str, n: int) -> int:
    """The number of ok lines; exits when the file is not N lines in order."""
    ok = 0
    with open(path, "rb") as fh:
        for k, raw in enumerate(fh):
            rec = json.loads(raw)
            if rec["index"] != k:
                sys.exit(f"results line {k + 1} has index {rec['index']}")
            ok += rec.get("ok") is True
    if k + 1 != n:
        sys.exit(f"{k + 1} result lines for {n} requests")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--limit", type=int, default=64)
    ap.add_argument("--resume-half", action="store_true")
    ap.add_argument("--folder")
    ap.add_argument("--max-mb", type=float)
    a = ap.parse_args()
    folder = a.folder or tempfile.mkdtemp(prefix="llmretry-rss-")
    req, res, fail = (os.path.join(folder, x) for x in
                      ("requests.jsonl", "results.jsonl", "failed.jsonl"))
    write_input(req, a.lines)
    cmd = [sys.executable, "-m", "llmretry", "batch", req, "-o", res, "--failures", fail,
           "--limit", str(a.limit), "--base-url", a.base_url, "--no-progress"]
    env = child_env()
    extra = ""
    t0 = time.monotonic()
    if a.resume_half:
        # A first run stopped half-way (by its progress file), then --resume.
        # Reaped by os.wait4 only (Popen.poll would reap it first and lose
        # its rusage); polled often, as a small input is done in a second.
        first = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
        while True:
            pid, status, ru = os.wait4(first.pid, os.WNOHANG)
            if pid:
                sys.exit(f"the first run ended (status {status}) before it was "
                         "stopped half-way: use more --lines")
            try:
                done = os.path.getsize(fail + ".done")
            except OSError:
                done = 0
            if done > 7 * a.lines // 2:     # about half the indices written
                first.send_signal(signal.SIGINT)
                break
            time.sleep(0.02)
        _, status, ru = os.wait4(first.pid, 0)
        first.returncode = os.waitstatus_to_exitcode(status)
        extra = (f" first_code={first.returncode} "
                 f"first_maxrss_mb={ru.ru_maxrss / 1024:.1f}")
        cmd = cmd + ["--resume"]
    with tempfile.TemporaryFile() as err:
        child = subprocess.Popen(cmd, env=env, stderr=err)
        _, status, ru = os.wait4(child.pid, 0)     # this child's own peak
        child.returncode = code = os.waitstatus_to_exitcode(status)
        secs = time.monotonic() - t0
        mb = ru.ru_maxrss / 1024
        if code != 0:
            err.seek(0)
            sys.stderr.write(err.read().decode("utf-8", "replace"))
            print(f"llmretry batch exited {code}", file=sys.stderr)
            return 1
    ok = check_results(res, a.lines)
    name = "resume_maxrss_mb" if a.resume_half else "maxrss_mb"
    print(f"RESULT lines={a.lines} limit={a.limit} ok={ok} secs={secs:.1f} "
          f"{name}={mb:.1f}{extra}", flush=True)
    if a.max_mb is not None and mb > a.max_mb:
        print(f"peak RSS {mb:.1f} MB is above {a.max_mb} MB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
