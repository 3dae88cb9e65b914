"""What :mod:`llmretry.ray` and :mod:`llmretry.dask` share (issue 29).

A job's arguments are checked once, on the driver, into a :class:`Job`
that is shipped to every worker; a worker runs the rows of one batch (a
Ray batch, a Dask partition) through one ``call_many`` on its own
:class:`~llmretry.Client` and gets back the output columns, one value per
row, in row order. A row never raises: its failure is its ``llm_error``.

Nothing here imports Ray, Dask or pyarrow: ``import llmretry`` must stay
free of them.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ._client import CallOptions, Client, Result
from ._models import _answer_text
from ._options import _unknown_names
from .errors import LLMError

__all__ = ["COLUMNS", "TEXT_COLUMNS", "OPTIONAL_INT_COLUMNS", "Job", "make_job",
           "run_rows", "rows_to_rerun", "client_for", "install_hint", "summary_start",
           "summary_add"]

# The output columns, in the order they are appended (DESIGN.md §16).
COLUMNS: Tuple[str, ...] = ("llm_response", "llm_content", "llm_error", "llm_attempts",
                            "llm_prompt_tokens", "llm_completion_tokens", "llm_request_id")
TEXT_COLUMNS = frozenset({"llm_response", "llm_content", "llm_error", "llm_request_id"})
OPTIONAL_INT_COLUMNS = frozenset({"llm_prompt_tokens", "llm_completion_tokens"})

# The call keywords a job passes to its workers' clients: call_llm's
# (generated from the core's table), which name nothing of the driver's
# process (no client=, no policy=).
_OPTION_NAMES = frozenset(CallOptions.__annotations__)
# One value for every row would make every row the same call to the server.
_PER_ROW = ("request_id", "idempotency_key")

# Request bodies as the engine sends them: the check that a row's dict can
# be sent must refuse what the engine's encoder refuses (NaN included).
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def install_hint(module: str, extra: str) -> ImportError:
    """The ImportError raised when ``module`` (Ray Data, Dask) is missing."""
    return ImportError(f"llmretry.{extra} needs {module}: pip install 'llmretry[{extra}]'")


@dataclass(frozen=True, eq=False)
class Job:
    """A job's checked arguments, as every worker gets them.

    ``options`` are Client defaults for every row's call (the driver's
    ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` filled in when not given);
    ``token`` names the job, so that a worker process keeps one client per
    job (:func:`client_for`). ``only_failed``: run just the rows whose
    ``llm_error`` is set and keep the others' columns (``retry_failed``).
    Its repr shows no option values (the key is one of them).
    """

    body_column: str
    limit: int
    shared: Optional[str]
    options: Dict[str, Any] = field(repr=False)
    only_failed: bool = False
    token: str = field(default_factory=lambda: uuid.uuid4().hex)

    def client(self) -> Client:
        """A new client for this job's calls: at most ``limit`` in flight,
        whatever number of batches share it."""
        return Client(max_in_flight=self.limit, shared=self.shared, **self.options)


def _check_limit(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1 (got {value})")
    return value


def make_job(where: str, body_column: Any, limit: Any, shared: Any,
             options: Dict[str, Any], only_failed: bool = False) -> Job:
    """Check a job's arguments on the driver, before anything is scheduled:
    TypeError/ValueError naming the argument, as a call would raise it."""
    if not isinstance(body_column, str):
        raise TypeError(f"{where}: body_column must be a str (a column name), "
                        f"not {type(body_column).__name__}")
    if not body_column:
        raise ValueError(f"{where}: body_column must not be empty")
    limit = _check_limit("limit", limit)
    if shared is None:
        # The workers' environment is not the driver's: what the driver says
        # goes with the job.
        shared = os.environ.get("LLMRETRY_SHARED") or None
    if shared is not None and not isinstance(shared, str):
        raise TypeError(f"{where}: shared must be a str such as 'shm:NAME' or "
                        f"'redis://host:6379' or None, not {type(shared).__name__}")
    unknown = sorted(set(options) - _OPTION_NAMES)
    if unknown:
        raise TypeError(f"{where} got unexpected keyword argument(s): "
                        f"{_unknown_names(unknown, _OPTION_NAMES)}")
    for name in _PER_ROW:
        if name in options:
            raise ValueError(f"{where}: {name} cannot be given for a whole job "
                             f"(each row's call gets its own)")
    options = dict(options)
    if "url" not in options and "base_url" not in options \
            and os.environ.get("OPENAI_BASE_URL"):
        options["base_url"] = os.environ["OPENAI_BASE_URL"]
    if "api_key" not in options and os.environ.get("OPENAI_API_KEY"):
        options["api_key"] = os.environ["OPENAI_API_KEY"]
    # The engine's own check of every option (names, types, ranges, the
    # shared store's name), by an empty batch on a client made for it:
    # what a worker would refuse is refused here, before any task starts.
    with Client(max_in_flight=limit, shared=shared, **options) as client:
        client.call_many([], limit=limit, logger=None)
    return Job(body_column, limit, shared, options, only_failed)


class _BadBody(Exception):
    """A row whose body cannot be sent (never raised out of run_rows)."""


def _body_of(value: Any, column: str) -> Dict[str, Any]:
    """A row's body as the dict to send, or _BadBody saying why not (never
    quoting it: it holds the prompt)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _BadBody(f"the {column} column holds bytes that are not UTF-8 "
                           f"(byte {exc.start})") from None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            pos = getattr(exc, "pos", None)
            # Dask's dataframe.convert-string (on by default) turns a column
            # of dicts into their str(): say so, it is not the user's doing.
            hint = (": a dict's str(), not JSON (Dask converts object columns to "
                    "strings: store json.dumps(body))"
                    if value.lstrip().startswith("{'") else "")
            raise _BadBody(f"the {column} column holds text that is not JSON"
                           + (f" (at character {pos})" if pos is not None else "")
                           + hint) from None
        if not isinstance(value, dict):
            raise _BadBody(f"the {column} column holds JSON text that is not an object "
                           f"(of type {type(value).__name__})")
    elif isinstance(value, Mapping):
        value = dict(value)
    else:
        what = "null" if value is None else f"a value of type {type(value).__name__}"
        raise _BadBody(f"the {column} column holds {what}, not a dict or JSON object text")
    try:
        _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        # The message names a type or a value like NaN, never the text.
        reason = "it is circular or nested too deeply" if isinstance(
            exc, RecursionError) else str(exc)
        raise _BadBody(f"the {column} column holds a dict that cannot be sent as JSON: "
                       f"{reason}") from None
    body: Dict[str, Any] = value
    return body


def _error_text(kind: str, reason: Optional[str], status: Optional[int], message: str,
                request_id: Optional[str]) -> str:
    return _COMPACT.encode({"kind": kind, "reason": reason, "status": status,
                            "message": message, "request_id": request_id})


def _tokens(usage: Optional[Mapping[str, Any]]) -> Tuple[Optional[int], Optional[int]]:
    if not usage:
        return None, None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (prompt if isinstance(prompt, int) else None,
            completion if isinstance(completion, int) else None)


def _row_of(value: Any) -> Tuple[Any, ...]:
    """The output columns of one call_many slot (a Result or its error)."""
    if isinstance(value, Result):
        data, meta = value.data, value.meta
        try:
            content: Optional[str] = _answer_text(data)
        except ValueError:      # a tool call, a refusal: no text
            content = None
        prompt, completion = _tokens(meta.usage_total or meta.usage)
        return (_COMPACT.encode(data), content, None, meta.attempts, prompt, completion,
                meta.request_id)
    if isinstance(value, LLMError):
        prompt, completion = _tokens(value.usage_total)
        return (None, None, _error_text(value.kind, value.reason, value.status, value.message,
                                        value.request_id),
                value.attempts, prompt, completion, value.request_id)
    # Nothing else is expected in a call_many slot; say what it was rather
    # than fail the whole batch.
    rid = str(uuid.uuid4())
    return (None, None, _error_text("exception", None, None, type(value).__name__, rid),
            0, None, None, rid)


def run_rows(client: Client, job: Job, bodies: Sequence[Any]) -> Dict[str, List[Any]]:
    """One call per body, as one ``call_many`` batch on ``client``: the
    output columns, each a list in row order. A body that cannot be sent is
    that row's ``invalid_request`` error; the other rows run."""
    n = len(bodies)
    cols: Dict[str, List[Any]] = {name: [None] * n for name in COLUMNS}
    sendable: List[Dict[str, Any]] = []
    rows: List[int] = []
    for i, value in enumerate(bodies):
        try:
            sendable.append(_body_of(value, job.body_column))
            rows.append(i)
        except _BadBody as exc:
            # Never sent, yet a row with an id its error and logs can name.
            rid = str(uuid.uuid4())
            _put(cols, i, (None, None, _error_text("invalid_request", None, None, str(exc),
                                                   rid), 0, None, None, rid))
    if sendable:
        results = client.call_many(sendable, limit=job.limit)
        for i, value in zip(rows, results):
            _put(cols, i, _row_of(value))
    return cols


def _put(cols: Dict[str, List[Any]], i: int, row: Tuple[Any, ...]) -> None:
    for name, value in zip(COLUMNS, row):
        cols[name][i] = value


def summary_start() -> Dict[str, Any]:
    """The counts of ``summarize`` before any row."""
    return {"rows": 0, "ok": 0, "failed": 0, "attempts": 0, "prompt_tokens": 0,
            "completion_tokens": 0, "failed_by_kind": {}}


def summary_add(totals: Dict[str, Any], errors: Sequence[Any], attempts: Sequence[Any],
                prompt: Sequence[Any], completion: Sequence[Any]) -> None:
    """Count some rows' output columns into ``totals`` (missing values in
    any engine's spelling: None, NaN, pd.NA)."""
    totals["rows"] += len(errors)
    kinds: Dict[str, int] = totals["failed_by_kind"]
    for e in errors:
        if not isinstance(e, str):
            continue
        totals["failed"] += 1
        try:
            kind = str(json.loads(e).get("kind"))
        except (ValueError, AttributeError):
            kind = "unknown"
        kinds[kind] = kinds.get(kind, 0) + 1
    totals["ok"] = totals["rows"] - totals["failed"]
    for key, values in (("attempts", attempts), ("prompt_tokens", prompt),
                        ("completion_tokens", completion)):
        totals[key] += sum(int(v) for v in values if _is_count(v))


def _is_count(value: Any) -> bool:
    try:
        return value is not None and value == value and int(value) >= 0
    except (TypeError, ValueError):
        return False


def rows_to_rerun(errors: Sequence[Any]) -> List[int]:
    """The rows a ``retry_failed`` pass runs again: those with an
    ``llm_error`` (a missing value in any engine's spelling is no error)."""
    return [i for i, e in enumerate(errors) if isinstance(e, str)]


# ---------------------------------------------------------------------------
# One client per job in a worker process (Dask: no actors to hold one)

_KEEP_IDLE = 4
_clients: "OrderedDict[str, List[Any]]" = OrderedDict()   # token -> [client, users]
_clients_lock = threading.Lock()


class _Using:
    """``with client_for(job) as client``: the worker process's client of
    ``job``, made on first use and shared by the job's batches that run at
    once in this process (one engine, so ``limit`` holds for them all)."""

    def __init__(self, job: Job) -> None:
        self._job = job

    def __enter__(self) -> Client:
        with _clients_lock:
            entry = _clients.get(self._job.token)
            if entry is None or entry[0].closed:
                entry = [self._job.client(), 0]
                _clients[self._job.token] = entry
            _clients.move_to_end(self._job.token)
            entry[1] += 1
            client: Client = entry[0]
            return client

    def __exit__(self, *exc_info: Any) -> None:
        stale = []
        with _clients_lock:
            _clients[self._job.token][1] -= 1
            # An earlier job's client holds an I/O thread and connections:
            # close the least recently used idle ones past a few (a job's
            # next partition would make its client again).
            idle = [token for token, (_, users) in _clients.items() if users == 0]
            for token in idle[:max(0, len(idle) - _KEEP_IDLE)]:
                stale.append(_clients.pop(token)[0])
        for client in stale:
            client.close()


def client_for(job: Job) -> _Using:
    """The context manager giving this process's client of ``job``."""
    return _Using(job)

