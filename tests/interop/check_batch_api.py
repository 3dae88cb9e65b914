"""llmretry.batch_api through LiteLLM's proxy (its /v1/files and /v1/batches
passed on to an OpenAI-compatible upstream: here the project's mock, on the
port LiteLLM was told in OPENAI_BASE_URL). The proxy is the server nobody
here wrote: its ids, its list, its answers. Run by tools/interop.sh.
Usage: check_batch_api.py BASE_URL UPSTREAM_PORT
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from typing import Any, Dict, List

import llmretry
from interop_util import Checks, batch_cli
from llmretry import batch_api
from llmretry.testing import MockServer

KEY = "sk-1234"
POLL = {"poll_interval_ms": 50, "max_poll_interval_ms": 200}


def bodies(n: int, tag: str) -> List[Dict[str, Any]]:
    return [{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"{tag} {i}"}]}
            for i in range(n)]


def main(base_url: str, upstream_port: int) -> int:
    checks = Checks()
    mock = MockServer(port=upstream_port)
    mock.start()
    store = mock.batch_api()
    store.auto = True           # each retrieve moves a batch one step

    def run_in_order() -> str:
        with tempfile.TemporaryDirectory() as tmp:
            out = batch_api.run(bodies(30, "run"), base_url=base_url, api_key=KEY, logger=None,
                                failures_path=os.path.join(tmp, "failed.jsonl"), **POLL)
        assert all(isinstance(r, llmretry.Result) for r in out), out[:2]
        ids = [r.data["id"] for r in out]
        assert ids == [f"chatcmpl-mock-{i}" for i in range(30)], ids[:3]
        (upstream,) = [b for b in store.batches.values() if b["request_counts"]["total"] == 30]
        return f"30 results in order; upstream batch {upstream['id']} {upstream['status']}"

    def cancel() -> str:
        job = batch_api.submit(bodies(5, "cancel"), base_url=base_url, api_key=KEY,
                               logger=None, **POLL)
        store.auto = None
        try:
            st = job.cancel(wait=False)
            (bid,) = job.batch_ids
            ups = [b for b in store.batches.values() if b["status"] == "cancelling"]
            assert len(ups) == 1, [b["status"] for b in store.batches.values()]
            store.auto = True
            st = job.wait()
        finally:
            store.auto = True
        assert st["status"] == "cancelled", st["status"]
        return f"{bid} (as the proxy names it) cancelled upstream"

    def resume_adopts() -> str:
        # A run stopped after the proxy made the batch, before its answer was
        # recorded: the resumed run finds it in the proxy's list by its file.
        with tempfile.TemporaryDirectory() as tmp:
            record = os.path.join(tmp, "job.batches")
            job = batch_api._new_job(bodies(4, "adopt"), record=record, base_url=base_url,
                                     api_key=KEY, logger=None, **POLL)
            real = job.api.post_json

            def stopped(*args: Any, **kw: Any) -> Any:
                real(*args, **kw)
                raise KeyboardInterrupt
            job.api.post_json = stopped      # type: ignore[method-assign]
            before = len(store.batches)
            try:
                job._submit()
            except KeyboardInterrupt:
                pass
            assert len(store.batches) == before + 1
            with open(record, encoding="utf-8") as f:
                assert json.load(f)["creating"], "no creating entry"
            again = batch_api.resume(bodies(4, "adopt"), record=record, base_url=base_url,
                                     api_key=KEY, logger=None, **POLL)
            assert len(store.batches) == before + 1, "the resumed run made another batch"
            again.wait()
            out = again.results()
        assert [r.data["id"] for r in out] == [f"chatcmpl-mock-{i}" for i in range(4)]
        return f"adopted {again.batch_ids[0]}, no second batch"

    def twins() -> str:
        # The upstream made the batch and its answer was lost (a 503 the proxy
        # passes on, in its own words); the retry made a second one: the job
        # finds both in the proxy's list and cancels the one it was not
        # answered with.
        store.lost_creates = 1
        before = set(store.batches)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            job = batch_api.submit(bodies(3, "twins"), base_url=base_url, api_key=KEY,
                                   logger=None, base_delay_ms=10, **POLL)
        made = sorted(set(store.batches) - before)
        assert len(made) == 2, made
        assert job.batch_ids == [made[1]], (job.batch_ids, made)
        assert store.batches[made[0]]["status"] in ("cancelling", "cancelled"), \
            store.batches[made[0]]["status"]
        said = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
        assert len(said) == 1 and said[0].endswith(f"kept {made[1]}, cancelled {made[0]}"), said
        job.wait()
        assert len(job.results()) == 3
        return said[0]

    def late_twin() -> str:
        # A create given up on that the proxy (or its upstream) made after the
        # check that followed the create: the job's polls find it in the
        # proxy's list and cancel it.
        store.auto = None
        before = set(store.batches)
        try:
            job = batch_api.submit(bodies(3, "late"), base_url=base_url, api_key=KEY,
                                   logger=None, **POLL)
            (rec,) = job.doc["batches"]
            twin = job.api.post_json("/batches", {"input_file_id": rec["input_file_id"],
                                                  "endpoint": "/v1/chat/completions",
                                                  "completion_window": "24h"})["id"]
        finally:
            store.auto = True
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            job.wait()
        said = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
        assert len(said) == 1 and said[0].endswith(f"kept {job.batch_ids[0]}, cancelled {twin}"), \
            said
        # Upstream: the job's batch ran to its end, the twin was cancelled.
        kept_up, twin_up = sorted(set(store.batches) - before)
        assert store.batches[kept_up]["status"] == "completed", store.batches[kept_up]
        assert store.batches[twin_up]["status"] in ("cancelling", "cancelled"), \
            store.batches[twin_up]["status"]
        assert len(job.results()) == 3
        return said[0]

    def cli() -> str:
        _, lines = batch_cli(base_url, KEY, bodies(6, "cli"), "--via", "batch-api",
                             "--poll-interval-ms", "50")
        assert [x["index"] for x in lines] == list(range(6)) and all(x["ok"] for x in lines)
        return "6 lines ok"

    try:
        checks.check("batch_api.run through the proxy: results in input order", run_in_order)
        checks.check("cancel through the proxy", cancel)
        checks.check("a resumed run adopts the batch the proxy made", resume_adopts)
        checks.check("a create made twice upstream: the twin cancelled", twins)
        checks.check("a twin made after the create's check: cancelled by a poll", late_twin)
        checks.check("llmretry batch --via batch-api through the proxy", cli)
    finally:
        mock.stop()
    return checks.summary("Batch API via LiteLLM")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
