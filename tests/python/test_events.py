"""Events: order, exact fields, the calling thread, and every kind of logger."""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
import time
from typing import Any, Dict, List

import pytest

import llmretry
from conftest import (EVENT_FIELDS, FAST, SECRET_KEY, Events, Scenario, check_event_sequence,
                      check_event_shape, run_call, secret_body)

LEVELS = {
    "llm_request_started": logging.DEBUG,
    "llm_request_succeeded": logging.INFO,
    "llm_request_failed": logging.WARNING,
    "llm_request_error": logging.WARNING,
    "llm_retry_scheduled": logging.WARNING,
    "llm_request_gave_up": logging.WARNING,
}


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: List[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def all_six(scen: Scenario, **kw: Any):
    """One call producing every event type: a timeout, a 503, then a give-up."""
    scen.script([{"delay_ms": 1000}, {"status": 503, "retry_after": "0.05"}],
                after={"status": 400, "error_code": "bad_thing"})
    return run_call(scen, None, timeout_ms=200, **kw)


def test_event_order_and_exact_fields(scen: Scenario) -> None:
    out = all_six(scen)
    assert out.error is not None
    assert out.events.names == [
        "llm_request_started", "llm_request_error", "llm_retry_scheduled",
        "llm_request_started", "llm_request_failed", "llm_retry_scheduled",
        "llm_request_started", "llm_request_failed", "llm_request_gave_up",
    ]
    for ev in out.events.events:
        assert set(ev) == EVENT_FIELDS[ev["event"]]
        check_event_shape(ev)
    check_event_sequence(out.events, 3, out.error.request_id)
    e = out.events.events
    assert e[0]["attempt"] == 0 and e[0]["timeout_ms"] == 200 and e[0]["deadline_left_ms"] is None
    assert e[1]["error_kind"] == "timeout" and e[1]["duration_ms"] >= 150
    assert e[2]["delay_source"] == "backoff" and e[2]["delay_ms"] == 20
    assert e[2]["next_attempt"] == 1
    assert e[4]["status"] == 503 and e[4]["retry_after"] == "0.05"
    assert e[4]["error_code"] == "server_error" and "mock error 503" in e[4]["body_preview"]
    assert e[5]["delay_source"] == "retry_after" and e[5]["delay_ms"] == 50
    assert e[7]["status"] == 400 and e[7]["error_code"] == "bad_thing"
    gave_up = e[8]
    assert gave_up["reason"] == "not_retryable" and gave_up["attempts"] == 3
    assert gave_up["error_kind"] == "http_status" and gave_up["status"] == 400
    assert gave_up["total_ms"] >= 200 + 20 + 50
    assert all(ev["model"] == "gpt-test" for ev in e)


def test_succeeded_fields(scen: Scenario) -> None:
    out = run_call(scen, [{"usage": {"prompt_tokens": 7, "completion_tokens": 5,
                                     "total_tokens": 12},
                           "system_fingerprint": "fp_x", "model": "gpt-served"}])
    (ev,) = out.events.of("llm_request_succeeded")
    assert set(ev) == EVENT_FIELDS["llm_request_succeeded"]
    assert ev["status"] == 200
    assert ev["usage"] == {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
    assert ev["response_model"] == "gpt-served"
    assert ev["system_fingerprint"] == "fp_x"
    assert ev["model"] == "gpt-test"
    meta = out.result.meta
    assert meta.usage == ev["usage"] and meta.response_model == "gpt-served"
    assert meta.system_fingerprint == "fp_x" and meta.model == "gpt-test"


def test_usage_missing(scen: Scenario) -> None:
    out = run_call(scen, [{"body": {"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}}])
    (ev,) = out.events.of("llm_request_succeeded")
    assert ev["usage"] is None
    assert out.result.meta.usage is None


def test_model_from_str_body(scen: Scenario) -> None:
    out = run_call(scen, [{}], body=json.dumps({"model": "m-from-text", "messages": []}))
    assert {e["model"] for e in out.events.events} == {"m-from-text"}
    assert out.result.meta.model == "m-from-text"


def test_events_on_the_calling_thread(scen: Scenario) -> None:
    scen.script([{"status": 503}], after={})
    results: Dict[str, Any] = {}

    def worker() -> None:
        events = Events()
        res = llmretry.call_llm(secret_body("thread"), base_url=scen.url, api_key=SECRET_KEY,
                                logger=events, **FAST)
        results["events"] = events
        results["ident"] = threading.get_ident()
        results["res"] = res

    t = threading.Thread(target=worker)
    t.start()
    t.join(30)
    assert not t.is_alive()
    assert results["events"].names  # delivered at all
    assert set(results["events"].threads) == {results["ident"]}
    assert results["ident"] != threading.get_ident()


def test_events_on_calling_threads_concurrently(scen: Scenario) -> None:
    scen.script([], after={"delay_ms": 100})
    out: Dict[int, Any] = {}
    errors: List[BaseException] = []

    def worker(i: int) -> None:
        try:
            events = Events()
            llmretry.call_llm(secret_body(f"c{i}"), base_url=scen.url, api_key=SECRET_KEY,
                              logger=events, **FAST)
            out[i] = (threading.get_ident(), events)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    for ident, events in out.values():
        assert events.names == ["llm_request_started", "llm_request_succeeded"]
        assert set(events.threads) == {ident}
        assert len({e["request_id"] for e in events.events}) == 1
    assert len({ev.events[0]["request_id"] for _, ev in out.values()}) == 6


def test_logging_logger_levels_and_message(scen: Scenario) -> None:
    logger = logging.getLogger("test_llmretry.custom")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    cap = Capture()
    logger.addHandler(cap)
    try:
        all_six(scen, logger=logger)
    finally:
        logger.removeHandler(cap)
    names = [r.llmretry_event["event"] for r in cap.records]
    assert names == [
        "llm_request_started", "llm_request_error", "llm_retry_scheduled",
        "llm_request_started", "llm_request_failed", "llm_retry_scheduled",
        "llm_request_started", "llm_request_failed", "llm_request_gave_up",
    ]
    for rec in cap.records:
        ev = rec.llmretry_event
        assert rec.levelno == LEVELS[ev["event"]], (ev["event"], rec.levelname)
        msg = rec.getMessage()
        assert msg.startswith(ev["event"] + " ")
        assert json.loads(msg[len(ev["event"]) + 1:]) == ev
        assert "\n" not in msg
        check_event_shape(ev)
        assert SECRET_KEY not in msg and "SECRET-PROMPT" not in msg


def test_logging_logger_success_level(scen: Scenario) -> None:
    logger = logging.getLogger("test_llmretry.success")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    cap = Capture()
    logger.addHandler(cap)
    try:
        run_call(scen, [{}], logger=logger)
    finally:
        logger.removeHandler(cap)
    assert [(r.llmretry_event["event"], r.levelno) for r in cap.records] == [
        ("llm_request_started", logging.DEBUG), ("llm_request_succeeded", logging.INFO)]


def test_logger_adapter(scen: Scenario) -> None:
    base = logging.getLogger("test_llmretry.adapter")
    base.setLevel(logging.DEBUG)
    base.propagate = False
    cap = Capture()
    base.addHandler(cap)
    try:
        run_call(scen, [{"status": 503}], logger=logging.LoggerAdapter(base, {"job": "j1"}))
    finally:
        base.removeHandler(cap)
    assert [r.llmretry_event["event"] for r in cap.records] == [
        "llm_request_started", "llm_request_failed", "llm_retry_scheduled",
        "llm_request_started", "llm_request_succeeded"]


def test_default_logger_is_llmretry(scen: Scenario) -> None:
    named = logging.getLogger("llmretry")
    assert any(isinstance(h, logging.NullHandler) for h in named.handlers), \
        "the llmretry logger should carry a NullHandler"
    old_level = named.level
    named.setLevel(logging.DEBUG)
    cap = Capture()
    named.addHandler(cap)
    try:
        scen.script([{"status": 503}])
        res = llmretry.call_llm(secret_body("dflt"), base_url=scen.url, api_key=SECRET_KEY,
                                **FAST)
        n_default = len(cap.records)
        llmretry.call_llm(secret_body("none"), base_url=scen.url, api_key=SECRET_KEY,
                          logger=None, **FAST)
        n_after_none = len(cap.records)
    finally:
        named.removeHandler(cap)
        named.setLevel(old_level)
    assert res.meta.attempts == 2
    assert [r.llmretry_event["event"] for r in cap.records[:n_default]] == [
        "llm_request_started", "llm_request_failed", "llm_retry_scheduled",
        "llm_request_started", "llm_request_succeeded"]
    assert [r.levelno for r in cap.records[:n_default]] == [
        logging.DEBUG, logging.WARNING, logging.WARNING, logging.DEBUG, logging.INFO]
    assert n_after_none == n_default, "logger=None must not log"


def test_logger_that_raises_keeps_the_result(scen: Scenario,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    seen: List[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u))
    calls: List[str] = []

    def bad_logger(ev: Dict[str, Any]) -> None:
        calls.append(ev["event"])
        raise RuntimeError("logger exploded")

    scen.script([{"status": 503}], after={"content": "still here"})
    res = llmretry.call_llm(secret_body("raise"), base_url=scen.url, api_key=SECRET_KEY,
                            logger=bad_logger, **FAST)
    assert res.data["choices"][0]["message"]["content"] == "still here"
    assert res.meta.attempts == 2
    assert calls == ["llm_request_started", "llm_request_failed", "llm_retry_scheduled",
                     "llm_request_started", "llm_request_succeeded"]
    # One report per call, the first error's (tests/vectors/loggers/).
    assert len(seen) == 1, f"{len(seen)} unraisable reports for {len(calls)} raises"
    assert isinstance(seen[0].exc_value, RuntimeError)
    assert str(seen[0].exc_value) == "logger exploded"


def test_logger_that_raises_on_error_path(scen: Scenario,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    seen: List[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u))

    def bad_logger(ev: Dict[str, Any]) -> None:
        raise RuntimeError("boom")

    scen.script([{"status": 400}])
    with pytest.raises(llmretry.HTTPStatusError) as info:
        llmretry.call_llm(secret_body("raise2"), base_url=scen.url, api_key=SECRET_KEY,
                          logger=bad_logger, **FAST)
    assert info.value.status == 400
    assert len(seen) == 1               # three raises, one report per call
    assert isinstance(seen[0].exc_value, RuntimeError)


class Stop(BaseException):
    pass


def test_logger_base_exception_cancels_and_propagates(scen: Scenario) -> None:
    """A BaseException from the logger stops a 30 s backoff at once."""
    scen.script([{"status": 503, "retry_after": "30"}])
    events = Events(raise_on="llm_retry_scheduled", exc=Stop("stop now"))
    t0 = time.monotonic()
    with pytest.raises(Stop):
        llmretry.call_llm(secret_body("stop"), base_url=scen.url, api_key=SECRET_KEY,
                          logger=events, **FAST)
    assert time.monotonic() - t0 < 3.0
    assert len(scen.requests()) == 1


def test_jsonl_logger(scen: Scenario) -> None:
    stream = io.StringIO()
    out = run_call(scen, [{"status": 503}], logger=llmretry.jsonl_logger(stream))
    assert out.ok
    lines = stream.getvalue().splitlines()
    events = [json.loads(line) for line in lines]
    assert [e["event"] for e in events] == [
        "llm_request_started", "llm_request_failed", "llm_retry_scheduled",
        "llm_request_started", "llm_request_succeeded"]
    for e in events:
        check_event_shape(e)
        assert e["request_id"] == out.result.meta.request_id
    assert SECRET_KEY not in stream.getvalue() and "SECRET-PROMPT" not in stream.getvalue()


def test_jsonl_logger_flushes() -> None:
    class Flushy(io.StringIO):
        flushes = 0

        def flush(self) -> None:
            Flushy.flushes += 1
            super().flush()

    stream = Flushy()
    log = llmretry.jsonl_logger(stream)
    log({"event": "llm_request_started", "request_id": "r", "attempt": 0, "model": "m",
         "timeout_ms": 1, "deadline_left_ms": None})
    assert json.loads(stream.getvalue())["request_id"] == "r"
    assert stream.getvalue().endswith("\n") and stream.getvalue().count("\n") == 1
    assert Flushy.flushes >= 1


def test_jsonl_logger_defaults_to_stderr(scen: Scenario,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    run_call(scen, [{}], logger=llmretry.jsonl_logger())
    captured = capsys.readouterr()
    names = [json.loads(line)["event"] for line in captured.err.splitlines()]
    assert names == ["llm_request_started", "llm_request_succeeded"]
    assert captured.out == ""


def test_engine_builds_only_the_masked_events(scen: Scenario) -> None:
    """event_mask selects events in the core: a WARNING logger costs no
    started/succeeded events, and a mask of one event gives just that one."""
    from llmretry import _llmretry

    scen.script([{"status": 503}, {}])
    got: List[Dict[str, Any]] = []
    retry_only = 1 << _llmretry.EVENT_NAMES.index("llm_retry_scheduled")
    engine = _llmretry.Engine()
    try:
        out = engine.call(json.dumps(secret_body("mask")).encode(), base_url=scen.url, base_delay_ms=1, jitter="none",
                          on_event=got.append, event_mask=retry_only)
    finally:
        engine.close()
    assert out["ok"] and out["attempts"] == 2
    assert [e["event"] for e in got] == ["llm_retry_scheduled"]


def test_logger_level_decides_which_events_are_built(scen: Scenario) -> None:
    """A logger at WARNING gets failures only; lowering its level at run
    time brings the started/succeeded events back on the next call."""
    logger = logging.getLogger("llmretry.test.mask")
    logger.propagate = False
    cap = Capture()
    logger.addHandler(cap)
    try:
        logger.setLevel(logging.WARNING)
        scen.script([{"status": 503}, {}, {}])
        llmretry.call_llm(secret_body("lvl"), base_url=scen.url, api_key=SECRET_KEY,
                          logger=logger, **FAST)
        names = [r.llmretry_event["event"] for r in cap.records]  # type: ignore[attr-defined]
        assert names == ["llm_request_failed", "llm_retry_scheduled"]
        cap.records.clear()
        logger.setLevel(logging.DEBUG)
        llmretry.call_llm(secret_body("lvl"), base_url=scen.url, api_key=SECRET_KEY,
                          logger=logger, **FAST)
        names = [r.llmretry_event["event"] for r in cap.records]  # type: ignore[attr-defined]
        assert names == ["llm_request_started", "llm_request_succeeded"]
    finally:
        logger.removeHandler(cap)
