"""Named policies (issue 9): loading, validation, resolution order, events, CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest

import llmretry
from conftest import ROOT, SECRET_KEY, Events, Scenario, run_call, secret_body
from llmretry import cli

POLICY_DIR = ROOT / "tests" / "policies"
EXAMPLES = ROOT / "examples"
RESOLVED = json.loads((POLICY_DIR / "resolved.json").read_text(encoding="utf-8"))
BAD = json.loads((POLICY_DIR / "bad.json").read_text(encoding="utf-8"))["cases"]

# Fast retries for the tests' own policies.
QUICK = {"base_delay_ms": 10, "max_delay_ms": 50, "jitter": "none"}


def started(events: Events) -> List[Dict[str, Any]]:
    return events.of("llm_request_started")


# ---------------------------------------------------------------------------
# The shared vector and loading

@pytest.mark.parametrize("name", RESOLVED["files"])
def test_example_files_resolve_to_the_shared_vector(name: str) -> None:
    policies = llmretry.load_policies(ROOT / name)
    assert list(policies) == list(RESOLVED["resolved"])
    got = {n: p.resolved() for n, p in policies.items()}
    assert got == RESOLVED["resolved"]
    for n, p in policies.items():
        assert list(p.resolved()) == list(RESOLVED["resolved"][n])  # all 14 keys, in order
        assert p.source == str(ROOT / name)
    with llmretry.Client.from_file(ROOT / name) as c:
        assert {n: p.resolved() for n, p in c.policies.items()} == RESOLVED["resolved"]


def test_mapping_and_file_load_alike(tmp_path: Path) -> None:
    data = json.loads((EXAMPLES / "policies.json").read_text(encoding="utf-8"))
    from_dict = llmretry.load_policies(data)
    assert {n: p.resolved() for n, p in from_dict.items()} == RESOLVED["resolved"]
    assert all(p.source is None for p in from_dict.values())
    # A Client takes the result of load_policies too.
    with llmretry.Client(policies=from_dict) as c:
        assert set(c.policies) == set(data)


def _bad_id(case: Dict[str, Any]) -> str:
    return str(case["why"]).replace(" ", "_")


@pytest.mark.parametrize("case", BAD, ids=_bad_id)
def test_bad_policies_from_a_dict(case: Dict[str, Any]) -> None:
    with pytest.raises(ValueError) as info:
        llmretry.load_policies(case["text"])
    for word in case["must_contain"]:
        assert word in str(info.value), (word, str(info.value))
    with pytest.raises(ValueError):
        llmretry.Client(policies=case["text"])


@pytest.mark.parametrize("case", BAD, ids=_bad_id)
def test_bad_policies_from_a_json_file(case: Dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "mypolicies.json"
    path.write_text(json.dumps(case["text"]), encoding="utf-8")
    for load in (llmretry.load_policies, llmretry.Client.from_file):
        with pytest.raises(ValueError) as info:
            load(path)
        msg = str(info.value)
        assert "mypolicies.json" in msg
        for word in case["must_contain"]:
            assert word in msg, (word, msg)


def _toml_value(v: Any) -> str:
    return json.dumps(v)    # ints, strings, bools and arrays read alike


@pytest.mark.parametrize("case", [c for c in BAD if isinstance(list(c["text"].values())[0], dict)
                                  and list(c["text"])[0]], ids=_bad_id)
def test_bad_policies_from_a_toml_file(case: Dict[str, Any], tmp_path: Path) -> None:
    lines = []
    for name, table in case["text"].items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in table.items()]
    path = tmp_path / "mypolicies.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError) as info:
        llmretry.load_policies(path)
    msg = str(info.value)
    assert "mypolicies.toml" in msg
    for word in case["must_contain"]:
        assert word in msg, (word, msg)


def test_toml_non_table_policy_and_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("fast = 5000\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"p\.toml: policy 'fast' must be a table"):
        llmretry.load_policies(path)
    path.write_text("[fast\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"p\.toml: not valid TOML"):
        llmretry.load_policies(path)
    other = tmp_path / "p.yaml"
    other.write_text("{}", encoding="utf-8")
    with pytest.raises(ValueError, match="toml or .json"):
        llmretry.load_policies(other)
    with pytest.raises(FileNotFoundError):
        llmretry.load_policies(tmp_path / "missing.toml")
    with pytest.raises(TypeError):
        llmretry.load_policies(5)  # type: ignore[arg-type]


def test_error_message_format(tmp_path: Path) -> None:
    path = tmp_path / "policies.toml"
    path.write_text('[fast]\ntimeout_ms = "5000"\n', encoding="utf-8")
    with pytest.raises(ValueError) as info:
        llmretry.load_policies(path)
    assert str(info.value) == f"{path}: policy 'fast': timeout_ms must be an integer (got string)"


def _shared_errors() -> Dict[str, Any]:
    with open(ROOT / "tests" / "policies" / "errors.json", encoding="utf-8") as fh:
        doc: Dict[str, Any] = json.load(fh)
    return doc


@pytest.mark.parametrize("case", _shared_errors()["cases"], ids=lambda c: c["error"][:40])
def test_shared_error_text(case: Dict[str, Any], tmp_path: Path) -> None:
    """The same words as the C core and the Lua binding (tests/policies/errors.json)."""
    path = tmp_path / "p.json"
    path.write_text(json.dumps(case["text"]), encoding="utf-8")
    with pytest.raises(ValueError) as info:
        llmretry.load_policies(path)
    assert str(info.value) == f"{path}: {case['error']}"
    if isinstance(case["text"], dict):
        with pytest.raises(ValueError) as info:
            llmretry.load_policies(case["text"])
        assert str(info.value) == case["error"]
    # TOML reads into the same data, and gets the same words.
    if isinstance(case["text"], dict) and all(isinstance(v, dict) for v in case["text"].values()) \
            and not any(v is None for t in case["text"].values() for v in t.values()):
        toml = tmp_path / "p.toml"
        toml.write_text("".join(
            f"[{json.dumps(name)}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in t.items())
            for name, t in case["text"].items()), encoding="utf-8")
        with pytest.raises(ValueError) as info:
            llmretry.load_policies(toml)
        assert str(info.value) == f"{toml}: {case['error']}"


@pytest.mark.parametrize("case", _shared_errors()["accepted"], ids=lambda c: c["why"])
def test_shared_accepted(case: Dict[str, Any]) -> None:
    llmretry.load_policies(case["text"])


@pytest.mark.parametrize("settings", [
    {"max_retries": 101}, {"base_delay_ms": -1}, {"deadline_ms": -5},
    {"retry_statuses": [99]}, {"max_response_bytes": 0}, {"retry_mode": "maybe"},
    {"retry_invalid_response": 1}, {"base_url": 5}, {"model": ""},
    {"idempotency_key": True}])
def test_more_refused_values(settings: Dict[str, Any]) -> None:
    key = next(iter(settings))
    with pytest.raises(ValueError, match=f"policy 'p': {key}"):
        llmretry.load_policies({"p": settings})


# ---------------------------------------------------------------------------
# Resolution order: explicit > policy > client defaults > built-in

def test_timeout_resolution_order(scen: Scenario) -> None:
    pols = {"p": {"timeout_ms": 4000, **QUICK}, "empty": {}}
    with llmretry.Client(policies=pols, timeout_ms=3000, api_key=SECRET_KEY,
                         base_url=scen.url) as c, llmretry.Client(api_key=SECRET_KEY,
                                                                  base_url=scen.url) as bare:
        def timeout_of(client: llmretry.Client, **kw: Any) -> int:
            ev = Events()
            client.call_llm(secret_body("t"), logger=ev, **kw)
            return int(started(ev)[0]["timeout_ms"])
        assert timeout_of(c, policy="p", timeout_ms=2000) == 2000    # explicit
        assert timeout_of(c, policy="p") == 4000                     # policy
        assert timeout_of(c, policy="empty") == 3000                 # client default
        assert timeout_of(c) == 3000
        assert timeout_of(bare) == 60000                             # built-in


def test_deadline_and_retries_from_policy(scen: Scenario) -> None:
    pols = {"p": {"deadline_ms": 50000, "max_retries": 1, **QUICK}}
    with llmretry.Client(policies=pols, max_retries=4, api_key=SECRET_KEY) as c:
        out = run_call(scen, [{"status": 503}] * 6, client=c, fast=False, policy="p")
        assert isinstance(out.error, llmretry.HTTPStatusError)
        assert out.error.attempts == 2
        left = started(out.events)[0]["deadline_left_ms"]
        assert left is not None and 40000 < left <= 50000
        sub = scen.sub("explicit")
        out = run_call(sub, [{"status": 503}] * 6, client=c, fast=False, policy="p",
                       max_retries=0, deadline_ms=None)
        assert out.error is not None and out.error.attempts == 1
        assert started(out.events)[0]["deadline_left_ms"] is None
        sub = scen.sub("client")
        out = run_call(sub, [{"status": 503}] * 6, client=c, fast=False, **QUICK)
        assert out.error is not None and out.error.attempts == 5


def test_model_and_base_url_from_policy(scen: Scenario) -> None:
    other = scen.sub("other")
    pols = {"p": {"model": "policy-model", "base_url": scen.url}}
    with llmretry.Client(policies=pols, url=other.url + "/chat/completions",
                         api_key=SECRET_KEY) as c:
        body = {"messages": [{"role": "user", "content": "SECRET-PROMPT-m"}]}
        res = c.call_llm(body, policy="p", logger=None)
        assert res.meta.model == "policy-model"
        assert "model" not in body     # the caller's dict is left alone
        recs = scen.requests()
        assert len(recs) == 1 and json.loads(recs[0]["body"])["model"] == "policy-model"
        # The body's own model wins; an explicit url beats the policy's base_url.
        res = c.call_llm(dict(body, model="own"), policy="p", logger=None,
                         url=other.url + "/chat/completions")
        assert res.meta.model == "own"
        assert len(other.requests()) == 1 and len(scen.requests()) == 1
        # Without the policy the client's url is used.
        c.call_llm(body, logger=None)
        assert len(other.requests()) == 2


def test_an_explicit_base_url_replaces_a_default_url(scen: Scenario) -> None:
    """The endpoint is one setting: a layer naming url or base_url replaces
    both of the lower layer's (a client's url lost to a call's base_url only
    under a policy before; without one the client's url won)."""
    other, third = scen.sub("other"), scen.sub("third")
    pols = {"q": {"timeout_ms": 5000}, "p": {"base_url": third.url}}
    with llmretry.Client(policies=pols, url=other.url + "/chat/completions",
                         api_key=SECRET_KEY) as c:
        body = {"model": "m", "messages": []}
        c.call_llm(body, base_url=scen.url, logger=None)
        c.call_llm(body, base_url=scen.url, policy="q", logger=None)
        assert len(scen.requests()) == 2 and not other.requests()
        # A policy without an endpoint leaves the client's url.
        c.call_llm(body, policy="q", logger=None)
        assert len(other.requests()) == 1
        # A policy's base_url beats the client's url; a call's url beats it.
        c.call_llm(body, policy="p", logger=None)
        assert len(third.requests()) == 1
        c.call_llm(body, policy="p", url=scen.url + "/chat/completions", logger=None)
        assert len(scen.requests()) == 3 and len(third.requests()) == 1
        res = c.call_many([body], policy="q", base_url=third.url, logger=None)
        assert not res.errors() and len(third.requests()) == 2


