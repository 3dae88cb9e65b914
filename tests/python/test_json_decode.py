"""Result.data straight from a body's bytes (bindings/python/json_decode.c)
is exactly what json.loads makes of it: the same types all the way down,
floats to the bit, dict order and repeated keys, escapes, and for what the C
decoder leaves to json's scanner (lone surrogates, NaN, nesting past its
limit, numbers json refuses) the old path's value or error. Its key cache
(kept across bodies) shares keys and never mixes them up or leaks them."""

from __future__ import annotations

import gc
import json
import random
import re
import struct
import sysconfig
import sys
import threading
import tracemalloc
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

import llmretry
from conftest import FAST, SECRET_KEY, Scenario, secret_body
from llmretry import _llmretry
from llmretry.testing import _replies

ROOT = Path(__file__).resolve().parents[2]
# A free-threaded build keeps no key table (no GIL to serialise it): keys
# are then equal, not one object.
SHARED_KEYS = not sysconfig.get_config_var("Py_GIL_DISABLED")


def same(a: Any, b: Any, path: str = "$") -> None:
    """a and b are equal, type for type (bool is not int, -0.0 is not 0.0),
    dicts in the same order. Without recursion: since Python 3.13 json.loads
    reads 5,000 levels, past Python's own recursion limit."""
    todo = [(a, b, path)]
    while todo:
        a, b, path = todo.pop()
        assert type(a) is type(b), (path, a, b)
        if type(a) is float:
            assert struct.pack("<d", a) == struct.pack("<d", b), (path, a, b)
        elif type(a) is dict:
            assert list(a) == list(b), path
            for k in a:
                assert type(k) is str, (path, k)
                todo.append((a[k], b[k], f"{path}.{k}"))
        elif type(a) is list:
            assert len(a) == len(b), path
            todo.extend((x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b)))
        else:
            assert a == b, (path, a, b)


def depth_of(body: bytes) -> int:
    """How deep a JSON text's arrays and objects nest (brackets in strings
    not counted)."""
    depth = deepest = 0
    in_string = escaped = False
    for c in body.decode("utf-8", "replace"):
        if in_string:
            in_string = escaped or c != '"'
            escaped = not escaped and c == "\\"
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def reference(body: bytes) -> Tuple[bool, Any]:
    """What the old path made of a body: (True, value) or (False, None)."""
    try:
        return True, json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError):
        return False, None


def check(body: bytes, handled: bool = True) -> None:
    """Both the C decoder (when it takes the body) and the whole path
    Result.data is made by agree with json.loads."""
    ok, want = reference(body)
    got = _llmretry._json_decode(body)
    if handled:
        assert got != (), body[:200]
    if got != ():
        assert ok, body[:200]
        same(got[0], want)
    if ok:
        same(_llmretry._parse_body(body), want)
    else:
        with pytest.raises(ValueError):
            _llmretry._parse_body(body)


