"""Fallbacks, retry budgets and circuit breakers (issue 19, docs/reliability.md)
through the Python surface: the rules live in the core (tests/c/test_health.c
has the same cases); here each is shown to reach Python users intact: the
options, the error class and its fields, meta.target, the events, and
Client.endpoint_stats(); and that they hold across call_llm, call_many,
map_with_concurrency and asyncio on one client."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Dict, List

import pytest

import llmretry
from conftest import FAST, SECRET_KEY

BODY = {"model": "gpt-test", "messages": [{"role": "user", "content": "SECRET-PROMPT-health"}]}
DEAD = {"status": 503}


def stats_of(client: llmretry.Client, scen: Any) -> Dict[str, Any]:
    mine = [s for s in client.endpoint_stats() if f"/s/{scen.name}/" in s["url"]]
    assert len(mine) == 1, client.endpoint_stats()
    return mine[0]


@pytest.fixture
def hclient() -> Any:
    c = llmretry.Client(api_key=SECRET_KEY, logger=None, **FAST)
    yield c
    c.close()


def test_retry_budget_bounds_a_storm_from_a_batch(hclient: Any, scen: Any) -> None:
    """60 items against a dead endpoint, max_retries 3: 240 requests without
    the budget; with the default (0.2 x requests + 10) at most 82."""
    scen.script([], after=DEAD)
    out = hclient.call_many([BODY] * 60, limit=60, base_url=scen.url, adaptive=False)
    assert out.summary.failed == 60
    n = len(scen.requests())
    assert 70 <= n <= 82, n
    reasons = [e.reason for _, e in out.errors()]
    assert reasons.count("retry_budget_exhausted") >= 50, reasons
    s = stats_of(hclient, scen)
    assert (s["requests"], s["retries"]) == (60, n - 60)
    assert s["retries_refused"] == reasons.count("retry_budget_exhausted")
    assert s["has_key"] is True and SECRET_KEY not in json.dumps(s)


def test_the_budget_is_shared_by_threads_and_loops(scen: Any) -> None:
    """A pool of call_llm workers and an event loop spend one budget."""
    scen.script([], after=DEAD)
    client = llmretry.Client(api_key=SECRET_KEY, logger=None, base_url=scen.url,
                             retry_budget_min=4, retry_budget_ratio=0.0, **FAST)
    try:
        def worker(_: Any, __: int) -> Any:
            return client.call_llm(BODY)

        client.map_with_concurrency(range(10), 10, worker, return_exceptions=True)

        async def loop() -> List[Any]:
            return await asyncio.gather(*(client.acall_llm(BODY) for _ in range(10)),
                                        return_exceptions=True)

        errs = asyncio.run(loop())
        assert all(isinstance(e, llmretry.HTTPStatusError) for e in errs)
        assert len(scen.requests()) == 20 + 4      # one budget of 4 retries for both
        assert stats_of(client, scen)["retries"] == 4
    finally:
        client.close()


def test_retry_budget_exhausted_error(scen: Any) -> None:
    scen.script([], after=DEAD)
    with llmretry.Client(api_key=SECRET_KEY, logger=None, **FAST) as client:
        with pytest.raises(llmretry.HTTPStatusError) as info:
            client.call_llm(BODY, base_url=scen.url, retry_budget_min=0, retry_budget_ratio=0)
    err = info.value
    assert (err.reason, err.attempts, err.status) == ("retry_budget_exhausted", 1, 503)
    assert "retry budget" in err.message
    assert err.target == 0 and err.targets is None


def test_breaker_opens_fails_fast_probes_and_closes(scen: Any) -> None:
    scen.script([DEAD, DEAD, DEAD])
    events: List[Dict[str, Any]] = []
    opts: Dict[str, Any] = dict(base_url=scen.url, max_retries=0, breaker_failures=3,
                                breaker_cooldown_ms=300)
    with llmretry.Client(api_key=SECRET_KEY, logger=events.append, **FAST) as client:
        for _ in range(3):
            with pytest.raises(llmretry.HTTPStatusError):
                client.call_llm(BODY, **opts)
        assert stats_of(client, scen)["breaker"] == "open"
        t0 = time.monotonic()
        with pytest.raises(llmretry.CircuitOpenError) as info:
            client.call_llm(BODY, **opts)
        assert time.monotonic() - t0 < 0.2
        err = info.value
        assert (err.kind, err.reason, err.attempts) == ("circuit_open", "circuit_open", 0)
        assert "circuit open after 3 consecutive failures" in str(err)
        assert len(scen.requests()) == 3                # nothing sent while open
        gave_up = [e for e in events if e["event"] == "llm_request_gave_up"][-1]
        assert gave_up["error_kind"] == "circuit_open" and gave_up["attempts"] == 0
        time.sleep(0.35)    # the client's own cooldown: real time must pass
        data, meta = client.call_llm(BODY, **opts)      # the probe: the script is over
        assert meta.attempts == 1
        s = stats_of(client, scen)
        assert (s["breaker"], s["breaker_opened"], s["short_circuited"]) == ("closed", 1, 1)


def test_the_breaker_is_off_by_default(hclient: Any, scen: Any) -> None:
    scen.script([DEAD] * 12)
    for _ in range(6):
        with pytest.raises(llmretry.HTTPStatusError):
            hclient.call_llm(BODY, base_url=scen.url, max_retries=1)
    assert len(scen.requests()) == 12
    assert stats_of(hclient, scen)["breaker"] == "closed"


def test_fallback_to_another_endpoint(scen: Any) -> None:
    backup = scen.sub("backup")
    scen.script([], after=DEAD)
    events: List[Dict[str, Any]] = []
    with llmretry.Client(api_key=SECRET_KEY, logger=events.append, **FAST) as client:
        data, meta = client.call_llm(
            BODY, base_url=scen.url, max_retries=1,
            fallbacks=[{"model": "backup-model", "base_url": backup.url,
                        "headers": {"X-Backup": "yes"}}])
    assert (meta.target, meta.attempts, meta.model) == (1, 3, "backup-model")
    assert data["model"] == "backup-model"
    [rec] = backup.requests()
    assert json.loads(rec["body"])["model"] == "backup-model"
    assert rec["headers"].get("x-backup") == "yes"
    assert "authorization" not in rec["headers"]        # the primary's key stays home
    fb = [e for e in events if e["event"] == "llm_retry_scheduled"][-1]
    assert (fb["delay_source"], fb["target"], fb["model"], fb["delay_ms"]) == \
        ("fallback", 1, "backup-model", 0)
    assert all("target" in e for e in events)
    assert SECRET_KEY not in json.dumps(events) and "SECRET-PROMPT" not in json.dumps(events)


def test_fallback_key_from_the_environment(scen: Any, monkeypatch: Any) -> None:
    backup = scen.sub("backup")
    scen.script([DEAD])
    monkeypatch.setenv("BACKUP_KEY", "sk-backup-SECRET")
    with llmretry.Client(api_key=SECRET_KEY, logger=None, **FAST) as client:
        _, meta = client.call_llm(BODY, base_url=scen.url, max_retries=0,
                                  fallbacks=[{"base_url": backup.url,
                                              "api_key_env": "BACKUP_KEY"}])
    assert meta.target == 1
    assert backup.requests()[0]["headers"]["authorization"] == "Bearer sk-backup-SECRET"


def test_every_target_failing_lists_them(scen: Any) -> None:
    backup = scen.sub("backup")
    scen.script([], after=DEAD)
    backup.script([], after={"status": 504})
    with llmretry.Client(api_key=SECRET_KEY, logger=None, **FAST) as client:
        with pytest.raises(llmretry.HTTPStatusError) as info:
            client.call_llm(BODY, base_url=scen.url, max_retries=1,
                            fallbacks=[{"model": "m2", "base_url": backup.url}])
    err = info.value
    assert (err.status, err.target, err.attempts) == (504, 1, 4)
    assert "on 2 targets" in err.message
    assert err.targets == [
        {"model": "gpt-test", "attempts": 2, "status": 503, "kind": "http_status",
         "reason": "retries_exhausted"},
        {"model": "m2", "attempts": 2, "status": 504, "kind": "http_status",
         "reason": "retries_exhausted"}]
    assert err.as_dict()["targets"] == err.targets


def test_no_fallback_after_a_400(scen: Any) -> None:
    backup = scen.sub("backup")
    scen.script([{"status": 400}])
    with llmretry.Client(api_key=SECRET_KEY, logger=None, **FAST) as client:
        with pytest.raises(llmretry.HTTPStatusError) as info:
            client.call_llm(BODY, base_url=scen.url, fallbacks=[{"base_url": backup.url}])
    assert info.value.status == 400 and info.value.target == 0
    assert backup.requests() == []


def test_fallback_within_the_deadline(scen: Any) -> None:
    """The primary hangs past its timeout; the fallback gets what is left of
    the deadline, and a deadline spent on the primary tries no fallback."""
    backup = scen.sub("backup")
    scen.script([], after={"delay_ms": 2000})
    with llmretry.Client(api_key=SECRET_KEY, logger=None, **FAST) as client:
        _, meta = client.call_llm(BODY, base_url=scen.url, timeout_ms=200, max_retries=0,
                                  deadline_ms=3000, fallbacks=[{"base_url": backup.url}])
        assert meta.target == 1 and meta.total_ms < 1500
        with pytest.raises(llmretry.DeadlineExceededError):
            client.call_llm(BODY, base_url=scen.url, timeout_ms=2000, max_retries=0,
                            deadline_ms=300, fallbacks=[{"base_url": backup.url}])
    assert len(backup.requests()) == 1


def test_fallbacks_in_a_batch_and_on_a_loop(scen: Any) -> None:
    backup = scen.sub("backup")
    scen.script([], after=DEAD)
    fallbacks = [{"model": "b", "base_url": backup.url}]
    with llmretry.Client(api_key=SECRET_KEY, logger=None, max_retries=0,
                         fallbacks=fallbacks, base_url=scen.url) as client:
        out = client.call_many([BODY] * 8, limit=4)
        assert out.summary.ok == 8
        assert {r.meta.target for r in out} == {1}

        async def loop() -> Any:
            return await client.acall_llm(BODY)

        assert asyncio.run(loop()).meta.target == 1
    assert len(backup.requests()) == 9


@pytest.mark.parametrize("value, error, match", [
    ({"model": "x"}, TypeError, "must be a list of dicts"),
    ("[]", TypeError, "must be a list of dicts"),
    ([1], TypeError, r"fallbacks\[0\] must be a dict"),
    ([{"model": 3}], TypeError, r"fallbacks\[0\].model must be a str"),
    ([{"modle": "x"}], ValueError, r"fallbacks\[0\]: unknown key 'modle'"),
    ([{"base_url": "ftp://x"}], ValueError, "must start with http:// or https://"),
    ([{"api_key": "sk-SECRET-X"}], ValueError, "needs the target's own url"),
    ([{"base_url": "http://x", "headers": {"Host": "h"}}], ValueError, "must not set Host"),
    ([{}] * 9, ValueError, "at most 8 targets"),
])
def test_bad_fallbacks_raise_naming_the_field(value: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match) as info:
        llmretry.Client(fallbacks=value, base_url="http://127.0.0.1:9").call_llm(BODY)
    assert "sk-SECRET" not in str(info.value)


def test_bad_health_options_raise() -> None:
    c = llmretry.Client(base_url="http://127.0.0.1:9")
    with pytest.raises(ValueError, match=r"retry_budget_ratio must be >= 0 \(got -0.5\)"):
        c.call_llm(BODY, retry_budget_ratio=-0.5)
    with pytest.raises(TypeError, match="retry_budget_ratio must be a number"):
        c.call_llm(BODY, retry_budget_ratio="0.1")
    with pytest.raises(ValueError, match="breaker_cooldown_ms must be > 0"):
        c.call_llm(BODY, breaker_cooldown_ms=0)
    with pytest.raises(ValueError, match="breaker_failures must be >= 0"):
        c.call_llm(BODY, breaker_failures=-1)
    c.close()


def test_policies_carry_fallbacks_without_secrets(scen: Any) -> None:
    backup = scen.sub("backup")
    scen.script([DEAD])
    policies = {"resilient": {"max_retries": 0, "breaker_failures": 5,
                              "fallbacks": [{"model": "b", "base_url": backup.url,
                                             "api_key_env": "NOPE_UNSET"}]}}
    with llmretry.Client(api_key=SECRET_KEY, logger=None, base_url=scen.url,
                         policies=policies, **FAST) as client:
        _, meta = client.call_llm(BODY, policy="resilient")
    assert meta.target == 1
    with pytest.raises(ValueError, match="api_key cannot be in a policy"):
        llmretry.Client(policies={"p": {"fallbacks": [{"base_url": "http://x",
                                                       "api_key": "sk-SECRET-Y"}]}})


def test_cli_fallback_and_breaker_flags(scen: Any, tmp_path: Any) -> None:
    """llmretry batch --fallback-model/--fallback-base-url: a dead primary's
    items are answered by the backup (no primary key sent there); the
    breaker flags open the primary's breaker so most items never reach it."""
    from test_cli import read_results, run_module, write_requests
    backup = scen.sub("backup")
    scen.script([], after=DEAD)
    req, res = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    write_requests(req, 10)
    p = run_module(["batch", str(req), "-o", str(res), "--limit", "1", "--no-progress",
                    "--base-url", scen.url, "--max-retries", "0", "--base-delay-ms", "10",
                    "--breaker-failures", "2", "--breaker-cooldown-ms", "60000",
                    "--fallback-model", "backup-model", "--fallback-base-url", backup.url])
    assert p.returncode == 0, p.stderr
    lines = read_results(res)
    assert len(lines) == 10 and all(rec["ok"] for rec in lines)
    assert {rec["meta"]["target"] for rec in lines} == {1}
    # Then the breakers sent them to the backup: one breaker per model, and
    # the items name two (none, and "own-model"), 2 failures each.
    assert len(scen.requests()) == 4
    recs = backup.requests()
    assert len(recs) == 10
    assert all(json.loads(r["body"])["model"] == "backup-model" for r in recs)
    assert all("authorization" not in r["headers"] for r in recs)
    bad = run_module(["batch", str(req), "-o", str(res), "--retry-budget-ratio", "-1"])
    assert bad.returncode == 2 and "--retry-budget-ratio" in bad.stderr


