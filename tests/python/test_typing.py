"""The typed surface as a user's type checker sees it (issue 17).

``mypy --strict`` on the async examples (examples/async_*.py), with the
package found on MYPYPATH (its inline annotations, py.typed and the
extension's _llmretry.pyi). Any error fails, the package's own modules that
the examples import included (an installed copy's errors would be silenced
for users; here they count).

A second check proves the types are real rather than Any: misused results of
the async API must be errors.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from conftest import PYTHON_DIR, ROOT, child_env

# Python only (the mock server, the type checker, version files): the
# sanitizer and pipe-notifier passes skip it (tools/check.sh, pipe-notifier-test.sh).
pytestmark = pytest.mark.pure_python

# tools/ensure-deps.sh installs mypy: not installed is an error here, never a
# skip (the checks run it as ``python -m mypy``).
import mypy  # noqa: E402,F401

EXAMPLES = sorted((ROOT / "examples").glob("async_*.py"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mypy cache for the module's runs: the package and the standard
    library are analysed once, not once per test (each run then checks its
    own file; the cache never changes what mypy reports)."""
    return tmp_path_factory.mktemp("mypy-cache")


def mypy(tmp_path: Path, cache: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    env = child_env()
    env["MYPYPATH"] = str(PYTHON_DIR)
    # mypy only reads the sources: no need to run it under tools/check.sh's
    # preloaded ASan runtime.
    env.pop("LD_PRELOAD", None)
    # A cache outside the work tree: no .mypy_cache left there.
    cmd = [sys.executable, "-m", "mypy", "--strict",
           "--cache-dir", str(cache), "--no-color-output",
           "--show-error-codes", *map(str, files)]
    return subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=300)


def test_async_examples_pass_mypy_strict(tmp_path: Path, cache: Path) -> None:
    assert len(EXAMPLES) >= 3, EXAMPLES
    proc = mypy(tmp_path, cache, *EXAMPLES)
    assert proc.returncode == 0, f"mypy --strict:\n{proc.stdout}{proc.stderr}"
    assert "Success: no issues found in" in proc.stdout, proc.stdout


MISUSE = '''\
import llmretry

async def misuse() -> None:
    body = {"model": "m", "messages": []}
    a: str = await llmretry.acall_llm(body)  # ERR Result
    b: str = await llmretry.acall_many([body])  # ERR BatchResult
    async with llmretry.astream_llm(body) as s:
        async for t in s.text_deltas():
            c: int = t  # ERR str
    client = llmretry.Client()
    e: str = await client.acall_llm(body)  # ERR Result
'''

# The assembled result of a stream, on its own: annotated Any, it would let
# any use of it (res.meta.usage["total_tokens"], ...) through unchecked.
MISUSE_STREAM_RESULT = '''\
import llmretry

async def misuse() -> None:
    async with llmretry.astream_llm({"model": "m", "messages": []}) as s:
        d: str = await s.result()  # ERR Result
'''


@pytest.mark.parametrize("src", [MISUSE, MISUSE_STREAM_RESULT], ids=["calls", "stream_result"])
def test_async_api_types_are_not_any(tmp_path: Path, cache: Path, src: str) -> None:
    path = tmp_path / "misuse.py"
    path.write_text(src, encoding="utf-8")
    proc = mypy(tmp_path, cache, path)
    lines = src.splitlines()
    want: List[int] = [i for i, line in enumerate(lines, 1) if "# ERR" in line]
    got = sorted({int(m.group(1)) for m in re.finditer(r"misuse\.py:(\d+): error:",
                                                          proc.stdout)})
    # Every misuse is an error, and nothing else is.
    assert got == want, f"errors on lines {got}, expected {want}:\n{proc.stdout}{proc.stderr}"
    for n in want:
        expect = lines[n - 1].rsplit("# ERR ", 1)[1]
        # e.g. 'Incompatible types in assignment (expression has type "Result", ...'
        assert re.search(rf'misuse\.py:{n}: error: .*type "{expect}"', proc.stdout), \
            (n, proc.stdout)


# Every call function's keywords are typed from the core's option table
# (CallOptions / BatchOptions, generated): a wrong type, a value outside an
# enum's choices or a keyword a batch cannot share is an error wherever the
# keywords are given.
MISUSE_OPTIONS = '''\
import llmretry

async def misuse() -> None:
    body = {"model": "m", "messages": []}
    await llmretry.acall_llm(body, timeout_ms="5")  # ERR
    llmretry.stream_llm(body, max_retries=None)  # ERR
    llmretry.Client(jitter="sometimes")  # ERR
    await llmretry.acall_many([body], request_id="x")  # ERR
    llmretry.call_many([body], call_deadline_ms=5, retry_statuses=[429], rpm=60)
    async with llmretry.astream_llm(body, fallbacks=[{"model": "m2"}], schema={}):
        pass
    llmretry.call_llm(body, timeout_ms=5, jitter="none", headers={"X-A": "b"})
    llmretry.Client().call_llm(body, deadline_ms=None, retry_budget_ratio=0.5)
'''


def test_call_keywords_are_typed(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "misuse.py"
    path.write_text(MISUSE_OPTIONS, encoding="utf-8")
    proc = mypy(tmp_path, cache, path)
    lines = MISUSE_OPTIONS.splitlines()
    want = [i for i, line in enumerate(lines, 1) if "# ERR" in line]
    got = sorted({int(m.group(1)) for m in re.finditer(r"misuse\.py:(\d+): error:",
                                                          proc.stdout)})
    assert got == want, f"errors on lines {got}, expected {want}:\n{proc.stdout}{proc.stderr}"


# A newcomer's slips (issue 32 item 5): a misspelt option is an error (the
# keywords are the core's table, as a TypedDict), and a Result unpacks to
# (Any, Meta), so meta is typed rather than Any.
MISUSE_NEWCOMER = '''\
import llmretry

async def misuse() -> None:
    body = {"model": "m", "messages": []}
    llmretry.Client(max_retry=3)  # ERR
    data, meta = llmretry.call_llm(body)
    s: str = meta  # ERR "Meta"
    n: int = meta.attempts + len(llmretry.call_llm(body))
    m: str = llmretry.call_llm(body)[1]  # ERR "Meta"
    with llmretry.Client() as client:
        d2, m2 = client.call_llm(body)
        t: str = m2  # ERR "Meta"
    d3, m3 = await llmretry.acall_llm(body)
    u: str = m3  # ERR "Meta"
'''


def test_newcomer_slips_are_type_errors(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "misuse.py"
    path.write_text(MISUSE_NEWCOMER, encoding="utf-8")
    proc = mypy(tmp_path, cache, path)
    lines = MISUSE_NEWCOMER.splitlines()
    want = [i for i, line in enumerate(lines, 1) if "# ERR" in line]
    got = sorted({int(m.group(1)) for m in re.finditer(r"misuse\.py:(\d+): error:",
                                                          proc.stdout)})
    assert got == want, f"errors on lines {got}, expected {want}:\n{proc.stdout}{proc.stderr}"
    assert re.search(r'misuse\.py:5: error: Unexpected keyword argument "max_retry"',
                     proc.stdout), proc.stdout
    for n in want[1:]:
        assert re.search(rf'misuse\.py:{n}: error: .*expression has type "Meta"',
                         proc.stdout), (n, proc.stdout)
