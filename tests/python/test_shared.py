"""Shared budgets (issue 28): the retry budget and the circuit breaker of an
endpoint shared by every process on the host that names the same store."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import uuid
from typing import Any, Dict, Iterator

import pytest

import llmretry
from llmretry.testing import MockServer

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@contextlib.contextmanager
def shm_store(prefix: str = "test-py") -> Iterator[str]:
    """A ``shared`` spec of a store in /dev/shm of its own, removed after."""
    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    try:
        yield f"shm:{name}"
    finally:
        try:
            os.unlink(f"/dev/shm/llmretry-{name}")
        except FileNotFoundError:
            pass


@pytest.fixture
def store() -> Iterator[str]:
    with shm_store() as spec:
        yield spec


def _open_the_breaker(base_url: str, shared: str) -> int:
    """In a process of its own: three 503s with breaker_failures=3."""
    with llmretry.Client(base_url=base_url, shared=shared, max_retries=0,
                         breaker_failures=3, breaker_cooldown_ms=60000,
                         logger=None) as client:
        n = 0
        for _ in range(3):
            try:
                client.call_llm(BODY)
            except llmretry.HTTPStatusError:
                n += 1
        return n


def test_an_unshared_breaker_is_each_process_own() -> None:
    """Without a store, another process's failures open nothing here (with
    one, shm or Redis: test_shared_redis.py's
    test_a_breaker_opened_in_another_process)."""
    with MockServer() as mock:
        mock.script("down", [], after={"status": 503})
        url = mock.scenario_url("down")
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1) as pool:
            assert pool.apply(_open_the_breaker, (url, "")) == 3
        assert len(mock.requests("down")) == 3
        with llmretry.Client(base_url=url, max_retries=0, breaker_failures=3,
                             breaker_cooldown_ms=60000, logger=None) as client:
            with pytest.raises(llmretry.HTTPStatusError) as info:
                client.call_llm(BODY)
            assert info.value.status == 503
            assert len(mock.requests("down")) == 4


def _storm(base_url: str, shared: str) -> Dict[str, Any]:
    with llmretry.Client(base_url=base_url, shared=shared, max_retries=3,
                         base_delay_ms=1, retry_budget_ratio=0.0, retry_budget_min=4,
                         logger=None) as client:
        out = client.call_many([BODY] * 10, limit=10)
        return {"attempts": out.summary.attempts}


def test_one_retry_budget_for_four_processes(store: str) -> None:
    # Four processes, ten calls each against a dead endpoint, max_retries 3
    # and a budget of 4 retries: together 40 first attempts and at most a
    # few retries over the shared budget (each process alone would take 4).
    with MockServer() as mock:
        mock.script("dead", [], after={"status": 503})
        url = mock.scenario_url("dead")
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(4) as pool:
            runs = pool.starmap(_storm, [(url, store)] * 4)
        seen = len(mock.requests("dead"))
        assert sum(r["attempts"] for r in runs) == seen
        # 40 first attempts + 4 shared retries; racing processes may each
        # pass the check once more (documented), never 4 x 4.
        assert 44 <= seen <= 48, seen


def test_bad_values_are_refused(store: str) -> None:
    with pytest.raises(ValueError, match="shared"):
        llmretry.Client(shared="shm:../etc")
    with pytest.raises(ValueError, match="shared"):
        llmretry.Client(shared="memcached://x")
    with pytest.raises(TypeError, match="shared"):
        llmretry.Client(shared=3)  # type: ignore[arg-type]
    c = llmretry.Client(shared=store)
    assert f"shared={store!r}" in repr(c)
    c.close()
    assert oct(os.stat("/dev/shm/llmretry-" + store[4:]).st_mode & 0o777) == "0o600"


def test_environment_variable(store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMRETRY_SHARED", store)
    c = llmretry.Client()
    assert f"shared={store!r}" in repr(c)
    c.close()


def test_cli_flag(store: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import json
    from llmretry import cli
    with MockServer() as mock:
        inp = tmp_path / "in.jsonl"
        inp.write_text(json.dumps(BODY) + "\n")
        base = ["batch", str(inp), "-o", str(tmp_path / "o"),
                "--failures", str(tmp_path / "f"), "--base-url", mock.base_url]
        assert cli.main(base + ["--shared", store]) == 0, capsys.readouterr().err
        assert os.path.exists("/dev/shm/llmretry-" + store[4:])
        capsys.readouterr()
        assert cli.main(base + ["--shared", "shm:../x"]) == 2
        err = capsys.readouterr().err
        assert "shared" in err and "Traceback" not in err, err



def _paced(base_url: str, shared: str, n: int) -> Dict[str, Any]:
    with llmretry.Client(base_url=base_url, shared=shared, rpm=1200, max_retries=5,
                         base_delay_ms=100, logger=None) as client:
        out = client.call_many([BODY] * n, limit=8)
        return {"ok": out.summary.ok, "attempts": out.summary.attempts}


def test_one_rate_budget_for_four_processes(store: str) -> None:
    # A provider's 1,200 a minute enforced per second (20 in any 1 s), and
    # four processes each configured with it: sharing the bucket, together
    # they stay under it (each pacing alone, together they send 4x: about
    # half their attempts are refused; bench/bench_shared.py measures both).
    with MockServer() as mock:
        mock.script("limited", [], limits={"rpm": 20, "window_ms": 1000})
        url = mock.scenario_url("limited")
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(4) as pool:
            runs = pool.starmap(_paced, [(url, store, 12)] * 4)
        recs = mock.requests("limited")
        refused = sum(1 for r in recs if r.get("rate_limited"))
        assert sum(r["ok"] for r in runs) == 48
        assert refused <= 1, f"{refused} of {len(recs)} refused"
