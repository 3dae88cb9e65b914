"""``llmretry call`` takes what the openai CLI takes (issue 32 item 3):
-m/--model, -t/--temperature, -M/--max-tokens, repeated -g ROLE CONTENT,
--body-json for any body; and ``--endpoint``/``--url`` on call and batch
(item 2), an embeddings batch's tokens in its summary."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import pytest

from conftest import Scenario
from llmretry import cli

FAST = ["--base-delay-ms", "10", "--max-delay-ms", "50", "--jitter", "none",
        "--timeout-ms", "5000"]


def run(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> Tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def sent(scen: Scenario) -> List[Dict[str, Any]]:
    return [json.loads(r["body"]) for r in scen.requests()]


def test_openai_cli_flags_make_the_body(scen: Scenario,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    scen.script([{"content": "Hi!"}])
    code, out, err = run(["call", "-m", "m1", "-g", "system", "Be brief",
                          "-g", "user", "SECRET-PROMPT-1", "-g", "assistant", "Yes?",
                          "-t", "0.5", "-M", "20", "SECRET-PROMPT-2",
                          "--base-url", scen.url, *FAST], capsys)
    assert (code, out) == (0, "Hi!\n"), err
    assert sent(scen) == [{"model": "m1", "temperature": 0.5, "max_tokens": 20, "messages": [
        {"role": "system", "content": "Be brief"},
        {"role": "user", "content": "SECRET-PROMPT-1"},
        {"role": "assistant", "content": "Yes?"},
        {"role": "user", "content": "SECRET-PROMPT-2"}]}]
    # The long names too, and -g alone (no prompt).
    code, _, _ = run(["call", "--model", "m2", "--message", "user", "x", "--temperature", "0",
                      "--max-tokens", "3", "--base-url", scen.url, *FAST], capsys)
    assert code == 0 and sent(scen)[-1] == {"model": "m2", "temperature": 0.0, "max_tokens": 3,
                                            "messages": [{"role": "user", "content": "x"}]}


def test_body_json_is_any_body(scen: Scenario, capsys: pytest.CaptureFixture[str]) -> None:
    body = {"model": "own", "messages": [{"role": "user", "content": "SECRET-PROMPT-b"}],
            "seed": 7, "response_format": {"type": "json_object"}}
    code, out, _ = run(["call", "--body-json", json.dumps(body), "--base-url", scen.url,
                        *FAST], capsys)
    assert (code, out) == (0, "ok\n") and sent(scen) == [body]
    # -m, -t and -M set its fields.
    code, _, _ = run(["call", "--body-json", json.dumps(body), "-m", "m3", "-t", "1",
                      "-M", "9", "--base-url", scen.url, *FAST], capsys)
    assert code == 0 and sent(scen)[-1] == dict(body, model="m3", temperature=1.0, max_tokens=9)


@pytest.mark.parametrize("argv, says", [
    (["call", "hi"], "-m/--model is required"),
    (["call", "-m", "m"], "nothing to send"),
    (["call", "--body-json", "[1]", "-m", "m"], "--body-json: a request must be a JSON object"),
    (["call", "--body-json", "{", "-m", "m"], "--body-json: not JSON"),
    (["call", "--body-json", "{}", "-m", "m", "SECRET-PROMPT-x"], "--body-json is the whole"),
    (["call", "-m", "m", "-g", "system", "s", "x", "--endpoint", "embeddings"],
     "--endpoint embeddings takes a prompt alone"),
    (["call", "-m", "m", "x", "--endpoint", "embedding"], "endpoint must be one of"),
])
def test_call_usage_errors(scen: Scenario, capsys: pytest.CaptureFixture[str],
                           argv: List[str], says: str) -> None:
    code, out, err = run([*argv, "--base-url", scen.url], capsys)
    assert code == 2 and out == "" and says in err
    assert "SECRET-PROMPT" not in err
    assert scen.requests() == []


def test_model_help_text(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["call", "--help"])
    out = capsys.readouterr().out
    # argparse's own form: "-m MODEL, --model MODEL", "-m, --model MODEL" since 3.13.
    assert re.search(r"-m( MODEL)?, --model MODEL", out) and "the model to call" in out


def test_call_per_endpoint(scen: Scenario, capsys: pytest.CaptureFixture[str]) -> None:
    base = f"/s/{scen.name}/v1"
    scen.script([{"content": "R!"}, {"content": "C!"}, {}, {}])
    code, out, _ = run(["call", "-m", "r", "-M", "5", "SECRET-PROMPT-r", "--endpoint",
                        "responses", "--base-url", scen.url, *FAST], capsys)
    assert (code, out) == (0, "R!\n")
    code, out, _ = run(["call", "-m", "c", "SECRET-PROMPT-c", "--endpoint", "completions",
                        "--base-url", scen.url, *FAST], capsys)
    assert (code, out) == (0, "C!\n")
    # Embeddings have no text: the whole response is printed.
    code, out, _ = run(["call", "-m", "e", "SECRET-PROMPT-e", "--endpoint", "embeddings",
                        "--base-url", scen.url, *FAST], capsys)
    assert code == 0 and json.loads(out)["data"][0]["embedding"] == [0.0, 0.25, -0.5]
    # --url wins over --base-url and --endpoint.
    code, out, _ = run(["call", "-m", "e", "x", "--endpoint", "responses", "--url",
                        scen.url + "/embeddings", "--base-url", "http://127.0.0.1:9/v1",
                        *FAST], capsys)
    assert code == 0 and json.loads(out)["object"] == "list"
    assert [r["path"] for r in scen.requests()] == [
        base + "/responses", base + "/completions", base + "/embeddings", base + "/embeddings"]
    assert sent(scen)[:3] == [{"input": "SECRET-PROMPT-r", "model": "r", "max_output_tokens": 5},
                              {"prompt": "SECRET-PROMPT-c", "model": "c"},
                              {"input": "SECRET-PROMPT-e", "model": "e"}]


def test_an_embeddings_batch(scen: Scenario, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    """batch --endpoint embeddings: every line to /embeddings, the prompt
    tokens (and no completion tokens) in the summary."""
    req, res = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    req.write_text("".join(json.dumps({"input": [f"SECRET-PROMPT-{i}", "b"]}) + "\n"
                           for i in range(5)), encoding="utf-8")
    code, _, err = run(["batch", str(req), "-o", str(res), "--model", "text-embedding-3-small",
                        "--endpoint", "embeddings", "--base-url", scen.url, *FAST], capsys)
    assert code == 0, err
    lines = [json.loads(line) for line in res.read_text(encoding="utf-8").splitlines()]
    assert [line["index"] for line in lines] == list(range(5))
    assert all(len(line["data"]["data"]) == 2 for line in lines)
    assert {r["path"] for r in scen.requests()} == {f"/s/{scen.name}/v1/embeddings"}
    assert "tokens: 40 prompt + 0 completion" in err
    # --url, the same.
    other = scen.sub("url")
    code, _, err = run(["batch", str(req), "-o", str(res), "--model", "e",
                        "--url", other.url + "/embeddings", *FAST], capsys)
    assert code == 0 and len(other.requests()) == 5


RF = {"type": "json_schema", "json_schema": {
    "name": "n", "strict": True,
    "schema": {"type": "object", "properties": {"n": {"type": "integer"}},
               "required": ["n"], "additionalProperties": False}}}


def test_batch_response_format(scen: Scenario, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    """batch --response-format FILE (issue 31 item 6): the object goes into
    each body that has none, the answers are held to its schema and a
    mismatch fails (after its retry) with its validation errors; a body's own
    response_format is kept."""
    req, res, fail = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "failed.jsonl"
    own = {"type": "json_object"}
    req.write_text(json.dumps({"messages": [{"role": "user", "content": "SECRET-PROMPT-0"}]})
                   + "\n" + json.dumps({"messages": [], "response_format": own}) + "\n",
                   encoding="utf-8")
    rf = tmp_path / "format.json"
    rf.write_text(json.dumps(RF), encoding="utf-8")
    scen.script([], after={"content": '{"n": "one"}'})
    code, _, err = run(["batch", str(req), "-o", str(res), "--failures", str(fail),
                        "--model", "m", "--response-format", str(rf), "--max-retries", "1",
                        "--limit", "1", "--base-url", scen.url, "--no-progress", *FAST], capsys)
    assert code == 1, err
    lines = [json.loads(line) for line in res.read_text(encoding="utf-8").splitlines()]
    want = [{"path": "$.n", "message": "expected integer"}]
    assert lines[0]["error"]["kind"] == "invalid_response"
    assert lines[0]["error"]["validation_errors"] == want
    assert json.loads(fail.read_text())["error"]["validation_errors"] == want
    assert lines[1]["ok"] is True          # json_object: JSON, no schema to match
    bodies = sent(scen)
    assert [b["response_format"] for b in bodies] == [RF, RF, own]
    assert "SECRET-PROMPT" not in err


def test_batch_response_format_for_responses(scen: Scenario, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """With --endpoint responses the format is the body's text.format, the
    json_schema object flattened as that API names it, and held to it too."""
    req, res = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    req.write_text(json.dumps({"input": "SECRET-PROMPT-r"}) + "\n", encoding="utf-8")
    rf = tmp_path / "format.json"
    rf.write_text(json.dumps(RF), encoding="utf-8")
    scen.script([{"content": '{"n": "x"}'}, {"content": '{"n": 2}'}])
    code, _, err = run(["batch", str(req), "-o", str(res), "--model", "m", "--endpoint",
                        "responses", "--response-format", str(rf), "--base-url", scen.url,
                        "--no-progress", *FAST], capsys)
    assert code == 0, err
    assert json.loads(res.read_text(encoding="utf-8"))["meta"]["attempts"] == 2
    assert sent(scen)[0]["text"] == {"format": {"type": "json_schema", "name": "n",
                                                "strict": True,
                                                "schema": RF["json_schema"]["schema"]}}


@pytest.mark.parametrize("text, says", [
    ('{"type": "json_schema", "json_schema": {"schema": {"oneOf": []}}}',
     "unsupported keyword 'oneOf' at $"),
    ('[1]', 'a response_format object with a "type"'),
    ('{"type": "json_schema"}', "needs json_schema.schema"),
    ('{', "not JSON"),
])
def test_batch_response_format_usage_errors(scen: Scenario, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str],
                                            text: str, says: str) -> None:
    req, rf = tmp_path / "in.jsonl", tmp_path / "format.json"
    req.write_text('{"messages": []}\n', encoding="utf-8")
    rf.write_text(text, encoding="utf-8")
    code, _, err = run(["batch", str(req), "-o", str(tmp_path / "o"), "--model", "m",
                        "--response-format", str(rf), "--base-url", scen.url], capsys)
    assert code == 2 and says in err, err
    code, _, err = run(["batch", str(req), "-o", str(tmp_path / "o"), "--model", "m",
                        "--response-format", str(tmp_path / "nope.json")], capsys)
    assert code == 2 and "--response-format: cannot read" in err
    assert scen.requests() == []
