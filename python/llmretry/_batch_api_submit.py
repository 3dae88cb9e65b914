"""Getting a job's items into batches at the provider, each exactly once
(llmretry.batch_api's BatchJob takes these methods from _Submitting).

Each part is uploaded, recorded as ``creating`` (its uploaded file), then
created and recorded as a batch. A run stopped between the two leaves a
batch the provider may run: the resumed run adopts it from ``GET /batches``
instead of paying for it twice. One create may also make two batches (an
attempt whose answer was lost, retried by llmretry or by a gateway on the
way, at a provider that does not honour the idempotency key): after each
create, and when adopting, the batches made from the file are read back and
all but one cancelled, with a RuntimeWarning naming them.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ._batch_api_answers import TERMINAL, checked_batch, plain_id
from ._batch_api_http import Api
from ._batch_api_lines import _indices, _parts, _ranges
from .errors import HTTPStatusError, LLMError


class _Submitting:
    """The submitting half of BatchJob (its state is BatchJob's)."""

    api: Api
    lines: List[bytes]
    models: List[str]
    endpoint: str
    record_path: Optional[str]
    doc: Dict[str, Any]
    last: Dict[str, Dict[str, Any]]
    _save: Callable[[], None]       # the record rewritten
    _told: Set[str]                 # the twins warned of (ids), each once
    _look_until: float              # until when wait()'s polls look (monotonic s)

    def _unsubmitted(self) -> List[int]:
        """The items no batch of the record holds."""
        covered = {i for rec in self.doc["batches"] for i in _indices(rec["ranges"])}
        return [i for i in range(len(self.lines)) if i not in covered]

    def _submit(self) -> None:
        """Upload and create the batches of the items no batch of the record
        holds. Each part is recorded as ``creating`` (its uploaded file)
        before its batch is created, and as a batch once created: a run
        stopped between the two leaves a batch the provider may run, which a
        resumed run adopts (:meth:`_recover`) instead of paying for twice."""
        doc, api = self.doc, self.api
        if doc.get("creating") is not None:
            self._recover(doc["creating"])
        parts = _parts(self.lines, self.models, doc["max_lines"], doc["max_bytes"],
                       self._unsubmitted())
        self._save()        # the record before the first upload: resume finds it
        for model, part in parts:
            data = b"\n".join(self.lines[i] for i in part) + b"\n"
            f = api.upload(f"llmretry-batch-{len(doc['batches'])}.jsonl", data)
            created = f.get("created_at")
            self._create({"input_file_id": f["id"], "model": model, "ranges": _ranges(part),
                          "file_created_at": created if type(created) is int else None})

    def _create(self, entry: Dict[str, Any]) -> None:
        """Create the batch of one uploaded part, recorded before and after."""
        self.doc["creating"] = entry
        self._save()
        create: Dict[str, Any] = {"input_file_id": entry["input_file_id"],
                                  "endpoint": self.endpoint, "completion_window": "24h"}
        if self.doc.get("metadata"):
            create["metadata"] = self.doc["metadata"]
        self._created(entry, self.api.post_json(
            "/batches", create, idempotency_key=f"llmretry-{entry['input_file_id']}"))
        # One create may have made more than one batch: an attempt whose
        # answer was lost, retried by us or by a gateway on the way (LiteLLM's
        # proxy retries a 503 itself), at a provider that does not honour
        # the idempotency key. Each is billed, and nobody collects the others.
        kept = self.doc["batches"][-1]["id"]
        try:
            made = self._made_from(entry)
        except LLMError:
            return          # a list that cannot be read: only a check
        self._cancel_twins(entry["input_file_id"], kept, [b for b in made if b.get("id") != kept])

    def _created(self, entry: Dict[str, Any], batch: Dict[str, Any]) -> None:
        bid = plain_id(batch.get("id"), "POST /batches: the batch id")
        self.doc["batches"].append({"id": bid, "input_file_id": entry["input_file_id"],
                                    "model": entry["model"], "ranges": entry["ranges"],
                                    "file_created_at": entry.get("file_created_at"),
                                    "collected": False})
        self.doc["creating"] = None
        self._save()
        self.last[bid] = checked_batch(batch, bid)

    def _adopt_created(self, entry: Any) -> bool:
        """Whether the provider lists a batch made from the file of the part
        an earlier run (or this one, stopped) was creating the batch of:
        that batch, adopted (recorded, ``creating`` cleared). Of several
        (a create retried after its answer was lost), the first made is
        adopted and the others cancelled."""
        found = self._made_from(entry)
        if not found:
            return False
        first, *twins = found[::-1]
        self._created(entry, first)
        self._cancel_twins(entry["input_file_id"], self.doc["batches"][-1]["id"], twins)
        return True

    def _made_from(self, entry: Any) -> List[Dict[str, Any]]:
        """The batches the provider lists made from a ``creating`` entry's
        file, the newest first."""
        fid, since = self._creating_file(entry)
        return self._listed_from({fid: since})[fid]

    def _listed_from(self, files: Dict[str, Any]) -> Dict[str, List[Dict[str, Any]]]:
        """The batches the provider lists made from each file of ``files``
        (file id: its upload time, None when unknown), the newest first.
        The list is read back to the oldest upload at most (the newest
        first), a bounded number of pages."""
        found: Dict[str, List[Dict[str, Any]]] = {fid: [] for fid in files}
        times = list(files.values())
        since = min(times) if all(type(t) is int for t in times) else None
        for b in self.api.listed_batches():
            if not isinstance(b, dict):
                continue
            fid = b.get("input_file_id")
            if isinstance(fid, str) and fid in found:
                found[fid].append(b)
            made = b.get("created_at")
            if since is not None and type(made) is int and made < since:
                break
        return found

    def _look_for_late_twins(self, ended: bool) -> None:
        """At each of BatchJob.wait's polls: cancel what the provider made
        of the job's files besides the batches the record keeps, found after
        the check that followed each create: an attempt given up on that the
        provider made later (a slow provider, a gateway's late retry). It
        looks while the job runs (the polls in its first TWIN_LOOK_S) and
        once when it has ``ended``: a twin that ran to its end was billed,
        and the warning says so. Each twin is told of once."""
        recs = self.doc["batches"]
        if not recs or not self.api.has_list or not (ended or time.monotonic() < self._look_until):
            return
        try:
            listed = self._listed_from({r["input_file_id"]: r.get("file_created_at")
                                        for r in recs})
        except LLMError:
            # Only a check: the job's own batches are not at stake. A list
            # that failed (after its retries) is not asked for at each poll
            # again, where its retries would hold the polls up: at the end.
            self._look_until = 0.0
            return
        kept = {r["id"] for r in recs}
        for fid, made in listed.items():
            # (An id that is no string is no batch this job can cancel, nor
            # a key of these sets: the check after the create names it.)
            twins = [b for b in made if isinstance(b.get("id"), str) and b["id"] not in kept
                     and b["id"] not in self._told
                     and b.get("status") not in ("cancelling", "cancelled")]
            if twins:
                self._cancel_twins(fid, next(r["id"] for r in recs if r["input_file_id"] == fid),
                                   twins)

    def _cancel_twins(self, fid: str, kept: str, twins: List[Dict[str, Any]]) -> None:
        """Cancel the batches made from a part's file besides the one the
        record keeps, with a warning naming them (those that had ended, and
        any whose cancel failed: the job goes on)."""
        if not twins:
            return
        cancelled, ended, failed = [], [], []
        for b in twins:
            try:
                bid = plain_id(b.get("id"), "GET /batches: a batch id")
                self._told.add(bid)
                if b.get("status") in TERMINAL:
                    ended.append(f"{bid} ({b['status']})")
                elif self._post_cancel(bid) is None:
                    ended.append(f"{bid} (ended)")
                else:
                    cancelled.append(bid)
            except LLMError as exc:
                failed.append(f"{b.get('id')!r} ({exc})")
        warnings.warn(f"batch API: {len(twins) + 1} batches were made of file {fid} (a create "
                      f"retried on its way, by this client or a gateway); kept {kept}"
                      + (f", cancelled {', '.join(cancelled)}" if cancelled else "")
                      + (f", too late to cancel {', '.join(ended)}" if ended else "")
                      + (f", could not cancel {'; '.join(failed)}" if failed else ""),
                      RuntimeWarning, stacklevel=2)

    def _creating_file(self, entry: Any) -> Tuple[str, Any]:
        """The file id and upload time of a ``creating`` entry of the record
        (ValueError when this version did not write it)."""
        try:
            if not isinstance(entry, dict) or "ranges" not in entry or "model" not in entry:
                raise TypeError
            fid = plain_id(entry.get("input_file_id"), "the record's creating input_file_id")
        except (TypeError, LLMError):
            raise ValueError(f"{self.record_path}: the record's 'creating' entry is not "
                             f"one this version wrote: {entry!r}") from None
        return fid, entry.get("file_created_at")

    def _recover(self, entry: Dict[str, Any]) -> None:
        """The part an earlier run uploaded and was creating the batch of
        when it stopped: the batch the provider made of it (created, its
        answer lost), else a batch created now from the same file."""
        if self._adopt_created(entry):
            return
        try:
            self._create(entry)
        except HTTPStatusError as exc:
            if exc.status not in (400, 404):
                raise
            # The file is gone (deleted, expired): its items are uploaded again.
            self.doc["creating"] = None
            self._save()

    @property
    def creating_file_id(self) -> Optional[str]:
        """The input file of a batch whose create was cut off and that the
        provider has not listed yet (None when there is none): the
        provider may still have made it."""
        entry = self.doc.get("creating")
        return self._creating_file(entry)[0] if entry is not None else None

    def _adopt_creating(self) -> bool:
        """Whether a ``creating`` entry's batch was found (and recorded)."""
        entry = self.doc.get("creating")
        return entry is not None and self._adopt_created(entry)

    def _post_cancel(self, batch_id: str) -> Optional[Dict[str, Any]]:
        """Cancel one batch: the Batch object, None when it had ended."""
        try:
            return checked_batch(self.api.post_json(f"/batches/{batch_id}/cancel", {}),
                                 batch_id)
        except HTTPStatusError as exc:
            if exc.status not in (400, 409):    # it ended meanwhile
                raise
            return None
