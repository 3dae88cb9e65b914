"""Batch jobs: call_many and map_with_concurrency under the batch policy.

The failures file and its progress file, resume, the pool-wide pause on a
429's Retry-After, the adaptive window, the batch deadline, the usage
summary and its event, progress, and Ctrl-C in the middle of a batch.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple

import pytest

import llmretry
from conftest import FAST, SECRET_KEY, Events, Scenario, child_env, secret_body
from llmretry import _batch

ERROR_KEYS = {"kind", "status", "message", "request_id", "attempts"}


def opts(scen: Scenario, **kw: Any) -> Dict[str, Any]:
    o: Dict[str, Any] = dict(FAST, base_url=scen.url, api_key=SECRET_KEY, logger=None)
    o.update(kw)
    return o


def bodies_for(n: int, tag: str = "b") -> List[Dict[str, Any]]:
    return [secret_body(f"{tag}{i}") for i in range(n)]


def index_of_request(rec: Dict[str, Any]) -> int:
    """The item index of a recorded request (its prompt is SECRET-PROMPT-<tag><i>)."""
    content = json.loads(rec["body"])["messages"][-1]["content"]
    return int(content.rsplit("-", 1)[1].lstrip("bcdmpqrx"))


def read_failures(path: Path) -> List[Dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n"), "a failures line was left unfinished"
    return [json.loads(line) for line in text.splitlines()]


def read_done(path: Path) -> List[int]:
    lines = Path(f"{path}.done").read_text(encoding="ascii").splitlines()
    header = json.loads(lines[0])
    assert header["llmretry_done"] == 1 and isinstance(header["items"], int)
    return [int(x) for x in lines[1:]]


def check_record(path: Path, n: int) -> Tuple[Set[int], Set[int]]:
    """Every item ok or failed at most once and never both; (ok, failed)."""
    failures = read_failures(path)
    failed = [rec["index"] for rec in failures]
    done = read_done(path)
    assert len(failed) == len(set(failed)), f"an item is in the failures file twice: {failed}"
    assert len(done) == len(set(done)), f"an item is marked done twice: {done}"
    assert not set(failed) & set(done), f"ok and failed: {set(failed) & set(done)}"
    assert set(failed) | set(done) <= set(range(n))
    for rec in failures:
        assert set(rec) in ({"index", "item", "error"}, {"index", "item", "item_repr", "error"})
        assert ERROR_KEYS <= set(rec["error"])
    return set(done), set(failed)


# ---------------------------------------------------------------------------
# call_many: results, summary, event


def test_call_many_summary_and_event(scen: Scenario) -> None:
    """limit=1 makes the server's steps map to items: 0 retried once, 1 fails."""
    scen.script([{"status": 503}, {}, {"status": 400}, {}])
    events = Events()
    out = llmretry.call_many(bodies_for(4), limit=1, **opts(scen, logger=events))
    assert isinstance(out, llmretry.BatchResult) and isinstance(out, list)
    assert [type(v).__name__ for v in out] == ["Result", "BadRequestError", "Result", "Result"]
    assert out.errors() == [(1, out[1])]
    s = out.summary
    assert isinstance(s, llmretry.BatchSummary)
    assert (s.items, s.ok, s.failed, s.not_started, s.skipped) == (4, 3, 1, 0, 0)
    assert (s.attempts, s.retries) == (5, 1)
    assert (s.prompt_tokens, s.completion_tokens, s.total_tokens) == (36, 9, 45)
    assert s.completed and s.elapsed_ms >= 0
    summaries = events.of("llm_batch_summary")
    assert len(summaries) == 1 and events.events[-1] is summaries[0]
    ev = summaries[0]
    assert {k: ev[k] for k in s.as_dict()} == s.as_dict()
    assert ev["request_id"] is None and ev["model"] is None
    assert "SECRET" not in json.dumps(ev)
    assert "4 items: 3 ok, 1 failed" in s.format()
    back = pickle.loads(pickle.dumps(out))
    assert back.summary == s and len(back) == 4


