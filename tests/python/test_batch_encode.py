"""A listed batch's bodies encoded in the extension's loop
(bindings/python/batch_encode.c) are what the package's per-item path
(_encode_batch_body) makes of each, values and errors, and what a batch
keeps of them adds no object per item for the cyclic GC to count."""

from __future__ import annotations

import collections
import gc
import random
from typing import Any, List, Optional, Tuple

import pytest

from llmretry import _bodies, _llmretry

from test_json_encode import gen

URLS = [None, "https://api.openai.com/v1/chat/completions",
        "https://example.test/v1/responses", "https://example.test/v1/embeddings"]


def per_item(bodies: List[Any], url: Optional[str]) -> List[Tuple[bytes, Optional[str]]]:
    """What the package made before the loop: each body on its own."""
    return [_bodies._encode_batch_body(b, url) for b in bodies]


class Sub(dict):   # type: ignore[type-arg]
    pass


def cases() -> List[Any]:
    rng = random.Random(3602)
    out: List[Any] = [
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        {"model": 7, "messages": []},                       # a model that is not a str
        {"messages": []},                                   # no model
        {"model": "m", "stream": True, "messages": []},     # asks for its usage
        {"model": "m", "stream": True, "stream_options": {"include_usage": False}},
        {"model": "m", "stream": False},
        {"model": "m", "stream": "yes"},
        {"model": "m", "stream": None},
        {"stream": True},
        {},
        {"model": "m", "messages": [{"role": "user", "content": '"stream": true'}]},
        {"model": "m", "x": {"stream": True}},               # not at the top level
        {"model": "m", 1: 2},                               # a key json turns into "1"
        {"model": "m", "t": (1, 2)},
        Sub(model="m", stream=True),                        # a subclass: json's encoder
        collections.OrderedDict(model="m"),
        '{"model": "m", "stream": true}',                   # text: sent as given
        b'{"model": "m"}',
        bytearray(b'  {"a": 1}'),
        {"model": "m", "big": 2 ** 80},
    ]
    for _ in range(300):
        body = {"model": rng.choice(["m", None, 3, "é"]), "messages": [gen(rng, 1)]}
        if rng.random() < 0.3:
            body["stream"] = rng.choice([True, False, 1, None])
        out.append(body)
    return out


@pytest.mark.parametrize("url", URLS)
def test_the_loop_makes_what_each_item_made(url: Optional[str]) -> None:
    bodies = cases()
    assert list(_bodies._encode_bodies(bodies, url)) == per_item(bodies, url)
    assert list(_bodies._encode_bodies(tuple(bodies), url)) == per_item(bodies, url)
    enc = _bodies._encode_bodies(bodies, url)
    assert len(enc) == len(bodies)
    assert list(zip(enc.payloads, enc.models)) == per_item(bodies, url)
    assert enc[3] == per_item(bodies[3:4], url)[0] and enc[-1] == per_item(bodies[-1:], url)[0]


@pytest.mark.parametrize("bad, kind", [
    ("hello", ValueError), ({"x": float("nan")}, TypeError), ({"x": object()}, TypeError),
    (42, TypeError), (Sub(x=float("inf")), TypeError),
])
def test_a_bad_body_is_the_per_item_error_naming_its_index(bad: Any, kind: type) -> None:
    bodies = [{"model": "m"}, {"model": "n"}, bad, {"model": "o"}]
    with pytest.raises(kind) as got:
        _bodies._encode_bodies(bodies, None)
    with pytest.raises(kind) as want:
        _bodies._encode_batch_body(bad, None)
    assert str(got.value) == f"bodies[2]: {want.value}"


def test_a_circular_body_is_still_the_same_error() -> None:
    body: Any = {"model": "m"}
    body["self"] = body
    with pytest.raises(TypeError, match=r"^bodies\[1\]: body cannot be sent as JSON: it is "
                       "circular"):
        _bodies._encode_bodies([{}, body], None)


def test_an_iterable_that_is_not_a_list_is_still_encoded() -> None:
    bodies = cases()[:20]
    assert list(_bodies._encode_bodies(collections.deque(bodies), None)) == per_item(bodies,
                                                                                    None)


def test_a_batch_s_bodies_add_no_object_per_item_for_the_gc() -> None:
    # The GC collects when enough container objects were made since the
    # last pass; a batch keeps what encoding made until it ends, so a pair
    # per item was one more of them for each item (its results make six).
    bodies = [{"model": "m", "messages": [{"role": "user", "content": str(i)}]}
              for i in range(2000)]
    threshold = gc.get_threshold()
    gc.collect()
    gc.set_threshold(1 << 30, threshold[1], threshold[2])
    try:
        before = gc.get_count()[0]
        enc = _bodies._encode_bodies(bodies, None)
        made = gc.get_count()[0] - before
    finally:
        gc.set_threshold(*threshold)
    assert len(enc) == 2000
    assert made < 20, made
