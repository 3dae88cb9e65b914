"""The full-size job of `make cluster` (issue 29): 1,000 rows against the
mock enforcing a per-key limit (a sliding 1 s window) with 429s, 503s and a
few permanent 400s among the answers, run by Ray actors or Dask workers that
share one budget. The tests in this directory are not part of `make test`.

The budget is a real redis-server's, started here (as a cluster's workers on
several machines would share one); LLMRETRY_CLUSTER_SHARED names another
store instead: ``shm`` for a fresh ``shm:`` one, or a spec such as
``redis://10.0.0.5:6379``.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests" / "python"
if str(TESTS) not in sys.path:        # conftest's helpers, as plain imports
    sys.path.insert(0, str(TESTS))

from conftest import PYTHON_DIR, child_env  # noqa: E402,F401
from redis_server import RedisServer  # noqa: E402

from llmretry.testing import MockServer  # noqa: E402

ROWS = 1000
PERM = [i for i in range(ROWS) if i % 100 == 7]          # 400 for good
STREAM = [i for i in range(ROWS) if i % 10 == 3]         # "stream": true
LIMIT_PER_S = 50
OPTIONS: Dict[str, Any] = {"rpm": LIMIT_PER_S * 60, "max_retries": 4, "base_delay_ms": 50}


def body(i: int) -> str:
    return json.dumps({"model": "perm" if i in PERM else "m",
                       "messages": [{"role": "user", "content": f"row {i}"}],
                       **({"stream": True} if i in STREAM else {})})


def script(mock: MockServer, name: str) -> None:
    """The scenario: the limit, and among the admitted requests a 503 every
    97th and a 429 naming a wait every 131st; "perm" rows routed to 400s."""
    mock.script(f"{name}-perm", [], after={"status": 400})
    steps = [{"status": 503} if k % 97 == 5 else
             {"status": 429, "retry_after_ms": 50} if k % 131 == 9 else {}
             for k in range(ROWS)]
    mock.script(name, steps, limits={"rpm": LIMIT_PER_S, "window_ms": 1000},
                route={"perm": f"{name}-perm"})


def check(mock: MockServer, name: str, got: List[Dict[str, Any]]) -> Dict[str, int]:
    """Every row once, in order, its outcome in place; the limit kept."""
    assert [r["id"] for r in got] == list(range(ROWS))
    for r in got:
        if r["id"] in PERM:
            err = json.loads(r["llm_error"])
            assert (err["kind"], err["status"], err["reason"]) == (
                "http_status", 400, "not_retryable"), err
        else:
            assert r["llm_error"] is None, (r["id"], r["llm_error"])
            assert r["llm_content"] == "ok"
    stats = mock.limit_stats(name)
    sent = sum(r["llm_attempts"] for r in got if r["id"] not in PERM)
    # Every attempt of the limited scenario was seen once: admitted or refused.
    assert sent == stats["admitted"] + stats["refused"], (sent, stats)
    assert stats["refused"] <= 0.01 * sent, stats
    return stats


@pytest.fixture(scope="module")
def mock() -> Iterator[MockServer]:
    with MockServer() as server:
        yield server


@pytest.fixture
def shared() -> Iterator[str]:
    spec = os.environ.get("LLMRETRY_CLUSTER_SHARED")
    if spec and spec != "shm":
        yield spec
    elif spec == "shm":
        name = f"cluster-full-{uuid.uuid4().hex[:12]}"
        yield f"shm:{name}"
        try:
            os.unlink(f"/dev/shm/llmretry-{name}")
        except FileNotFoundError:
            pass
    else:
        with RedisServer() as redis:
            # 1 s to answer: a loaded machine's stall is no outage.
            yield redis.url + "?timeout_ms=1000"
