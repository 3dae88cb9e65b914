"""Engine.call_many's item_headers: one item's own header lines, asked for
before the item is submitted, for a run of items at a time (llmretry.otel
gives each batch item its span's traceparent through it)."""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Optional

import pytest

from conftest import Scenario
from llmretry import _llmretry

BODY = b'{"model": "m", "messages": []}'


def test_each_item_gets_its_own_lines_on_every_attempt(scen: Scenario) -> None:
    scen.script([{"status": 503}], after={})
    asked: List[Any] = []

    def item_headers(index: int) -> Optional[List[str]]:
        asked.append((index, threading.get_ident()))
        if index == 2:
            return None                 # the batch's own
        return ["X-Batch: item", f"X-Item: {index}"]

    engine = _llmretry.Engine()
    try:
        out = engine.call_many([BODY] * 4, limit=1, base_url=scen.url, headers=["X-Batch: all"],
                               item_headers=item_headers, max_retries=2, base_delay_ms=1)
    finally:
        engine.close()
    assert all(o["ok"] for o in out)
    assert sorted(i for i, _ in asked) == [0, 1, 2, 3]          # once per item
    assert {t for _, t in asked} == {threading.get_ident()}       # on the batch's thread
    seen = [(r["headers"].get("x-item"), r["headers"].get("x-batch")) for r in scen.requests()]
    # Item 0 was retried: both its attempts carry its lines.
    assert seen == [("0", "item"), ("0", "item"), ("1", "item"), (None, "all"), ("3", "item")]


def test_bad_item_headers_are_refused(scen: Scenario) -> None:
    engine = _llmretry.Engine()
    try:
        with pytest.raises(TypeError, match="item_headers must be callable"):
            engine.call_many([BODY], item_headers=1, base_url=scen.url)
        with pytest.raises(TypeError, match=r"item_headers\(\)\[0\] must be a str"):
            engine.call_many([BODY], item_headers=lambda i: [1], base_url=scen.url)
        with pytest.raises(ValueError, match="bodies\\[0\\]"):
            engine.call_many([BODY], item_headers=lambda i: ["Bad\nName: x"], base_url=scen.url)
        with pytest.raises(ZeroDivisionError):
            engine.call_many([BODY], item_headers=lambda i: 1 / 0, base_url=scen.url)
    finally:
        engine.close()
    assert scen.requests() == []


def test_a_run_of_items_is_asked_for_before_any_is_submitted(scen: Scenario) -> None:
    """item_headers is asked for a run of items (up to 64) before any of them
    is submitted, and then they are submitted back to back: the engine's I/O
    thread takes them at one wake-up. The host's work per item (llmretry.otel's
    span: tens of µs) used to spread the submissions out and wake it once
    per item (issue 34's benchmark: half its CPU per call)."""
    requests_seen: Dict[int, int] = {}

    def item_headers(index: int) -> Optional[List[str]]:
        if index == 1:
            # Had item 0 been submitted already, its request would come in:
            # give it a second (nothing comes once the fix is in).
            deadline = time.monotonic() + 1.0
            while not scen.requests() and time.monotonic() < deadline:
                time.sleep(0.01)
        requests_seen[index] = len(scen.requests())
        return [f"X-Item: {index}"]

    engine = _llmretry.Engine()
    try:
        out = engine.call_many([BODY] * 8, limit=8, base_url=scen.url,
                               item_headers=item_headers)
    finally:
        engine.close()
    assert all(o["ok"] for o in out)
    assert requests_seen == dict.fromkeys(range(8), 0)
    assert sorted(r["headers"]["x-item"] for r in scen.requests()) == [str(i) for i in range(8)]