def test_a_stream_falls_back_before_its_first_chunk_not_after(scen: Any) -> None:
    backup = scen.sub("backup")
    backup.script([{"stream": {"chunks": 5}}])
    scen.script([], after=DEAD)
    body = dict(BODY, stream=True)
    fallbacks = [{"model": "mb", "base_url": backup.url}]
    with llmretry.Client(api_key=SECRET_KEY, logger=None, **FAST) as client:
        with client.stream_llm(body, base_url=scen.url, max_retries=0,
                               fallbacks=fallbacks) as s:
            text = "".join(s.text_deltas())
            res = s.result()
        assert text and res.meta.target == 1 and res.meta.model == "mb"
        assert json.loads(backup.requests()[0]["body"])["model"] == "mb"
        # Chunks read, then the stream breaks: no fallback (they would repeat).
        # (chunks 100 ms apart: the first is read, the commit point, before the drop)
        scen.script([{"stream": {"end": "drop", "after": 2, "chunks": 5, "delay_ms": 100}}])
        with pytest.raises(llmretry.StreamInterruptedError):
            with client.stream_llm(body, base_url=scen.url, max_retries=0,
                                   fallbacks=fallbacks) as s:
                for _ in s:
                    pass
    assert len(backup.requests()) == 1


def test_a_429_falls_back_a_cancel_does_not(scen: Any) -> None:
    backup = scen.sub("backup")
    fallbacks = [{"base_url": backup.url}]
    scen.script([{"status": 429}])
    with llmretry.Client(api_key=SECRET_KEY, logger=None, **FAST) as client:
        _, meta = client.call_llm(BODY, base_url=scen.url, max_retries=0, fallbacks=fallbacks)
        assert meta.target == 1
        scen.script([], after={"delay_ms": 3000})

        async def cancelled() -> None:
            task = asyncio.ensure_future(
                client.acall_llm(BODY, base_url=scen.url, fallbacks=fallbacks))
            end = time.monotonic() + 10         # its attempt is at the primary
            while len(scen.requests()) < 1 and time.monotonic() < end:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(cancelled())
    time.sleep(0.2)     # a look for a request that must not come: only time can show it
    assert len(backup.requests()) == 1          # only the 429's fallback


def test_the_key_is_one_endpoint_however_its_header_is_spelt(scen: Any) -> None:
    """api_key=K and a header "authorization: Bearer K" (as the openai SDK
    sends it, lower case) are one key: one endpoint, one budget and breaker."""
    scen.script([])
    with llmretry.Client(logger=None, **FAST) as c:
        c.call_llm(BODY, base_url=scen.url, api_key=SECRET_KEY)
        c.call_llm(BODY, base_url=scen.url, api_key="",
                   headers={"authorization": f"Bearer {SECRET_KEY}"})
        c.call_llm(BODY, base_url=scen.url, api_key="",
                   headers={"AUTHORIZATION": f"Bearer  {SECRET_KEY}"})
        mine = [s for s in c.endpoint_stats() if f"/s/{scen.name}/" in s["url"]]
        assert len(mine) == 2, mine           # "Bearer  K" (two spaces) is another value
        assert sorted(s["requests"] for s in mine) == [1, 2], mine
