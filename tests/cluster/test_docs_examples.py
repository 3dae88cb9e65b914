"""docs/cluster.md's Ray and Dask examples, each a program of its own that
starts its cluster (too slow for the doc tests of make test; make cluster)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, List

import pytest

from jobs import ROOT, child_env, mock  # noqa: F401
from doc_examples import examples

EXAMPLES = [ex for ex in examples() if ex.path == "docs/cluster.md" and ex.lang == "python"]


def program(engine: str, first_line: str) -> str:
    """The example whose code has ``first_line``, and after it the examples
    that continue it (their skip reason says "the <engine> example above")."""
    picked: List[str] = []
    for ex in EXAMPLES:
        if not picked and first_line in ex.code:
            picked.append(ex.code)
        elif picked and f"the {engine} example above" in (ex.skip or ""):
            picked.append(ex.code)
    assert picked, first_line
    return "\n".join(picked)


@pytest.mark.parametrize("engine, marker", [("Ray", "import ray\n"),
                                            ("Dask", "import dask.dataframe as dd\n")],
                         ids=["ray", "dask"])
def test_example_runs(engine: str, marker: str, mock: Any, tmp_path: Path) -> None:
    env = child_env()
    env["OPENAI_BASE_URL"] = mock.base_url
    prog = tmp_path / "example.py"
    prog.write_text(program(engine, marker), encoding="utf-8")
    proc = subprocess.run([sys.executable, str(prog)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"--- stdout\n{proc.stdout[-3000:]}--- stderr\n{proc.stderr[-3000:]}"
    assert "'rows': 100, 'ok': 100, 'failed': 0" in proc.stdout, proc.stdout
