"""Type stub of the C extension ``llmretry._llmretry`` (bindings/python/_llmretry.c).

This is a private module: the public API lives in ``llmretry``. It is the one
place where Python meets the C core. Conventions:

* Argument errors detected by the core (``llmretry_options_check``) raise
  ``ValueError`` whose message starts with the offending option's name
  (e.g. ``"timeout_ms must be > 0 (got -5)"``); wrong Python types raise
  ``TypeError`` naming the argument. Both happen before any I/O.
* ``Engine.call`` waits with the GIL released and wakes every 50 ms to run
  signal handlers: Ctrl-C cancels the call and raises ``KeyboardInterrupt``.
  In a ``run_pool`` worker thread, a stopping pool cancels the call and
  raises ``PoolStop`` instead.
* I/O failures are *returned* (``ok`` is False), never raised: the Python
  layer turns them into ``LLMError`` subclasses.
"""
from typing import (Any, Callable, Dict, Iterator, List, Literal, Optional, Sequence, Tuple,
                    TypedDict, Union)

from typing_extensions import Unpack

VERSION: str  # LLMRETRY_VERSION from core/include/llmretry.h: the one version
CORE_VERSION: str  # llmretry_version(): what the linked core was compiled as
LIBCURL_VERSION: str  # the loaded libcurl's version (the bundled copy in a wheel)
EVENT_NAMES: tuple[str, ...]  # event names in the order of their event_mask bits
EVENTS_ALL: int  # the event_mask with every event

class PoolStop(BaseException):
    """Raised inside a run_pool worker whose pool is stopping (Ctrl-C)."""

class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

# The core's enumerations and option table (generated: ``make generate``).
# BEGIN GENERATED engine-options (tools/gen_surface.py, from the core's tables: do not edit)
ErrorKind = Literal[
    "http_status", "timeout", "network", "invalid_response", "deadline_exceeded",
    "cancelled", "response_too_large", "stream_interrupted", "circuit_open", "refusal",
]
Reason = Literal[
    "retries_exhausted", "not_retryable", "deadline", "retry_after_too_long", "unsafe_mode",
    "cancelled", "stream_interrupted", "retry_budget_exhausted", "circuit_open",
]
StreamReason = Literal[
    "network", "idle_timeout", "error_event", "truncated", "deadline", "cancelled",
    "invalid_chunk", "too_large",
]


