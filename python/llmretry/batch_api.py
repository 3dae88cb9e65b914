"""OpenAI's Batch API behind llmretry's batch shape: half the price for jobs
that can wait up to a day (docs/batch.md, "The Batch API").

::

    out = llmretry.batch_api.run(bodies, failures_path="failed.jsonl")
    out[0].data, out.summary            # as call_many returns them

    job = llmretry.batch_api.submit(bodies, record="job.json")
    job.wait(progress=True)             # polls with backoff; Ctrl-C detaches
    out = job.results()                 # a BatchResult in input order

What it does: check every body (a model each, no stream, one endpoint the
Batch API serves) before anything is sent; group the bodies by model (one
model per batch file, as the API requires) and split each group past
``max_lines`` lines or ``max_bytes`` bytes; for each part upload the file
(``/files``, purpose ``batch``), create the batch (``/batches``, window
``24h``) and write the job's record; poll until every batch ends; download
the output and error files; map each line's ``custom_id`` back to its
index; delete the uploaded and result files (unless ``keep_files``).

Each HTTP call (upload, create, poll, download, cancel, delete) is an
engine call, with its retries, a per-call deadline, events and request id
(llmretry._batch_api_http).

The record (``record=``, default ``failures_path + ".batches"``) is a JSON
file rewritten atomically before each batch is created (``creating``: its
uploaded file), after it is created and after it is collected: the
endpoint, the number of items, and per batch its id, its input file, its
model and its item indices as ranges. A run stopped while a batch was being
created leaves ``creating``: the resumed run adopts the batch the provider
lists for that file, or creates it from the same file. ``resume=True`` with
the same bodies polls the batches the record names instead of submitting
again; those collected by an earlier run are not downloaded again (their
items are ok in the failures file's progress file, or failed there).
"""

from __future__ import annotations

import json
import os
import time
from typing import (Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence,
                    Set, Tuple)

from . import _batch
from ._batch import BatchResult
from ._batch_api_answers import (TERMINAL, LineJudge, checked_batch, line_value, not_run,
                                 parse_lines)
from ._batch_api_http import Api
# _parts and _detach_or_cancel too: the tests reach them here.
from ._batch_api_lines import (ENDPOINTS, _error_of, _fingerprint, _indices,  # noqa: F401
                               _lines_of, _parts)
from ._batch_api_submit import _Submitting
from ._batch_api_wait import (BatchDetached, _detach_or_cancel,  # noqa: F401
                              _interruptible_wait, _say, _sleep)
from ._llmretry import url_shown
from ._logging import DEFAULT
from ._options import _unknown_names
from ._client import Client, _client_or_default
from .errors import LLMError

__all__ = ["run", "submit", "resume", "BatchJob", "BatchAPIError", "BatchDetached",
           "ENDPOINTS", "MAX_LINES", "MAX_BYTES"]

#: The API's limits on one input file.
MAX_LINES = 50_000
MAX_BYTES = 200 * 1024 * 1024
RECORD_VERSION = 1
#: How long wait()'s polls look for a create made late (_look_for_late_twins).
TWIN_LOOK_S = 600.0

Progress = Callable[[int, Optional[int], int], None]


class BatchAPIError(LLMError):
    """A batch that failed as a whole (its input did not validate, the
    record does not match the input): the message names the batch and,
    when the API says, the input line."""

    kind = "batch_failed"


# ---------------------------------------------------------------------------
# Results: what each output and error line becomes, and the server's answers
# checked before use, are _batch_api_answers.py.


# ---------------------------------------------------------------------------
# The job


