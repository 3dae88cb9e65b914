"""Arguments that teach (issue 32 item 5): the mistakes a newcomer makes with
call_llm are told what to do instead, before any I/O; whole floats are
accepted for integer options; help() shows the core's real defaults."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import pydoc
import re
from typing import Any, Callable, Dict

import pytest

import llmretry
from llmretry import batch_api
from conftest import FAST, ROOT, SECRET_KEY, Scenario, secret_body
from llmretry import _llmretry


def opts(scen: Scenario, **kw: Any) -> Dict[str, Any]:
    o: Dict[str, Any] = dict(FAST, base_url=scen.url, api_key=SECRET_KEY, logger=None)
    o.update(kw)
    return o


MISSING_BODY: Dict[str, Callable[[Dict[str, Any]], Any]] = {
    "call_llm": lambda kw: llmretry.call_llm(**kw),
    "call_llm_with_deadline": lambda kw: llmretry.call_llm_with_deadline(**kw),
    "stream_llm": lambda kw: llmretry.stream_llm(**kw),
    "astream_llm": lambda kw: llmretry.astream_llm(**kw),
    "acall_llm": lambda kw: asyncio.run(llmretry.acall_llm(**kw)),
}


@pytest.mark.parametrize("fn", sorted(MISSING_BODY))
def test_body_fields_as_keywords_say_to_pass_a_dict(scen: Scenario, fn: str) -> None:
    kw = dict(model="gpt-4.1-mini", messages=[{"role": "user", "content": "SECRET-PROMPT"}],
              base_url=scen.url, api_key=SECRET_KEY)
    with pytest.raises(TypeError) as info:
        MISSING_BODY[fn](kw)
    text = str(info.value)
    assert text.startswith(f"{fn}() needs the request body"), text
    assert "messages, model go in the request body: pass the body as a dict" in text
    assert '{"model": ' in text           # an example of the dict
    assert "SECRET" not in text           # never the prompt or the key
    assert scen.requests() == []


def test_no_body_at_all_shows_one(scen: Scenario) -> None:
    with pytest.raises(TypeError, match=r'call_llm\(\) needs the request body as its first '
                                        r'argument, a dict such as \{"model": '):
        llmretry.call_llm(base_url=scen.url)  # type: ignore[call-arg]


def test_body_field_beside_a_body_names_it(scen: Scenario) -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\): temperature; "
                                        r"temperature goes in the request body"):
        llmretry.call_llm(secret_body("t"), temperature=0.2, **opts(scen))  # type: ignore
    assert scen.requests() == []


@pytest.mark.parametrize("given, meant", [
    ("timeout", "timeout_ms"), ("deadline", "deadline_ms"), ("max_retry", "max_retries"),
    ("maxRetries", "max_retries"), ("retries", "max_retries"), ("loger", "logger"),
    ("responseModel", "response_model"), ("delay", None), ("colour", None)])
def test_a_misspelt_keyword_says_what_was_meant(scen: Scenario, given: str,
                                                meant: Any) -> None:
    """The core's rule (llmretry_option_suggest) over Python's keywords: a
    unit left off, another library's spelling, a typo; nothing when it is
    not clear (delay: base_delay_ms or max_delay_ms)."""
    said = f"{given} (did you mean {meant}?)" if meant else given
    for call in (lambda: llmretry.call_llm(secret_body("m"), **opts(scen), **{given: 1}),
                 lambda: llmretry.call_many([secret_body("m")], **opts(scen), **{given: 1}),
                 lambda: llmretry.Client(**{given: 1})):
        with pytest.raises(TypeError) as info:
            call()
        assert str(info.value).endswith(f"got unexpected keyword argument(s): {said}"), \
            str(info.value)
    assert scen.requests() == []


@pytest.mark.parametrize("call, given, meant", [
    (lambda kw: llmretry.Client(**kw), "max_inflight", "max_in_flight"),
    (lambda kw: llmretry.Client(**kw), "ioLoop", "io_loop"),
    (lambda kw: llmretry.call_many([{"model": "m"}], **kw), "limt", "limit"),
    (lambda kw: llmretry.call_many([{"model": "m"}], **kw), "failure_path", "failures_path"),
    (lambda kw: llmretry.call_many([{"model": "m"}], **kw), "keepResults", "keep_results"),
    (lambda kw: batch_api.run([{"model": "m"}], **kw), "poll_interval", "poll_interval_ms"),
    (lambda kw: batch_api.run([{"model": "m"}], **kw), "keep_file", "keep_files"),
])
def test_a_misspelt_keyword_of_the_function_itself_is_suggested(call: Any, given: str,
                                                                meant: str) -> None:
    """Not only the call options: a function's own keywords (Client's
    max_in_flight, call_many's limit, the Batch API's poll_interval_ms)
    get the same "did you mean", before any I/O."""
    with pytest.raises(TypeError) as info:
        call({given: 1})
    assert f"{given} (did you mean {meant}?)" in str(info.value), str(info.value)


@pytest.mark.parametrize("body", ["hello", "  SECRET-PROMPT tell me a joke", b"hello",
                                  bytearray(b"42"), "null", '"a JSON string"', ""])
def test_text_that_is_not_an_object_says_what_a_body_is(scen: Scenario, body: Any) -> None:
    with pytest.raises(ValueError) as info:
        llmretry.call_llm(body, **opts(scen))
    text = str(info.value)
    assert text.startswith("body must be a dict or the JSON text of an object, such as "
                           '{"model": '), text
    assert "SECRET" not in text and "hello" not in text   # the text may be the prompt
    with pytest.raises(ValueError, match=r"^bodies\[1\]: body must be a dict or the JSON"):
        llmretry.call_many([secret_body("a"), body], **opts(scen))
    assert scen.requests() == []


def test_object_text_is_still_sent_as_is(scen: Scenario) -> None:
    text = ' \n' + json.dumps(secret_body("txt"))
    for body in (text, text.encode()):
        assert llmretry.call_llm(body, **opts(scen)).meta.status == 200
    assert [r["body"] for r in scen.requests()] == [text, text]


def test_whole_floats_are_accepted_for_integer_options(scen: Scenario) -> None:
    scen.script([{"status": 503}, {}])
    res = llmretry.call_llm(secret_body("f"), **opts(scen, timeout_ms=0.5 * 10000,
                                                      max_retries=1.0, base_delay_ms=20.0,
                                                      deadline_ms=3e4))
    assert res.meta.attempts == 2
    with llmretry.Client(**opts(scen, timeout_ms=5000.0)) as client:
        assert client.call_llm(secret_body("g")).meta.status == 200
    out = llmretry.call_many([secret_body("h")], deadline_ms=30000.0, call_deadline_ms=1e4,
                             **opts(scen))
    assert out.summary.ok == 1


@pytest.mark.parametrize("name,value", [("timeout_ms", 0.3 * 1001), ("max_retries", 2.5),
                                        ("deadline_ms", 1.5), ("rpm", float("nan")),
                                        ("breaker_failures", float("inf"))])
def test_fractional_floats_raise_naming_the_option(scen: Scenario, name: str,
                                                   value: float) -> None:
    with pytest.raises(TypeError, match=rf"^{name} must be a whole number"):
        llmretry.call_llm(secret_body("x"), **opts(scen, **{name: value}))
    with pytest.raises(TypeError, match=rf"^{name} must be a whole number"):
        llmretry.Client(**{name: value})
    assert scen.requests() == []


def test_help_shows_the_cores_defaults() -> None:
    """Every call keyword with a built-in default is shown in call_llm's
    help as ``name=value``, the value the core's option table holds."""
    text = pydoc.render_doc(llmretry.call_llm, renderer=pydoc.plaintext)
    assert "**options: 'Unpack[CallOptions]'" in text      # the real signature
    keywords = set(llmretry.CallOptions.__annotations__)
    shown = 0
    for opt in _llmretry.describe()["options"]:
        default = json.loads(opt["builtin"])
        if opt["name"] not in keywords or default is None:
            continue
        as_python = repr(default) if not isinstance(default, str) else f'"{default}"'
        assert f"``{opt['name']}={as_python}``" in text, (opt["name"], as_python)
        shown += 1
    assert shown >= 15
    assert re.search(r"``max_retries=3``", text)
    # And no value written in the prose differs from the core's (a copy
    # that drifted).
    builtin = {o["name"]: json.loads(o["builtin"]) for o in _llmretry.describe()["options"]}
    for name, value in re.findall(r"``(\w+)=([^`]*)``", text):
        if builtin.get(name) is not None:
            want = builtin[name]
            assert value == (f'"{want}"' if isinstance(want, str) else repr(want)), name