class EngineOptions(TypedDict, total=False):
    """Engine.call's keywords from the core's option table, as this module
    takes them (headers as "Name: value" lines, fallbacks and schema as
    JSON text); ranges are checked by the core (ValueError naming the option)."""

    #: the full endpoint URL, used as is (instead of base_url + / + endpoint)
    url: Optional[str]
    #: the API's base URL, / + endpoint appended before its query, if any (else
    #: $OPENAI_BASE_URL, else https://api.openai.com/v1)
    base_url: Optional[str]
    #: the API path appended to base_url (docs/endpoints.md); url, when set, wins
    endpoint: Literal["chat/completions", "completions", "embeddings", "responses"]
    #: sent as Authorization: Bearer (else $OPENAI_API_KEY, else none); never in a log,
    #: event or error
    api_key: Optional[str]
    #: the call's model, for events and policies (else the body's "model")
    model: Optional[str]
    #: one attempt, connect to last byte (for a stream: to the first chunk)
    timeout_ms: int
    #: attempts = 1 + retries; every request the server saw counts, a refused one (429) too
    max_retries: int
    #: the exponential backoff's base
    base_delay_ms: int
    #: the exponential backoff's cap
    max_delay_ms: int
    #: additive: min(cap, base·2ⁿ) + U(0, base); full: U(0, min(cap, base·2ⁿ)); none:
    #: min(cap, base·2ⁿ)
    jitter: Literal["additive", "full", "none"]
    #: one budget for all attempts and waits; each attempt gets min(timeout, time left)
    deadline_ms: Optional[int]
    #: unsafe: never retry once the request may have reached the server
    retry_mode: Literal["safe", "unsafe"]
    #: the statuses that may be retried (null: 408, 429, 500-599 except 501 and 505)
    retry_statuses: Optional[Sequence[int]]
    #: a longer server-requested wait ends the call
    max_retry_after_ms: int
    #: a 2xx body that is not JSON, or that validate rejects, is retried
    retry_invalid_response: bool
    #: larger bodies fail with response_too_large
    max_response_bytes: int
    #: sent as Idempotency-Key on every attempt; in a policy only "auto" (a new key per
    #: call)
    idempotency_key: Optional[str]
    #: requests a minute to the endpoint (its URL, key and model), paced evenly on the
    #: client
    rpm: int
    #: tokens a minute to the endpoint, estimated from each body and corrected by its usage
    tpm: int
    #: the endpoint's retry budget: over a rolling 10 s, retries <= ratio x requests + min
    retry_budget_ratio: float
    #: the retry budget's allowance: retries <= ratio x requests + min
    retry_budget_min: int
    #: that many transient failures in a row (timeout, network, 408, 429, 5xx) open the
    #: endpoint's circuit breaker
    breaker_failures: int
    #: how long the breaker stays open before one probe may go
    breaker_cooldown_ms: int
    #: targets ({model, base_url or url, api_key or api_key_env, headers}) tried in order
    #: when the current one gives up
    fallbacks: Optional[str]
    #: a JSON Schema every answer must match (docs/structured-outputs.md)
    schema: Optional[str]
    #: a retry after an answer that failed the schema sends that answer and its errors back
    repair: bool
    #: the call's tokens for tpm (0: estimated from the body)
    estimated_tokens: int
    #: sent as X-Client-Request-Id (else a new UUID v4)
    request_id: Optional[str]
    #: extra request headers
    headers: Optional[Sequence[str]]
    #: the name of the policy the options came from, in every event
    policy: Optional[str]
    #: the CA bundle to verify servers with, instead of libcurl's default one
    ca_file: Optional[str]
    #: for a stream, the longest gap between two chunks
    idle_timeout_ms: int
    #: unread stream chunks beyond this pause the transfer until the host reads
    stream_buffer_bytes: int
    #: the HTTP method; GET and DELETE send no body (a retried POST may repeat its effect)
    method: Literal["POST", "GET", "DELETE"]
    #: the body's Content-Type (null: application/json); another type sends the body as is,
    #: unparsed
    content_type: Optional[str]
    #: a 2xx answer's bytes are the result as text, not parsed as JSON (JSON Lines, say)
    raw_response: bool
    #: which events to make: bit n asks for EVENT_NAMES[n]
    event_mask: int
# END GENERATED engine-options