def test_call_many_streams_ask_for_usage(scen: Scenario) -> None:
    """A batch's streaming dicts ask for their usage as one call's do (it was
    missing: LiteLLM's proxy answered them with no usage chunk); a dict that
    sets stream_options and a str body are sent as given."""
    bodies: List[Any] = [secret_body("s0", stream=True), secret_body("s1", stream=True),
                         secret_body("s2", stream=True,
                                     stream_options={"include_usage": False}),
                         json.dumps(secret_body("s3", stream=True))]
    before = json.dumps(bodies)
    out = llmretry.call_many(bodies, limit=1, **opts(scen))
    assert [type(v).__name__ for v in out] == ["Result"] * 4
    assert all(v.meta.stream for v in out)
    assert [v.meta.usage is not None for v in out] == [True, True, False, False]
    assert out.summary.total_tokens == 2 * out[0].meta.usage["total_tokens"] > 0
    assert json.dumps(bodies) == before, "the caller's bodies were changed"
    sent = [json.loads(rec["body"]) for rec in scen.server.requests(scen.name)]
    assert [b.get("stream_options") for b in sent] == [
        {"include_usage": True}, {"include_usage": True}, {"include_usage": False}, None]


def test_call_many_empty_is_a_batch(scen: Scenario) -> None:
    out = llmretry.call_many([], **opts(scen))
    assert out == [] and out.summary.items == 0 and out.summary.completed


@pytest.mark.parametrize("failed,level", [(False, logging.INFO), (True, logging.WARNING)])
def test_summary_event_level(scen: Scenario, caplog: pytest.LogCaptureFixture,
                             failed: bool, level: int) -> None:
    scen.script([{"status": 400}] if failed else [])
    logger = logging.getLogger("test_batch_summary_level")
    with caplog.at_level(logging.INFO, logger=logger.name):
        llmretry.call_many(bodies_for(2), limit=1, **opts(scen, logger=logger))
    recs = [r for r in caplog.records if r.getMessage().startswith("llm_batch_summary ")]
    assert len(recs) == 1 and recs[0].levelno == level
    assert recs[0].llmretry_event["failed"] == (1 if failed else 0)  # type: ignore[attr-defined]