def mock_replies() -> List[bytes]:
    """The mock's success bodies, of every API it answers."""
    out = []
    steps: List[Dict[str, Any]] = [
        {}, {"content": "héllo ✓ \U0001f600 \"q\" \\ \n\t\x00\x1f"},
        {"usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}},
        {"model": "m", "system_fingerprint": None, "embedding": [0.1, -0.0, 1e-300, 3]},
    ]
    for n, step in enumerate(steps):
        for api in ("chat", "completions", "embeddings", "responses"):
            out.append(_replies._response_body(step, 200, n, "gpt-x", api, {"input": ["a", "b"]}))
    return out


def vector_bodies() -> List[bytes]:
    """Every JSON file of tests/vectors, and the bodies its scripts answer."""
    out = []

    def bodies(x: Any) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "body" and isinstance(v, str):
                    out.append(v.encode("utf-8"))
                bodies(v)
        elif isinstance(x, list):
            for v in x:
                bodies(v)

    files = sorted((ROOT / "tests" / "vectors").rglob("*.json"))
    assert len(files) > 50
    for f in files:
        raw = f.read_bytes()
        out.append(raw)
        bodies(json.loads(raw))
    return out


C_DEPTH = 128        # the C decoder's nesting: deeper goes to json's scanner


def test_vectors_and_mock_replies_decode_as_json_loads() -> None:
    for body in mock_replies() + vector_bodies():
        try:
            body.decode("utf-8")
            json.loads(body)
        except (ValueError, RecursionError):
            check(body, handled=False)      # a vector's deliberately bad or deep body
        else:
            # A deep vector json.loads reads (Python 3.13 reads 5,000 levels).
            check(body, handled=depth_of(body) <= C_DEPTH)


EDGES = [
    # numbers: ints of any size, floats by json's own conversion
    b"0", b"-0", b"7", b"-7", b"123456789012345678", b"-123456789012345678",
    b"1234567890123456789", b"-9223372036854775808", b"9223372036854775808",
    b"18446744073709551616", b"-" + b"9" * 300, b"1" + b"0" * 4000,
    b"0.0", b"-0.0", b"-0.0e0", b"1e400", b"-1e400", b"1E+2", b"1e-2", b"2.5E-3",
    b"1.7976931348623157e308", b"5e-324", b"2e-324", b"0.1", b"0.30000000000000004",
    b"123456789012345678901234567890.5", b"9007199254740993", b"9007199254740993.0",
    b"1" * 70 + b".5", b"0." + b"1" * 400, b"1e-400",
    # literals, strings, escapes
    b"true", b"false", b"null", b'""', b'"x"', b'"\\"\\\\\\/\\b\\f\\n\\r\\t"',
    b'"\\u00e9\\u20ac\\ud83d\\ude00\\u0000z"', b'"\\u0041\\u00410"', '"h\u00e9llo \u2713 \U0001f600"'.encode(),
    b'"' + b"\\u0000" * 60 + b'"', b'"' + "é\\n".encode() * 200 + b'"',
    # containers: empty, nested, keys escaped/non-ASCII/long, repeated keys
    b"[]", b"{}", b"[[]]", b"[{}]", b'{"a":[]}', b'{"a":{}}', b' \t\r\n[ 1 , 2 ]\n ',
    b'{"a":1,"b":2,"a":3}', b'{"a":{"x":1},"a":[2]}', b'{"":0,"\\u0000":1,"\\"":2}',
    '{"\u0131d":1,"id":2,"Id":3,"ID":4,"i\u0307d":5,"\U0001f600":6}'.encode(),
    b'{"' + b"k" * 32 + b'":1,"' + b"k" * 33 + b'":2,"' + b"k" * 31 + b'":3}',
    b'{"caf\\u00e9":1,"caf\xc3\xa9":2}', b'{"a\\nb":1,"a\\u000ab":2}',
    b'[1,"a",true,null,false,1.5,{"b":[{"c":null}]},[[[-1]]]]',
]


@pytest.mark.parametrize("body", EDGES, ids=range(len(EDGES)))
def test_edge_values_are_json_loads_exactly(body: bytes) -> None:
    check(body)


FALLBACKS = [
    b'"\\ud800"', b'"\\udc00"', b'"\\ud800\\u0041"', b'"a\\udfff"', b'{"\\ud800":1}',
    b"NaN", b"[Infinity]", b"-Infinity", b"1" * 5000,         # json's int digit limit
    b"[" * 129 + b"]" * 129, b"[" * 5000 + b"]" * 5000, b'{"a":' * 3000 + b"1" + b"}" * 3000,
]


@pytest.mark.parametrize("body", FALLBACKS, ids=range(len(FALLBACKS)))
def test_what_the_decoder_leaves_goes_the_old_way(body: bytes) -> None:
    check(body, handled=False)
    assert _llmretry._json_decode(body) == ()


def test_nesting_up_to_the_limit_and_past_it() -> None:
    for depth in (1, 64, C_DEPTH - 1, C_DEPTH):
        check(b"[" * depth + b"]" * depth)
        check(b'{"k":' * depth + b"0" + b"}" * depth)
    assert _llmretry._json_decode(b"[" * (C_DEPTH + 1) + b"]" * (C_DEPTH + 1)) == ()
    # The recursion limit json's scanner is held to holds here too: up to
    # Python 3.11 the body is left to it (and fails there as it would have);
    # since 3.12 neither is held to it (C code has a recursion limit of its
    # own) and both read it.
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(60, len(_stack()) + 40))
    try:
        deep = b"[" * 100 + b"]" * 100
        try:
            json.loads(deep)
            held = False
        except RecursionError:
            held = True
        assert held == (sys.version_info < (3, 12))
        assert (_llmretry._json_decode(deep) == ()) == held
        check(deep, handled=not held)
    finally:
        sys.setrecursionlimit(old)