class BatchJob(_Submitting):
    """Batches at the provider for one input, and their record.

    Made by :func:`submit` or :func:`resume`. ``batch_ids`` names them;
    :meth:`status` looks once, :meth:`wait` polls until they end,
    :meth:`cancel` cancels them, :meth:`results` collects what they did.
    Submitting (upload, create, adoption, twins) is _batch_api_submit's.
    """

    def __init__(self, api: Api, bodies: Sequence[Any], lines: List[bytes], cids: List[str],
                 models: List[str], endpoint: str, record_path: Optional[str],
                 doc: Dict[str, Any], options: Dict[str, Any]) -> None:
        self.api = api
        self.bodies = bodies
        self.lines = lines
        self.cids = cids
        self.models = models
        self.endpoint = endpoint
        self.record_path = record_path
        self.doc = doc
        self.options = options
        self.last: Dict[str, Dict[str, Any]] = {}
        self._told: Set[str] = set()
        self._look_until = time.monotonic() + TWIN_LOOK_S

    @property
    def batch_ids(self) -> List[str]:
        return [b["id"] for b in self.doc["batches"]]

    def __repr__(self) -> str:
        return (f"BatchJob(batches={self.batch_ids!r}, items={len(self.lines)}, "
                f"endpoint={self.endpoint!r})")

    def _save(self) -> None:
        if self.record_path is None:
            return
        path, fh = _batch.temp_beside(self.record_path)
        with fh:
            fh.write(json.dumps(self.doc, indent=1).encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(path, self.record_path)

    # -- looking -----------------------------------------------------------------

    def _fetch(self, batch_id: str) -> Dict[str, Any]:
        """GET one batch, its fields checked (_batch_api_answers)."""
        doc = checked_batch(self.api.get_json(f"/batches/{batch_id}"), batch_id)
        self.last[batch_id] = doc
        return doc

    def status(self) -> Dict[str, Any]:
        """Retrieve each batch not known to be over: ``{"status": overall,
        "batches": [the API's Batch objects], "request_counts": {total,
        completed, failed}}``; the overall status is ``in_progress`` while
        any batch runs, else ``completed`` when all completed, else the
        first other end (failed, expired, cancelled)."""
        out = []
        for rec in self.doc["batches"]:
            known = self.last.get(rec["id"])
            if known is None or known.get("status") not in TERMINAL:
                known = self._fetch(rec["id"])
            out.append(known)
        counts = {"total": 0, "completed": 0, "failed": 0}
        for b in out:
            for k in counts:
                counts[k] += b["request_counts"][k]
        statuses = [b.get("status") for b in out]
        if any(s not in TERMINAL for s in statuses):
            overall = "in_progress"
        else:
            overall = next((str(s) for s in statuses if s != "completed"), "completed")
        return {"status": overall, "batches": out, "request_counts": counts}

    def wait(self, progress: Any = None, poll_interval_ms: Optional[int] = None,
             max_poll_interval_ms: Optional[int] = None) -> Dict[str, Any]:
        """Poll until every batch has ended, waiting longer between polls
        (x1.5 up to the cap); the last :meth:`status`. ``progress``: True
        for a bar on stderr, or a callable (done, total, failed) fed the
        batches' ``request_counts``."""
        first = poll_interval_ms if poll_interval_ms is not None else \
            self.options.get("poll_interval_ms", 5000)
        cap = max_poll_interval_ms if max_poll_interval_ms is not None else \
            self.options.get("max_poll_interval_ms", 60000)
        bar = _batch.ProgressBar(desc="llmretry batch-api") if progress is True else None
        report = bar if bar is not None else (progress if callable(progress) else None)
        delay = first / 1000.0
        try:
            if bar is not None:
                bar.start(len(self.lines))
            while True:
                st = self.status()
                rc = st["request_counts"]
                if report is not None:
                    report(rc["completed"] + rc["failed"], rc["total"] or len(self.lines),
                           rc["failed"])
                ended = st["status"] != "in_progress"
                self._look_for_late_twins(ended)
                if ended:
                    return st
                _sleep(delay)
                delay = min(delay * 1.5, cap / 1000.0)
        finally:
            if bar is not None:
                bar.close()

    def cancel(self, wait: bool = True, find_created_ms: int = 10_000) -> Dict[str, Any]:
        """Cancel every batch still running and (``wait``) poll until each
        has ended (``cancelled``, or another end it reached first).

        A batch being created when the run stopped (a Ctrl-C while
        submitting, a create that timed out) is cancelled too once the
        provider lists it. A provider may make it after its answer was
        given up on, so with ``wait`` it is looked for again (every poll
        interval, at most a second apart) until found or ``find_created_ms``
        has passed (not again at a server with no batch list); without,
        once. One not found stays in the record (``creating``, see
        :attr:`creating_file_id`)."""
        if isinstance(find_created_ms, bool) or not isinstance(find_created_ms, int) \
                or find_created_ms < 0:
            raise ValueError(f"find_created_ms must be an integer >= 0, not {find_created_ms!r}")
        end = time.monotonic() + find_created_ms / 1000.0
        self._adopt_creating()
        self._cancel_each(self.doc["batches"])
        if not wait:
            return self.status()
        look = min(self.options.get("poll_interval_ms", 5000), 1000) / 1000.0
        while self.doc.get("creating") is not None and time.monotonic() < end \
                and self.api.has_list:
            _sleep(min(look, end - time.monotonic()))
            if self._adopt_creating():
                self._cancel_each(self.doc["batches"][-1:])
        return self.wait()

    def _cancel_each(self, recs: List[Dict[str, Any]]) -> None:
        for rec in recs:
            known = self.last.get(rec["id"])
            if known is not None and known.get("status") in TERMINAL:
                continue
            doc = self._post_cancel(rec["id"])
            if doc is None:
                self.last.pop(rec["id"], None)
            else:
                self.last[rec["id"]] = doc

    # -- collecting ----------------------------------------------------------------

    def _download(self, file_id: Optional[str]) -> Tuple[List[Dict[str, Any]], int]:
        """A result file's lines that are JSON objects, and how many others."""
        if not file_id:
            return [], 0
        return parse_lines(self.api.get_text(f"/files/{file_id}/content"))

    def _collect_one(self, rec: Dict[str, Any], emit: Callable[[int, Any, bool], None],
                     keep_files: bool) -> List[int]:
        """Download one ended batch, emit its items; the indices it left
        unanswered or failed (for then_realtime)."""
        batch = self.last.get(rec["id"]) or self._fetch(rec["id"])
        status = batch["status"]
        indices = _indices(rec["ranges"])
        by_cid = {self.cids[i]: i for i in indices}
        answered = set()
        failed: List[int] = []
        unreadable = 0
        judge = LineJudge(self.api.url_of(self.endpoint[len("/v1"):]), self.api.api_key,
                          self.api.headers, self.lines, indices)
        for file_id in (batch["output_file_id"], batch["error_file_id"]):
            lines, bad_lines = self._download(file_id)
            unreadable += bad_lines
            for line in lines:
                cid = line.get("custom_id")
                i = by_cid.get(cid) if isinstance(cid, str) else None
                if i is None or i in answered:
                    continue
                answered.add(i)
                value, bad = line_value(line, self.models[i], status, judge, i)
                if bad:
                    failed.append(i)
                emit(i, value, bad)
        for i in indices:
            if i not in answered:
                failed.append(i)
                emit(i, not_run(status, batch, rec["id"], self.models[i], judge, unreadable), True)
        if not keep_files:
            for key in ("output_file_id", "error_file_id"):
                if batch.get(key):
                    self.api.delete_file(batch[key])
            self.api.delete_file(rec["input_file_id"])
        rec["collected"] = True
        rec["status"] = status
        self._save()
        return failed

    def results(self, *, failures_path: Any = None, resume: bool = False,
                then_realtime: bool = False, keep_files: Optional[bool] = None,
                logger: Any = DEFAULT,
                batch: Optional[_batch.Batch] = None, already_ok: Any = None,
                **realtime: Any) -> BatchResult:
        """Collect every ended batch into a BatchResult in input order (the
        type call_many returns): each slot a Result, or the item's error
        (an HTTP status the batch met, ``batch_expired``,
        ``batch_cancelled``, :class:`BatchAPIError` for a batch that failed
        validation), or SKIPPED for an item an earlier run collected.
        ``failures_path`` keeps call_many's failures file; ``then_realtime``
        sends the failed items through call_many (``realtime`` its options)
        in the same run; the files are deleted unless ``keep_files``."""
        if keep_files is None:
            keep_files = bool(self.options.get("keep_files", False))
        running = [rec["id"] for rec, b in zip(self.doc["batches"], self.status()["batches"])
                   if b["status"] not in TERMINAL]
        if running:
            raise RuntimeError(f"batches still running: {', '.join(running)} "
                               f"(wait() for them first)")
        if batch is None:
            batch = _batch.Batch(list(self.bodies), failures_path=failures_path,
                                 resume=resume, logger=logger)
        old: Dict[int, Dict[str, Any]] = {}
        path = batch.journal.path if batch.journal is not None else None
        if batch.resume and path is not None and os.path.exists(path):
            old = _batch.read_failures(path)
        with batch:
            batch.open(already_ok)
            pending = set(batch.to_run)
            retry: List[int] = []

            def emit(i: int, value: Any, failed: bool) -> None:
                if i not in pending:
                    return
                if failed and then_realtime:
                    retry.append(i)
                    return
                if not failed:
                    batch.acc.add(1, 0, value.meta.usage)
                pending.discard(i)
                batch.item_done(i, value, failed)

            for rec in self.doc["batches"]:
                if rec.get("collected"):
                    # An earlier run's: its failed items are in the old failures file.
                    for i in _indices(rec["ranges"]):
                        if i in pending:
                            emit(i, _error_of(old.get(i, {})), True)
                    continue
                self._collect_one(rec, emit, keep_files)
            if retry:
                self._realtime(sorted(retry), batch, pending, realtime)
        return batch.result()

    def _realtime(self, indices: List[int], batch: _batch.Batch, pending: Set[int],
                  options: Dict[str, Any]) -> None:
        """The items the batches failed, through call_many."""
        api = self.api
        opts = dict(options)
        if "url" not in opts:
            opts.pop("base_url", None)      # the batch's endpoint, on the batch's base URL
        opts.setdefault("url", api.url_of(self.endpoint[len("/v1"):]))
        opts.setdefault("api_key", api.api_key)
        if api.headers:
            opts.setdefault("headers", api.headers)
        limit = opts.pop("limit", 8)
        bodies = [json.loads(self.lines[i])["body"] for i in indices]
        opts.setdefault("logger", api.logger)
        out = api.client.call_many(bodies, limit, **opts)
        batch.acc.merge(_accounting_of(out.summary))
        for i, value in zip(indices, out):
            pending.discard(i)
            batch.item_done(i, value, isinstance(value, BaseException))


def _accounting_of(summary: _batch.BatchSummary) -> _batch.Accounting:
    acc = _batch.Accounting()
    acc.add(summary.attempts, summary.retries, {
        "prompt_tokens": summary.prompt_tokens, "completion_tokens": summary.completion_tokens,
        "total_tokens": summary.total_tokens}, summary.resends)
    return acc


# ---------------------------------------------------------------------------
# Entry points

_API_OPTIONS = ("base_url", "api_key", "headers", "timeout_ms", "max_retries", "base_delay_ms",
                "max_delay_ms", "jitter", "max_retry_after_ms", "call_deadline_ms")
_JOB_OPTIONS = ("poll_interval_ms", "max_poll_interval_ms", "keep_files")


def _prepare(bodies: Iterable[Any], endpoint: Optional[str], client: Optional[Client],
             record: Any, failures_path: Any, options: Dict[str, Any]
             ) -> Tuple[Api, List[Any], str, List[bytes], List[str], List[str],
                        Optional[str], Dict[str, Any]]:
    known = _API_OPTIONS + _JOB_OPTIONS + ("logger",)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"unknown option(s) {_unknown_names(unknown, known)} (known: "
                        f"{', '.join(sorted(known))})")
    items = list(bodies)
    ep, lines, cids, models = _lines_of(items, endpoint)
    if record is None and failures_path is not None:
        record = os.fspath(failures_path) + ".batches"
    record_path = None if record is None else os.fspath(record)
    api = Api(_client_or_default(client), options.get("base_url"), options.get("api_key"),
              options.get("headers"), {k: options.get(k) for k in _API_OPTIONS[3:]},
              options.get("logger", DEFAULT))
    job_opts = {k: options[k] for k in _JOB_OPTIONS if k in options}
    return api, items, ep, lines, cids, models, record_path, job_opts


