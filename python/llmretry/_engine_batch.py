"""A batch's run on the engine (call_many and acall_many): what
Engine.call_many or Engine.batch is given, and each item's value recorded."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _batch
from ._bodies import _core_url, _encode_batch_body, _Encoded, _LazyBodies
from ._options import _INT32_MAX, _Plan
from ._policies import new_idempotency_key
from ._results import _batch_value, _call_extra
from ._tokens import estimate_tokens

if TYPE_CHECKING:
    from ._client import Client


class _EngineBatch:
    """One batch's run on the engine: the arguments of Engine.call_many (or
    Engine.batch, its asyncio form) for the items still to run, and the
    batch record's side of each item as it finishes.

    Every request runs on the engine thread; the host thread only waits,
    delivers events and builds the results, item by item, for the batch's
    record."""

    __slots__ = ("engine", "args", "kwargs", "batch", "_each", "_values", "_stats",
                 "_validator")

    def __init__(self, client: "Client", batch: "_batch.Batch",
                 encoded: Sequence[Tuple[bytes, Optional[str]]], plan: _Plan,
                 limit: int, deadline_ms: Optional[int], adaptive: bool) -> None:
        to_run = batch.runnable
        keep = batch.results is not None
        self.engine = client._engine if client._engine is not None else client._reopen()
        self.batch = batch
        extra, validator = _call_extra(plan, None)
        if plan.auto_key:
            extra["idempotency_keys"] = [new_idempotency_key() for _ in to_run]
        if plan.kwargs.get("tpm"):
            # Under a token budget, tiktoken's count per item when the host
            # has it (0: the core estimates).
            url = _core_url(plan.kwargs)
            tokens = [estimate_tokens(url, encoded[i][0]) for i in to_run]
            if any(tokens):
                extra["estimated_tokens"] = tokens
        self._validator = validator

        # The engine makes each success a Result; what it hands back as an
        # outcome dict (a failure, a body Python cannot parse, a validator's
        # verdict to apply) becomes a value here.
        def item_done(k: int, value: Any) -> None:
            failed = not_started = False
            if type(value) is dict:
                value, failed, not_started = _batch_value(value, validator)
            batch.item_done(to_run[k], value, failed, not_started=not_started)

        # Items are watched one by one only when something wants each one
        # as it finishes (a record, progress, on_result); otherwise the
        # values are recorded once the run ends.
        self._each = batch.needs_each_item()
        every = len(to_run) == len(encoded)     # every item runs: to_run is 0..n-1
        # Recorded at the end with every item run, the values go straight
        # into the batch's own list (record_values then only converts the
        # outcome dicts).
        self._values: Optional[List[Any]] = (
            None if not keep else batch.results if every and not self._each
            else [None] * len(to_run))
        self._stats: Dict[str, int] = {}
        if isinstance(encoded, _Encoded):
            # The lists as they are when every item runs; else the runnable
            # items' entries, read from the lists (not a pair made per item
            # for each of them).
            payloads, models = encoded.payloads, encoded.models
            if not every:
                payloads = [payloads[i] for i in to_run]
                models = [models[i] for i in to_run]
        else:
            payloads = [encoded[i][0] for i in to_run]
            models = [encoded[i][1] for i in to_run]
        self.args = (payloads,)
        # The extension reads limit as a C int: a larger one means the same
        # (no batch has 2**31 calls in flight).
        self.kwargs = dict(models=models,
                           limit=min(limit, _INT32_MAX), batch_deadline_ms=deadline_ms,
                           adaptive=adaptive, on_result=item_done if self._each else None,
                           results=self._values, keep_results=keep, stats=self._stats,
                           as_result=True, **extra, **plan.kwargs)

    def finish(self) -> None:
        """After the run (also when it raised): the totals and, unless each
        item was recorded as it finished, every value."""
        self.batch.add_totals(self._stats)
        if not self._each:
            assert self._values is not None
            validator = self._validator
            self.batch.record_values(self._values, lambda out: _batch_value(out, validator))


class _LazyEngineBatch:
    """_EngineBatch for a batch read lazily: the engine pulls (index, body,
    model, key) from a generator as its pacer wants more (at most its
    submit-ahead window, 4 * limit + 64, unfinished at once), each item
    encoded just then; an item is held (for the failures file) only while
    it is in flight."""

    __slots__ = ("engine", "args", "kwargs", "batch", "_stats")

    def __init__(self, client: "Client", batch: "_batch.Batch", source: _LazyBodies,
                 plan: _Plan, limit: int, deadline_ms: Optional[int], adaptive: bool) -> None:
        self.engine = client._engine if client._engine is not None else client._reopen()
        self.batch = batch
        extra, validator = _call_extra(plan, None)
        auto_key, prep, invalid = plan.auto_key, source.prep, source.invalid
        # index -> item while in flight, for its failures-file line.
        in_flight: Dict[int, Any] = {}
        keep_items = batch.journal is not None

        count_tokens = bool(plan.kwargs.get("tpm"))
        url = _core_url(plan.kwargs)

        def feed() -> Iterator[Tuple[int, bytes, Optional[str], Optional[str], int]]:
            for i, item in enumerate(source.items):
                if not batch.wants(i):
                    continue
                if invalid and i in invalid:
                    batch.item_done(i, invalid[i], True, item=item)
                    continue
                try:
                    body = prep(item)
                    payload, model = _encode_batch_body(body, url)
                except (TypeError, ValueError) as exc:
                    kind = TypeError if isinstance(exc, TypeError) else ValueError
                    raise kind(f"bodies[{i}]: {exc}") from None
                if keep_items:
                    in_flight[i] = item
                yield (i, payload, model, new_idempotency_key() if auto_key else None,
                       estimate_tokens(url, payload) if count_tokens else 0)

        def item_done(i: int, value: Any) -> None:
            failed = not_started = False
            if type(value) is dict:
                value, failed, not_started = _batch_value(value, validator)
            batch.item_done(i, value, failed, not_started=not_started,
                            item=in_flight.pop(i, None))

        self._stats: Dict[str, int] = {}
        self.args = (feed(),)
        self.kwargs = dict(limit=min(limit, _INT32_MAX), batch_deadline_ms=deadline_ms,
                           adaptive=adaptive, on_result=item_done, keep_results=False,
                           stats=self._stats, as_result=True, **extra, **plan.kwargs)

    def finish(self) -> None:
        """After the run (also when it raised): the totals."""
        self.batch.add_totals(self._stats)


def _engine_job(client: "Client", batch: "_batch.Batch",
                encoded: Union[Sequence[Tuple[bytes, Optional[str]]], _LazyBodies],
                plan: _Plan, limit: int, deadline_ms: Optional[int],
                adaptive: bool) -> Union[_EngineBatch, _LazyEngineBatch]:
    """The engine run of a batch, lazy or not."""
    if isinstance(encoded, _LazyBodies):
        return _LazyEngineBatch(client, batch, encoded, plan, limit, deadline_ms, adaptive)
    return _EngineBatch(client, batch, encoded, plan, limit, deadline_ms, adaptive)