class Engine:
    """One llmretry engine: an I/O thread and its connection cache."""

    def __init__(self, max_in_flight: int = 256, max_host_connections: int = 0,
                 shared: Optional[str] = None, io_loop: str = "perform") -> None: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None:
        """Cancel calls in flight and join the I/O thread. Idempotent."""
    def call(
        self,
        body: bytes,
        *,
        on_event: Optional[Callable[[dict[str, Any]], Any]] = None,
        validate: Optional[Callable[[bytes], Optional[str]]] = None,
        as_result: bool = False,
        keep_response: bool = False,
        stream_usage: bool = False,
        **options: Unpack[EngineOptions],
    ) -> Any:
        """Run one call to completion and return its outcome.

        ``body`` is the JSON request body (UTF-8); ``options`` are the core's
        (``EngineOptions``, each as docs/reliability.md says). ``model`` names
        the model for events (None: read from the body). ``headers`` are extra
        ``"Name: value"`` lines. ``on_event`` (None: the engine makes no
        events) receives each event dict on this thread; an ``Exception`` it
        raises is reported with ``sys.unraisablehook`` and the call goes on,
        a ``BaseException`` cancels the call and propagates. ``validate``
        receives each 2xx body and returns None to accept it or a reason
        string to reject it (an ``invalid_response`` failure the policy may
        retry); a ``BaseException`` from it cancels and propagates.

        Returns a dict: ``"ok"``, then on success the fields of the core's
        meta shape (Meta's: ``attempt``, ``attempts``, ``status``, ``usage``,
        ...) and ``"body"`` (bytes); on failure the fields of its error shape
        (LLMError's: ``kind``, an ``ErrorKind``; ``reason``, a ``Reason``, or
        for ``stream_interrupted`` a ``StreamReason``; ``message``,
        ``status``, ..., ``validation_errors`` already parsed), a streamed
        call's progress (``stream``, ``chunks``, ``chunks_delivered``,
        ``ttft_ms``, ``stream_reason``) and, when there is one, ``"body"``
        (a broken stream's partial chat.completion). ``describe()`` lists
        those fields; a null one is None.

        With ``keep_response=True`` (llmretry.httpx) both also hold
        ``"headers"``: bytes, the last attempt's response status line and
        header lines as received (absent when it got no response), and a
        failure on an HTTP status (or a 2xx body that is not JSON) its whole
        ``"body"``.

        With ``as_result`` (and no ``validate``), a success whose body
        Python's json parses is returned as the package's ``Result``
        (registered with ``_set_result_types``) instead of its dict; its
        ``Meta`` and the body's all-atomic dicts are not tracked by the
        cyclic GC. Other outcomes stay dicts.
        """

    def endpoint_stats(self) -> List[Dict[str, Any]]: ...
    def channel(self) -> "Channel":
        """One event loop's view of this engine: calls started on it report
        to its file descriptor and nowhere else."""
        ...
    def group(self, limit: int, deadline_ms: Optional[int] = None,
              adaptive: bool = True) -> "Group":
        """A batch pacer for Channel.call(..., group=) (its calls report to
        their channel)."""
        ...
    def batch(self, bodies: Union[Sequence[bytes],
                                  Iterator[Tuple[int, bytes, Optional[str], Optional[str]]]],
              **options: Any) -> "BatchRun":
        """call_many's arguments; nothing runs until the first step()."""
        ...
    def stream(self, body: bytes, **options: Any) -> "Call":
        """Start a streaming call (Engine.call's keywords, plus
        ``stream_usage`` and ``stream_buffer_bytes``); read it with
        ``Call.next_chunk``."""
        ...
    def call_many(
        self,
        bodies: Union[Sequence[bytes],
                      Iterator[Tuple[int, bytes, Optional[str], Optional[str]]]],
        *,
        models: Optional[Sequence[Optional[str]]] = None,
        idempotency_keys: Optional[Sequence[Optional[str]]] = None,
        item_headers: Optional[Callable[[int], Optional[Sequence[str]]]] = None,
        limit: int = 8,
        batch_deadline_ms: Optional[int] = None,
        adaptive: bool = True,
        on_result: Optional[Callable[[int, Any], Any]] = None,
        results: Optional[list[Any]] = None,
        keep_results: bool = True,
        stats: Optional[dict[str, int]] = None,
        **options: Any,
    ) -> Optional[list[Any]]:
        """Run one call per body as one batch on the engine thread.

        ``options`` are those of ``call`` (``request_id`` and
        ``idempotency_key`` are refused: a batch cannot share them; give
        ``idempotency_keys``, one per body, instead). The
        batch is an engine group: at most ``limit`` items run at once, a
        429 naming a wait pauses the new starts of its model for that long,
        with
        ``adaptive`` the window halves on a burst of 429s and grows back on
        successes, and ``batch_deadline_ms`` bounds the whole batch (items
        not started in time fail with ``deadline_exceeded``). This thread
        only waits (GIL released, waking for signals every 50 ms), delivers
        events and validation requests, and calls ``on_result(index,
        outcome)`` as each item finishes; an exception from it (or Ctrl-C)
        cancels the rest and propagates. Returns the outcomes in input order
        (the values of ``call``, ``as_result`` included), in ``results`` when
        given (a list as long as ``bodies``, filled in place as items
        finish, so what finished before an exception is kept there). ``stats``,
        a dict, receives the batch group's stats (the core's group shape:
        ``window``, ``pauses``, ``halvings``, ...), its token totals (the usage
        shape) and ``attempts``, ``retries``, ``resends`` when the batch ends,
        also when it ends by an exception.

        ``item_headers(index)``, when given, is called on this thread just
        before each item is submitted: the ``"Name: value"`` lines it returns
        are that item's headers, on every attempt, in place of ``headers``
        (None: ``headers``). llmretry.otel gives each item its span there.

        ``keep_results=False``: no list is kept (returns None), each
        outcome goes to ``on_result`` only. ``bodies`` may instead be an
        iterator of ``(index, body bytes, model or None, key or None)``
        tuples (then ``keep_results=False``, and no ``models``,
        ``idempotency_keys`` or ``results``): it is read only as the pacer
        wants more (at most ``4 * limit + 64`` items submitted and not
        finished), each item checked as it comes, and ``on_result`` gets the
        tuple's index. An exception from the iterator ends the batch as one
        from ``on_result`` does.
        """

