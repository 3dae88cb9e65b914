"""A request body encoded by the extension (bindings/python/json_encode.c)
is byte for byte what the package's json encoder sends, and what it does
not take goes to that encoder, whose output or error stands."""

from __future__ import annotations

import collections
import enum
import random
from typing import Any, List

import pytest

from conftest import nested
from llmretry import _bodies, _llmretry


def by_json(obj: Any) -> bytes:
    return _bodies._BODY_ENCODER.encode(obj).encode("utf-8")


CHARS = "ab \"\\/\n\r\t\b\f\x00\x01\x1f\x7f\x80é€\u2028\uffff\U0001f600\U0010ffff"


def gen(rng: random.Random, depth: int) -> Any:
    r = rng.random()
    if depth > 6 or r < 0.5:
        s = rng.random()
        if s < 0.2:
            return rng.randint(-2 ** 70, 2 ** 70) if rng.random() < 0.3 else rng.randint(-99, 99)
        if s < 0.35:
            return rng.choice([0.0, -0.0, 1e300, 5e-324, 0.1, 1e16, 1e-7, 123456.789,
                               rng.uniform(-1e6, 1e6), rng.random()])
        if s < 0.85:
            return "".join(rng.choice(CHARS) for _ in range(rng.randint(0, 12)))
        return rng.choice([True, False, None])
    if r < 0.7:
        items = [gen(rng, depth + 1) for _ in range(rng.randint(0, 5))]
        return tuple(items) if rng.random() < 0.2 else items
    return {"".join(rng.choice(CHARS) for _ in range(rng.randint(0, 6))): gen(rng, depth + 1)
            for _ in range(rng.randint(0, 6))}


def test_generated_bodies_are_byte_for_byte_json() -> None:
    rng = random.Random(3601)
    for _ in range(3000):
        body = {"model": "m", "messages": [gen(rng, 1)], "x": gen(rng, 0)}
        assert _llmretry.encode_json(body) == by_json(body), body


def test_long_strings_and_a_large_body() -> None:
    # characters that grow (escapes, 4-byte UTF-8) across the chunk boundaries
    for n in (1023, 1024, 1025, 4097):
        for filler in ("a", "\x00", "\U0001f600", "é\n"):
            body = {"s": filler * n, "t": ["x" * n, filler]}
            assert _llmretry.encode_json(body) == by_json(body)
    big = {"messages": [{"role": "user", "content": f"{i} é \"q\"\n" * 50} for i in range(2000)]}
    assert _llmretry.encode_json(big) == by_json(big)


class Color(enum.IntEnum):
    RED = 1


class Text(str):
    pass


LEFT: List[Any] = [
    {"x": float("nan")}, {"x": float("inf")}, {"x": [-float("inf")]},
    {1: "int key"}, {None: 1}, {True: 1}, {2.5: 1},
    {"s": "\ud800"}, {"\udfff": 1},
    {"e": Color.RED}, {"t": Text("sub")}, collections.OrderedDict(a=1),
    {"o": object()}, {"set": {1}}, {"b": b"bytes"},
    {"deep": nested(64)}, {"deeper": nested(500)},
]


@pytest.mark.parametrize("body", LEFT, ids=range(len(LEFT)))
def test_what_it_leaves_goes_to_json_which_says(body: Any) -> None:
    assert _llmretry.encode_json(body) is None
    try:
        want: Any = by_json(body)
    except (TypeError, ValueError) as exc:
        with pytest.raises(TypeError) as info:
            _bodies._encode_body(body)
        assert str(exc) in str(info.value)
    else:
        assert _bodies._encode_body(body)[0] == want


def test_depth_up_to_the_limit_is_taken() -> None:
    for depth in (1, 62, 63):
        body = {"v": nested(depth)}
        assert _llmretry.encode_json(body) == by_json(body)


def test_an_int_past_the_digit_limit_is_json_s_error() -> None:
    body = {"n": 10 ** 5000}
    try:
        want = by_json(body)
    except ValueError:          # Python's int digit limit (3.11, 3.10.7, 3.9.14)
        assert _llmretry.encode_json(body) is None
        with pytest.raises(TypeError, match="body cannot be sent as JSON"):
            _bodies._encode_body(body)
    else:
        assert _llmretry.encode_json(body) == want


def test_a_cycle_is_still_the_same_error() -> None:
    body: Any = {"a": []}
    body["a"].append(body)
    assert _llmretry.encode_json(body) is None
    with pytest.raises(TypeError, match="circular or nested too deeply"):
        _bodies._encode_body(body)


def test_the_model_is_still_read() -> None:
    payload, model = _bodies._encode_body({"model": "gpt-x", "messages": []})
    assert payload == b'{"model":"gpt-x","messages":[]}' and model == "gpt-x"
