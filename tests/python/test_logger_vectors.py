"""The logger vectors of tests/vectors/loggers/: one rule for a raising logger.

Every vector runs through each way Python reads a call's mailbox (the
extension's one reader, bindings/python/mailbox.c): ``call_llm`` (Engine.call),
``acall_llm`` (a Call read by the loop), ``call_many`` (a batch's items); a
stream through ``stream_llm`` and ``astream_llm``. tests/lua/logger_vectors_spec.lua
runs the same files through Lua's reader (lua/llmretry/mailbox.lua).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest

import llmretry
from conftest import SECRET_KEY, VECTOR_DIR

OPTION_NAMES = {"timeout_ms", "max_retries", "base_delay_ms", "max_delay_ms", "jitter"}
LOGGER_FILES = sorted((VECTOR_DIR / "loggers").glob("*.json"))


def test_logger_vectors_found() -> None:
    assert len(LOGGER_FILES) >= 3, f"only {len(LOGGER_FILES)} logger vectors"


def _call(body: Dict[str, Any], kw: Dict[str, Any]) -> Any:
    return llmretry.call_llm(body, **kw)


def _acall(body: Dict[str, Any], kw: Dict[str, Any]) -> Any:
    return asyncio.run(llmretry.acall_llm(body, **kw))


def _many(body: Dict[str, Any], kw: Dict[str, Any]) -> Any:
    out = llmretry.call_many([body], limit=1, **kw)[0]
    if isinstance(out, BaseException):
        raise out
    return out


def _stream(body: Dict[str, Any], kw: Dict[str, Any]) -> Any:
    with llmretry.stream_llm(body, **kw) as s:
        for _ in s:
            pass
        return s.result()


def _astream(body: Dict[str, Any], kw: Dict[str, Any]) -> Any:
    async def run() -> Any:
        async with llmretry.astream_llm(body, **kw) as s:
            async for _ in s:
                pass
            return await s.result()
    return asyncio.run(run())


CALL_WAYS: Dict[str, Callable[[Dict[str, Any], Dict[str, Any]], Any]] = {
    "call": _call, "acall": _acall, "many": _many}
STREAM_WAYS: Dict[str, Callable[[Dict[str, Any], Dict[str, Any]], Any]] = {
    "stream": _stream, "astream": _astream}


def _cases() -> List[Any]:
    cases = []
    for path in LOGGER_FILES:
        vec = json.loads(path.read_text(encoding="utf-8"))
        ways = STREAM_WAYS if vec["body"].get("stream") else CALL_WAYS
        cases += [pytest.param(path, way, id=f"{path.stem}-{way}") for way in ways]
    return cases


@pytest.mark.parametrize("path,way", _cases())
def test_logger_vector(path: Path, way: str, server: Any,
                       monkeypatch: pytest.MonkeyPatch) -> None:
    vec = json.loads(path.read_text(encoding="utf-8"))
    assert vec["name"] == path.stem, "name must equal the file name"
    options = dict(vec.get("options", {}))
    assert not set(options) - OPTION_NAMES, f"unknown option(s) {set(options) - OPTION_NAMES}"
    exp, raise_on = vec["expect"], set(vec["raise_on"])
    scenario = f"{vec['name']}_{way}"
    server.script(scenario, vec["script"]["steps"], vec["script"].get("after"))

    reports: List[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", reports.append)
    logged: List[Dict[str, Any]] = []

    def logger(ev: Dict[str, Any]) -> None:
        if ev["event"].startswith("llm_batch_"):
            return                  # the batch's own summary, not the call's
        logged.append(ev)
        if ev["event"] in raise_on:
            raise RuntimeError(f"logger broke on {ev['event']}")

    run = (STREAM_WAYS if vec["body"].get("stream") else CALL_WAYS)[way]
    kw = dict(options, base_url=server.scenario_url(scenario), api_key=SECRET_KEY,
              logger=logger)
    if exp["outcome"] == "ok":
        res = run(vec["body"], kw)
        assert res.data["choices"][0]["message"]["content"] == exp["content"]
    else:
        with pytest.raises(llmretry.LLMError) as info:
            run(vec["body"], kw)
        assert info.value.kind == exp["error_kind"]

    assert [ev["event"] for ev in logged] == exp["logged"], "every event reaches the logger"
    assert len(reports) == exp["reports"], (
        f"{len(reports)} reports: {[str(u.object) for u in reports]}")
    if reports:
        u, first = reports[0], next(ev for ev in logged if ev["event"] in raise_on)
        assert first["event"] == exp["reported_event"]
        assert isinstance(u.exc_value, RuntimeError)
        assert str(u.exc_value) == f"logger broke on {exp['reported_event']}"
        text = str(u.object)
        assert exp["reported_event"] in text and first["request_id"] in text, text
        assert SECRET_KEY not in text and "SECRET-PROMPT" not in text
