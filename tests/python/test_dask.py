"""llmretry.dask on a real local Dask cluster (issue 29, DESIGN.md §16).

One ``distributed.LocalCluster`` of two worker processes for the module,
calling the suite's mock server over loopback; every worker logs the
``llmretry`` logger's events to a file (configured with ``client.run``, as
docs/cluster.md shows), so the tests can see where events went.
"""

from __future__ import annotations

import json
import logging.config
import os
import uuid
from typing import Any, Dict, Iterator, List

import pytest

from cluster_jobs import (body_text, check_events, check_mixed, check_resumed,
                          check_two_jobs_shared, event_pids, expected_summary, heal, mixed_rows,
                          script_mixed)
from conftest import PYTHON_DIR, SECRET_KEY, Scenario

import llmretry.dask as ldask
from llmretry._cluster import COLUMNS

# All of this module's tests on one pytest-xdist worker: one cluster, not four.
pytestmark = pytest.mark.xdist_group("dask")

# Imported by the module's fixture, not at collection: every pytest-xdist
# worker collects this file, and importing Dask costs each about 2 s of CPU.
# Not installed is an error there (tools/ensure-deps.sh installs it), never a skip.
dask: Any = None
dd: Any = None
distributed: Any = None
pd: Any = None


@pytest.fixture(scope="module")
def dask_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The module's cluster and a client of it; its workers log events to
    ``client.events_log``."""
    global dask, dd, distributed, pd
    import dask
    import dask.dataframe as dd
    import distributed
    import pandas as pd
    log = tmp_path_factory.mktemp("dask") / "events.log"
    old = os.environ.get("PYTHONPATH")
    # The worker processes import llmretry from this tree.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(PYTHON_DIR), old) if p)
    try:
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                                           dashboard_address=None, silence_logs=logging.ERROR)
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    client = distributed.Client(cluster)
    config = {
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"pid": {"format": "%(process)d %(message)s"}},
        "handlers": {"file": {"class": "logging.FileHandler", "filename": str(log),
                              "formatter": "pid"}},
        "loggers": {"llmretry": {"level": "INFO", "handlers": ["file"]}}}

    def setup() -> None:
        logging.config.dictConfig(config)

    client.run(setup)
    client.events_log = log
    try:
        yield client
    finally:
        client.close()
        cluster.close()


def records(pdf: Any) -> List[Dict[str, Any]]:
    """Rows as dicts, missing values as None (as Ray gives them)."""
    return [{k: (None if v is pd.NA else v) for k, v in row.items()}
            for row in pdf.astype(object).to_dict("records")]


def test_every_row_once_in_order_failures_in_place(dask_client: Any, scen: Scenario) -> None:
    subs = script_mixed(scen)
    rows = mixed_rows()
    # Bodies as dicts (a pandas object column: Dask must not make it
    # strings, see docs/cluster.md) and as JSON text, mixed.
    for r in rows[::3]:
        if isinstance(r["body"], str) and r["body"].startswith("{"):
            r["body"] = json.loads(r["body"])
    with dask.config.set({"dataframe.convert-string": False}):
        df = dd.from_pandas(pd.DataFrame(rows), npartitions=4)
        out = ldask.map_calls(df, limit=4, base_url=scen.url, api_key=SECRET_KEY,
                              max_retries=2, base_delay_ms=10, jitter="none").persist()
    pdf = out.compute()
    assert list(pdf.columns) == ["id", "note", "body", *COLUMNS]
    assert [str(t) for t in pdf.dtypes[3:]] == [
        "string", "string", "string", "int64", "Int64", "Int64", "string"]
    assert list(pdf.index) == list(range(len(rows)))
    got = records(pdf)
    check_mixed(got, scen, subs)
    check_events(dask_client.events_log.read_text(encoding="utf-8"), got, os.getpid(),
                 [SECRET_KEY, "SECRET-PROMPT"])
    assert ldask.summarize(out) == expected_summary()

    # The resume, through Parquet as a job that stopped would have it (the
    # dicts written as JSON text: Parquet holds no column of both).
    heal(subs)
    path = dask_client.events_log.parent / "out.parquet"
    text = out["body"].map(lambda b: json.dumps(b) if isinstance(b, dict) else b,
                           meta=("body", "string[pyarrow]"))
    out.assign(body=text).to_parquet(str(path))
    again = ldask.retry_failed(dd.read_parquet(str(path)), limit=4, base_url=scen.url).compute()
    for r in got:     # as written
        r["body"] = json.dumps(r["body"]) if isinstance(r["body"], dict) else r["body"]
    check_resumed(got, records(again), scen, subs)


def test_a_job_is_one_budget_for_its_worker_processes(dask_client: Any, scen: Scenario) -> None:
    # The mock lets 25 requests through in any second and refuses the rest;
    # two worker processes each allowed 25/s (rpm 1500) but sharing one
    # store send 25/s together, so (almost) nothing is refused.
    store = f"test-dask-{uuid.uuid4().hex[:12]}"
    scen.server.script(scen.name, [], limits={"rpm": 25, "window_ms": 1000})
    df = dd.from_pandas(pd.DataFrame({"body": [body_text(i) for i in range(60)]}),
                        npartitions=4)
    try:
        pdf = ldask.map_calls(df, limit=8, shared=f"shm:{store}", base_url=scen.url,
                              rpm=1500).compute()
    finally:
        try:
            os.unlink(f"/dev/shm/llmretry-{store}")
        except FileNotFoundError:
            pass
    assert pdf["llm_error"].isna().all()
    stats = scen.server.limit_stats(scen.name)
    assert stats["admitted"] == 60
    assert stats["refused"] <= 1, stats       # <= 1 % of 60 attempts, rounded up
    # Both worker processes called.
    pids = event_pids(dask_client.events_log.read_text(encoding="utf-8"),
                      set(pdf["llm_request_id"]))
    assert len(pids) == 2 and sum(pids.values()) == 60, pids



def test_two_jobs_at_once_share_one_redis_budget(dask_client: Any, scen: Scenario) -> None:
    # Two Dask jobs computed at once on the cluster's two worker processes,
    # on one Redis budget (standing for workers on several machines): the
    # mock lets 25 requests through in any second, each job is allowed 24/s
    # (rpm 1440), and together they send 24/s, so (almost) nothing is refused.
    # (24, not 25: through Redis on a loaded machine, a request delayed on its
    # way bunches with the next ones in the mock's window — 2 of 60 refused
    # once in CI at exactly 25. Unshared, the jobs would send 48/s.)
    from redis_server import RedisServer
    scen.server.script(scen.name, [], limits={"rpm": 25, "window_ms": 1000})
    with RedisServer() as redis:
        shared = redis.url + "?timeout_ms=1000"     # a loaded machine's stall is no outage
        jobs = [ldask.map_calls(dd.from_pandas(pd.DataFrame(
                    {"body": [body_text(100 * k + i) for i in range(30)]}), npartitions=3),
                    limit=8, shared=shared, base_url=scen.url, rpm=1440) for k in (1, 2)]
        a, b = dask.compute(*jobs)
    for k, pdf in ((1, a), (2, b)):
        assert pdf["llm_error"].isna().all()
        assert list(pdf["body"]) == [body_text(100 * k + i) for i in range(30)]
    check_two_jobs_shared(scen)

def test_bad_arguments_raise_before_anything_runs(dask_client: Any, scen: Scenario) -> None:
    df = dd.from_pandas(pd.DataFrame({"prompt": ["x"]}), npartitions=1)
    with pytest.raises(ValueError, match="'body'.*body_column"):
        ldask.map_calls(df, base_url=scen.url)
    good = dd.from_pandas(pd.DataFrame({"body": [body_text(0)]}), npartitions=1)
    with pytest.raises(ValueError, match="limit"):
        ldask.map_calls(good, limit=0, base_url=scen.url)
    with pytest.raises(ValueError, match="max_retries"):
        ldask.map_calls(good, max_retries=-1, base_url=scen.url)
    with pytest.raises(TypeError, match="max_retreis"):
        ldask.map_calls(good, max_retreis=2, base_url=scen.url)
    with pytest.raises(ValueError, match="idempotency_key"):
        ldask.map_calls(good, idempotency_key="k", base_url=scen.url)
    with pytest.raises(TypeError, match="dask.dataframe.DataFrame"):
        ldask.map_calls(pd.DataFrame({"body": ["{}"]}), base_url=scen.url)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no column .llm_response.*output of map_calls"):
        ldask.retry_failed(good, base_url=scen.url)
    with pytest.raises(ValueError, match="already has a column 'llm_response'"):
        ldask.map_calls(good.assign(llm_response="x"), base_url=scen.url)
    assert scen.requests() == []
    # A dict that Dask made a string (dataframe.convert-string): that row's
    # error says so, and the job goes on.
    dicts = dd.from_pandas(pd.DataFrame({"body": [json.loads(body_text(0)), body_text(1)]}),
                           npartitions=1)
    pdf = ldask.map_calls(dicts, base_url=scen.url).compute()
    err = json.loads(pdf["llm_error"][0])
    assert err["kind"] == "invalid_request" and "json.dumps" in err["message"], err
    assert pd.isna(pdf["llm_error"][1]) and len(scen.requests()) == 1
    # No rows: no calls, no error, the columns all the same.
    empty = ldask.map_calls(dd.from_pandas(pd.DataFrame({"body": pd.Series([], dtype=object)}),
                                           npartitions=1), base_url=scen.url).compute()
    assert len(empty) == 0 and list(empty.columns) == ["body", *COLUMNS]
