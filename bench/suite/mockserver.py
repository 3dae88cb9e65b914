"""The project's mock server (llmretry.testing) as a separate process, for the
extra measurements: a stalled endpoint (Ctrl-C latency) and scripted 429s
with Retry-After (retry-timer accuracy). Separate, so that its threads never
compete with the measured client for a GIL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, Optional
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[2]


def python_env() -> dict[str, str]:
    """The environment for the mock and the Python clients (repo's llmretry)."""
    env = dict(os.environ)
    py = str(ROOT / "python")
    env["PYTHONPATH"] = py + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("OPENAI_API_KEY", None)
    env.pop("OPENAI_BASE_URL", None)
    return env


class Mock:
    """`python -m llmretry.testing --port 0` and its control API."""

    def __init__(self) -> None:
        self.proc: Optional[subprocess.Popen[str]] = None
        self.port = 0

    def start(self) -> "Mock":
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmretry.testing", "--port", "0"], cwd=ROOT,
            env=python_env(), stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.isdigit():
            self.stop()
            raise RuntimeError(f"the mock server did not start (printed {line!r})")
        self.port = int(line)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def __enter__(self) -> "Mock":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _control(self, method: str, path: str, doc: Any = None) -> Any:
        data = json.dumps(doc).encode() if doc is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data,
                                     method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def script(self, name: str, steps: list[dict[str, Any]],
               after: Optional[dict[str, Any]] = None) -> None:
        self._control("PUT", "/_mock/scenarios/" + quote(name, safe=""),
                      {"steps": steps, "after": after})

    def requests(self, name: str) -> list[dict[str, Any]]:
        return self._control("GET", "/_mock/requests/" + quote(name, safe=""))

    def base_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/s/{quote(name, safe='')}/v1"


def lua_env(abi: str = "5.4") -> Optional[dict[str, str]]:
    """LUA_PATH/LUA_CPATH for a luarocks tree of the module: the one
    bench/clients/setup.sh builds (build-bench/lua/ABI), else the test
    suite's (build-lua/ABI); None when neither is built."""
    for tree in (ROOT / "build-bench" / "lua" / abi, ROOT / "build-lua" / abi):
        if (tree / "lib" / "lua" / abi / "llmretry" / "core.so").exists():
            break
    else:
        print(f"no Lua {abi} build of llmretry (run bench/clients/setup.sh): "
              "Lua rows skipped", file=sys.stderr)
        return None
    lpath = f"{tree}/share/lua/{abi}/?.lua;{tree}/share/lua/{abi}/?/init.lua;;"
    cpath = f"{tree}/lib/lua/{abi}/?.so;;"
    env = python_env()
    env.update({"LUA_PATH": lpath, "LUA_CPATH": cpath,
                "LUA_PATH_5_4": lpath, "LUA_CPATH_5_4": cpath})
    return env
