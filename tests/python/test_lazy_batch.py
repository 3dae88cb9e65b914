"""Constant-memory batches (issue 18, item 5): call_many over any iterable,
read lazily; keep_results=False; resume with a generator; ``llmretry batch``
streaming its input and output (a peak RSS that does not grow with the lines).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

import llmretry
from conftest import FAST, ROOT, SECRET_KEY, Scenario, child_env, secret_body

LIMIT = 4
AHEAD = 4 * LIMIT + 64      # batch.c's submit-ahead window


def opts(scen: Scenario, **kw: Any) -> Dict[str, Any]:
    o: Dict[str, Any] = dict(FAST, base_url=scen.url, api_key=SECRET_KEY, logger=None)
    o.update(kw)
    return o


class Pulled:
    """A generator of bodies that records how far it has been read, and
    the most items read and not yet finished at any moment."""

    def __init__(self, n: int, tag: str = "z") -> None:
        self.n = n
        self.tag = tag
        self.pulled = 0
        self.finished = 0
        self.worst = 0

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        for i in range(self.n):
            self.pulled = i + 1
            self.worst = max(self.worst, self.pulled - self.finished)
            yield secret_body(f"{self.tag}{i}")

    def on_result(self, index: int, value: Any) -> None:
        self.finished += 1


def index_of(rec: Dict[str, Any]) -> int:
    content = json.loads(rec["body"])["messages"][-1]["content"]
    return int(content.rsplit("-", 1)[1].lstrip("z"))


def test_a_generator_is_read_lazily(scen: Scenario) -> None:
    """Never more than the submit-ahead window read beyond what finished,
    and the results (kept) are all there, in order."""
    n = 400
    scen.script([], after={"delay_ms": 2})
    src = Pulled(n)
    out = llmretry.call_many(iter(src), limit=LIMIT, on_result=src.on_result, **opts(scen))
    assert src.finished == n and src.pulled == n
    assert 0 < src.worst <= AHEAD + 1, src.worst     # +1: the item being read
    assert src.worst < n // 2, "the generator was read ahead of the batch"
    assert len(out) == n and all(isinstance(r, llmretry.Result) for r in out)
    assert out.summary.items == n and out.summary.ok == n and out.summary.completed
    assert sorted(index_of(r) for r in scen.requests()) == list(range(n))


def test_keep_results_false_hands_every_value_to_on_result(scen: Scenario) -> None:
    n = 60
    scen.script([{"status": 400} if i % 7 == 3 else {} for i in range(n)])
    got: Dict[int, Any] = {}

    def on_result(i: int, v: Any) -> None:
        assert i not in got
        got[i] = v

    out = llmretry.call_many((secret_body(f"z{i}") for i in range(n)), limit=1,
                             keep_results=False, on_result=on_result, **opts(scen))
    # The documented object: an empty BatchResult with its summary.
    assert isinstance(out, llmretry.BatchResult) and list(out) == [] and len(out) == 0
    assert out.errors() == []
    s = out.summary
    assert (s.items, s.ok, s.failed, s.skipped, s.completed) == (n, n - 9, 9, 0, True)
    assert sorted(got) == list(range(n))
    failed = sorted(i for i, v in got.items() if isinstance(v, llmretry.LLMError))
    assert failed == [i for i in range(n) if i % 7 == 3]
    # A list with keep_results=False: the same object.
    scen.script([])
    out = llmretry.call_many([secret_body("z0")] * 3, keep_results=False,
                             on_result=lambda i, v: None, **opts(scen))
    assert list(out) == [] and out.summary.ok == 3


def test_a_bad_body_in_a_generator_raises_when_reached(scen: Scenario, tmp_path: Path) -> None:
    """Read lazily, a body that cannot be sent raises naming its index; the
    items before it ran and are in the record, so a resume continues."""
    path = tmp_path / "failed.jsonl"
    bodies: List[Any] = [secret_body(f"z{i}") for i in range(5)]
    bodies[3] = {"x": float("nan")}
    with pytest.raises(TypeError, match=r"bodies\[3\]"):
        llmretry.call_many(iter(bodies), limit=1, failures_path=path, **opts(scen))
    done = Path(f"{path}.done").read_text().splitlines()
    assert json.loads(done[0]) == {"llmretry_done": 1, "items": None}
    assert set(int(x) for x in done[1:]) <= {0, 1, 2}
    bodies[3] = secret_body("z3")
    out = llmretry.call_many(iter(bodies), limit=1, failures_path=path, resume=True,
                             **opts(scen))
    assert out.summary.ok + out.summary.skipped == 5 and out.summary.failed == 0


def test_failures_file_and_resume_with_a_generator(scen: Scenario, tmp_path: Path) -> None:
    n = 40
    bad = {5, 17, 18, 33}
    path = tmp_path / "failed.jsonl"
    scen.script([{"status": 400} if i in bad else {} for i in range(n)])
    got: Dict[int, Any] = {}
    out = llmretry.call_many((secret_body(f"z{i}") for i in range(n)), limit=1,
                             failures_path=path, keep_results=False,
                             on_result=got.__setitem__, **opts(scen))
    assert out.summary.failed == len(bad) and out.summary.items == n
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(r["index"] for r in recs) == sorted(bad)
    for r in recs:      # the item as given, though the batch keeps none
        assert r["item"] == secret_body(f"z{r['index']}")
    # The resume reads the generator again from its start; only the failed
    # ones are sent.
    scen.script([])
    before = len(scen.requests())
    src = Pulled(n)
    again = llmretry.call_many(iter(src), limit=2, failures_path=path, resume=True,
                               on_result=src.on_result, **opts(scen))
    sent = sorted(index_of(r) for r in scen.requests()[before:])
    assert sent == sorted(bad)
    assert again.summary.skipped == n - len(bad) and again.summary.ok == len(bad)
    assert [i for i, r in enumerate(again) if r is not llmretry.SKIPPED] == sorted(bad)
    assert path.read_text() == ""
    # A generator cannot be resumed from a failures file alone (its length
    # is not known); a list can.
    os.unlink(f"{path}.done")
    path.write_text(json.dumps({"index": 1, "item": None, "error": {}}) + "\n")
    with pytest.raises(ValueError, match="length"):
        llmretry.call_many((secret_body(f"z{i}") for i in range(n)), failures_path=path,
                           resume=True, **opts(scen))


def test_acall_many_with_a_generator(scen: Scenario) -> None:
    n = 150
    scen.script([], after={"delay_ms": 1})
    src = Pulled(n)

    async def main() -> Any:
        return await llmretry.acall_many(iter(src), limit=LIMIT, keep_results=False,
                                         on_result=src.on_result, **opts(scen))

    out = asyncio.run(main())
    assert list(out) == [] and out.summary.ok == n and src.finished == n
    assert src.worst <= AHEAD + 1


def test_progress_total_of_a_generator(scen: Scenario) -> None:
    seen: List[Any] = []
    llmretry.call_many((secret_body(f"z{i}") for i in range(3)), limit=1,
                       progress=lambda d, t, f: seen.append((d, t, f)), **opts(scen))
    assert seen == [(1, None, 0), (2, None, 0), (3, None, 0)]


# ---------------------------------------------------------------------------
# llmretry batch: a peak RSS that does not grow with the lines
#
# A streamed run's peak is a fixed cost (Python, the extension, the engine,
# one sort run of the results: _cli_batch.py's SORT_RUN_LINES, 10,000 lines), about
# 50 MB from 10,000 lines on; the code before this item kept every result and
# peaked at 1.3 GB on 200,000 lines (6.5 KB a line). Each run is held under
# MAX_MB, and the growth from SMALL lines (every fixed buffer at its full
# size) to LINES under MAX_GROWTH bytes a line: 10 MB over the 40,000 lines
# between them, where 1.7 MB is the most seen. (A single 200,000-line run
# under the same MAX_MB, which this replaced, took 70 s and let a growth of
# up to some 350 bytes a line pass.)
SMALL, LINES = 10_000, 50_000
MAX_MB = 120
MAX_GROWTH = 250


def _nginx(tmp: Path) -> Optional[str]:
    """The benchmarks' nginx (bench/nginx.conf) on a free port, or None."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(nginx) or not os.path.exists(
            "/usr/lib/nginx/modules/ngx_http_echo_module.so"):
        return None
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp.chmod(0o755)
    conf = (ROOT / "bench" / "nginx.conf").read_text().replace(
        "127.0.0.1:18089", f"127.0.0.1:{port}")
    (tmp / "nginx.conf").write_text(conf)
    p = subprocess.run([nginx, "-p", f"{tmp}/", "-e", str(tmp / "error.log"),
                        "-c", str(tmp / "nginx.conf")], capture_output=True)
    return None if p.returncode else f"http://127.0.0.1:{port}/v1"