def _stack() -> List[Any]:
    f, out = sys._getframe(), []
    while f is not None:
        out.append(f)
        f = f.f_back
    return out


# ---- generated documents ----------------------------------------------------

KEYS = ["id", "Id", "ID", "ie", "id ", "idx", "\u0131d", "id\u00e9", "\u00e9", "\U0001f600",
        "choices", "Choices", "choicez", "message", "content", "", "k\"q", "tab\t", "nul\x00",
        "a" * 31, "a" * 32, "a" * 33, "total_tokens", "total_tokenS", "ab", "ba"]
ALPHABET = "ab \"\\/\n\t\x00\x1f\x7fé€\u2028\U0001f600\ud83d"
LONE = re.compile(r"\\ud83d(?!\\ud[c-f])")
BLANKS = ["", "", "", " ", "\n  ", "\t", "\r\n"]


def gen_number(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.3:
        return str(rng.randint(-1000, 1000))
    if r < 0.5:
        return str(rng.randint(-10 ** rng.randint(1, 40), 10 ** rng.randint(1, 40)))
    if r < 0.7:
        return repr(struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0])
    mant = ("-" if rng.random() < 0.3 else "") + rng.choice(["0", str(rng.randint(1, 10 ** 20))])
    if rng.random() < 0.6:
        mant += "." + str(rng.randint(0, 10 ** rng.randint(1, 25))).zfill(rng.randint(1, 5))
    if rng.random() < 0.5:
        mant += rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.randint(0, 400))
    return mant


def gen_string(rng: random.Random, ascii_only: bool) -> str:
    s = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 12)))
    if not ascii_only:
        s = s.replace("\ud83d", "")     # a lone surrogate has no UTF-8
    return json.dumps(s, ensure_ascii=ascii_only)


def gen(rng: random.Random, depth: int, ascii_only: bool) -> str:
    r = rng.random()
    if depth > 5 or r < 0.45:
        s = rng.random()
        if s < 0.35:
            v = gen_number(rng)
            return v if "n" not in v else "0"       # no inf/nan reprs
        if s < 0.8:
            return gen_string(rng, ascii_only)
        return rng.choice(["true", "false", "null"])
    b = lambda: rng.choice(BLANKS)  # noqa: E731
    if r < 0.7:
        items = [gen(rng, depth + 1, ascii_only) for _ in range(rng.randint(0, 5))]
        return "[" + b() + ("," + b()).join(i + b() for i in items) + "]"
    members = []
    for _ in range(rng.randint(0, 6)):
        key = rng.choice(KEYS) if rng.random() < 0.8 else "".join(
            rng.choice(ALPHABET) for _ in range(rng.randint(0, 6)))
        if not ascii_only:
            key = key.replace("\ud83d", "")
        members.append(json.dumps(key, ensure_ascii=ascii_only) + b() + ":" + b()
                       + gen(rng, depth + 1, ascii_only) + b())
    return "{" + b() + ("," + b()).join(members) + "}"


def test_generated_documents() -> None:
    rng = random.Random(36)
    handled = 0
    for _ in range(3000):
        ascii_only = rng.random() < 0.5
        text = rng.choice(BLANKS) + gen(rng, 0, ascii_only) + rng.choice(BLANKS)
        body = text.encode("utf-8", "surrogatepass")
        check(body, handled=False)
        if _llmretry._json_decode(body) != ():
            handled += 1
        else:                   # only a lone surrogate's escape is left to json
            assert LONE.search(text), text
    assert handled > 2000