NOT_STARTED: object  # run_pool's slot for an item never started (deadline, stop)

class Call:
    """One call in flight whose mailbox the host reads: started by
    Engine.stream (a stream is a call that yields chunks) or by a Channel
    (an event loop's calls). Taking the first chunk is the commit point:
    before it the engine retries, after it a failure ends the call as
    ``stream_interrupted``."""
    request_id: str
    done: bool
    def next_chunk(self) -> Optional[Tuple[Optional[str], bytes]]:
        """The next chunk: its SSE event name (None for plain data) and JSON
        text (events and validation are delivered on this thread meanwhile);
        None once the call has ended."""
        ...
    def outcome(self) -> Any:
        """The finished call's value, as Engine.call returns it."""
        ...
    def try_chunk(self) -> Union[Tuple[Optional[str], bytes], None, Literal[False]]:
        """next_chunk without waiting: False while nothing is there. A call
        that does not stream (Channel.call) only gives None (its end: its
        events and validation delivered) or False."""
        ...
    def response_head(self) -> Optional[bytes]:
        """With ``keep_response=True``: the response's status line and header
        lines as received, once a chunk was read (the commit point) or the
        call is done; None before."""
        ...
    def cancel(self) -> None: ...

class Channel:
    """An event loop's view of an engine (Engine.channel())."""
    closed: bool
    def call(self, body: bytes, *, group: Optional["Group"] = None,
             **options: Any) -> Call: ...
    def stream(self, body: bytes, *, group: Optional["Group"] = None,
               **options: Any) -> Call: ...
    def ready(self) -> list[Call]:
        """The calls with news since the last ready()."""
        ...
    def fileno(self) -> int: ...
    def close(self) -> None: ...

class Group:
    """A batch pacer (Engine.group())."""
    def stats(self) -> dict[str, int]: ...

class BatchRun:
    """A batch in progress (Engine.batch()): call_many without the wait."""
    results: Optional[list[Any]]   # None: keep_results=False
    def step(self) -> bool:
        """Submit and collect what can be done now; True once all finished."""
        ...
    def fileno(self) -> int: ...
    def close(self) -> None: ...

class LazyMeta:
    """A Meta's values, kept in a Result the extension built (its ``_meta``
    slot) until ``Result.meta`` is first read."""
    def __call__(self) -> Any:
        """A new Meta of the values."""
        ...
    def pick(self, indices: tuple[int, ...], /) -> tuple[Any, ...]:
        """The values of the fields at ``indices`` (places in Meta.__slots__),
        as the Meta would hold them, without building it (llmretry.otel)."""
        ...

