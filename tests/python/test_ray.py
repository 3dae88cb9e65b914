"""llmretry.ray on a real local Ray cluster (issue 29, DESIGN.md §16).

One cluster for the module (``ray.init(num_cpus=2)``: starting one takes
seconds), its actors in worker processes calling the suite's mock server over
loopback. Each test is one or two Ray executions; every worker process logs
the ``llmretry`` logger's events to a file (the ``worker_process_setup_hook``
that docs/cluster.md shows), so the tests can see where events went.
"""

from __future__ import annotations

import logging.config
import os
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from cluster_jobs import (body_text, check_events, check_mixed, check_resumed,
                          check_two_jobs_shared, event_pids, expected_summary, heal, mixed_rows,
                          script_mixed)
from conftest import PYTHON_DIR, SECRET_KEY, Scenario

import llmretry.ray as lray
from llmretry._cluster import COLUMNS

# All of this module's tests on one pytest-xdist worker: one cluster, not four.
pytestmark = pytest.mark.xdist_group("ray")

# Imported by the module's fixture, not at collection: every pytest-xdist
# worker collects this file, and importing Ray costs each about 2 s of CPU.
# Not installed is an error there (tools/ensure-deps.sh installs it), never a skip.
ray: Any = None
pd: Any = None


@pytest.fixture(scope="module")
def events_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Start the module's cluster; yield the file its workers log events to."""
    global ray, pd
    import pandas as pd
    import ray
    import ray.data
    log = tmp_path_factory.mktemp("ray") / "events.log"
    # Each worker process's logging, configured as a user would. (A nested
    # function: cloudpickle sends it by value, so the workers need nothing
    # of the tests.)
    config = {
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"pid": {"format": "%(process)d %(message)s"}},
        "handlers": {"file": {"class": "logging.FileHandler", "filename": str(log),
                              "formatter": "pid"}},
        "loggers": {"llmretry": {"level": "INFO", "handlers": ["file"]}}}

    def setup() -> None:
        logging.config.dictConfig(config)

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING,
             object_store_memory=200 * 1024 * 1024,
             runtime_env={"env_vars": {"PYTHONPATH": str(PYTHON_DIR)},
                          "worker_process_setup_hook": setup})
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True   # the rows' order, as docs/cluster.md says
    # Every actor up before the first batch, so that each gets some (on a
    # loaded machine the second one may start after the first has done all).
    ctx.wait_for_min_actors_s = 120
    try:
        yield log
    finally:
        ray.shutdown()


def test_every_row_once_in_order_failures_in_place(events_log: Path, scen: Scenario,
                                                   tmp_path: Path) -> None:
    subs = script_mixed(scen)
    # From Parquet: Ray's read tasks need a CPU beside the two actors.
    pd.DataFrame(mixed_rows()).to_parquet(tmp_path / "rows.parquet")
    ds = ray.data.read_parquet(str(tmp_path / "rows.parquet"))
    out = lray.map_calls(ds, concurrency=2, limit=4, base_url=scen.url, api_key=SECRET_KEY,
                         max_retries=2, base_delay_ms=10, jitter="none").materialize()
    got = out.take_all()
    check_mixed(got, scen, subs)
    assert list(out.schema().names) == ["id", "note", "body", *COLUMNS]
    assert [str(t) for t in out.schema().types[3:]] == [
        "string", "string", "string", "int64", "int64", "int64", "string"]
    check_events(events_log.read_text(encoding="utf-8"), got, os.getpid(),
                 [SECRET_KEY, "SECRET-PROMPT"])
    assert lray.summarize(out) == expected_summary()

    # The resume: the failed rows again, now that the server is well.
    heal(subs)
    again = lray.retry_failed(out, concurrency=1, limit=4, base_url=scen.url).take_all()
    check_resumed(got, again, scen, subs)


