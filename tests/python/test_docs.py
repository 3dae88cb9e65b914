"""The docs cannot go stale: every Python and shell example of README.md and
docs/*.md runs against the mock server, and every link resolves inside the
repository. (The Lua examples run in tests/lua/docs_spec.lua, where the Lua
module is built; the markers are explained in doc_examples.py.)

Each example is a program of its own, run as a user would run it: Python
examples with this interpreter, shell examples with bash (-e, pipefail) and an
``llmretry`` command on PATH, each in a fresh directory holding a link to
examples/. ``OPENAI_BASE_URL`` points at a mock server of its own (freshly
scripted with the file's mock scenarios), ``LLMRETRY_MOCK`` at its root, and
``OPENAI_API_KEY`` holds a recognisable fake key.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from conftest import ROOT, child_env
from doc_examples import Example, doc_files, examples, unmatched_output
from llmretry.testing import MockServer

FAKE_KEY = "sk-doc-test-not-a-real-key"
TIMEOUT_S = 60     # generous: importing LangChain took over 20 s on a loaded machine

RUN = [ex for ex in examples() if ex.lang in ("python", "sh")]


@pytest.fixture
def mock(ex: Example) -> Iterator[MockServer]:
    # Strict (a real server's 404s and 400s): an example with a wrong path
    # or a body a real server refuses fails here.
    with MockServer(strict=True) as server:
        if ex.scenarios:
            server.load_scenarios(ex.scenarios)
        yield server


@pytest.fixture
def ex(request: pytest.FixtureRequest) -> Example:
    param: Example = request.param
    return param


def example_env(mock: MockServer, tmp: Path) -> Dict[str, str]:
    env = child_env()
    env["OPENAI_BASE_URL"] = mock.base_url
    env["OPENAI_API_KEY"] = FAKE_KEY
    env["LLMRETRY_MOCK"] = f"http://127.0.0.1:{mock.port}"
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    cmd = bin_dir / "llmretry"   # what `pip install .` puts on PATH
    cmd.write_text(f'#!/bin/sh\nexec {sys.executable} -m llmretry "$@"\n', encoding="utf-8")
    cmd.chmod(0o755)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_example(ex: Example, mock: MockServer, tmp: Path) -> "subprocess.CompletedProcess[str]":
    work = tmp / "work"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")
    env = example_env(mock, tmp)
    if ex.lang == "python":
        prog = work / "example.py"
        argv = [sys.executable, str(prog)]
    else:
        prog = work / "example.sh"
        argv = ["bash", "-e", "-o", "pipefail", str(prog)]
    prog.write_text(ex.code, encoding="utf-8")
    return subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)


@pytest.mark.parametrize("ex", RUN, ids=[ex.name for ex in RUN], indirect=True)
def test_example_runs(ex: Example, mock: MockServer, tmp_path: Path) -> None:
    if ex.skip is not None:
        pytest.skip(f"{ex.name}: {ex.skip}")
    proc = run_example(ex, mock, tmp_path)
    assert proc.returncode == 0, (
        f"{ex.name} ({ex.lang}) exited with {proc.returncode}\n--- code\n{ex.code}"
        f"--- stdout\n{proc.stdout[-3000:]}--- stderr\n{proc.stderr[-3000:]}")
    assert FAKE_KEY not in proc.stdout + proc.stderr, f"{ex.name} printed the API key"
    if ex.output is not None:
        missing = unmatched_output(ex.output, proc.stdout + "\n" + proc.stderr)
        assert missing is None, (
            f"{ex.name} did not print {missing!r} (its output block, in order)\n"
            f"--- stdout\n{proc.stdout[-3000:]}--- stderr\n{proc.stderr[-3000:]}")


def test_the_docs_have_examples_of_each_kind() -> None:
    """A broken extractor must not pass by finding nothing."""
    langs = {ex.lang for ex in examples() if ex.skip is None}
    assert langs == {"python", "lua", "sh"}, langs


# ---------------------------------------------------------------------------
# Links

_LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCED = re.compile(r"^\s*```.*?^\s*```", re.DOTALL | re.MULTILINE)
_CODE = re.compile(_FENCED.pattern + r"|`[^`\n]*`", re.DOTALL | re.MULTILINE)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> List[str]:
    text = _FENCED.sub("", path.read_text(encoding="utf-8"))
    return [slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)]


def links() -> List[Tuple[Path, str]]:
    out = []
    for path in doc_files() + [ROOT / "BENCHMARKS.md", ROOT / "bench" / "README.md"]:
        text = _CODE.sub("", path.read_text(encoding="utf-8"))
        out += [(path, m.group(1)) for m in _LINK.finditer(text)]
    return out


def test_every_link_resolves_inside_the_repository() -> None:
    bad = []
    found = links()
    assert len(found) > 20, "the link pattern found almost nothing"
    for path, target in found:
        where = f"{path.relative_to(ROOT)}: ({target})"
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            bad.append(f"{where}: links outside the repository")
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if ROOT not in dest.parents and dest != ROOT:
            bad.append(f"{where}: leaves the repository")
        elif not dest.exists():
            bad.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{where}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not bad, "\n".join(bad)
