"""The Client, the default client and the clients' process lifecycle.

A :class:`Client` owns one engine (an I/O thread and its connection cache)
and a set of call defaults, converted and checked once when the client is
made. The module-level :func:`call_llm` (_api.py) uses a default client
created on first use, re-created in a forked child and closed at exit.

Every call keyword defaults to :data:`DEFAULT`, meaning "the client's
default, else the documented one"; passing a value (None included) overrides
the client's default for that call.

Its batch methods (call_many's conversion and run) are in _client_batch.py,
which Client inherits. Meta and Result (_results.py) stay importable from
here: pickles name them so. docs/design.md maps the package's other modules.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import weakref
from typing import (TYPE_CHECKING, Any, Awaitable, Callable, Dict, Iterable, List, Mapping,
                    Optional, Tuple, TypeVar, Union)

from . import _batch, _engine_batch, _llmretry
from ._batch import BatchResult
from ._bodies import _core_url, _encode_call_body
from ._client_batch import _ClientBatches
from ._logging import DEFAULT
from ._options import (_BASE_PLAN, BatchOptions, Body, CallOptions, _check_option_names,
                       _int32, _Plan, _PolicyPlan, _type_name, _with_auto_key)
from ._policies import BUILTIN_DEFAULTS, Policy, PolicySource, load_policies
from ._pool import map_with_concurrency as _map_with_concurrency
from ._results import Meta, Result, _call_extra, _parse_json, _result_of, _Validator
from ._stream import Stream
from ._streaming import _client_stream, _stream_call
from ._tokens import estimate_tokens

if sys.version_info >= (3, 11):
    from typing import Unpack
elif TYPE_CHECKING:     # only type checkers read the annotations (PEP 563) before 3.11
    from typing_extensions import Unpack
if TYPE_CHECKING:
    from . import _aio

__all__ = ["Client", "Result", "Meta", "CallOptions", "BatchOptions"]

T = TypeVar("T")
R = TypeVar("R")

# What a client shows of itself, with the built-in values when not given.
_SHOWN_IN_REPR = ("base_url", "timeout_ms", "max_retries", "deadline_ms")
# Client(io_loop=...): the engine's I/O loops (core/include/llmretry/engine.h).
_IO_LOOPS = ("perform", "events")


# Live clients, so a forked child can drop its parent's engines.
_live_clients: "weakref.WeakSet[Client]" = weakref.WeakSet()
# A parent's engines, kept referenced in a forked child: freeing one there
# could wait on a lock some parent thread held at fork time.
_parent_engines: List[Any] = []


class Client(_ClientBatches):
    """An engine (I/O thread, connection cache) and a set of call defaults.

    ``defaults`` are any :func:`call_llm` keywords except ``body`` and
    ``client``; they are converted and checked here, once (an unknown name or
    a wrong type raises TypeError; value ranges are checked at the first
    call). ``max_in_flight`` caps the calls the engine runs at once;
    ``max_host_connections`` (0: no cap) the connections it opens to one
    host (calls past it wait for one: an HTTP/1.1 server needs one per call
    in flight, an HTTP/2 one shares each among many).

    ``shared`` says where each endpoint's rate budget, retry budget and
    circuit breaker live: ``None`` (the default, or the ``LLMRETRY_SHARED``
    environment variable when set) keeps them in this process; ``"shm:NAME"``
    shares them with every process on this host that names NAME (gunicorn
    workers, a multiprocessing pool, notebooks on one key);
    ``"redis://[:password@]host:port[/db]"`` with every process on every
    machine using that Redis. Their calls then pace against one limit, their
    retries count against one budget and one breaker opens for all
    (docs/shared.md). A Redis that is down or slow never fails a call: each
    process paces alone until it is back.

    ``io_loop`` is how the engine's I/O thread runs its transfers
    (docs/reliability.md, "The I/O loop"): ``"perform"`` (the default) looks
    at every transfer in flight at each wake-up, cheapest for batches whose
    calls answer together; ``"events"`` (Linux) runs only the transfers whose
    sockets are ready, cheaper for a service holding hundreds of slow calls
    at once of which few answer at a time (a gateway, an asyncio server).

    ``policies`` are named policies (a mapping ``{name: {key: value}}`` or
    a ``.toml``/``.json`` file, see :func:`llmretry.load_policies`), checked
    here; a call picks one with ``policy="name"``. For one call, explicit
    arguments beat the policy, the policy beats these defaults, and these
    beat the built-in ones.

    Use it as a context manager, or call :meth:`close`, to stop its I/O
    thread. In a forked child a client makes itself a new engine on first
    use. A client is safe to share between threads.

    Example::

        with llmretry.Client(base_url="http://127.0.0.1:8080/v1",
                             timeout_ms=10000, max_retries=5) as client:
            data, meta = client.call_llm(body)
    """

    def __init__(self, *, max_in_flight: int = 256, max_host_connections: int = 0,
                 shared: Optional[str] = None,
                 policies: Optional[PolicySource] = None,
                 io_loop: str = "perform",
                 **defaults: Unpack[CallOptions]) -> None:
        _check_option_names(defaults, "Client()", _CLIENT_KEYWORDS)
        max_in_flight = _int32("max_in_flight", max_in_flight)
        self._max_in_flight = max_in_flight
        self._max_host_connections = _int32("max_host_connections", max_host_connections)
        if shared is None:
            shared = os.environ.get("LLMRETRY_SHARED") or None
        if shared is not None and not isinstance(shared, str):
            raise TypeError(f"shared must be a str such as 'shm:NAME' or "
                            f"'redis://host:port' or None, not {type(shared).__name__}")
        self._shared = shared
        if not isinstance(io_loop, str):
            raise TypeError(f"io_loop must be 'perform' or 'events', not "
                            f"{type(io_loop).__name__}")
        if io_loop not in _IO_LOOPS:
            raise ValueError(f"io_loop must be 'perform' or 'events', not {io_loop!r}")
        self._io_loop = io_loop
        self._defaults: Dict[str, Any] = dict(defaults)
        self._plan = _BASE_PLAN.with_options(defaults.items())
        loaded = load_policies(policies) if policies is not None else {}
        self._policies: Dict[str, _PolicyPlan] = {
            name: _PolicyPlan(pol, self._plan) for name, pol in loaded.items()}
        self._lock = threading.Lock()
        self._closed = False
        self._engine: Any = _llmretry.Engine(max_in_flight, self._max_host_connections,
                                             shared, io_loop)
        _live_clients.add(self)

    @classmethod
    def from_file(cls, path: Union[str, "os.PathLike[str]"],
                  **defaults: Unpack[CallOptions]) -> "Client":
        """A client with the policies of a ``.toml``/``.json`` file and these
        defaults (as :class:`Client`)."""
        return cls(policies=path, **defaults)

    @property
    def policies(self) -> Dict[str, Policy]:
        """The client's policies by name."""
        return {name: pp.policy for name, pp in self._policies.items()}

    def _policy_plan(self, name: Any) -> _PolicyPlan:
        """The named policy, or ValueError naming it and the known ones."""
        pp = self._policies.get(name) if isinstance(name, str) else None
        if pp is None:
            if not isinstance(name, str):
                raise TypeError(f"policy must be a str or None, not {_type_name(name)}")
            known = ", ".join(sorted(self._policies)) or "none"
            raise ValueError(f"unknown policy {name!r} (known policies: {known})")
        return pp

    def endpoint_stats(self) -> List[Dict[str, Any]]:
        """What the client's engine knows of each endpoint it has called
        (a URL, the key sent to it and the model its calls name; never the
        key itself), one dict each:

        ``url``, ``model`` (None for calls naming none), ``has_key``;
        ``requests`` and ``retries`` sent so far;
        ``window_requests``, ``window_retries`` over the retry budget's
        rolling 10 s and ``retries_refused`` (calls that gave up as
        ``retry_budget_exhausted``); ``breaker`` (``"closed"``, ``"open"``,
        ``"half_open"``), ``consecutive_failures``, ``breaker_opened``
        (times), ``short_circuited`` (attempts failed as ``circuit_open``),
        ``open_ms_left``; ``rpm``, ``tpm`` in force (configured, else
        learned; 0: none) and ``in_flight``.
        """
        engine = self._engine
        return engine.endpoint_stats() if engine is not None else []

    # -- lifecycle ------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run."""
        return self._closed

    def close(self) -> None:
        """Cancel the calls in flight and stop the I/O thread. Idempotent."""
        with self._lock:
            self._closed = True
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()
        # The channels of its event loops: only if asyncio was ever used (it
        # is imported on first use, to keep it out of `import llmretry`).
        aio = sys.modules.get(__package__ + "._aio")
        if aio is not None:
            aio.forget(self)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _reopen(self) -> Any:
        """The engine, made anew after a fork; RuntimeError once closed."""
        with self._lock:
            if self._closed:
                raise RuntimeError("this llmretry Client is closed")
            if self._engine is None:
                self._engine = _llmretry.Engine(self._max_in_flight,
                                                self._max_host_connections, self._shared,
                                                self._io_loop)
            return self._engine

    def _forget_engine_after_fork(self) -> None:
        self._lock = threading.Lock()
        if self._engine is not None:
            _parent_engines.append(self._engine)
            self._engine = None

    def __repr__(self) -> str:
        shown = {k: self._defaults.get(k, BUILTIN_DEFAULTS.get(k)) for k in _SHOWN_IN_REPR}
        if isinstance(shown["base_url"], str):      # never its user info or query
            shown["base_url"] = _llmretry.url_shown(shown["base_url"])
        parts = [f"{k}={v!r}" for k, v in shown.items()]
        parts.append("api_key=<set>" if self._defaults.get("api_key") else "api_key=<unset>")
        if self._shared:
            parts.append(f"shared={_shown_shared(self._shared)!r}")
        if self._io_loop != "perform":
            parts.append(f"io_loop={self._io_loop!r}")
        if self._closed:
            parts.append("closed")
        return f"Client({', '.join(parts)})"

    # -- calls ---------------------------------------------------------------

    def _run(self, body: Any, plan: _Plan) -> Result:
        """One call with a converted plan: the Result, or raise LLMError."""
        engine, payload, extra, validator = self._prepare(body, plan)
        out = engine.call(payload, as_result=True, **extra, **plan.kwargs)
        return _result_of(out, validator)

    def _prepare(self, body: Any, plan: _Plan) -> Tuple[Any, bytes, Dict[str, Any],
                                                        Optional["_Validator"]]:
        """What one call hands the engine: the engine, the encoded body, the
        keywords besides plan.kwargs (stream_usage for a dict that streams)
        and the validator."""
        payload, model = _encode_call_body(body, plan.kwargs)
        engine = self._engine
        if engine is None:
            engine = self._reopen()
        extra, validator = _call_extra(plan, model)
        if type(body) is dict and body.get("stream") is True:
            # A dict that streams: ask for its usage (the core adds
            # stream_options unless the body sets them) and assemble.
            extra["stream_usage"] = True
        if plan.kwargs.get("tpm"):
            # Under a token budget, tiktoken's count when the host has it.
            tokens = estimate_tokens(_core_url(plan.kwargs), payload)
            if tokens:
                extra["estimated_tokens"] = tokens
        return engine, payload, extra, validator

    def _plan_of(self, body: Any, policy: Optional[str], options: Mapping[str, Any],
                 where: str) -> Tuple[Any, _Plan]:
        """The body to send and the plan of a call given as keywords (the
        stream and asyncio functions): the named policy's settings under
        the explicit ones. ValueError/TypeError before any I/O."""
        if options:
            _check_option_names(options, where)
        if policy is None:
            return body, self._plan.with_call_options(options)
        pp = self._policy_plan(policy)
        plan = pp.plan.with_call_options(options)
        if pp.auto_key and options.get("idempotency_key", DEFAULT) is DEFAULT:
            plan = _with_auto_key(plan)
        return pp.body(body), plan

    def call_llm(self, body: Body, *, policy: Optional[str] = None,
                 **options: Unpack[CallOptions]) -> Result:
        """:func:`llmretry.call_llm` with this client's engine and defaults."""
        body, plan = self._plan_of(body, policy, options, "call_llm()")
        return self._run(body, plan)

    def stream_llm(self, body: Body, *, policy: Optional[str] = None,
                   stream_buffer_bytes: int = DEFAULT,
                   **options: Unpack[CallOptions]) -> Stream:
        """:func:`llmretry.stream_llm` with this client's engine and defaults."""
        return _client_stream(self, body, policy, stream_buffer_bytes, options)

    def call_llm_with_deadline(self, body: Body, deadline_ms: int = 180000,
                               **options: Any) -> Result:
        """:meth:`call_llm` with a total deadline (default 180 s)."""
        return self.call_llm(body, deadline_ms=deadline_ms, **options)

    def call_many(self, bodies: Iterable[Body], limit: int = 8, *,
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
                  **options: Unpack[BatchOptions]) -> BatchResult:
        """:func:`llmretry.call_many` with this client's engine and defaults."""
        job = self._many(bodies, limit, dict(options), "call_many()",
                         # BEGIN GENERATED many-forward (tools/gen_surface.py's BATCH_KEYWORDS: do not edit)
                         deadline_ms=deadline_ms, call_deadline_ms=call_deadline_ms,
                         failures_path=failures_path, resume=resume, progress=progress,
                         adaptive=adaptive, on_result=on_result, policy=policy,
                         keep_results=keep_results,
                         # END GENERATED many-forward
                         )
        return self._run_batch(*job)

    # -- asyncio (see llmretry._aio) --------------------------------------------

    async def acall_llm(self, body: Body, *, policy: Optional[str] = None,
                        **options: Unpack[CallOptions]) -> Result:
        """:func:`llmretry.acall_llm` with this client's engine and defaults."""
        body, plan = self._plan_of(body, policy, options, "acall_llm()")
        engine, payload, extra, validator = self._prepare(body, plan)
        result: Result = await (_AIO or _import_aio()).acall(
            self, engine, payload, extra, plan.kwargs, lambda out: _result_of(out, validator))
        return result

    def astream_llm(self, body: Body, *, policy: Optional[str] = None,
                    stream_buffer_bytes: int = DEFAULT,
                    **options: Unpack[CallOptions]) -> "_aio.AsyncStream":
        """:func:`llmretry.astream_llm` with this client's engine and defaults."""
        body, plan = self._plan_of(body, policy, options, "astream_llm()")
        engine, payload, extra, validator = _stream_call(self, body, plan, stream_buffer_bytes)
        stream: "_aio.AsyncStream" = (_AIO or _import_aio()).astream(
            self, engine, payload, extra, plan.kwargs, lambda out: _result_of(out, validator),
            _parse_json)
        return stream

    async def acall_many(self, bodies: Iterable[Body], limit: int = 8, *,
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
                         **options: Unpack[BatchOptions]) -> BatchResult:
        """:func:`llmretry.acall_many` with this client's engine and defaults."""
        batch, encoded, plan, limit, batch_deadline, adaptive = self._many(
            bodies, limit, dict(options), "acall_many()",
            # BEGIN GENERATED many-forward (tools/gen_surface.py's BATCH_KEYWORDS: do not edit)
            deadline_ms=deadline_ms, call_deadline_ms=call_deadline_ms,
            failures_path=failures_path, resume=resume, progress=progress,
            adaptive=adaptive, on_result=on_result, policy=policy,
            keep_results=keep_results,
            # END GENERATED many-forward
            )
        try:
            with batch:
                batch.open()
                if batch.lazy or batch.runnable:
                    job = _engine_batch._engine_job(self, batch, encoded, plan, limit,
                                                    batch_deadline, adaptive)
                    from . import _aio_batch
                    try:
                        await _aio_batch.amany(job)
                    finally:
                        job.finish()
            result: BatchResult = batch.result()
            return result
        except KeyboardInterrupt as exc:
            raise _batch.interrupted(batch, exc) from None

    async def amap_with_concurrency(self, items: Iterable[T], limit: int,
                                    worker: Callable[[T, int], Awaitable[R]], *,
                                    # BEGIN GENERATED map-keywords (tools/gen_surface.py's BATCH_KEYWORDS: do not edit)
                                    return_exceptions: bool = False,
                                    deadline_ms: Optional[int] = None,
                                    failures_path: Optional[Union[str, "os.PathLike[str]"]] = None,
                                    resume: bool = False,
                                    progress: Union[bool, Callable[[int, int, int], Any]] = False,
                                    adaptive: bool = True,
                                    on_result: Optional[Callable[[int, Any], Any]] = None,
                                    logger: Any = DEFAULT,
                                    # END GENERATED map-keywords
                                    ) -> BatchResult:
        """:func:`llmretry.amap_with_concurrency`; the batch summary goes to
        this client's default logger unless ``logger`` says otherwise."""
        if logger is DEFAULT:
            logger = self._defaults.get("logger", DEFAULT)
        from . import _aio_batch
        return await _aio_batch.amap_with_concurrency(
            items, limit, worker,
            # BEGIN GENERATED map-forward (tools/gen_surface.py's BATCH_KEYWORDS: do not edit)
            return_exceptions=return_exceptions, deadline_ms=deadline_ms,
            failures_path=failures_path, resume=resume, progress=progress,
            adaptive=adaptive, on_result=on_result, logger=logger,
            # END GENERATED map-forward
            )

    def map_with_concurrency(self, items: Iterable[T], limit: int,
                             worker: Callable[[T, int], R], *,
                             # BEGIN GENERATED map-keywords (tools/gen_surface.py's BATCH_KEYWORDS: do not edit)
                             return_exceptions: bool = False,
                             deadline_ms: Optional[int] = None,
                             failures_path: Optional[Union[str, "os.PathLike[str]"]] = None,
                             resume: bool = False,
                             progress: Union[bool, Callable[[int, int, int], Any]] = False,
                             adaptive: bool = True,
                             on_result: Optional[Callable[[int, Any], Any]] = None,
                             logger: Any = DEFAULT,
                             # END GENERATED map-keywords
                             ) -> BatchResult:
        """:func:`llmretry.map_with_concurrency` (the pool is the same); the
        batch summary goes to this client's default logger unless ``logger``
        says otherwise."""
        if logger is DEFAULT:
            logger = self._defaults.get("logger", DEFAULT)
        return _map_with_concurrency(items, limit, worker,
                                     # BEGIN GENERATED map-forward (tools/gen_surface.py's BATCH_KEYWORDS: do not edit)
                                     return_exceptions=return_exceptions,
                                     deadline_ms=deadline_ms, failures_path=failures_path,
                                     resume=resume, progress=progress, adaptive=adaptive,
                                     on_result=on_result, logger=logger,
                                     # END GENERATED map-forward
                                     )


