"""Client's batch half (call_many, and the batch API's realtime items):
its arguments checked and converted before any I/O, and a batch run as one
engine group. Client (_client.py) inherits it."""

from __future__ import annotations

import inspect
import os
import warnings
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, Mapping, Optional,
                    Sequence, Sized, Tuple, Union, cast)

from . import _batch, _engine_batch
from ._batch import BatchResult
from ._bodies import _batch_items, _core_url, _encode_bodies, _LazyBodies
from ._logging import DEFAULT
from ._options import (_INT32_MAX, Body, _bool, _check_batch_options, _check_option_names,
                       _int_option, _opt_int_option, _Plan, _PolicyPlan, _type_name)

if TYPE_CHECKING:
    from ._client import Client


def _as_given(body: Any) -> Any:
    """A lazy batch's prep when nothing changes its items."""
    return body


class _ClientBatches:
    """The batch methods of Client (what they read of it is declared below)."""

    if TYPE_CHECKING:
        _max_in_flight: int
        _defaults: Dict[str, Any]
        _plan: _Plan

        def _policy_plan(self, name: Any) -> _PolicyPlan: ...

    def _many(self, bodies: Iterable[Body], limit: int, options: Dict[str, Any], where: str, *,
              # BEGIN GENERATED many-keywords (tools/gen_surface.py's BATCH_KEYWORDS: do not edit)
              deadline_ms: Optional[int] = None,
              call_deadline_ms: Optional[int] = DEFAULT,
              failures_path: Optional[Union[str, "os.PathLike[str]"]] = None,
              resume: bool = False,
              progress: Union[bool, Callable[[int, int, int], Any]] = False,
              adaptive: bool = True,
              on_result: Optional[Callable[[int, Any], Any]] = None,
              policy: Optional[str] = None,
              keep_results: bool = True,
              # END GENERATED many-keywords
              ) -> Tuple[Any, ...]:
        """call_many's arguments checked and converted (before any I/O): the
        arguments of _run_batch."""
        _check_option_names(options, where, _MANY_KEYWORDS)
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit must be an int, not {_type_name(limit)}")
        if limit < 1:
            raise ValueError(f"limit must be >= 1 (got {limit})")
        if limit > self._max_in_flight:
            # The engine's cap on calls at once (file descriptors, memory)
            # holds for batches too: say so rather than run fewer silently.
            warnings.warn(
                f"{where[:-2]}(limit={limit}) on a Client whose max_in_flight is "
                f"{self._max_in_flight}: at most {self._max_in_flight} calls run at once; "
                f"use Client(max_in_flight={min(limit, _INT32_MAX)}) (and pass client=) for more",
                RuntimeWarning, stacklevel=3)
        batch_deadline = _opt_int_option("deadline_ms", deadline_ms)
        if batch_deadline is not None and batch_deadline < 0:
            raise ValueError(f"deadline_ms must be >= 0 or None (got {batch_deadline})")
        adaptive = _bool("adaptive", adaptive)
        if call_deadline_ms is not DEFAULT:
            # Checked under its own name: "deadline_ms" is the batch's.
            if call_deadline_ms is not None:
                call_deadline_ms = _int_option("call_deadline_ms", call_deadline_ms)
                if call_deadline_ms < 0:
                    raise ValueError(f"call_deadline_ms must be >= 0 or None "
                                     f"(got {call_deadline_ms})")
            options["deadline_ms"] = call_deadline_ms
        items = _batch_items(bodies)
        logger = options.get("logger", self._defaults.get("logger", DEFAULT))
        if not isinstance(items, Iterator):
            # A list or tuple: every body encoded and checked before any call.
            plan, sent = self._batch_plan(policy, options, items)
            encoded: Any = _encode_bodies(sent, _core_url(plan.kwargs))
            batch = _batch.Batch(items, failures_path=failures_path, resume=resume,
                                 progress=progress, on_result=on_result, logger=logger,
                                 parse_items=True, keep_results=keep_results)
        else:
            # Any other iterable: each item read, encoded and checked just
            # before it is submitted (_LazyEngineBatch).
            plan, prep = self._batch_prep(policy, options)
            encoded = _LazyBodies(items, prep)
            batch = _batch.Batch(None, failures_path=failures_path, resume=resume,
                                 progress=progress, on_result=on_result, logger=logger,
                                 parse_items=True, keep_results=keep_results,
                                 n=len(bodies) if isinstance(bodies, Sized) else None)
        return batch, encoded, plan, limit, batch_deadline, adaptive

    def _batch_prep(self, policy: Any,
                    options: Dict[str, Any]) -> Tuple[_Plan, Callable[[Any], Any]]:
        """The plan of a batch's calls, and what makes each item the body
        sent (the policy's model filled in); ValueError for an unknown
        policy."""
        if policy is None:
            plan = self._plan.with_options(options.items()) if options else self._plan
            _check_batch_options(plan.kwargs)
            return plan, _as_given
        pp = self._policy_plan(policy)
        plan = pp.plan.with_options(options.items()) if options else pp.plan
        if pp.auto_key and "idempotency_key" not in options:
            plan = _Plan(plan.kwargs, plan.validate, plan.event_mask, auto_key=True)
        _check_batch_options(plan.kwargs)
        return plan, _as_given if pp.model is None else pp.body

    def _batch_plan(self, policy: Any, options: Dict[str, Any],
                    items: Sequence[Any]) -> Tuple[_Plan, Sequence[Any]]:
        """_batch_prep for a listed batch: the plan and the bodies to send."""
        plan, prep = self._batch_prep(policy, options)
        return plan, items if prep is _as_given else [prep(body) for body in items]

    def _run_batch(self, batch: "_batch.Batch",
                   encoded: Union[Sequence[Tuple[bytes, Optional[str]]], _LazyBodies],
                   plan: _Plan, limit: int, deadline_ms: Optional[int], adaptive: bool,
                   already_ok: Optional[Any] = None,
                   invalid: Optional[Mapping[int, BaseException]] = None) -> BatchResult:
        """Run ``batch`` (its bodies already encoded) as one engine group.

        Every request runs on the engine thread; this thread only waits,
        delivers events and builds the results, item by item, for the
        batch's record (``already_ok``: indices not to run, ``invalid``:
        items failed without being sent, both as Batch.open).
        Ctrl-C raises BatchInterrupted, holding what finished. ``encoded``
        is a _LazyBodies for a lazy batch (``invalid`` then goes there).
        """
        try:
            return self._run_batch_inner(batch, encoded, plan, limit, deadline_ms, adaptive,
                                         already_ok, invalid)
        except KeyboardInterrupt as exc:
            raise _batch.interrupted(batch, exc) from None

    def _run_batch_inner(self, batch: "_batch.Batch",
                         encoded: Union[Sequence[Tuple[bytes, Optional[str]]], _LazyBodies],
                         plan: _Plan, limit: int, deadline_ms: Optional[int], adaptive: bool,
                         already_ok: Optional[Any],
                         invalid: Optional[Mapping[int, BaseException]]) -> BatchResult:
        with batch:
            if isinstance(encoded, _LazyBodies):
                encoded.invalid = invalid
                invalid = None
            batch.open(already_ok, invalid)
            if batch.lazy or batch.runnable:
                # Looked up at each run: llmretry.otel wraps _engine_job.
                job = _engine_batch._engine_job(cast("Client", self), batch, encoded, plan, limit,
                                                deadline_ms, adaptive)
                try:
                    job.engine.call_many(*job.args, **job.kwargs)
                finally:
                    job.finish()
        return batch.result()


# call_many's own keywords (limit, models, failures_path, ...), for "did you
# mean" when one is misspelt.
_MANY_KEYWORDS = tuple(name for name in inspect.signature(_ClientBatches._many).parameters
                       if name not in ("self", "bodies", "options", "where"))