def submit(bodies: Iterable[Any], *, endpoint: Optional[str] = None,
           client: Optional[Client] = None, record: Any = None, failures_path: Any = None,
           metadata: Optional[Mapping[str, str]] = None, max_lines: int = MAX_LINES,
           max_bytes: int = MAX_BYTES, **options: Any) -> BatchJob:
    """Check the bodies, upload them and create their batches: a BatchJob.

    ``endpoint``: the bodies' (``"/v1/chat/completions"``, the default;
    ``"/v1/embeddings"``, ``"/v1/responses"``, ``"/v1/completions"``, or
    their short names). An item may be a batch line ``{"custom_id", "body",
    "url"?}``, its custom id kept. ``record``: where the job's record goes
    (default ``failures_path + ".batches"``; none: the job cannot be resumed
    by another process). ``max_lines``, ``max_bytes``: one input file's
    limits (the API's by default). ``options``: ``base_url``, ``api_key``,
    ``headers``, the retry options of each HTTP call (``timeout_ms``,
    ``max_retries``, ``base_delay_ms``, ``max_delay_ms``, ``jitter``,
    ``max_retry_after_ms``, ``call_deadline_ms``), ``poll_interval_ms``,
    ``max_poll_interval_ms``, ``keep_files``, ``logger``.
    """
    job = _new_job(bodies, endpoint=endpoint, client=client, record=record,
                   failures_path=failures_path, metadata=metadata, max_lines=max_lines,
                   max_bytes=max_bytes, **options)
    job._submit()
    return job


