"""A listed batch's bodies encoded in the extension's loop
(bindings/python/batch_encode.c) are what the package's per-item path
(_encode_batch_body) makes of each, values and errors, and the pairs it
keeps for the batch are not left for the cyclic GC to visit."""

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
    assert _bodies._encode_bodies(bodies, url) == per_item(bodies, url)
    assert _bodies._encode_bodies(tuple(bodies), url) == per_item(bodies, url)


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
    assert _bodies._encode_bodies(collections.deque(bodies), None) == per_item(bodies, None)


def test_the_pairs_are_not_for_the_gc_to_visit() -> None:
    # bytes and a str or None: in no cycle. A batch keeps one pair per item
    # until it ends, and the GC walked them all on each full pass.
    out = _bodies._encode_bodies([{"model": "m"}, {"messages": []},
                                  {"model": "m", "stream": True}], None)
    assert [gc.is_tracked(p) for p in out] == [False, False, False]