def test_broken_summary_logger_keeps_the_results(scen: Scenario,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    def logger(ev: Dict[str, Any]) -> None:
        if ev["event"] == "llm_batch_summary":
            raise RuntimeError("logger down")

    out = llmretry.call_many(bodies_for(2), **opts(scen, logger=logger))
    assert out.summary.ok == 2
    assert "logger down" in capsys.readouterr().err


def test_call_deadline_ms_is_per_call(scen: Scenario) -> None:
    scen.script([{"delay_ms": 3000}])
    t0 = time.monotonic()
    out = llmretry.call_many(bodies_for(2), limit=2, call_deadline_ms=300, **opts(scen))
    assert time.monotonic() - t0 < 2.0
    slow = [v for v in out if isinstance(v, llmretry.DeadlineExceededError)]
    assert len(slow) == 1 and slow[0].attempts == 1, out   # the first to arrive is slow
    assert out.summary.ok == 1 and out.summary.not_started == 0


@pytest.mark.parametrize("kw,exc", [
    ({"failures_path": 123}, TypeError),
    ({"progress": "yes"}, TypeError),
    ({"deadline_ms": -1}, ValueError),
    ({"deadline_ms": "soon"}, TypeError),
    ({"adaptive": 1}, TypeError),
    ({"resume": "yes"}, TypeError),
    ({"resume": True}, ValueError),             # without failures_path
    ({"on_result": 5}, TypeError),
    ({"logger": 5}, TypeError),
])
def test_bad_batch_arguments_raise_before_any_call(scen: Scenario, kw: Dict[str, Any],
                                                   exc: type) -> None:
    o = opts(scen)
    o.update(kw)
    with pytest.raises(exc):
        llmretry.call_many(bodies_for(2), **o)
    with pytest.raises(exc):
        llmretry.map_with_concurrency(range(2), 2, lambda x, i: x,
                                      **{k: v for k, v in kw.items()})
    assert scen.requests() == []


def test_public_batch_names() -> None:
    for name in ("BatchResult", "BatchSummary", "SKIPPED"):
        assert name in llmretry.__all__
    assert llmretry.BatchResult.__doc__ and llmretry.BatchSummary.__doc__
    assert repr(llmretry.SKIPPED) == "SKIPPED" and not llmretry.SKIPPED
    assert pickle.loads(pickle.dumps(llmretry.SKIPPED)) is llmretry.SKIPPED


# ---------------------------------------------------------------------------
# The failures file


def test_failures_file_is_written_as_items_fail(scen: Scenario, tmp_path: Path) -> None:
    """Each failure is on disk when progress reports it; lines hold the item as JSON."""
    scen.script([{"status": 400, "error_code": "bad"}, {}, {"status": 400}, {"status": 400}])
    path = tmp_path / "failed.jsonl"
    bodies: List[Any] = [secret_body("d0"), json.dumps(secret_body("d1")),
                         json.dumps(secret_body("d2")).encode(), '["a JSON text"]']
    seen: List[Tuple[int, int, int, int]] = []

    def progress(done: int, total: int, failed: int) -> None:
        seen.append((done, total, failed, len(read_failures(path))))

    out = llmretry.call_many(bodies, limit=1, failures_path=path, progress=progress,
                             **opts(scen))
    assert [d for d, _, _, _ in seen] == [1, 2, 3, 4]
    assert all(total == 4 for _, total, _, _ in seen)
    assert [(f, lines) for _, _, f, lines in seen] == [(1, 1), (1, 1), (2, 2), (3, 3)]
    recs = read_failures(path)
    assert [r["index"] for r in recs] == [0, 2, 3]
    assert recs[0]["item"] == bodies[0]
    assert recs[1]["item"] == secret_body("d2")       # bytes of JSON: written as JSON
    assert recs[2]["item"] == ["a JSON text"]
    err = out[0]
    assert recs[0]["error"] == {"kind": "http_status", "status": 400, "message": err.message,
                                "request_id": err.request_id, "attempts": 1}
    assert read_done(path) == [1]
    assert str(SECRET_KEY) not in path.read_text()


def test_failures_file_for_map_items_and_plain_exceptions(tmp_path: Path) -> None:
    path = tmp_path / "failed.jsonl"

    class Thing:
        def __repr__(self) -> str:
            return "Thing()"

    items: List[Any] = [{"a": 1}, Thing(), float("nan"), 4]

    def worker(item: Any, index: int) -> int:
        if index < 3:
            raise ValueError(f"no {index}")
        return index

    out = llmretry.map_with_concurrency(items, 2, worker, return_exceptions=True,
                                        failures_path=path, logger=None)
    assert out[3] == 3 and isinstance(out[0], ValueError)
    recs = {r["index"]: r for r in read_failures(path)}
    assert recs[0]["item"] == {"a": 1}
    assert recs[1]["item"] is None and recs[1]["item_repr"] == "Thing()"
    assert recs[2]["item"] is None and recs[2]["item_repr"] == "nan"
    assert recs[0]["error"] == {"kind": "exception", "type": "ValueError", "status": None,
                                "message": "no 0", "request_id": None, "attempts": None}
    assert read_done(path) == [3]


def test_failures_path_starts_afresh_without_resume(scen: Scenario, tmp_path: Path) -> None:
    path = tmp_path / "failed.jsonl"
    scen.script([{"status": 400}])
    llmretry.call_many(bodies_for(3), limit=1, failures_path=str(path), **opts(scen))
    assert len(read_failures(path)) == 1
    scen.script([])
    out = llmretry.call_many(bodies_for(3), limit=1, failures_path=str(path), **opts(scen))
    assert out.summary.ok == 3 and read_failures(path) == []
    assert sorted(read_done(path)) == [0, 1, 2]


# ---------------------------------------------------------------------------
# 1,000 items with 10% injected faults: nothing lost, resume completes


def fault_script(n: int, seed: int) -> List[Dict[str, Any]]:
    rng = random.Random(seed)
    faults: List[Dict[str, Any]] = [
        {"status": 503}, {"status": 500}, {"status": 429, "retry_after_ms": "5"},
        {"status": 400}, {"fault": "reset"}, {"fault": "invalid_json"},
        {"status": 502}, {"status": 429},
    ]
    return [dict(rng.choice(faults)) if rng.random() < 0.10 else {} for _ in range(n)]


@pytest.mark.slow
def test_thousand_items_with_faults_lose_nothing_then_resume(
        scen: Scenario, tmp_path: Path) -> None:
    n = 1000
    path = tmp_path / "failed.jsonl"
    bodies = bodies_for(n, "m")
    scen.script(fault_script(n + 200, seed=6))
    done_calls: List[int] = []
    o = opts(scen, base_delay_ms=1, max_delay_ms=5, jitter="none", max_retries=2)
    out = llmretry.call_many(bodies, limit=32, failures_path=path,
                             on_result=lambda i, v: done_calls.append(i), **o)
    s = out.summary
    ok = {i for i, v in enumerate(out) if isinstance(v, llmretry.Result)}
    failed = {i for i, v in enumerate(out) if isinstance(v, llmretry.LLMError)}
    assert len(out) == n and ok | failed == set(range(n)) and not ok & failed
    assert sorted(done_calls) == list(range(n)), "on_result once per item"
    assert (s.ok, s.failed, s.skipped) == (len(ok), len(failed), 0)
    assert failed, "the script's 400s must fail some items for good"
    assert all(out[i].status == 400 or out[i].attempts == 3 for i in failed)
    done, in_file = check_record(path, n)
    assert done == ok and in_file == failed
    recs = server_recs = scen.requests()
    # Each attempt reached the server once, and so did each free re-send (a
    # kept-alive connection the script closed under a request).
    assert s.attempts + s.resends == len(server_recs), "every request counted once"
    assert s.retries == s.attempts - n
    assert s.total_tokens == 15 * len(ok)
    assert {index_of_request(r) for r in recs} == set(range(n))

    # The re-run retries just the failed items; the others are SKIPPED.
    scen.script([])
    out2 = llmretry.call_many(bodies, limit=32, failures_path=path, resume=True, **o)
    assert sorted(index_of_request(r) for r in scen.requests()) == sorted(failed)
    for i in range(n):
        if i in failed:
            assert isinstance(out2[i], llmretry.Result), (i, out2[i])
        else:
            assert out2[i] is llmretry.SKIPPED
    s2 = out2.summary
    assert (s2.ok, s2.failed, s2.skipped, s2.items) == (len(failed), 0, len(ok), n)
    done2, in_file2 = check_record(path, n)
    assert done2 == set(range(n)) and in_file2 == set()


# ---------------------------------------------------------------------------
# Resume


def test_resume_runs_failed_and_never_run_items(scen: Scenario, tmp_path: Path) -> None:
    """A record whose run stopped midway: the failed items and those never
    run run again, the ok ones do not."""
    path = tmp_path / "failed.jsonl"
    bodies = bodies_for(6, "r")
    path.write_text(json.dumps({"index": 1, "item": None, "error": {}}) + "\n"
                    + '{"index": 4, "ite', encoding="utf-8")        # a torn last line
    Path(f"{path}.done").write_text('{"llmretry_done": 1, "items": 6}\n0\n2\n3', "ascii")
    seen: List[int] = []
    out = llmretry.call_many(bodies, limit=2, failures_path=path, resume=True,
                             on_result=lambda i, v: seen.append(i), **opts(scen))
    # 3 is torn in the progress file (no newline): not known to be ok.
    assert sorted(index_of_request(r) for r in scen.requests()) == [1, 3, 4, 5]
    assert sorted(seen) == [1, 3, 4, 5]
    assert [v is llmretry.SKIPPED for v in out] == [True, False, True, False, False, False]
    assert out.summary.skipped == 2
    done, failed = check_record(path, 6)
    assert done == set(range(6)) and failed == set()


def test_resume_from_a_failures_file_alone(scen: Scenario, tmp_path: Path) -> None:
    path = tmp_path / "failed.jsonl"
    path.write_text("".join(json.dumps({"index": i, "item": None, "error": {}}) + "\n"
                            for i in (2, 5)), encoding="utf-8")
    scen.script([{"status": 400}])
    out = llmretry.call_many(bodies_for(7), limit=1, failures_path=path, resume=True,
                             **opts(scen))
    assert sorted(index_of_request(r) for r in scen.requests()) == [2, 5]
    assert isinstance(out[2], llmretry.HTTPStatusError) and isinstance(out[5], llmretry.Result)
    done, failed = check_record(path, 7)
    assert failed == {2} and done == {0, 1, 3, 4, 5, 6}


def test_resume_without_a_record_is_a_first_run(scen: Scenario, tmp_path: Path) -> None:
    out = llmretry.call_many(bodies_for(3), failures_path=tmp_path / "f.jsonl", resume=True,
                             **opts(scen))
    assert out.summary.ok == 3 and len(scen.requests()) == 3


def test_resume_refuses_another_batch(scen: Scenario, tmp_path: Path) -> None:
    path = tmp_path / "failed.jsonl"
    llmretry.call_many(bodies_for(3), failures_path=path, **opts(scen))
    with pytest.raises(ValueError, match="3 items"):
        llmretry.call_many(bodies_for(5), failures_path=path, resume=True, **opts(scen))
    path.write_text(json.dumps({"index": 9, "item": None, "error": {}}) + "\n")
    os.remove(f"{path}.done")
    with pytest.raises(ValueError, match="item 9|same batch"):
        llmretry.call_many(bodies_for(5), failures_path=path, resume=True, **opts(scen))
    assert len(scen.requests()) == 3


def test_map_resume_uses_original_indices(tmp_path: Path) -> None:
    path = tmp_path / "failed.jsonl"
    calls: List[int] = []
    failing = [True]

    def worker(item: str, index: int) -> str:
        calls.append(index)
        if failing[0] and index % 3 == 0:
            raise RuntimeError(f"item {index}")
        return item.upper()

    items = [f"w{i}" for i in range(10)]
    out = llmretry.map_with_concurrency(items, 3, worker, return_exceptions=True,
                                        failures_path=path, logger=None)
    assert {i for i, v in enumerate(out) if isinstance(v, RuntimeError)} == {0, 3, 6, 9}
    calls.clear()
    failing[0] = False
    got: List[Tuple[int, Any]] = []
    out2 = llmretry.map_with_concurrency(items, 3, worker, return_exceptions=True,
                                         failures_path=path, resume=True, logger=None,
                                         on_result=lambda i, v: got.append((i, v)))
    assert sorted(calls) == [0, 3, 6, 9]
    assert sorted(got) == [(i, f"W{i}") for i in (0, 3, 6, 9)]
    assert [i for i, v in enumerate(out2) if v is not llmretry.SKIPPED] == [0, 3, 6, 9]
    assert out2[3] == "W3" and out2.summary.skipped == 6
    assert check_record(path, 10) == (set(range(10)), set())


# ---------------------------------------------------------------------------
# Pacing: the pool-wide pause on Retry-After, the adaptive window


def check_pool_paused(recs: List[Dict[str, Any]], limit: int, pause_s: float) -> None:
    """The first request got a 429 naming pause_s: no request started
    after the first `limit` until that wait was over."""
    times = sorted(r["time"] for r in recs)
    t429 = min(r["time"] for r in recs if r["step"] == 0)
    later = times[limit:]
    assert later, "no request after the first wave"
    early = [round(t - t429, 3) for t in later if t - t429 < pause_s * 0.8]
    assert not early, f"requests started {early} s after the 429 (pause {pause_s} s)"


@pytest.mark.slow
def test_call_many_pauses_the_whole_pool_on_retry_after(scen: Scenario) -> None:
    scen.script([{"status": 429, "retry_after": "0.6"}], after={"delay_ms": 80})
    out = llmretry.call_many(bodies_for(12), limit=4, adaptive=False, **opts(scen))
    assert out.summary.ok == 12 and out.summary.pauses >= 1
    # Without the pool-wide pause, items 4.. would start ~80 ms after the 429.
    check_pool_paused(scen.requests(), 4, 0.6)


@pytest.mark.slow
def test_map_pauses_the_whole_pool_on_retry_after(scen: Scenario) -> None:
    scen.script([{"status": 429, "retry_after": "0.6"}], after={"delay_ms": 80})

    def worker(body: Dict[str, Any], index: int) -> int:
        return llmretry.call_llm(body, **opts(scen)).meta.attempts

    out = llmretry.map_with_concurrency(bodies_for(12), 4, worker, adaptive=False,
                                        logger=None)
    assert sorted(out) == [1] * 11 + [2] and out.summary.pauses >= 1
    check_pool_paused(scen.requests(), 4, 0.6)


def test_adaptive_window_halves_on_a_burst_of_429s(scen: Scenario) -> None:
    burst = [{"status": 429, "retry_after_ms": "30"}] * 8
    scen.script(burst, after={"delay_ms": 10})
    out = llmretry.call_many(bodies_for(24), limit=8, **opts(scen))
    assert out.summary.ok == 24 and out.summary.halvings >= 1
    sub = scen.sub("fixed")
    sub.script(burst, after={"delay_ms": 10})
    out = llmretry.call_many(bodies_for(24), limit=8, adaptive=False, **opts(sub))
    assert out.summary.ok == 24 and out.summary.halvings == 0


@pytest.mark.parametrize("adaptive", [True, False])
def test_map_adaptive_window(scen: Scenario, adaptive: bool) -> None:
    scen.script([{"status": 429, "retry_after_ms": "30"}] * 8, after={"delay_ms": 10})

    def worker(body: Dict[str, Any], index: int) -> Any:
        return llmretry.call_llm(body, **opts(scen))

    out = llmretry.map_with_concurrency(bodies_for(24), 8, worker, adaptive=adaptive,
                                        logger=None)
    assert out.summary.ok == 24 and out.summary.pauses >= 1
    assert (out.summary.halvings >= 1) is adaptive


def test_map_summary_counts_the_workers_calls(scen: Scenario) -> None:
    scen.script([{"status": 503}])

    def worker(body: Dict[str, Any], index: int) -> int:
        a = llmretry.call_llm(body, **opts(scen))
        b = llmretry.call_llm(body, **opts(scen))
        return a.meta.attempts + b.meta.attempts

    out = llmretry.map_with_concurrency(bodies_for(3), 2, worker, logger=None)
    s = out.summary
    assert sum(out) == 7 and (s.attempts, s.retries) == (7, 1)
    assert s.total_tokens == 6 * 15 and s.ok == 3
    # Calls outside a batch are not counted anywhere.
    assert _batch.current_accounting() is None


# ---------------------------------------------------------------------------
# The batch deadline


@pytest.mark.slow
def test_call_many_batch_deadline(scen: Scenario, tmp_path: Path) -> None:
    """Items of 500 ms, 2 at once, 1.2 s for the batch: 0-3 finish, 4-5
    are cut at the deadline, the rest never start."""
    scen.script([], after={"delay_ms": 500})
    path = tmp_path / "failed.jsonl"
    t0 = time.monotonic()
    out = llmretry.call_many(bodies_for(8), limit=2, deadline_ms=1200, failures_path=path,
                             **opts(scen, timeout_ms=10000))
    took = time.monotonic() - t0
    assert took < 1.9, f"the batch deadline did not bound the batch ({took:.2f} s)"
    s = out.summary
    assert isinstance(out[0], llmretry.Result) and s.ok >= 2
    errors = [v for v in out if isinstance(v, llmretry.LLMError)]
    assert errors and all(isinstance(e, llmretry.DeadlineExceededError) for e in errors)
    assert isinstance(out[7], llmretry.DeadlineExceededError) and out[7].attempts == 0
    assert s.not_started == sum(1 for e in errors if e.attempts == 0) >= 1
    assert s.failed == len(errors)
    done, failed = check_record(path, 8)
    assert failed == {i for i, v in enumerate(out) if isinstance(v, llmretry.LLMError)}
    # The running calls got the batch's time left, not their 10 s timeout.
    assert all(e.total_ms < 1500 for e in errors)


def test_map_batch_deadline_not_started(tmp_path: Path) -> None:
    # Items 0 and 1 end at once, 2 and 3 run past the deadline: 4 to 7 can
    # never start, however slowly the machine schedules the workers (0.3 s
    # sleeps against a 0.4 s deadline failed on a loaded machine).
    deadline_s = 1.0
    t0 = time.monotonic()

    def worker(item: int, index: int) -> int:
        if item >= 2:
            time.sleep(max(0.0, t0 + deadline_s + 0.2 - time.monotonic()))
        return item

    path = tmp_path / "failed.jsonl"
    out = llmretry.map_with_concurrency(range(8), 2, worker, return_exceptions=True,
                                        deadline_ms=int(deadline_s * 1000), failures_path=path,
                                        logger=None)
    assert out[:4] == [0, 1, 2, 3]
    for v in out[4:]:
        assert isinstance(v, llmretry.DeadlineExceededError)
        assert (v.kind, v.reason, v.attempts, v.request_id) == (
            "deadline_exceeded", "deadline", 0, None)
        assert "batch deadline" in str(v)
    assert out.summary.not_started == 4 and out.summary.failed == 4
    assert check_record(path, 8) == ({0, 1, 2, 3}, {4, 5, 6, 7})
    t0 = time.monotonic()
    with pytest.raises(llmretry.DeadlineExceededError):
        llmretry.map_with_concurrency(range(8), 2, worker, deadline_ms=int(deadline_s * 1000),
                                      logger=None)


def test_map_batch_deadline_clamps_calls_in_workers(scen: Scenario) -> None:
    scen.script([], after={"delay_ms": 3000})

    def worker(body: Dict[str, Any], index: int) -> Any:
        return llmretry.call_llm(body, **opts(scen, timeout_ms=10000))

    t0 = time.monotonic()
    out = llmretry.map_with_concurrency(bodies_for(2), 2, worker, deadline_ms=400,
                                        return_exceptions=True, logger=None)
    assert time.monotonic() - t0 < 2.0
    assert all(isinstance(v, llmretry.DeadlineExceededError) and v.attempts == 1 for v in out)


# ---------------------------------------------------------------------------
# on_result and progress


def test_on_result_exception_stops_the_batch(scen: Scenario, tmp_path: Path) -> None:
    path = tmp_path / "failed.jsonl"

    def on_result(index: int, value: Any) -> None:
        if index == 2:
            raise RuntimeError("disk full")

    events = Events()
    with pytest.raises(RuntimeError, match="disk full"):
        llmretry.call_many(bodies_for(10), limit=1, failures_path=path, on_result=on_result,
                           **opts(scen, logger=events))
    done, failed = check_record(path, 10)
    assert done == {0, 1} and failed == set()
    (summary,) = events.of("llm_batch_summary")
    assert summary["completed"] is False and summary["ok"] == 2


@pytest.mark.parametrize("return_exceptions", [False, True])
def test_map_on_result_exception_stops_the_pool(tmp_path: Path,
                                                return_exceptions: bool) -> None:
    path = tmp_path / "failed.jsonl"
    ran: List[int] = []

    def on_result(index: int, value: Any) -> None:
        if index == 2:
            raise RuntimeError("disk full")

    def worker(item: int, index: int) -> int:
        ran.append(index)
        time.sleep(0.01)
        return item

    with pytest.raises(RuntimeError, match="disk full"):
        llmretry.map_with_concurrency(range(20), 1, worker, failures_path=path,
                                      return_exceptions=return_exceptions,
                                      on_result=on_result, logger=None)
    assert ran == [0, 1, 2]
    assert check_record(path, 20) == ({0, 1}, set())


def test_progress_without_tqdm_prints_a_line(scen: Scenario, no_tqdm: None,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    scen.script([{"status": 400}])
    llmretry.call_many(bodies_for(5), limit=1, progress=True, **opts(scen))
    err = capsys.readouterr().err
    assert "llmretry: 0/5 (0%), 0 failed" in err
    assert "llmretry: 5/5 (100%), 1 failed" in err and err.endswith("\n")
    assert "SECRET" not in err


class FakeTqdm:
    instances: List["FakeTqdm"] = []

    def __init__(self, total: int, **kw: Any) -> None:
        self.total = total
        self.kw = kw
        self.updates: List[int] = []
        self.postfix: List[str] = []
        self.closed = False
        FakeTqdm.instances.append(self)

    def update(self, n: int) -> None:
        self.updates.append(n)

    def set_postfix_str(self, s: str, refresh: bool = True) -> None:
        self.postfix.append(s)

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    @staticmethod
    def write(s: str, file: Any = None) -> None:
        (file or sys.stderr).write(s + "\n")


def fake_tqdm(monkeypatch: pytest.MonkeyPatch, auto: Any = FakeTqdm) -> None:
    """tqdm as ``import tqdm.auto`` finds it: ``auto`` its tqdm.auto.tqdm
    (Jupyter's widget class, or the text one), FakeTqdm its tqdm.tqdm."""
    fake = types.ModuleType("tqdm")
    fake.__path__ = []  # type: ignore[attr-defined]  # a package: tqdm.auto imports
    fake.tqdm = FakeTqdm  # type: ignore[attr-defined]
    fake_auto = types.ModuleType("tqdm.auto")
    fake_auto.tqdm = auto  # type: ignore[attr-defined]
    fake.auto = fake_auto  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tqdm", fake)
    monkeypatch.setitem(sys.modules, "tqdm.auto", fake_auto)
    FakeTqdm.instances.clear()


def test_progress_uses_tqdm_when_installed(scen: Scenario,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tqdm(monkeypatch)
    scen.script([{"status": 400}])
    llmretry.call_many(bodies_for(6), limit=2, progress=True, **opts(scen))
    (bar,) = FakeTqdm.instances
    assert bar.total == 6 and sum(bar.updates) == 6 and bar.closed
    assert bar.postfix == ["failed=1"]
    FakeTqdm.instances.clear()
    llmretry.map_with_concurrency(range(4), 2, lambda x, i: x, progress=True, logger=None)
    (bar,) = FakeTqdm.instances
    assert bar.total == 4 and sum(bar.updates) == 4 and bar.closed


def test_progress_falls_back_to_text_when_the_widget_cannot_be_drawn(
        scen: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """tqdm.auto in Jupyter without ipywidgets raises ImportError ("IProgress
    not found") when the bar is made: the batch runs with tqdm's text bar."""
    def no_widget(**kw: Any) -> None:
        raise ImportError("IProgress not found. Please update jupyter and ipywidgets.")

    fake_tqdm(monkeypatch, auto=no_widget)
    llmretry.call_many(bodies_for(3), limit=2, progress=True, **opts(scen))
    (bar,) = FakeTqdm.instances
    assert bar.total == 3 and sum(bar.updates) == 3 and bar.closed

def test_progress_callable_sees_every_item_in_order(scen: Scenario) -> None:
    seen: List[Tuple[int, int, int]] = []
    scen.script([{"status": 400}, {}, {"status": 400}])
    llmretry.call_many(bodies_for(8), limit=3, progress=lambda *a: seen.append(a),
                       **opts(scen))
    assert [d for d, _, _ in seen] == list(range(1, 9))
    assert {t for _, t, _ in seen} == {8} and seen[-1][2] == 2
    assert [f for _, _, f in seen] == sorted(f for _, _, f in seen)


# ---------------------------------------------------------------------------
# Ctrl-C in the middle of a batch

# The key comes in an argument: the traceback of the KeyboardInterrupt quotes
# the call's source lines (all of them since Python 3.13), which must not
# hold it for the test's check of what llmretry itself prints.
CHILD = r"""
import sys, llmretry
base_url, path, key = sys.argv[1], sys.argv[2], sys.argv[3]
bodies = [{"model": "m", "messages": [{"role": "user", "content": f"SECRET-PROMPT-c{i}"}]}
          for i in range(40)]
print("READY", flush=True)
llmretry.call_many(bodies, limit=4, base_url=base_url, api_key=key, logger=None,
                   max_retries=0, failures_path=path)
print("RETURNED", flush=True)
"""


@pytest.mark.slow
def test_ctrl_c_leaves_a_consistent_record_then_resume(scen: Scenario,
                                                       tmp_path: Path) -> None:
    steps = [{"status": 400} if i % 5 == 0 else {} for i in range(40)]
    for s in steps:
        s["delay_ms"] = 100
    scen.script(steps)
    path = tmp_path / "failed.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, scen.url, str(path), SECRET_KEY],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env())
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
        end = time.monotonic() + 20
        while time.monotonic() < end:
            if Path(f"{path}.done").exists() and len(read_done(path)) >= 8:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # A KeyboardInterrupt carrying what finished (issue 13, item 17).
    assert "llmretry.BatchInterrupted: batch interrupted" in err and "RETURNED" not in out
    assert "SECRET" not in err
    ok1, failed1 = check_record(path, 40)
    assert len(ok1) >= 8 and len(ok1) + len(failed1) < 40, "the batch was not interrupted"

    n_requests = len(scen.requests())
    scen.script([])
    out2 = llmretry.call_many(
        [{"model": "m", "messages": [{"role": "user", "content": f"SECRET-PROMPT-c{i}"}]}
         for i in range(40)], limit=4, failures_path=path, resume=True,
        **opts(scen, max_retries=0))
    rerun = sorted(index_of_request(r) for r in scen.requests())
    assert rerun == sorted(set(range(40)) - ok1), "resume must run every item not ok"
    assert n_requests >= len(ok1) + len(failed1)
    assert out2.summary.skipped == len(ok1) and out2.summary.failed == 0
    assert check_record(path, 40) == (set(range(40)), set())


def test_a_batch_recorded_at_its_end_is_the_batch_watched_item_by_item(scen: Scenario) -> None:
    """Nothing watching items (no record, progress or on_result), the run
    fills the batch's own list and converts only the outcome dicts at its
    end (_batch_tally): values and summary as when on_result watches each."""
    def run(on_result: Any, deadline_ms: Any = None) -> llmretry.BatchResult:
        scen.script([{}, {"status": 400}, {}, {"status": 400}, {"status": 400}, {}])
        return llmretry.call_many(bodies_for(6), limit=1, on_result=on_result,
                                  deadline_ms=deadline_ms, **opts(scen))

    for deadline_ms in (None, 0):
        seen: List[int] = []
        at_end, watched = run(None, deadline_ms), run(lambda i, v: seen.append(i), deadline_ms)
        assert sorted(seen) == list(range(6))
        for out in (at_end, watched):
            kinds = [type(v).__name__ for v in out]
            if deadline_ms is None:
                assert kinds == ["Result", "BadRequestError", "Result", "BadRequestError",
                                 "BadRequestError", "Result"]
            else:       # every item kept from starting: each an error, not_started
                assert kinds == ["DeadlineExceededError"] * 6
                assert all(v.attempts == 0 for v in out)
        s, w = at_end.summary.as_dict(), watched.summary.as_dict()
        s.pop("elapsed_ms")
        w.pop("elapsed_ms")
        assert s == w
        assert (s["ok"], s["failed"], s["not_started"]) == (
            (3, 3, 0) if deadline_ms is None else (0, 6, 6))
