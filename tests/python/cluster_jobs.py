"""The job that tests/python/test_ray.py and test_dask.py both run: rows
whose calls succeed (two after a 429), fail for good (400), run out of
retries (503) or cannot be sent, some streaming; and the checks of its
output (issue 29)."""

from __future__ import annotations

import json
from typing import Any, Dict, List

from conftest import Scenario

from llmretry._cluster import COLUMNS

N = 40
CONTENT = "hello from the mock"


def body_text(i: int, model: str = "m", **extra: Any) -> str:
    return json.dumps({"model": model,
                       "messages": [{"role": "user", "content": f"SECRET-PROMPT-{i}"}],
                       **extra})


def by_request_id(scen: Scenario) -> Dict[str, Dict[str, Any]]:
    return {r["headers"]["x-client-request-id"]: r for r in scen.requests()}


def prompt_of(record: Dict[str, Any]) -> str:
    return str(json.loads(record["body"])["messages"][0]["content"])


# The rows of the mixed job: which fail, and how.
BAD = {7: "[1, 2]", 11: "not json{", 13: None}      # never sent: invalid_request
PERM = [i for i in range(N) if i % 10 == 3 and i not in BAD]     # 400 for good
DOWN = [i for i in range(N) if i % 10 == 5]                      # 503 until retries run out
STREAM = [i for i in range(N) if i % 4 == 1]                     # "stream": true
OK = [i for i in range(N) if i not in BAD and i not in PERM and i not in DOWN]


def mixed_rows() -> List[Dict[str, Any]]:
    def body(i: int) -> Any:
        if i in BAD:
            return BAD[i]
        model = "perm" if i in PERM else "down" if i in DOWN else "m"
        return body_text(i, model, **({"stream": True} if i in STREAM else {}))
    return [{"id": i, "note": f"n{i}", "body": body(i)} for i in range(N)]


def script_mixed(scen: Scenario) -> Dict[str, Scenario]:
    """Rows of model "perm" meet 400s, "down" 503s (the mock routes them
    to scenarios of their own), the others two 429s among them, then
    successes."""
    subs = {"perm": scen.sub("perm").script([], after={"status": 400}),
            "down": scen.sub("down").script([], after={"status": 503})}
    scen.server.script(scen.name, [{"status": 429, "retry_after_ms": 10}] * 2,
                       after={"content": CONTENT},
                       route={model: sub.name for model, sub in subs.items()})
    return subs


def check_mixed(got: List[Dict[str, Any]], scen: Scenario, subs: Dict[str, Scenario]) -> None:
    """Every row once, in order, with its own call's outcome in place."""
    assert [r["id"] for r in got] == list(range(N))
    assert [r["note"] for r in got] == [f"n{i}" for i in range(N)]
    seen = {**by_request_id(scen), **by_request_id(subs["perm"]),
            **by_request_id(subs["down"])}
    for r in got:
        i = r["id"]
        assert isinstance(r["llm_request_id"], str) and r["llm_request_id"]
        if i in BAD:
            err = json.loads(r["llm_error"])
            assert err["kind"] == "invalid_request" and r["llm_attempts"] == 0
            assert err["request_id"] == r["llm_request_id"] not in seen
            continue
        # The row's own call: the request with its id carried its prompt.
        assert prompt_of(seen[r["llm_request_id"]]) == f"SECRET-PROMPT-{i}"
        if i in PERM or i in DOWN:
            err = json.loads(r["llm_error"])
            assert (err["kind"], err["status"], err["reason"], r["llm_attempts"]) == (
                ("http_status", 400, "not_retryable", 1) if i in PERM
                else ("http_status", 503, "retries_exhausted", 3)), (i, err)
            assert err["request_id"] == r["llm_request_id"]
            assert r["llm_response"] is None and r["llm_content"] is None
            continue
        assert r["llm_error"] is None
        data = json.loads(r["llm_response"])
        assert r["llm_content"] == CONTENT == data["choices"][0]["message"]["content"]
        assert (r["llm_prompt_tokens"], r["llm_completion_tokens"]) == (12, 3)
        if i in STREAM:
            # Streamed, and assembled into one chat.completion (usage asked for).
            rec = seen[r["llm_request_id"]]
            assert rec["events_sent"] > 2, rec
            assert json.loads(rec["body"])["stream_options"] == {"include_usage": True}
            assert data["object"] == "chat.completion"
    # The two 429s were retried: two attempts more than the rows that succeeded.
    assert sum(got[i]["llm_attempts"] for i in OK) == len(OK) + 2
    # Errors never quote the prompt (nor does anything else we add).
    assert not any("SECRET" in json.dumps([r[c] for c in COLUMNS]) for r in got)


