"""LLM calls inside Ray Data, under llmretry's policy (docs/cluster.md).

``map_calls(ds)`` adds seven columns to a Dataset: one call per row, run by
a pool of Ray actors that each hold one :class:`~llmretry.Client` and send
each batch of rows through :func:`~llmretry.call_many` (so the batch's
pacing, retries, rate limits, breaker and events are llmretry's). A row
never raises: a call that fails for good is that row's ``llm_error``, and
``retry_failed`` runs those rows again. With ``shared="shm:NAME"`` (one
host) or ``shared="redis://..."`` (every machine) the actors spend one rate
and retry budget. Ray is imported only when a function here is called;
``pip install 'llmretry[ray]'`` installs it.

Example::

    import ray
    import llmretry.ray

    ds = ray.data.read_parquet("prompts.parquet")      # a "body" column: JSON text
    out = llmretry.ray.map_calls(ds, concurrency=4, limit=32,
                                 base_url="https://api.openai.com/v1",
                                 shared="redis://redis.internal:6379")
    out.write_parquet("answers/")
"""

from __future__ import annotations

import importlib
import inspect
from typing import TYPE_CHECKING, Any, Dict, Optional

from ._cluster import (COLUMNS, TEXT_COLUMNS, Job, install_hint, make_job, rows_to_rerun,
                       run_rows, summary_add, summary_start)

if TYPE_CHECKING:   # Ray is imported when a job is set up, not before
    import ray.data

__all__ = ["map_calls", "retry_failed", "summarize"]


def _ray_data() -> Any:
    try:
        import ray.data
    except ImportError:
        raise install_hint("Ray Data", "ray") from None
    return ray.data


def map_calls(ds: "ray.data.Dataset", *, body_column: str = "body", concurrency: int = 2,
              limit: int = 64, shared: Optional[str] = None,
              batch_size: Optional[int] = None, num_cpus: float = 0.25,
              **options: Any) -> "ray.data.Dataset":
    """One LLM call per row of ``ds``: the Dataset with seven columns more.

    ``body_column`` holds each row's request body: JSON object text (the
    safe form: Arrow stores a column of dicts as a struct, which gives every
    row every key that any row has, as null) or a dict. ``concurrency`` Ray
    actors each hold one :class:`~llmretry.Client` and run each batch of
    ``batch_size`` rows (default ``4 * limit``) through ``call_many`` with
    at most ``limit`` calls in flight per actor. ``shared`` is every
    actor's client's ``shared`` (``"shm:NAME"``: the actors of one host;
    ``"redis://..."``: of every host), so that together they keep to one
    budget (``rpm``, ``tpm``, retries, breaker); unset, the driver's
    ``LLMRETRY_SHARED``. ``num_cpus``: what Ray reserves for each actor (a
    quarter: the calls mostly wait; a whole CPU per actor would leave a
    small cluster none for reading and writing the data, and the job would
    wait for ever).
    ``options`` are :func:`llmretry.call_llm` keywords for every row's call
    (not ``request_id`` or ``idempotency_key``: each row gets its own); the
    driver's ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` go with the job
    when ``base_url``/``url`` and ``api_key`` are not given.

    The columns added (DESIGN.md §16):

    * ``llm_response``: the response as JSON text (a streaming body's
      assembled answer), or null;
    * ``llm_content``: the first choice's message content, or a Responses
      answer's output text, or null;
    * ``llm_error``: null, or JSON text ``{"kind", "reason", "status",
      "message", "request_id"}``: the error of a call that failed for good,
      or kind ``invalid_request`` for a body that is not a dict or JSON
      object text (never sent);
    * ``llm_attempts`` (int), ``llm_prompt_tokens``,
      ``llm_completion_tokens`` (int or null: what the row was billed over
      all its attempts), ``llm_request_id`` (str).

    Every row comes out once, with its own input columns; Ray keeps the
    rows' order when ``DataContext.get_current().execution_options.preserve_order``
    is set. The returned Dataset is lazy, as any: each consumption (count,
    write, take) runs the calls again, so write it or ``materialize()`` it
    once. Events go to each actor's ``logging.getLogger("llmretry")``
    (configure it with ``ray.init(runtime_env={"worker_process_setup_hook":
    ...})``) unless ``logger=`` says otherwise.

    Raises TypeError or ValueError naming the argument, before anything is
    scheduled: a missing ``body_column``, a bad ``concurrency`` or
    ``limit``, an option the engine refuses; ImportError when Ray Data is
    not installed.
    """
    return _map(ds, "map_calls()", body_column, concurrency, limit, shared, batch_size,
                num_cpus, options, only_failed=False)