def _new_job(bodies: Iterable[Any], *, endpoint: Optional[str] = None,
             client: Optional[Client] = None, record: Any = None, failures_path: Any = None,
             metadata: Optional[Mapping[str, str]] = None, max_lines: int = MAX_LINES,
             max_bytes: int = MAX_BYTES, **options: Any) -> BatchJob:
    """submit's job, its bodies checked, nothing sent yet."""
    if max_lines < 1 or max_bytes < 1:
        raise ValueError("max_lines and max_bytes must be positive")
    api, items, ep, lines, cids, models, record_path, job_opts = _prepare(
        bodies, endpoint, client, record, failures_path, options)
    _parts(lines, models, max_lines, max_bytes)     # a line too big: refused now
    doc: Dict[str, Any] = {"llmretry_batch_api": RECORD_VERSION, "items": len(lines),
                           "endpoint": ep, "base_url": url_shown(api.base_url),
                           "input_sha256": _fingerprint(cids, lines), "batches": [],
                           "max_lines": max_lines, "max_bytes": max_bytes}
    if metadata:
        doc["metadata"] = dict(metadata)
    return BatchJob(api, items, lines, cids, models, ep, record_path, doc, job_opts)


def resume(bodies: Iterable[Any], *, record: Any = None, failures_path: Any = None,
           endpoint: Optional[str] = None, client: Optional[Client] = None,
           **options: Any) -> BatchJob:
    """The BatchJob of an earlier run's record, for the same bodies
    (ValueError when the record is of another input). The items no batch
    of the record holds (a run stopped while submitting) are submitted."""
    job = _load_job(bodies, record=record, failures_path=failures_path, endpoint=endpoint,
                    client=client, **options)
    job._submit()
    return job


