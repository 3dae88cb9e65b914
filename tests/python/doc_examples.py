"""The code examples of README.md and docs/*.md, for the doc tests.

Every fenced block whose language is ``python``, ``lua``, ``sh`` or ``bash``
is an example, and an example runs unless the markdown says otherwise in an
HTML comment on the line right before its fence:

``<!-- doc-test: skip (REASON) -->``
    not run (it needs a real endpoint, a host such as Neovim or nginx, root,
    minutes...); the test reports it as skipped with REASON.
``<!-- doc-test: nvim -->`` or ``<!-- doc-test: nvim then (LUA) -->``
    (Lua) runs inside a headless Neovim against the mock server
    (tests/nvim/docs.lua, from tools/host-test.sh), with LUA appended to it
    (to use what it defines: a command, a local function); the other suites
    report it as skipped.
``<!-- doc-test: output -->``
    (before a ``text`` block) what the example just before it prints, as a
    reader sees it: each line of the block must be found in the example's
    output (stdout, then stderr), in order; ``...`` in a line stands for
    anything (a time, an id), a line of ``...`` alone is not checked.
``<!-- doc-test: mock-scenarios -->``
    (before a ``json`` block) the mock server's scenarios for the examples
    after it in the same file, as ``python -m llmretry.testing --scenarios``
    reads them; each example starts with them freshly loaded.

Examples run against the project's mock server (llmretry.testing):
``OPENAI_BASE_URL`` is its ``/v1`` and ``LLMRETRY_MOCK`` its root URL.
tests/python/test_docs.py runs the Python and shell examples,
tests/lua/docs_spec.lua the Lua ones (it reads them from
``python3 tests/python/doc_examples.py lua``, which prints them as JSON).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[2]
LANGS = {"python": "python", "lua": "lua", "sh": "sh", "bash": "sh"}

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
_DIRECTIVE = re.compile(r"^\s*<!--\s*doc-test:\s*(.*?)\s*-->\s*$")
_SKIP = re.compile(r"^skip\s*\((.+)\)$")
_NVIM = re.compile(r"^nvim(?:\s+then\s*\((.+)\))?$")
NVIM_SKIP = "runs inside Neovim: tools/host-test.sh runs it there (tests/nvim/docs.lua)"


@dataclasses.dataclass
class Example:
    path: str                 # relative to the repository root
    line: int                 # the fence's line, 1-based
    lang: str                 # python, lua or sh
    code: str                 # the program, as the block holds it
    skip: Optional[str]       # why it is not run, or None
    scenarios: Optional[Dict[str, Any]]   # the mock's scenarios, or None
    host: Optional[str] = None            # "nvim": only Neovim runs it
    then: str = ""                        # Lua run after it (nvim examples)
    # The output it must print: per line, the pieces between "..."s.
    output: Optional[List[List[str]]] = None

    @property
    def name(self) -> str:
        return f"{self.path}:{self.line}"


class DocError(ValueError):
    """A doc-test marker the extractor cannot follow."""


def doc_files() -> List[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def _blocks(text: str) -> Iterator[Tuple[int, str, str, Optional[str]]]:
    """(fence line, language, code, directive or None) of each fenced block."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
        start = i
        body: List[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            line = lines[i]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            i += 1
        i += 1
        prev = lines[start - 1] if start > 0 else ""
        d = _DIRECTIVE.match(prev)
        yield start + 1, lang, "\n".join(body) + "\n", d.group(1) if d else None


def extract(path: Path) -> List[Example]:
    rel = path.relative_to(ROOT).as_posix()
    out: List[Example] = []
    scenarios: Optional[Dict[str, Any]] = None
    for line, lang, code, directive in _blocks(path.read_text(encoding="utf-8")):
        where = f"{rel}:{line}"
        if directive == "mock-scenarios":
            if lang != "json":
                raise DocError(f"{where}: mock-scenarios marks a json block, not {lang!r}")
            scenarios = json.loads(code)
            continue
        if directive == "output":
            if lang not in ("text", ""):
                raise DocError(f"{where}: output marks a text block, not {lang!r}")
            if not out or out[-1].output is not None:
                raise DocError(f"{where}: output follows no example of its own")
            out[-1].output = [line.split("...") for line in code.splitlines()
                              if line.strip() not in ("", "...")]
            continue
        if lang not in LANGS:
            if directive is not None:
                raise DocError(f"{where}: doc-test marker before a {lang or 'plain'} block")
            continue
        lang = LANGS[lang]
        skip, host, then = None, None, ""
        if directive is not None:
            m, n = _SKIP.match(directive), _NVIM.match(directive)
            if n and lang == "lua":
                skip, host, then = NVIM_SKIP, "nvim", n.group(1) or ""
            elif m:
                skip = m.group(1)
            else:
                raise DocError(f"{where}: unknown doc-test marker {directive!r}")
        out.append(Example(rel, line, lang, code, skip, scenarios, host, then))
    return out


def unmatched_output(expected: List[List[str]], text: str) -> Optional[str]:
    """The first expected line (see ``output``) not found in ``text`` after
    the lines found before it, or None. tests/lua/docs_spec.lua does the same."""
    lines = text.splitlines()
    at = 0
    for pieces in expected:
        while at < len(lines) and not _has_in_order(lines[at], pieces):
            at += 1
        if at == len(lines):
            return "...".join(pieces)
        at += 1
    return None


def _has_in_order(line: str, pieces: List[str]) -> bool:
    pos = 0
    for piece in pieces:
        found = line.find(piece, pos)
        if found < 0:
            return False
        pos = found + len(piece)
    return True


def examples(lang: Optional[str] = None) -> List[Example]:
    found = [ex for path in doc_files() for ex in extract(path)]
    return [ex for ex in found if lang is None or ex.lang == lang]


if __name__ == "__main__":   # python3 tests/python/doc_examples.py [LANG]: JSON
    wanted = sys.argv[1] if len(sys.argv) > 1 else None
    print(json.dumps([dataclasses.asdict(ex) | {"name": ex.name}
                      for ex in examples(wanted)]))