def test_mutations_of_a_real_body() -> None:
    rng = random.Random(3636)
    real = mock_replies()[1]
    checked = valid = 0
    for _ in range(3000):
        b = bytearray(real)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(b))
            op = rng.random()
            if op < 0.4:
                b[at] = rng.randrange(256)
            elif op < 0.7:
                del b[at]
            else:
                b.insert(at, rng.choice(b'{}[]",:\\0123456789.eE-+ \tnultrfasu\x00\xc3\xa9\xff'))
        check(bytes(b), handled=False)
        checked += 1
        valid += reference(bytes(b))[0]
    assert checked == 3000 and 0 < valid < checked


# ---- the key cache ----------------------------------------------------------

CLOSE_KEYS = ["id", "Id", "iD", "ie", "\u0131d", "id\u00e9", "ide", "idé", "i", "idd"]


def body_with(keys: List[str], base: int) -> bytes:
    return json.dumps({k: base + i for i, k in enumerate(keys)}, ensure_ascii=False).encode()


def test_keys_are_shared_across_bodies_and_never_mixed() -> None:
    a = _llmretry._json_decode(body_with(CLOSE_KEYS, 0))[0]
    b = _llmretry._json_decode(body_with(CLOSE_KEYS[::-1], 100))[0]
    assert a == {k: i for i, k in enumerate(CLOSE_KEYS)}
    assert b == {k: 100 + i for i, k in enumerate(CLOSE_KEYS[::-1])}
    ka = {k: k for k in a}
    for k in b:
        assert (k is ka[k]) == SHARED_KEYS, k       # one str per key, kept across bodies
    # more keys than the cache has slots: evicted or not, never a wrong one
    many = [f"key{i}" for i in range(2000)] + [f"Key{i}" for i in range(2000)]
    rng = random.Random(7)
    for _ in range(50):
        keys = rng.sample(many, 60)
        got = _llmretry._json_decode(body_with(keys, 0))[0]
        assert list(got.items()) == [(k, i) for i, k in enumerate(keys)]


def test_the_key_expected_next_is_taken_only_when_its_bytes_are_there() -> None:
    # The cache expects, after a key, the key that followed it last time (a
    # batch's bodies have one order); each body here has, at some place,
    # something close to the expected key: every one decodes as json.loads.
    order = ["id", "object", "created", "model", "choices", "usage"]
    train = body_with(order, 0)
    near = ["objec", "objects", "Object", "obj\u0065ct", "object\"", "\u006fbject", "",
            "object\u0000", "ob\nject"]
    for other in near:
        text = '{"id":1,"%s":2,"created":3}' % other
        for body in (train, text.encode(), train):
            check(body, handled=reference(body)[0])
    # the expected key's bytes, then not a key: spaces, no colon, the end
    for tail in ('"object!:2}', '"object" :2}', '"object"\t:\n2}', '"object"2}', '"object"',
                 '"object', '"object":', '"object"}', '"object" ,'):
        check(train)
        body = ('{"id":1,' + tail).encode()
        check(body, handled=reference(body)[0])
    # keys past the cache's length or escaped are never expected, still right
    long_keys = ["id", "k" * 40, "object", "k" * 40]
    for _ in range(3):
        check(json.dumps({k: i for i, k in enumerate(long_keys)}).encode())


def test_short_values_repeated_across_bodies_are_one_str() -> None:
    # A batch keeps every result's strings alive and each full GC pass reads
    # them: a short value that comes again ("object", "role", "stop", the
    # model) is one str while it keeps coming; long or escaped ones are made
    # each time; a value that takes another's place never reads as it.
    def body(i: int) -> bytes:
        return json.dumps({"object": "chat.completion", "model": "gpt-4.1-mini",
                           "finish_reason": "stop", "n": "x" * 25, "e": "a\nb",
                           "id": f"c{i}", "empty": ""}).encode()

    a, b = (_llmretry._json_decode(body(i))[0] for i in (1, 2))
    same(a, json.loads(body(1)))
    same(b, json.loads(body(2)))
    for k in ("object", "model", "finish_reason", "empty"):
        assert (a[k] is b[k]) == SHARED_KEYS, k
    assert a["n"] == b["n"] and a["n"] is not b["n"]
    assert a["e"] == b["e"] and a["e"] is not b["e"]
    # many different short values through the same slots: each one right
    rng = random.Random(11)
    values = [f"v{i}" for i in range(3000)] + [f"V{i}é" for i in range(3000)]
    for _ in range(20):
        picked = rng.sample(values, 50)
        got = _llmretry._json_decode(json.dumps(picked, ensure_ascii=False).encode())[0]
        assert got == picked