def test_auto_idempotency_key(scen: Scenario) -> None:
    with llmretry.Client.from_file(EXAMPLES / "policies.toml", api_key=SECRET_KEY,
                                   base_url=scen.url, **QUICK) as c:
        scen.script([{"status": 503}, {}, {}])
        # Explicit retry_mode beats the policy's unsafe, so the 503 is retried.
        c.call_llm(secret_body("a"), policy="unsafe", retry_mode="safe", logger=None)
        c.call_llm(secret_body("b"), policy="unsafe", logger=None)
        recs = scen.requests()
        keys = [r["headers"].get("idempotency-key") for r in recs]
        assert len(keys) == 3 and all(keys)
        assert keys[0] == keys[1]           # the same key on each attempt
        assert keys[2] != keys[0]           # a new key per call
        c.call_llm(secret_body("c"), policy="unsafe", idempotency_key="mine", logger=None)
        c.call_llm(secret_body("d"), policy="autocomplete", logger=None)
        recs = scen.requests()
        assert recs[3]["headers"].get("idempotency-key") == "mine"
        assert "idempotency-key" not in recs[4]["headers"]


def test_unsafe_policy_does_not_retry(scen: Scenario) -> None:
    with llmretry.Client.from_file(EXAMPLES / "policies.json", api_key=SECRET_KEY,
                                   base_url=scen.url) as c:
        out = run_call(scen, [{"status": 503}, {}], client=c, fast=False, policy="unsafe")
        assert out.error is not None and out.error.attempts == 1
        assert out.error.reason == "unsafe_mode"