def run_pool(items: Sequence[Any], limit: int,
             worker: Callable[[Any, int], Any], return_exceptions: bool = False, *,
             deadline_ms: Optional[int] = None, adaptive: bool = True,
             on_result: Optional[Callable[[int, Any, bool], Any]] = None,
             stats: Optional[dict[str, int]] = None) -> list[Any]:
    """Run worker(item, index) on min(limit, len(items)) C threads holding
    the GIL in turn; results in input order.

    With return_exceptions False, the first exception stops new starts and
    is raised once the running items finish; with True, exceptions are
    returned in place. Ctrl-C stops the pool (calls in flight in workers are
    cancelled with PoolStop) and raises KeyboardInterrupt once the worker
    threads have returned.

    Batch policy: calls made by workers report to the pool, so a 429 that
    names a wait (Retry-After, x-ratelimit-reset) pauses the new starts of
    its model for that long, and with ``adaptive`` the number of items
    running halves on a burst of 429s and grows back by one per window-full
    of successes, never above ``limit``. ``deadline_ms`` bounds the whole
    batch: calls in workers get the smaller of their own deadline and the
    time left, and items not started in time keep ``NOT_STARTED`` in their
    slot.
    ``on_result(index, value, failed)`` runs on the pool thread after each
    item (an exception from it stops the pool and is raised). ``stats``, a
    dict, receives the group shape's fields (``pauses``, ``halvings``, ``window``
    the smallest, ...) summed over the pool's groups at the end.
    """

def extract_json(text: Union[str, bytes]) -> str:
    """The JSON text inside model output (fenced, bare or amid prose);
    ValueError when there is none."""

def assert_shape_json(json_text: Union[str, bytes], shape_json: Union[str, bytes],
                      path: str = "root") -> None:
    """The core's assert_shape on JSON texts; ValueError naming the path."""

def schema_errors(schema_text: Union[str, bytes], json_text: Union[str, bytes]) -> Optional[str]:
    """The core's JSON Schema check (llmretry_schema_validate): None when the
    JSON matches, else the JSON text of its errors; ValueError for a refused
    schema or text that is not JSON."""

def _set_result_types(result: type, meta: type, scan_once: Callable[[str, int], Any],
                      parse: Callable[[bytes], Any]) -> None:
    """Register the classes ``as_result`` builds (``__slots__`` classes with
    ``data, _meta`` (a LazyMeta until ``meta`` is read) and one slot per field of the core's meta shape, else
    TypeError), json's ``scan_once`` and the package's ``parse(bytes)`` for
    bodies the scanner refuses (and for the JSON of validation errors)."""

def encode_json(obj: Any) -> Optional[bytes]:
    """``json.JSONEncoder(ensure_ascii=False, separators=(",", ":"),
    allow_nan=False).encode(obj).encode("utf-8")``, byte for byte, or None
    when the object is not one it takes (a subclass, a non-str key, NaN, a
    lone surrogate, deep nesting...): then json's encoder is to say."""

def _json_decode(body: bytes) -> Tuple[Any, ...]:
    """``(value,)`` when the C decoder (json_decode.c) takes the body, ``()``
    when it leaves it to json's scanner (for the tests)."""

def _parse_body(body: bytes) -> Any:
    """What ``Result.data`` is made of a 2xx body: the C decoder, else json's
    scanner, else the package's parser (ValueError) (for the tests)."""

def body_fields() -> Tuple[str, ...]:
    """The request body's own fields ("model", "messages", ...;
    llmretry_body_fields): keywords named so were meant for the body."""

def judge_answer(status: int, answer: Union[bytes, bytearray, memoryview], body: bytes,
                 **options: Any) -> Any:
    """What ``Engine.call(body, as_result=True, **options)`` gives had the
    server answered ``status`` with the bytes ``answer`` in its one attempt
    (``max_retries`` is 0): a ``Result``, or the outcome dict of a failure.
    For answers got without an attempt (a Batch API's result lines): the
    core's judgement, on a host engine of its own for each answer
    (llmretry_call_exchange_answer). A status outside 200-599 is a failed
    attempt; ``on_event`` and ``validate`` raise ValueError."""

def text_quotes(text: Union[bytes, bytearray, memoryview],
                body: Union[bytes, bytearray, memoryview], secrets: Sequence[str]) -> bool:
    """Does a server's ``text`` (its first 512 bytes) quote the request
    ``body``'s messages (16 bytes in a row) or one of the ``secrets``? The
    screen an error's server text passes (llmretry_text_quotes), for text
    the engine did not read itself."""

