"""The full-size job on a local Dask cluster (make cluster; issue 29)."""

from __future__ import annotations

import logging
import os
from typing import Any, Iterator

import dask.dataframe as dd
import distributed
import pandas as pd
import pytest

from jobs import OPTIONS, PYTHON_DIR, ROWS, body, check, mock, script, shared  # noqa: F401

import llmretry.dask as ldask


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PYTHON_DIR), os.environ.get("PYTHONPATH")) if p)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                                  dashboard_address=None, silence_logs=logging.ERROR) as lc, \
            distributed.Client(lc):
        yield


def test_a_thousand_rows_two_workers_one_budget(cluster: None, mock: Any, shared: str) -> None:
    script(mock, "dask-full")
    df = dd.from_pandas(pd.DataFrame({"id": range(ROWS), "body": [body(i) for i in range(ROWS)]}),
                        npartitions=20)
    pdf = ldask.map_calls(df, limit=16, shared=shared, base_url=mock.scenario_url("dask-full"),
                          **OPTIONS).compute()
    got = [{k: (None if v is pd.NA else v) for k, v in row.items()}
           for row in pdf.astype(object).to_dict("records")]
    check(mock, "dask-full", got)
