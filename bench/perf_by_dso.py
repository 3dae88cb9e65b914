"""A gateway worker's CPU per call, by library, from `perf record` files.

Used by bench/run_openresty.sh (PROFILE=1). Each argument names one
gateway's recording: NAME=PERF_DATA:CALLS_PER_S. The samples of each
library (perf report --sort dso) become microseconds per call:
samples / FREQ / (calls/s x SECS). Prints a markdown table, one column per
gateway, its rows the groups below (a library no group names is "other").

    python3 bench/perf_by_dso.py --freq 999 --secs 8 llmretry=perf.a:16900 ...
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Callable

# (row, test on the library's name), first match wins; in the table's order.
GROUPS: list[tuple[str, Callable[[str], bool]]] = [
    ("kernel (syscalls, TCP, wake-ups)", lambda d: d.startswith("[kernel")),
    ("llmretry's C core (core.so)", lambda d: d == "core.so"),
    ("libcurl", lambda d: d.startswith("libcurl")),
    ("libc (malloc, string functions)", lambda d: d.startswith("libc.so")),
    ("LuaJIT: VM, collector, C API", lambda d: d.startswith("libluajit")),
    ("LuaJIT: compiled Lua (traces)", lambda d: d.startswith("[JIT]")),
    ("lua-cjson", lambda d: "cjson" in d),
    ("nginx and its Lua module", lambda d: d == "nginx" or d.startswith("ngx_")),
]
OTHER = "other"


def samples_by_dso(path: str) -> dict[str, int]:
    """{library: samples} of one recording (perf report --sort dso)."""
    out = subprocess.run(
        ["perf", "report", "-i", path, "--no-children", "--sort", "dso",
         "-F", "sample,dso", "--stdio"],
        check=True, capture_output=True, text=True).stdout
    counts: dict[str, int] = {}
    for line in out.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[0].isdigit():
            name = parts[1].strip()
            counts[name] = counts.get(name, 0) + int(parts[0])
    return counts


def group_of(dso: str) -> str:
    for row, test in GROUPS:
        if test(dso):
            return row
    return OTHER


def parse_run(arg: str) -> tuple[str, str, float]:
    name, sep, rest = arg.partition("=")
    path, sep2, rps = rest.rpartition(":")
    if not sep or not sep2 or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=PERF_DATA:CALLS_PER_S, got {arg!r}")
    try:
        return name, path, float(rps)
    except ValueError:
        raise argparse.ArgumentTypeError(f"calls/s of {name!r} is not a number: {rps!r}") from None


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--freq", type=float, required=True, help="perf record's -F")
    ap.add_argument("--secs", type=float, required=True, help="how long each recording ran")
    ap.add_argument("runs", nargs="+", type=parse_run, metavar="NAME=PERF_DATA:CALLS_PER_S")
    args = ap.parse_args(argv)
    table: dict[str, dict[str, float]] = {}
    for name, path, rps in args.runs:
        per_call = 1e6 / args.freq / (rps * args.secs)
        col: dict[str, float] = {}
        for dso, n in samples_by_dso(path).items():
            row = group_of(dso)
            col[row] = col.get(row, 0.0) + n * per_call
        table[name] = col
    names = [name for name, _, _ in args.runs]
    rows = [row for row, _ in GROUPS] + [OTHER]
    print("| µs per call | " + " | ".join(f"/{n}" for n in names) + " |")
    print("|---|" + "---:|" * len(names))
    for row in rows:
        if any(table[n].get(row, 0.0) >= 0.05 for n in names):
            print(f"| {row} | " + " | ".join(f"{table[n].get(row, 0.0):.1f}" for n in names) + " |")
    print("| **total** | " + " | ".join(f"**{sum(table[n].values()):.1f}**" for n in names) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
