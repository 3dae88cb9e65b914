"""What the interop checks share: one line per check, and counting the
requests a server received from its uvicorn access log."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple


class Checks:
    """Runs checks, prints one line each, and a closing count."""

    def __init__(self) -> None:
        self.results: List[Tuple[str, bool, str]] = []

    def check(self, name: str, fn: Callable[[], str]) -> None:
        try:
            detail = fn()
            self.results.append((name, True, detail))
        except AssertionError as exc:
            self.results.append((name, False, str(exc)))
        except Exception as exc:  # a foreign exception is a failure too
            self.results.append((name, False, f"{type(exc).__name__}: {exc}"))
        ok, what = self.results[-1][1], self.results[-1][2]
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {what}", flush=True)

    def summary(self, label: str) -> int:
        """Print 'interop (label): N passed, N failed'; the exit status."""
        failed = [name for name, ok, _ in self.results if not ok]
        print(f"interop ({label}): {len(self.results) - len(failed)} passed, "
              f"{len(failed)} failed")
        return 1 if failed else 0


class AccessLog:
    """A server's requests to one route, counted from its uvicorn access log
    (one ``"POST /v1/chat/completions HTTP/1.1" <status>`` line per request)."""

    def __init__(self, path: str, route: str = "/v1/chat/completions") -> None:
        self.path = path
        self.line = re.compile(r'"POST ' + re.escape(route) + r' HTTP/1\.1" (\d{3})')

    def statuses(self) -> List[int]:
        with open(self.path, encoding="utf-8", errors="replace") as f:
            return [int(m.group(1)) for m in self.line.finditer(f.read())]

    def mark(self) -> int:
        return len(self.statuses())

    def since(self, mark: int, want: int) -> List[int]:
        """The statuses logged after ``mark`` (from mark()). uvicorn logs a
        request when it starts the response, before the call that sent it
        returns; the wait is for the log file only, and a request too many
        would still be counted: the count is read again after it."""
        until = time.monotonic() + 3.0
        while len(self.statuses()) - mark < want and time.monotonic() < until:
            time.sleep(0.05)
        time.sleep(0.3)
        return self.statuses()[mark:]


def batch_cli(base_url: str, key: str, requests: Sequence[Dict[str, Any]],
              *flags: str) -> Tuple[subprocess.CompletedProcess, List[Dict[str, Any]]]:
    """`llmretry batch` of ``requests`` (one JSON line each) with ``flags``
    against ``base_url``: the finished process (exit status 0 asserted) and
    its output file's lines."""
    with tempfile.TemporaryDirectory() as tmp:
        req, out = os.path.join(tmp, "in.jsonl"), os.path.join(tmp, "out.jsonl")
        with open(req, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in requests)
        env = dict(os.environ, OPENAI_API_KEY=key)
        p = subprocess.run([sys.executable, "-m", "llmretry", "batch", req, "-o", out,
                            "--base-url", base_url, "--no-progress", *flags],
                           capture_output=True, text=True, env=env, timeout=120)
        assert p.returncode == 0, p.stderr[-800:]
        with open(out, encoding="utf-8") as f:
            return p, [json.loads(line) for line in f]
