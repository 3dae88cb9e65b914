"""The full-size job on a local Ray cluster (make cluster; issue 29)."""

from __future__ import annotations

import logging
import os
from typing import Any, Iterator

import pytest
import ray
import ray.data

from jobs import OPTIONS, PYTHON_DIR, ROWS, body, check, mock, script, shared  # noqa: F401

import llmretry.ray as lray


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PYTHON_DIR), os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    yield
    ray.shutdown()


def test_a_thousand_rows_two_actors_one_budget(cluster: None, mock: Any, shared: str) -> None:
    script(mock, "ray-full")
    ds = ray.data.from_items([{"id": i, "body": body(i)} for i in range(ROWS)],
                             override_num_blocks=20)
    got = lray.map_calls(ds, concurrency=2, limit=16, batch_size=50, shared=shared,
                         base_url=mock.scenario_url("ray-full"), **OPTIONS).take_all()
    check(mock, "ray-full", got)