def test_actors_on_one_host_share_one_budget(events_log: Path, scen: Scenario) -> None:
    # The mock lets 25 requests through in any second and refuses the rest;
    # two actors each allowed 25/s (rpm 1500) but sharing one store send
    # 25/s together, so (almost) nothing is refused.
    store = f"test-ray-{uuid.uuid4().hex[:12]}"
    scen.server.script(scen.name, [], limits={"rpm": 25, "window_ms": 1000})
    rows = [{"body": body_text(i)} for i in range(60)]
    try:
        got = lray.map_calls(ray.data.from_items(rows, override_num_blocks=6), concurrency=2,
                             limit=8, batch_size=10, shared=f"shm:{store}",
                             base_url=scen.url, rpm=1500).take_all()
    finally:
        try:
            os.unlink(f"/dev/shm/llmretry-{store}")
        except FileNotFoundError:
            pass
    assert [r["llm_error"] for r in got] == [None] * 60
    pids = event_pids(events_log.read_text(encoding="utf-8"), {r["llm_request_id"] for r in got})
    assert len(pids) == 2 and sum(pids.values()) == 60, pids     # both actors called
    stats = scen.server.limit_stats(scen.name)
    assert stats["admitted"] == 60
    assert stats["refused"] <= 1, stats       # <= 1 % of 60 attempts, rounded up



def test_two_jobs_at_once_share_one_redis_budget(events_log: Path, scen: Scenario) -> None:
    # Two Ray jobs running at once (two actors each), all four actors on one
    # Redis budget (standing for jobs on several machines): the mock lets 25
    # requests through in any second, each actor is allowed 24/s (rpm 1440),
    # and together they send 24/s, so (almost) nothing is refused. (24, not
    # 25: through Redis on a loaded machine a request delayed on its way
    # bunches with the next ones in the mock's window; see test_dask.py.)
    # The first 16 answers (the first job's first wave: 8 in flight for each
    # of its actors) come after 8 s: Ray starts at most two worker processes
    # at once here (num_cpus=2), so on a loaded machine one job's actors were
    # up 1.5-3.6 s after the other's, while a job sent its 30 requests in
    # 1.4 s, and the jobs ran one after the other. Held, the first job's
    # requests span the second's start.
    import threading
    from redis_server import RedisServer
    scen.server.script(scen.name, [{"delay_ms": 8000}] * 16,
                       limits={"rpm": 25, "window_ms": 1000})
    got: dict = {}
    with RedisServer() as redis:
        shared = redis.url + "?timeout_ms=1000"     # a loaded machine's stall is no outage

        def job(k: int) -> None:
            rows = [{"body": body_text(100 * k + i)} for i in range(30)]
            got[k] = lray.map_calls(ray.data.from_items(rows, override_num_blocks=3),
                                    concurrency=2, limit=8, batch_size=10, shared=shared,
                                    base_url=scen.url, rpm=1440).take_all()

        threads = [threading.Thread(target=job, args=(k,)) for k in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(got) == [1, 2]
    for k in (1, 2):
        assert [r["llm_error"] for r in got[k]] == [None] * 30
        assert [r["body"] for r in got[k]] == [body_text(100 * k + i) for i in range(30)]
    check_two_jobs_shared(scen)

def test_bad_arguments_raise_before_anything_runs(events_log: Path, scen: Scenario) -> None:
    ds = ray.data.from_items([{"prompt": "x"}])
    with pytest.raises(ValueError, match="'body'.*body_column"):
        lray.map_calls(ds, base_url=scen.url)
    good = ray.data.from_items([{"body": body_text(0)}])
    with pytest.raises(ValueError, match="concurrency"):
        lray.map_calls(good, concurrency=0, base_url=scen.url)
    with pytest.raises(TypeError, match="concurrency"):
        lray.map_calls(good, concurrency="2", base_url=scen.url)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit"):
        lray.map_calls(good, limit=0, base_url=scen.url)
    with pytest.raises(ValueError, match="max_retries"):
        lray.map_calls(good, max_retries=-1, base_url=scen.url)
    with pytest.raises(TypeError, match="max_retreis"):
        lray.map_calls(good, max_retreis=2, base_url=scen.url)
    with pytest.raises(ValueError, match="request_id"):
        lray.map_calls(good, request_id="x", base_url=scen.url)
    with pytest.raises(ValueError, match="shared"):
        lray.map_calls(good, shared="memcached://x", base_url=scen.url)
    with pytest.raises(TypeError, match="ray.data.Dataset"):
        lray.map_calls([{"body": "{}"}], base_url=scen.url)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no column .llm_response.*output of map_calls"):
        lray.retry_failed(good, base_url=scen.url)
    assert scen.requests() == []
    # No rows: no calls, no error.
    assert lray.map_calls(ray.data.from_items([]), base_url=scen.url).count() == 0