def test_threads_decoding_at_once_get_their_own_keys() -> None:
    errors: List[BaseException] = []

    def work(shift: int) -> None:
        try:
            keys = CLOSE_KEYS[shift:] + CLOSE_KEYS[:shift]
            want = {k: i for i, k in enumerate(keys)}
            body = body_with(keys, 0)
            for _ in range(2000):
                assert _llmretry._json_decode(body)[0] == want
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_no_leak_of_keys_or_values() -> None:
    body = mock_replies()[1]
    key = next(iter(_llmretry._json_decode(body)[0]))
    for _ in range(100):                        # warm: the cache holds its keys
        _llmretry._json_decode(body)
        _llmretry._parse_body(b'{"x":"\\ud800"}')
    gc.collect()
    before = sys.getrefcount(key)
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for _ in range(10_000):
            _llmretry._json_decode(body)
            _llmretry._parse_body(b'{"x":"\\ud800"}')       # the old path
            _llmretry._json_decode(b'{"' + b"z" * 40 + b'":[1.5,"\\u00e9"]}')
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert sys.getrefcount(key) == before
    assert grown < 10_000, grown                  # not ~10,000 bodies' worth


def test_atomic_dicts_are_untracked_containers_holding_lists_are_not() -> None:
    v = _llmretry._json_decode(b'{"a":{"b":{"c":1}},"l":[{"d":"x"}],"e":{"f":[]}}')[0]
    assert gc.is_tracked(v) and gc.is_tracked(v["l"]) and gc.is_tracked(v["e"])
    assert not gc.is_tracked(v["a"]) and not gc.is_tracked(v["a"]["b"])
    assert not gc.is_tracked(v["l"][0])
    v["a"]["b"]["g"] = []                        # given a container: tracked again
    assert gc.is_tracked(v["a"]["b"])
    flat = _llmretry._json_decode(b'{"a":{"b":1},"c":2}')[0]
    assert not gc.is_tracked(flat)


# ---- through call_many, two engines ----------------------------------------

def test_call_many_data_is_json_loads_and_keys_are_shared(scen: Scenario) -> None:
    # Each an answer (choices: a chat body without any is no answer).
    docs = [body_with(CLOSE_KEYS, 0)[:-1] + b', "choices": [{}]}',
            body_with(CLOSE_KEYS[::-1], 50)[:-1] + b', "choices": [{}]}',
            b'{"id":"x","n":1e400,"m":-0.0,"big":' + b"9" * 40 + b',"s":"\\u00e9\\ud83d\\ude00",'
            b'"id":"last","choices":[{}],'
            b'"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}']
    kw: Dict[str, Any] = dict(base_url=scen.url, api_key=SECRET_KEY, logger=None, **FAST)
    results = []
    for _ in range(2):                          # two clients: two engines
        scen.script([{"body": d.decode()} for d in docs])
        client = llmretry.Client(**kw)
        try:
            out = client.call_many([secret_body(f"k{i}") for i in range(len(docs))], limit=1)
        finally:
            client.close()
        assert [type(r) for r in out] == [llmretry.Result] * len(docs)
        for r, d in zip(out, docs):
            same(r.data, json.loads(d))
        results.append(out)
    first = {k: k for k in results[0][0].data}
    for out in results:
        for r in out[:2]:
            for k in r.data:
                assert (k is first[k]) == SHARED_KEYS   # json's memo made new ones per body