# ---------------------------------------------------------------------------
# Events, unknown names, module-level functions, batches

def test_events_carry_the_policy_name(scen: Scenario) -> None:
    with llmretry.Client(policies={"fast": QUICK}, api_key=SECRET_KEY) as c:
        out = run_call(scen, [{"status": 503}, {}], client=c, policy="fast")
        assert out.ok and len(out.events.events) >= 4
        assert {e["policy"] for e in out.events.events} == {"fast"}
        out = run_call(scen.sub("none"), [{}], client=c)
        assert {e["policy"] for e in out.events.events} == {None}


def test_unknown_policy_before_any_io(scen: Scenario) -> None:
    with llmretry.Client(policies={"fast": {}, "slow": {}}, base_url=scen.url) as c:
        ev = Events()
        with pytest.raises(ValueError) as info:
            c.call_llm(secret_body("x"), policy="nope", logger=ev)
        assert "'nope'" in str(info.value) and "fast, slow" in str(info.value)
        with pytest.raises(ValueError, match="nope"):
            c.call_many([secret_body("x")], policy="nope", logger=ev)
        with pytest.raises(ValueError, match="nope"):
            llmretry.call_llm(secret_body("x"), policy="nope", client=c, logger=ev)
        with pytest.raises(ValueError, match="nope"):
            llmretry.call_llm(secret_body("x"), policy="nope", base_url=scen.url)
        with pytest.raises(TypeError):
            c.call_llm(secret_body("x"), policy=5)  # type: ignore[arg-type]
        assert ev.events == [] and scen.requests() == []