def event_pids(log_text: str, request_ids: Any) -> Dict[int, int]:
    """{pid: calls} of the processes that logged the success of those calls."""
    pids: Dict[int, int] = {}
    for ln in log_text.splitlines():
        if " llm_request_succeeded " in ln \
                and ln.split('"request_id":"', 1)[-1][:36] in request_ids:
            pid = int(ln.split(" ", 1)[0])
            pids[pid] = pids.get(pid, 0) + 1
    return pids


def check_events(log_text: str, got: List[Dict[str, Any]], driver_pid: int,
                 secrets: List[str]) -> None:
    """The events of the job's calls reached the ``llmretry`` logger of the
    worker processes: lines ``PID <event name> <JSON>``, written there."""
    lines = log_text.splitlines()
    ids = {r["llm_request_id"] for r in got if r["id"] not in BAD}
    ours = [ln for ln in lines if ln.split('"request_id":"', 1)[-1][:36] in ids]
    pids = {int(ln.split(" ", 1)[0]) for ln in ours}
    assert pids and driver_pid not in pids
    assert sum(" llm_request_succeeded " in ln for ln in ours) == len(OK)
    assert sum(" llm_request_gave_up " in ln for ln in ours) == len(PERM) + len(DOWN)
    assert not any(secret in ln for ln in lines for secret in secrets)


def expected_summary() -> Dict[str, Any]:
    failed = len(BAD) + len(PERM) + len(DOWN)
    return {"rows": N, "ok": N - failed, "failed": failed,
            "attempts": len(OK) + 2 + len(PERM) + 3 * len(DOWN),
            "prompt_tokens": 12 * len(OK), "completion_tokens": 3 * len(OK),
            "failed_by_kind": {"http_status": len(PERM) + len(DOWN),
                               "invalid_request": len(BAD)}}


def heal(subs: Dict[str, Scenario]) -> None:
    """The failing scenarios answer "second" from now on."""
    for sub in subs.values():
        sub.script([], after={"content": "second"})


def check_resumed(got: List[Dict[str, Any]], again: List[Dict[str, Any]], scen: Scenario,
                  subs: Dict[str, Scenario]) -> None:
    """retry_failed ran the rows that had failed, once each, and kept every
    other row as it was."""
    assert [r["id"] for r in again] == list(range(N))
    assert len(subs["perm"].requests()) + len(subs["down"].requests()) == len(PERM) + len(DOWN)
    assert len(scen.requests()) == len(OK) + 2
    for before, after in zip(got, again):
        if before["id"] in PERM or before["id"] in DOWN:
            assert after["llm_error"] is None and after["llm_content"] == "second"
            assert after["llm_request_id"] != before["llm_request_id"]
            assert after["llm_attempts"] == 1
        elif before["id"] in BAD:
            assert json.loads(after["llm_error"])["kind"] == "invalid_request"
        else:
            assert after == before


def check_two_jobs_shared(scen: Scenario) -> None:
    """Two jobs of 30 rows on one shared budget: all 60 admitted, at most 1
    refused (1 % of 60 attempts, rounded up), and the jobs ran at once (each
    job's requests began before the other's ended)."""
    stats = scen.server.limit_stats(scen.name)
    assert stats["admitted"] == 60
    assert stats["refused"] <= 1, stats
    times = {k: [r["time"] for r in scen.server.requests(scen.name)
                 if f"SECRET-PROMPT-{k}" in r["body"]] for k in (1, 2)}
    assert max(min(times[1]), min(times[2])) < min(max(times[1]), max(times[2])), times
