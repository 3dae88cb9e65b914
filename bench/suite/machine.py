"""What the figures were measured on: hardware, OS and every tool's version."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]

PY_PACKAGES = ("openai", "httpx", "aiohttp", "tenacity", "anyio", "matplotlib")


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _cmd(args: list[str]) -> Optional[str]:
    """First non-empty output line of a command, None when it cannot run."""
    try:
        res = subprocess.run(args, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in (res.stdout + "\n" + res.stderr).splitlines():
        if line.strip():
            return line.strip()
    return None


def load_average() -> list[float]:
    return [float(x) for x in _read("/proc/loadavg").split()[:3]]


def cpu_model() -> str:
    m = re.search(r"^model name\s*:\s*(.+)$", _read("/proc/cpuinfo"), re.M)
    return m.group(1).strip() if m else platform.processor()


def ram_gib() -> Optional[float]:
    m = re.search(r"^MemTotal:\s*(\d+) kB", _read("/proc/meminfo"), re.M)
    return round(int(m.group(1)) / 1024 / 1024, 1) if m else None


def _first_match(text: Optional[str], pattern: str) -> Optional[str]:
    if not text:
        return None
    m = re.search(pattern, text)
    return m.group(1) if m else text


def tool_versions() -> dict[str, Optional[str]]:
    out: dict[str, Optional[str]] = {
        "python": platform.python_version(),
        "lua5.4": _first_match(_cmd(["lua5.4", "-v"]), r"Lua (\S+)"),
        "luajit": _first_match(_cmd(["luajit", "-v"]), r"LuaJIT (\S+)"),
        "nginx": _first_match(_cmd(["nginx", "-v"]), r"nginx/(\S+)"),
        "libcurl": _cmd(["pkg-config", "--modversion", "libcurl"]),
        "libcjson": _cmd(["pkg-config", "--modversion", "libcjson"]),
        "wrk": _first_match(_cmd(["wrk", "-v"]), r"wrk (\S+)"),
        "gcc": _first_match(_cmd(["gcc", "--version"]), r"(\d+\.\d+\.\d+)"),
    }
    for name in PY_PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    out["llmretry"] = _git_commit()
    return out


def _git_commit() -> Optional[str]:
    commit = _cmd(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    if commit is None:
        return None
    dirty = _cmd(["git", "-C", str(ROOT), "status", "--porcelain", "--",
                  "core", "bindings", "python", "lua"])
    return commit + (" (library sources modified)" if dirty else "")


def describe() -> dict[str, object]:
    os_release = _read("/etc/os-release")
    m = re.search(r'^PRETTY_NAME="?([^"\n]+)', os_release, re.M)
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "ram_gib": ram_gib(),
        "kernel": platform.release(),
        "os": m.group(1) if m else platform.platform(),
        "debian_version": _read("/etc/debian_version").strip() or None,
        "virtualization": _cmd(["systemd-detect-virt"]),
        "versions": tool_versions(),
    }


if __name__ == "__main__":
    import json
    print(json.dumps(describe(), indent=2))