def json_text_opens(data: Union[bytes, bytearray, memoryview]) -> bool:
    """Does a body's text open a JSON object (or an array): ``{`` or ``[``
    after white space? The core's check at submit (llmretry_json_text_opens)."""

def option_suggest(name: str, names: Sequence[str]) -> Optional[str]:
    """The one of ``names`` an unknown option name most likely meant, for
    "did you mean ...?" (llmretry_option_suggest): case, ``_`` and the
    ``_ms`` unit aside, whole words (``retries``: ``max_retries``), or a
    typo; None when none is clear."""

def url_join(base: str, path: str) -> str:
    """The engine's join of a base URL and a path (``"/files"``): the base's
    trailing slashes trimmed, the path before its query, no fragment
    (llmretry_url_join)."""

def url_shown(url: str) -> str:
    """``url`` with its user info and its query each ``***``, no fragment:
    how the endpoint stats and reprs show a URL (llmretry_url_shown)."""

def stream_body(url: Optional[str], body: bytes, streamed: bool) -> Optional[bytes]:
    """The body the core sends for an object the host encoded
    (llmretry_stream_body): ``"stream": true`` when ``streamed``, and a
    streaming body asks for its usage; None when sent as it is."""

def _batch_tally(values: List[Any]) -> Tuple[int, List[int]]:
    """Of a batch's values filled in place (None: not finished): how many
    finished, and the indices of the outcome dicts among them."""

def encode_bodies(bodies: Union[List[Any], Tuple[Any, ...]], url: Optional[str],
                  encode_one: Callable[[int, Any], Tuple[bytes, Optional[str]]]
                  ) -> Tuple[List[bytes], List[Optional[str]]]:
    """A listed batch's bodies as sent: ``(payloads, models)``, item i's
    bytes and model. An exact dict that :func:`encode_json` takes is done
    in C (its ``stream_body`` form, its ``"model"`` when a str); every
    other body is ``encode_one(index, body)``'s ``(bytes, model)``, whose
    errors propagate."""

def check_header(name: str, value: str, index: int) -> None:
    """The core's rule for one extra header (llmretry_check_header):
    ValueError naming header #index (never an invalid name) or the value's
    header."""

def estimate_tokens(url: Optional[str], body: bytes,
                    count: Optional[Callable[[str], int]]) -> Optional[int]:
    """The core's token estimate of a body (what it is charged against
    tpm): its prompt texts counted by ``count`` (None: characters / 4)
    plus the completion's bound; None when ``count`` fails."""

def parse_retry_after(value: str, now_unix_ms: int) -> int:
    """The core's Retry-After parser: ms > 0, or -1 when not usable."""

def parse_policies(json_text: str, source: Optional[str] = None) -> List[Tuple[str, str]]:
    """The core's policy loader: [(name, settings_json)], or ValueError."""
    ...

def resolve_policy(settings_json: Optional[str], explicit_json: Optional[str],
                   defaults_json: Optional[str]) -> str:
    """Every policy key's value (JSON): explicit > policy > defaults > built-in."""
    ...

def check_policy_value(key: str, value_json: str) -> None:
    """ValueError when the policy rules refuse the value."""
    ...

def describe() -> Dict[str, Any]:
    """The core's tables whole: ``options`` (a dict per option: name, type,
    flags, builtin, range, min, max, choices, doc), ``shapes`` (per shape, a
    dict per field: name, type, nullable, items, doc), ``error_kinds``,
    ``reasons``, ``stream_reasons``. tools/gen_surface.py writes the typed
    surface from them."""
    ...

def options() -> Tuple[Tuple[str, str, int], ...]:
    """The core's call options: (name, type, flags) with type one of "text",
    "int", "bool", "enum", "statuses", "headers" and flags LLMRETRY_OPTFLAG_*."""
    ...
def check_options(**keywords: Any) -> None:
    """TypeError/ValueError (the core's message) unless the calls of a batch
    can share these Engine.call keywords."""
    ...
def policy_keys() -> Tuple[str, ...]:
    """The policy keys, in the order resolve_policy lists them."""
    ...