def _load_job(bodies: Iterable[Any], *, record: Any = None, failures_path: Any = None,
              endpoint: Optional[str] = None, client: Optional[Client] = None,
              **options: Any) -> BatchJob:
    """resume's job, nothing sent yet."""
    api, items, ep, lines, cids, models, record_path, job_opts = _prepare(
        bodies, endpoint, client, record, failures_path, options)
    if record_path is None:
        raise ValueError("resume needs record (or failures_path) to find the batches")
    with open(record_path, encoding="utf-8") as fh:
        doc = json.load(fh)
    if not isinstance(doc, dict) or doc.get("llmretry_batch_api") != RECORD_VERSION:
        raise ValueError(f"{record_path}: not a batch API job record")
    if doc.get("items") != len(lines) or doc.get("input_sha256") != _fingerprint(cids, lines) \
            or doc.get("endpoint") != ep:
        raise ValueError(f"{record_path}: the record is of another input (the items, "
                         f"their bodies or the endpoint differ)")
    return BatchJob(api, items, lines, cids, models, ep, record_path, doc, job_opts)


def run(bodies: Iterable[Any], *, endpoint: Optional[str] = None,
        client: Optional[Client] = None, record: Any = None, failures_path: Any = None,
        resume: bool = False, then_realtime: bool = False, keep_files: bool = False,
        progress: Any = False, metadata: Optional[Mapping[str, str]] = None,
        max_lines: int = MAX_LINES, max_bytes: int = MAX_BYTES, cancel_grace_s: float = 3.0,
        realtime: Optional[Mapping[str, Any]] = None, _batch_obj: Any = None,
        **options: Any) -> BatchResult:
    """Run the bodies through the Batch API and return a BatchResult in input
    order, as call_many does (see :func:`submit` for the options).

    ``failures_path`` and ``resume``: call_many's failures file, and the
    record beside it (``record``); with ``resume=True`` and a record, the
    batches it names are polled and collected instead of new ones.
    ``then_realtime``: the items the batches failed (expired, cancelled,
    a failed batch, an error status) go through call_many in the same run
    (``realtime``: its options, e.g. ``limit``). ``keep_files``: leave the
    uploaded and result files at the provider. ``progress``: as call_many's,
    fed by the batches' request counts. Ctrl-C while waiting raises
    :class:`BatchDetached` (the batches go on); a second Ctrl-C within
    ``cancel_grace_s`` cancels them and waits for them to end."""
    items = list(bodies)
    rec_path = record if record is not None else (
        None if failures_path is None else os.fspath(failures_path) + ".batches")
    if resume and rec_path is not None and os.path.exists(rec_path):
        job = _load_job(items, record=rec_path, endpoint=endpoint, client=client,
                        keep_files=keep_files, **options)
    else:
        job = _new_job(items, endpoint=endpoint, client=client, record=rec_path,
                       metadata=metadata, max_lines=max_lines, max_bytes=max_bytes,
                       keep_files=keep_files, **options)
    _interruptible_wait(job, progress, cancel_grace_s, _say)
    return job.results(failures_path=failures_path, resume=resume and failures_path is not None,
                       then_realtime=then_realtime, keep_files=keep_files,
                       logger=options.get("logger", DEFAULT), batch=_batch_obj,
                       **dict(realtime or {}))
