"""The batch vectors of tests/vectors/batches/ through map_with_concurrency.

Mirrors tests/c/test_batch_vectors.c (which runs the items as one engine
group): here each item is a worker making one ``call_llm``, so the vectors
show that Python's pool is paced by the engine's admission stage exactly as
a batch is (tests/vectors/README.md, "Batch vectors").
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

import llmretry
from conftest import SECRET_KEY, VECTOR_DIR

OPTION_NAMES = {"timeout_ms", "max_retries", "base_delay_ms", "max_delay_ms", "jitter",
                "deadline_ms", "max_retry_after_ms", "retry_budget_ratio", "retry_budget_min",
                "breaker_failures", "breaker_cooldown_ms"}
BATCH_FILES = sorted((VECTOR_DIR / "batches").glob("*.json"))
BODY = {"model": "gpt-test", "messages": [{"role": "user", "content": "SECRET"}]}


def test_batch_vectors_found() -> None:
    assert len(BATCH_FILES) >= 2


@pytest.mark.parametrize("path", BATCH_FILES, ids=[p.stem for p in BATCH_FILES])
def test_batch_vector(path: Path, server: Any) -> None:
    vec = json.loads(path.read_text(encoding="utf-8"))
    name, exp, items = vec["name"], vec["expect"], vec["items"]
    assert name == path.stem
    shared = dict(vec.get("options", {}))
    for opts in [shared] + [it.get("options", {}) for it in items]:
        assert not set(opts) - OPTION_NAMES, f"unknown option(s) {set(opts) - OPTION_NAMES}"
    server.script(name, vec["script"].get("steps", []), vec["script"].get("after"))
    client = llmretry.Client(max_in_flight=vec.get("max_in_flight", 256), logger=None,
                             base_url=server.scenario_url(name), api_key=SECRET_KEY)
    t0 = time.monotonic()

    def worker(item: Dict[str, Any], index: int) -> Tuple[Any, float, float]:
        delay = item.get("start_after_ms", 0) / 1000.0 - (time.monotonic() - t0)
        if delay > 0:
            time.sleep(delay)
        started = time.monotonic()
        try:
            value: Any = client.call_llm(BODY, **{**shared, **item.get("options", {})})
        except llmretry.LLMError as exc:
            value = exc
        return value, started, time.monotonic()

    try:
        out: List[Any] = llmretry.map_with_concurrency(items, vec["limit"], worker)
    finally:
        client.close()
    for i, (want, (value, started, ended)) in enumerate(zip(exp["items"], out)):
        ok = isinstance(value, llmretry.Result)
        assert ok == (want["outcome"] == "ok"), f"item {i}: {value!r}"
        meta = value.meta if ok else value
        if "error_kind" in want:
            assert value.kind == want["error_kind"], f"item {i}: {value!r}"
        if "reason" in want:
            assert value.reason == want["reason"], f"item {i}: {value!r}"
        if "attempts" in want:
            assert meta.attempts == want["attempts"], f"item {i}: {meta.attempts} attempts"
        if "max_ms" in want:
            took = (ended - started) * 1000
            assert took <= want["max_ms"], f"item {i} took {took:.0f} ms"
    recs = server.requests(name)
    assert len(recs) == exp["requests"], f"{len(recs)} requests"
    if "quiet_after_429_ms" in exp:
        lo, hi = (v / 1000.0 for v in exp["quiet_after_429_ms"])
        t429 = next(r["time"] for r in recs if r["step"] == 0)
        # Requests after the script's two (step -1): the one sent beside the
        # 429 may come late on a loaded machine (131 ms was seen).
        early = [r["time"] - t429 for r in recs
                 if r["step"] == -1 and t429 + lo < r["time"] < t429 + hi]
        assert not early, f"requests {early} s after the 429, during its pause"