@pytest.mark.slow
def test_cli_peak_rss_does_not_grow_with_the_lines(scen: Scenario, tmp_path: Path) -> None:
    """SMALL and LINES lines through ``llmretry batch`` (against the local
    nginx of bench/nginx.sh when installed, else the mock), the child's peak
    RSS measured by bench/rss_batch.py; and the same, stopped half-way and
    resumed (the resumed run measured). The two run at once: each measures
    its own children's peak, and each mostly waits on the server."""
    web = tmp_path / "nginx"
    web.mkdir()
    url = _nginx(web)

    def peak_mb(lines: int, extra: List[str]) -> float:
        folder = tmp_path / f"{lines}{''.join(extra)}"
        folder.mkdir()
        p = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "rss_batch.py"), "--lines", str(lines),
             "--base-url", url or scen.url, "--limit", "64", "--max-mb", str(MAX_MB),
             "--folder", str(folder), *extra],
            capture_output=True, text=True, env=child_env(), timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        assert f"RESULT lines={lines} limit=64 ok={lines} " in p.stdout, p.stdout
        m = re.search(r" (?:resume_)?maxrss_mb=([0-9.]+)", p.stdout)
        assert m, p.stdout
        return float(m.group(1))

    def growth(extra: List[str]) -> None:
        small, big = peak_mb(SMALL, extra), peak_mb(LINES, extra)
        grown = (big - small) * 2**20 / (LINES - SMALL)
        assert grown < MAX_GROWTH, (
            f"{extra}: peak RSS {small:.1f} MB on {SMALL} lines, {big:.1f} MB on "
            f"{LINES}: {grown:.0f} bytes more a line")

    try:
        with ThreadPoolExecutor(2) as pool:
            for done in [pool.submit(growth, extra) for extra in ([], ["--resume-half"])]:
                done.result()
    finally:
        if url is not None:
            subprocess.run([shutil.which("nginx") or "/usr/sbin/nginx", "-p", f"{web}/",
                            "-e", str(web / "error.log"), "-c", str(web / "nginx.conf"),
                            "-s", "stop"], capture_output=True)


def test_index_set() -> None:
    from llmretry._batch import IndexSet
    s = IndexSet([3, 0, 17, 3], limit=20)
    assert list(s) == [0, 3, 17] and len(s) == 3 and 17 in s and 4 not in s
    s.discard(3)
    s.discard(5)
    assert list(s) == [0, 17] and s.count(10) == 1 and s.count(20) == 2
    with pytest.raises(ValueError, match="20"):
        s.add(20)
    c = IndexSet([1, 2], limit=5, complement=True)
    assert [i for i in range(5) if i in c] == [0, 3, 4] and c.count(5) == 3
    with pytest.raises(TypeError):
        len(c)