def test_module_level_and_with_deadline(scen: Scenario) -> None:
    with llmretry.Client(policies={"p": {"timeout_ms": 4321}}, api_key=SECRET_KEY,
                         base_url=scen.url) as c:
        ev = Events()
        llmretry.call_llm(secret_body("m"), policy="p", client=c, logger=ev)
        llmretry.call_llm_with_deadline(secret_body("m"), policy="p", client=c, logger=ev)
        c.call_llm_with_deadline(secret_body("m"), 9000, policy="p", logger=ev)
        s = started(ev)
        assert [e["timeout_ms"] for e in s] == [4321] * 3
        assert s[0]["deadline_left_ms"] is None
        assert 170000 < s[1]["deadline_left_ms"] <= 180000
        assert 0 < s[2]["deadline_left_ms"] <= 9000
        assert {e["policy"] for e in ev.events} == {"p"}


def test_call_many_and_map_with_concurrency(scen: Scenario) -> None:
    pols = {"p": {"timeout_ms": 4321, "model": "pm", **QUICK}}
    with llmretry.Client(policies=pols, api_key=SECRET_KEY, base_url=scen.url) as c:
        ev = Events()
        bodies = [{"messages": [{"role": "user", "content": f"SECRET-PROMPT-{i}"}]}
                  for i in range(3)]
        out = llmretry.call_many(bodies, 2, policy="p", client=c, logger=ev)
        assert out.summary.ok == 3
        assert all(r.meta.model == "pm" for r in out)
        assert {e["timeout_ms"] for e in started(ev)} == {4321}
        assert {e["policy"] for e in ev.events if e["event"].startswith("llm_request")} == {"p"}
        assert all(json.loads(r["body"])["model"] == "pm" for r in scen.requests())
        ev2 = Events()
        res = c.map_with_concurrency(
            bodies, 2, lambda b, i: c.call_llm(b, policy="p", logger=ev2), logger=None)
        assert all(isinstance(r, llmretry.Result) for r in res)
        assert {e["policy"] for e in ev2.events} == {"p"}



def test_call_many_gives_each_item_its_own_idempotency_key(scen: Scenario) -> None:
    """Policy "auto" in a batch: one key per item, the same on its retries."""
    scen.script([{"status": 503}], after={})
    pols = {"u": {"idempotency_key": "auto", **QUICK}}
    bodies = [{"model": "m", "messages": [{"role": "user", "content": f"SECRET-PROMPT-{i}"}]}
              for i in range(4)]
    with llmretry.Client(policies=pols, api_key=SECRET_KEY, base_url=scen.url) as c:
        out = c.call_many(bodies, 2, policy="u", logger=None)
    assert out.summary.ok == 4
    recs = scen.requests()
    assert len(recs) == 5                       # one item was retried once
    by_call: Dict[str, set] = {}
    for r in recs:
        by_call.setdefault(r["headers"]["x-client-request-id"], set()).add(
            r["headers"].get("idempotency-key"))
    assert len(by_call) == 4
    keys = [next(iter(ks)) for ks in by_call.values()]
    assert all(len(ks) == 1 for ks in by_call.values()), "a retry changed its key"
    assert None not in keys and len(set(keys)) == 4, "items shared a key"