def test_an_option_the_prose_does_not_show_gets_its_default_from_the_table() -> None:
    """A row added to the core's table needs no edit of call_llm's
    docstring: tools/gen_surface.py lists a keyword it does not show as
    ``name=value``, with the table's default, before the example (and
    tests/python/test_generated.py checks the committed docstring is what
    it writes)."""
    spec = importlib.util.spec_from_file_location("gen_surface",
                                                  ROOT / "tools" / "gen_surface.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    tables = _llmretry.describe()
    # The source's docstring, indented (Python 3.13's __doc__ is dedented).
    doc = gen.call_llm_docstring((ROOT / "python" / "llmretry" / "_api.py")
                                 .read_text(encoding="utf-8")).group(1)
    assert "``max_retries=3``" in doc
    prose = doc.replace("``max_retries=3``", "three retries")
    out = gen.call_defaults(prose, tables)
    assert out is not None
    listed, example = out.split("    Example::")
    assert "``max_retries=3``" in listed.split("Built-in defaults of the other keywords:")[1]
    assert "``timeout_ms=60000``" not in listed.split("Built-in defaults")[1]  # shown already
    assert gen.call_defaults(doc, tables) == doc        # nothing to add today
    assert gen.call_defaults(out, tables) == out        # and a listed one stays listed once