def retry_failed(ds: "ray.data.Dataset", *, body_column: str = "body", concurrency: int = 2,
                 limit: int = 64, shared: Optional[str] = None,
                 batch_size: Optional[int] = None, num_cpus: float = 0.25,
                 **options: Any) -> "ray.data.Dataset":
    """The resume of a :func:`map_calls` job: its output (or that output
    read back from Parquet) with the rows whose ``llm_error`` is set called
    again, their seven columns replaced by the new call's, every other row
    as it was. Arguments as :func:`map_calls`; ValueError when ``ds`` lacks
    one of the columns :func:`map_calls` adds."""
    return _map(ds, "retry_failed()", body_column, concurrency, limit, shared, batch_size,
                num_cpus, options, only_failed=True)


def _map(ds: "ray.data.Dataset", where: str, body_column: Any, concurrency: Any, limit: Any,
         shared: Any, batch_size: Any, num_cpus: Any, options: Dict[str, Any],
         only_failed: bool) -> "ray.data.Dataset":
    rd = _ray_data()
    if not isinstance(ds, rd.Dataset):
        raise TypeError(f"{where}: ds must be a ray.data.Dataset, not {type(ds).__name__}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int):
        raise TypeError(f"{where}: concurrency must be an int (the number of actors), "
                        f"not {type(concurrency).__name__}")
    if concurrency < 1:
        raise ValueError(f"{where}: concurrency must be >= 1 (got {concurrency})")
    if batch_size is not None and (isinstance(batch_size, bool)
                                   or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"{where}: batch_size must be an int >= 1 or None (got {batch_size!r})")
    if isinstance(num_cpus, bool) or not isinstance(num_cpus, (int, float)) or num_cpus < 0:
        raise ValueError(f"{where}: num_cpus must be a number >= 0 (got {num_cpus!r})")
    job = make_job(where, body_column, limit, shared, options, only_failed)
    _check_columns(ds, where, job)
    kwargs: Dict[str, Any] = dict(
        fn_constructor_kwargs={"job": job}, batch_format="pyarrow",
        batch_size=batch_size or 4 * job.limit,
        # Two batches queued per actor: the next one is at hand when a batch
        # ends, yet an actor that starts late still finds work.
        compute=rd.ActorPoolStrategy(size=concurrency, max_tasks_in_flight_per_actor=2),
        num_cpus=num_cpus)
    if "udf_modifying_row_count" in inspect.signature(ds.map_batches).parameters:
        # One row out per row in: Ray may then push a limit() before the calls.
        kwargs["udf_modifying_row_count"] = False
    out: "ray.data.Dataset" = ds.map_batches(_CallBatches, **kwargs)
    return out


def _check_columns(ds: Any, where: str, job: Job) -> None:
    """A missing body column (or, to resume, a missing output column) is
    refused on the driver when the schema is known without running
    anything; otherwise the first batch refuses it."""
    schema = ds.schema(fetch_if_missing=False)
    if schema is None:
        return
    names = list(schema.names)
    _check_names(names, where, job)


def _check_names(names: Any, where: str, job: Job) -> None:
    if job.body_column not in names:
        raise ValueError(f"{where}: the dataset has no column {job.body_column!r} "
                         f"(body_column; its columns: {', '.join(map(str, names))})")
    present = [c for c in COLUMNS if c in names]
    if job.only_failed:
        missing = [c for c in COLUMNS if c not in names]
        if missing:
            raise ValueError(f"{where}: the dataset has no column {missing[0]!r}: "
                             f"retry_failed takes the output of map_calls")
    elif present:
        raise ValueError(f"{where}: the dataset already has a column {present[0]!r}: "
                         f"use retry_failed() to run its failed rows again, or drop the "
                         f"llm_* columns")


def _pyarrow() -> Any:
    # Imported by name: the type checker has no stubs for it.
    return importlib.import_module("pyarrow")


def _arrow_type(name: str) -> Any:
    pa = _pyarrow()
    return pa.string() if name in TEXT_COLUMNS else pa.int64()


class _CallBatches:
    """The callable class Ray Data runs in each actor: one Client for the
    actor's life, one ``call_many`` per batch (a pyarrow Table)."""

    def __init__(self, job: Job) -> None:
        self._job = job
        self._client = job.client()

    def __call__(self, table: Any) -> Any:
        """``table``: a pyarrow Table (the batch); the same with the columns."""
        return _call_table(self._client, self._job, table)

    def __repr__(self) -> str:   # never the options: the key is one
        return f"llmretry.ray worker(limit={self._job.limit})"


def _call_table(client: Any, job: Job, table: Any) -> Any:
    """The batch with the output columns: appended (map_calls), or, to
    resume, replaced in the rows that had an error."""
    pa = _pyarrow()
    _check_names(table.column_names, "llmretry.ray", job)
    bodies = table.column(job.body_column)
    if not job.only_failed:
        cols = run_rows(client, job, bodies.to_pylist())
        for name in COLUMNS:
            table = table.append_column(name, pa.array(cols[name], type=_arrow_type(name)))
        return table
    rerun = rows_to_rerun(table.column("llm_error").to_pylist())
    if not rerun:
        return table
    cols = run_rows(client, job, bodies.take(pa.array(rerun, pa.int64())).to_pylist())
    for name in COLUMNS:
        values = table.column(name).to_pylist()
        for k, i in enumerate(rerun):
            values[i] = cols[name][k]
        # Keep the column's own type (large_string read back from Parquet,
        # say) so every block of the Dataset has one schema.
        kind = table.schema.field(name).type
        if pa.types.is_null(kind):
            kind = _arrow_type(name)
        table = table.set_column(table.schema.get_field_index(name), name,
                                 pa.array(values, type=kind))
    return table


def summarize(ds: "ray.data.Dataset") -> Dict[str, Any]:
    """Counts over the output of :func:`map_calls` (or :func:`retry_failed`),
    on the driver: ``rows``, ``ok``, ``failed``, ``attempts``,
    ``prompt_tokens``, ``completion_tokens`` and ``failed_by_kind``
    (``{kind: rows}``). Reads four columns; give it the materialized or
    written output, since a lazy one would run its calls again."""
    rd = _ray_data()
    names = ["llm_error", "llm_attempts", "llm_prompt_tokens", "llm_completion_tokens"]
    # Blocks already in the object store are read as they are (selecting
    # columns would run a task per block); anything else, a Parquet read
    # say, reads just the four columns.
    source = ds if isinstance(ds, rd.dataset.MaterializedDataset) else ds.select_columns(names)
    totals = summary_start()
    batches: Any = source.iter_batches(batch_format="pyarrow", batch_size=None)
    for batch in batches:
        summary_add(totals, batch.column("llm_error").to_pylist(),
                    batch.column("llm_attempts").to_pylist(),
                    batch.column("llm_prompt_tokens").to_pylist(),
                    batch.column("llm_completion_tokens").to_pylist())
    return totals
