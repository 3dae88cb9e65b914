"""LLM calls inside Dask DataFrames, under llmretry's policy (docs/cluster.md).

``map_calls(df)`` adds seven columns to a Dask DataFrame through
``map_partitions``: each partition's rows go through one
:func:`~llmretry.call_many` on its worker process's
:class:`~llmretry.Client` (one per job and process, shared by the partitions
that process runs at once), so pacing, retries, rate limits, breaker and
events are llmretry's. A row never raises: a call that fails for good is that
row's ``llm_error``, and ``retry_failed`` runs those rows again. With
``shared="shm:NAME"`` (one host) or ``shared="redis://..."`` (every machine)
the workers spend one rate and retry budget. Dask is imported only when a
function here is called; ``pip install 'llmretry[dask]'`` installs it.

Example::

    import dask.dataframe as dd
    from distributed import Client
    import llmretry.dask

    Client("tcp://scheduler:8786")
    df = dd.read_parquet("prompts/")                 # a "body" column: JSON text
    out = llmretry.dask.map_calls(df, limit=32, shared="redis://redis.internal:6379")
    out.to_parquet("answers/")
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from ._cluster import (COLUMNS, OPTIONAL_INT_COLUMNS, TEXT_COLUMNS, Job, client_for,
                       install_hint, make_job, rows_to_rerun, run_rows, summary_add,
                       summary_start)

if TYPE_CHECKING:   # Dask is imported when a job is set up, not before
    import dask.dataframe

__all__ = ["map_calls", "retry_failed", "summarize"]


def _dd() -> Any:
    try:
        import dask.dataframe as dd
    except ImportError:
        raise install_hint("Dask DataFrame", "dask") from None
    return dd


def map_calls(df: "dask.dataframe.DataFrame", *, body_column: str = "body", limit: int = 64,
              shared: Optional[str] = None, **options: Any) -> "dask.dataframe.DataFrame":
    """One LLM call per row of ``df``: the DataFrame with seven columns more.

    ``body_column`` holds each row's request body: a dict or its JSON text.
    Each worker process runs its partitions' rows through ``call_many`` on
    one :class:`~llmretry.Client` for the job, with at most ``limit`` calls
    in flight per process. ``shared`` is that client's ``shared``
    (``"shm:NAME"``: the workers of one host; ``"redis://..."``: of every
    host), so that together they keep to one budget (``rpm``, ``tpm``,
    retries, breaker); unset, the driver's ``LLMRETRY_SHARED``. ``options``
    are :func:`llmretry.call_llm` keywords for every row's call (not
    ``request_id`` or ``idempotency_key``); the driver's ``OPENAI_BASE_URL``
    and ``OPENAI_API_KEY`` go with the job when ``base_url``/``url`` and
    ``api_key`` are not given.

    The columns added, as in :func:`llmretry.ray.map_calls`:
    ``llm_response``, ``llm_content``, ``llm_error``, ``llm_request_id``
    (``string[pyarrow]``, missing as ``pd.NA``), ``llm_attempts``
    (``int64``), ``llm_prompt_tokens``, ``llm_completion_tokens``
    (``Int64``, missing as ``pd.NA``). ``llm_error`` is the JSON text
    ``{"kind", "reason", "status", "message", "request_id"}`` of a call that
    failed for good, or of kind ``invalid_request`` for a body that is not a
    dict or JSON object text (never sent).

    Rows keep their partition, index and order. The result is lazy: each
    ``compute``/``to_parquet`` runs the calls again, so write it or
    ``persist()`` it once. Events go to each worker's
    ``logging.getLogger("llmretry")`` (configure it with
    ``client.run(logging.basicConfig, level=logging.INFO)``) unless
    ``logger=`` says otherwise.

    Raises TypeError or ValueError naming the argument before anything is
    computed: a missing ``body_column``, a bad ``limit``, an option the
    engine refuses; ImportError when Dask is not installed.
    """
    return _map(df, "map_calls()", body_column, limit, shared, options, only_failed=False)


def retry_failed(df: "dask.dataframe.DataFrame", *, body_column: str = "body", limit: int = 64,
                 shared: Optional[str] = None, **options: Any) -> "dask.dataframe.DataFrame":
    """The resume of a :func:`map_calls` job: its output (or that output
    read back from Parquet) with the rows whose ``llm_error`` is set called
    again, their seven columns replaced by the new call's, every other row
    as it was. Arguments as :func:`map_calls`; ValueError when ``df`` lacks
    one of the columns :func:`map_calls` adds."""
    return _map(df, "retry_failed()", body_column, limit, shared, options, only_failed=True)


def _pandas() -> Any:
    # Imported by name: the type checker has no stubs for it.
    return importlib.import_module("pandas")


def _dtypes() -> Dict[str, Any]:
    pd = _pandas()
    return {name: pd.StringDtype("pyarrow") if name in TEXT_COLUMNS
            else pd.Int64Dtype() if name in OPTIONAL_INT_COLUMNS else "int64"
            for name in COLUMNS}


def _map(df: "dask.dataframe.DataFrame", where: str, body_column: Any, limit: Any,
         shared: Any, options: Dict[str, Any], only_failed: bool) -> "dask.dataframe.DataFrame":
    dd = _dd()
    if not isinstance(df, dd.DataFrame):
        raise TypeError(f"{where}: df must be a dask.dataframe.DataFrame, "
                        f"not {type(df).__name__}")
    job = make_job(where, body_column, limit, shared, options, only_failed)
    names = list(df.columns)
    if job.body_column not in names:
        raise ValueError(f"{where}: the DataFrame has no column {job.body_column!r} "
                         f"(body_column; its columns: {', '.join(map(str, names))})")
    present = [c for c in COLUMNS if c in names]
    if only_failed:
        missing = [c for c in COLUMNS if c not in names]
        if missing:
            raise ValueError(f"{where}: the DataFrame has no column {missing[0]!r}: "
                             f"retry_failed takes the output of map_calls")
        meta = df._meta.astype(_dtypes())
    else:
        if present:
            raise ValueError(f"{where}: the DataFrame already has a column {present[0]!r}: "
                             f"use retry_failed() to run its failed rows again, or drop "
                             f"the llm_* columns")
        meta = _with_columns(df._meta, {name: [] for name in COLUMNS})
    out: "dask.dataframe.DataFrame" = df.map_partitions(_call_partition, job, meta=meta)
    return out


def _with_columns(pdf: Any, cols: Dict[str, List[Any]]) -> Any:
    pd = _pandas()
    dtypes = _dtypes()
    return pdf.assign(**{name: pd.Series(cols[name], index=pdf.index, dtype=dtypes[name])
                         for name in COLUMNS})


def _call_partition(pdf: Any, job: Job) -> Any:
    """A partition with the output columns: appended (map_calls), or, to
    resume, replaced in the rows that had an error. Runs on a worker."""
    bodies = pdf[job.body_column].tolist()
    if not job.only_failed:
        with client_for(job) as client:
            cols = run_rows(client, job, bodies)
        return _with_columns(pdf, cols)
    pdf = pdf.astype(_dtypes())
    rerun = rows_to_rerun(pdf["llm_error"].tolist())
    if not rerun:
        return pdf
    with client_for(job) as client:
        cols = run_rows(client, job, [bodies[i] for i in rerun])
    out = pdf.copy()
    for name in COLUMNS:
        col = out.columns.get_loc(name)
        for k, i in enumerate(rerun):
            out.iat[i, col] = cols[name][k]
    return out


def summarize(df: "dask.dataframe.DataFrame") -> Dict[str, Any]:
    """Counts over the output of :func:`map_calls` (or :func:`retry_failed`),
    on the driver: ``rows``, ``ok``, ``failed``, ``attempts``,
    ``prompt_tokens``, ``completion_tokens`` and ``failed_by_kind``
    (``{kind: rows}``), summed per partition on the workers. Give it the
    persisted or written output: a lazy one would run its calls again."""
    import dask
    dk: Any = dask      # its compute and delayed are untyped
    parts = df[["llm_error", "llm_attempts", "llm_prompt_tokens",
                "llm_completion_tokens"]].to_delayed()
    totals = summary_start()
    for part in dk.compute(*[dk.delayed(_partition_summary)(p) for p in parts]):
        totals["rows"] += part["rows"]
        totals["failed"] += part["failed"]
        for key in ("attempts", "prompt_tokens", "completion_tokens"):
            totals[key] += part[key]
        for kind, n in part["failed_by_kind"].items():
            totals["failed_by_kind"][kind] = totals["failed_by_kind"].get(kind, 0) + n
    totals["ok"] = totals["rows"] - totals["failed"]
    return totals


def _partition_summary(pdf: Any) -> Dict[str, Any]:
    totals = summary_start()
    summary_add(totals, pdf["llm_error"].tolist(), pdf["llm_attempts"].tolist(),
                pdf["llm_prompt_tokens"].tolist(), pdf["llm_completion_tokens"].tolist())
    return totals
