"""A batch made of a job's file after the check that followed its create
(llmretry.batch_api): a create attempt given up on that the provider made
late, or a gateway's retry that landed after the list was read. The job's
polls look for one while it runs, and the job's end once more; each is
cancelled, or told of as billed when it had run to its end, once. (Twins
found right after the create, and on adoption: test_batch_api.py.)"""

from __future__ import annotations

import json
import urllib.request
import warnings
from typing import Any, Callable, Dict, Iterator, List

import pytest

from llmretry import batch_api
from llmretry.errors import LLMError
from llmretry.testing import MockServer

KEY = "sk-test-SECRET-KEY-123"
POLL = {"poll_interval_ms": 5, "max_poll_interval_ms": 20, "max_retries": 0, "logger": None}


@pytest.fixture
def mock() -> Iterator[MockServer]:
    with MockServer() as server:
        yield server


def _submit(mock: MockServer, n: int) -> batch_api.BatchJob:
    bodies = [{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"q{i}"}]}
              for i in range(n)]
    return batch_api.submit(bodies, base_url=mock.base_url, api_key=KEY, **POLL)


def _late_twin(mock: MockServer, job: batch_api.BatchJob) -> str:
    """The job's file made into a second batch, after submit() returned:
    the id."""
    (rec,) = job.doc["batches"]
    req = urllib.request.Request(
        f"{mock.base_url}/batches", method="POST", headers={"Content-Type": "application/json"},
        data=json.dumps({"input_file_id": rec["input_file_id"], "completion_window": "24h",
                         "endpoint": "/v1/chat/completions"}).encode())
    with urllib.request.urlopen(req, timeout=10) as resp:
        return str(json.loads(resp.read())["id"])


class _Stop(Exception):
    pass


def _stop_at(call: int) -> Callable[[int, int, int], None]:
    """A wait() progress callable that stops the wait at its ``call``-th
    report (each poll reports once, before it looks for twins)."""
    seen: List[int] = []

    def report(done: int, total: int, failed: int) -> None:
        seen.append(done)
        if len(seen) == call:
            raise _Stop
    return report


def _warned(job: batch_api.BatchJob, twin: str, how: str) -> str:
    return (f"batch API: 2 batches were made of file {job.doc['batches'][0]['input_file_id']} "
            f"(a create retried on its way, by this client or a gateway); kept "
            f"{job.batch_ids[0]}, {how} {twin}")


def test_a_twin_made_after_the_create_is_cancelled_by_a_poll(mock: MockServer) -> None:
    store = mock.batch_api()
    job = _submit(mock, 3)
    twin = _late_twin(mock, job)
    store.auto = {"to": "in_progress"}      # the job's own batch runs on
    with pytest.warns(RuntimeWarning) as said:
        with pytest.raises(_Stop):
            job.wait(progress=_stop_at(2))  # the first poll looked
    assert [str(w.message) for w in said] == [_warned(job, twin, "cancelled")]
    assert store.batches[twin]["status"] == "cancelling"
    store.auto = True
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # told once
        job.wait()
    assert [r.data["id"] for r in job.results()] == [f"chatcmpl-mock-{i}" for i in range(3)]


def test_a_twin_that_ran_to_its_end_is_told_when_the_job_ends(
        mock: MockServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the polls' window the list is read once more, when the job has
    ended: a twin that completed was billed, and the warning says so."""
    monkeypatch.setattr(batch_api, "TWIN_LOOK_S", 0.0)
    store = mock.batch_api()
    job = _submit(mock, 2)
    twin = _late_twin(mock, job)
    store.advance(twin, to="completed")
    store.auto = {"to": "in_progress"}
    lists = store.lists
    with pytest.raises(_Stop):
        job.wait(progress=_stop_at(3))
    assert store.lists == lists             # the polls past the window do not list
    store.auto = True
    with pytest.warns(RuntimeWarning) as said:
        job.wait()
    assert [str(w.message) for w in said] == [_warned(job, twin, "too late to cancel")
                                              + " (completed)"]
    assert store.lists == lists + 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # told once; each wait's end looks
        job.wait()
    assert store.lists == lists + 2 and store.batches[twin]["status"] == "completed"


def test_twins_already_cancelled_are_not_told_again(mock: MockServer) -> None:
    """A twin someone cancelled (this job's create check, an earlier run
    of it) is not running: no warning."""
    store = mock.batch_api()
    job = _submit(mock, 2)
    twin = _late_twin(mock, job)
    job.api.post_json(f"/batches/{twin}/cancel", {})
    store.auto = True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert job.wait()["status"] == "completed"


def test_a_list_that_fails_is_only_a_check(mock: MockServer) -> None:
    """A list that fails (after its retries) stops nothing and is not asked
    for at each poll again: once more at the end."""
    store = mock.batch_api()
    job = _submit(mock, 2)
    _late_twin(mock, job)
    store.auto = {"to": "in_progress"}
    asked: List[int] = []

    def broken(*args: Any, **kwargs: Any) -> Any:
        asked.append(1)
        raise LLMError("the list is down")
        yield                               # a generator, as the Api's
    job.api.listed_batches = broken         # type: ignore[method-assign]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(_Stop):
            job.wait(progress=_stop_at(4))
        assert len(asked) == 1              # the first poll's; not the next two
        store.auto = True
        assert job.wait()["status"] == "completed"
    assert len(asked) == 2                  # and the end's
    assert len(job.results()) == 2


def test_a_hostile_list_entry_is_passed_over(mock: MockServer) -> None:
    """Entries of the list that are no batch, name their file as something
    other than a string (a list: unhashable), or name the job's file with an
    id that is no string, are passed over."""
    store = mock.batch_api()
    job = _submit(mock, 2)
    twin = _late_twin(mock, job)
    real = job.api.listed_batches
    fid = job.doc["batches"][0]["input_file_id"]
    junk: List[Any] = [None, 7, {"input_file_id": ["x"]}, {"input_file_id": {"a": 1}},
                       {"input_file_id": fid, "id": ["x"], "status": "in_progress"},
                       {"input_file_id": fid, "id": {"a": 1}}]

    def listed(*args: Any, **kwargs: Any) -> Iterator[Any]:
        yield from junk
        yield from real(*args, **kwargs)
    job.api.listed_batches = listed         # type: ignore[method-assign]
    store.auto = True
    with pytest.warns(RuntimeWarning, match=f"cancelled {twin}$"):
        job.wait()
    body: Dict[str, Any] = store.batches[twin]
    assert body["status"] in ("cancelling", "cancelled")


def test_a_twin_whose_id_is_no_string_is_named_not_raised(mock: MockServer,
                                                         tmp_path: Any) -> None:
    """The check right after the create lists an entry of the job's file
    whose id is a list: it cannot be cancelled, and the warning says so;
    nothing raises TypeError (the set of twins told of holds ids)."""
    store = mock.batch_api()
    job = batch_api._new_job([{"model": "gpt-4o-mini", "messages": [
        {"role": "user", "content": "q"}]}], base_url=mock.base_url, api_key=KEY, **POLL)
    real = job.api.listed_batches

    def listed(*args: Any, **kwargs: Any) -> Iterator[Any]:
        for b in real(*args, **kwargs):
            yield b
            if isinstance(b, dict):
                yield {"input_file_id": b.get("input_file_id"), "id": ["x"]}
    job.api.listed_batches = listed         # type: ignore[method-assign]
    with pytest.warns(RuntimeWarning, match=r"could not cancel \['x'\] \(GET /batches: a "
                      r"batch id is not a plain id"):
        job._submit()
    store.auto = True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert job.wait()["status"] == "completed"