# llmretry._aio, imported on the first await so that asyncio stays out of
# `import llmretry`; kept here, as a `from . import` per call costs ~1 µs.
_AIO: Any = None


def _import_aio() -> Any:
    global _AIO
    from . import _aio
    _AIO = _aio
    return _aio


# Client()'s own keywords (max_in_flight, ...), for "did you mean".
# (From the code object: inspect costs 4 ms of `import llmretry`.)
_init_code = Client.__init__.__code__
_CLIENT_KEYWORDS = tuple(
    name for name in _init_code.co_varnames[:_init_code.co_argcount + _init_code.co_kwonlyargcount]
    if name not in ("self", "defaults"))
del _init_code


def _shown_shared(spec: str) -> str:
    """``shared`` as a repr may show it: a Redis URL's password (and user)
    as ``***``, up to the last ``@`` before the host, as the core reads it
    and its events show it. Its query stays: the store's own options
    (``timeout_ms``), not a provider's (a base_url's is ``_llmretry.url_shown``'s)."""
    scheme, sep, rest = spec.partition("://")
    if not sep:
        return spec
    end = len(rest)
    for c in "/?#":
        if c in rest:
            end = min(end, rest.index(c))
    at = rest.rfind("@", 0, end)
    return f"{scheme}://***{rest[at:]}" if at >= 0 else spec


# ---------------------------------------------------------------------------
# The default client (the module-level functions' in _api.py)

_default_client: Optional[Client] = None
_default_lock = threading.Lock()


def _get_default_client() -> Client:
    global _default_client
    with _default_lock:
        if _default_client is None or _default_client.closed:
            _default_client = Client()
        return _default_client


def _client_or_default(client: Any) -> Client:
    if client is None:
        return _default_client or _get_default_client()
    if isinstance(client, Client):
        return client
    raise TypeError(f"client must be a llmretry.Client or None, not {_type_name(client)}")


# ---------------------------------------------------------------------------
# Process lifecycle: a forked child makes its own engines; exit closes them.

def _after_fork_in_child() -> None:
    global _default_lock
    _default_lock = threading.Lock()
    for client in list(_live_clients):
        client._forget_engine_after_fork()


def _close_all_at_exit() -> None:
    for client in list(_live_clients):
        try:
            client.close()
        except Exception:   # exiting anyway: never mask the exit status
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_all_at_exit)