# ---------------------------------------------------------------------------
# CLI

def test_cli_policies_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for name in RESOLVED["files"]:
        assert cli.main(["policies", str(ROOT / name)]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out) == RESOLVED["resolved"] and err == ""
    bad = tmp_path / "bad.toml"
    bad.write_text("[fast]\ntimeout = 5\n", encoding="utf-8")
    assert cli.main(["policies", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "bad.toml" in err and "fast" in err and "timeout" in err
    assert cli.main(["policies", str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr()[1]


def test_cli_call_with_policy(scen: Scenario, capsys: pytest.CaptureFixture[str],
                              tmp_path: Path) -> None:
    pols = tmp_path / "p.json"
    pols.write_text(json.dumps({"p": {"timeout_ms": 4321, "max_retries": 0}}),
                    encoding="utf-8")
    events = tmp_path / "events.jsonl"
    scen.script([{"status": 503}, {}])
    code = cli.main(["call", "SECRET-PROMPT-cli", "--model", "m", "--base-url", scen.url,
                     "--policies", str(pols), "--policy", "p", "--events", str(events)])
    assert code == 1
    evs = [json.loads(line) for line in events.read_text(encoding="utf-8").splitlines()]
    assert {e["policy"] for e in evs} == {"p"}
    assert [e["timeout_ms"] for e in evs if e["event"] == "llm_request_started"] == [4321]
    capsys.readouterr()
    # A flag beats the policy.
    code = cli.main(["call", "SECRET-PROMPT-cli", "--model", "m", "--base-url", scen.url,
                     "--policies", str(pols), "--policy", "p", "--timeout-ms", "3333",
                     "--events", str(events)])
    assert code == 0
    evs = [json.loads(line) for line in events.read_text(encoding="utf-8").splitlines()]
    assert evs[-2]["timeout_ms"] == 3333 and evs[-2]["event"] == "llm_request_started"
    capsys.readouterr()
    assert cli.main(["call", "x", "--model", "m", "--policy", "p"]) == 2
    assert "--policies" in capsys.readouterr()[1]
    assert cli.main(["call", "x", "--model", "m", "--policies", str(pols),
                     "--policy", "zzz"]) == 2
    assert "zzz" in capsys.readouterr()[1]
    assert len(scen.requests()) == 2


def test_cli_batch_with_policy(scen: Scenario, capsys: pytest.CaptureFixture[str],
                               tmp_path: Path) -> None:
    req = tmp_path / "req.jsonl"
    req.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]})
                             for i in range(3)) + "\n", encoding="utf-8")
    events = tmp_path / "events.jsonl"
    res = tmp_path / "res.jsonl"
    code = cli.main(["batch", str(req), "-o", str(res), "--base-url", scen.url,
                     "--policies", str(EXAMPLES / "policies.toml"),
                     "--policy", "autocomplete", "--events", str(events)])
    assert code == 0, capsys.readouterr()
    evs = [json.loads(line) for line in events.read_text(encoding="utf-8").splitlines()]
    started_evs = [e for e in evs if e["event"] == "llm_request_started"]
    assert len(started_evs) == 3 and {e["timeout_ms"] for e in started_evs} == {5000}
    assert {e["policy"] for e in evs if e["event"].startswith("llm_request")} == {"autocomplete"}
    assert [r["ok"] for r in (json.loads(x) for x in res.read_text().splitlines())] == [True] * 3
    # The unsafe policy: each request its own Idempotency-Key.
    seen = len(scen.requests())
    code = cli.main(["batch", str(req), "-o", str(res), "--base-url", scen.url,
                     "--policies", str(EXAMPLES / "policies.toml"), "--policy", "unsafe"])
    assert code == 0, capsys.readouterr()
    keys = [r["headers"].get("idempotency-key") for r in scen.requests()[seen:]]
    assert len(keys) == 3 and None not in keys and len(set(keys)) == 3
