"""asyncio: await calls, streams and batches on the client's engine.

There is no thread per call and no executor. Each running event loop gets
its own channel on the client's engine (a file descriptor watched with
``loop.add_reader``; uvloop's loops too): the engine's I/O thread does every
request, and the loop's thread, when the channel is readable, reads the
mailboxes of its calls, so loggers and validators run on the loop's thread
and a loop never sees another loop's calls. A batch (``acall_many``) is
watched the same way through its own descriptor.

Cancelling the awaiting task (``task.cancel()``, ``asyncio.timeout``,
``asyncio.wait_for``, a notebook's interrupt) cancels the call on the engine
at once (the server sees the connection closed) and ``CancelledError``
propagates; the call's last event (``llm_request_gave_up``, reason
``cancelled``) is still delivered on the loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import signal
import threading
import weakref
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Dict, List, Optional, Tuple

from ._stream import StreamBase, content_deltas

if TYPE_CHECKING:
    from ._aio_batch import _APool
    from ._client import Client
    from ._results import Result

__all__ = ["AsyncStream", "acall", "astream"]

_INT32_MAX = 2 ** 31 - 1


# ---------------------------------------------------------------------------
# One channel per (client engine, running loop)

class _LoopChannel:
    """A loop's channel on one engine: who waits for which call's news."""

    __slots__ = ("engine", "channel", "_loop", "waiting", "_closing", "__weakref__")

    def __init__(self, engine: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.channel = engine.channel()
        # Weak: the registry's entry (keyed by the loop) must not keep its
        # own key alive, or every asyncio.run would leave a channel open.
        self._loop = weakref.ref(loop)
        # The call (the extension's Call) -> what to do on the loop when it has news.
        # The entry keeps the call alive until its end has been read.
        self.waiting: Dict[Any, Callable[[], None]] = {}
        self._closing = False
        loop.add_reader(self.channel.fileno(), self._readable)

    def _readable(self) -> None:
        for call in self.channel.ready():
            on_news = self.waiting.get(call)
            if on_news is not None:
                on_news()
        if self._closing and not self.waiting:
            self.close()

    def close_when_idle(self) -> None:
        """Close once every call still awaited has delivered its end (the
        client's engine was closed: they all end, cancelled, right away)."""
        self._closing = True
        if not self.waiting:
            self.close()

    def drain_then_forget(self, call: Any,
                          end: Optional["asyncio.Future[None]"] = None) -> None:
        """Read a cancelled call's mail to its end (its last events reach
        the logger), then let it go; ``end`` is set then."""
        def on_news() -> None:
            item: Any = False
            try:
                while True:
                    item = call.try_chunk()
                    if item is None or item is False:
                        break
            except Exception:       # a failing logger loses nothing else
                item = None
            if call.done or item is None:
                self.waiting.pop(call, None)
                if end is not None and not end.done():
                    end.set_result(None)
        self.waiting[call] = on_news
        on_news()

    async def cancel_and_wait(self, call: Any) -> None:
        """Cancel a call whose awaiting task is being cancelled, and wait the
        moment its end takes, so its last event (gave_up, cancelled)
        reaches the logger before the cancellation goes on (asyncio.run
        closes the loop right after)."""
        call.cancel()
        end: "asyncio.Future[None]" = self.loop.create_future()
        self.drain_then_forget(call, end)
        try:
            await end
        except asyncio.CancelledError:
            pass                    # cancelled again: the call ends all the same

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop()
        if loop is None:        # only reachable from the loop itself
            raise RuntimeError("the event loop of this channel is gone")
        return loop

    def close(self) -> None:
        """Stop watching (the loop may be closed already) and close the
        channel; calls still running on it keep going, unheard."""
        loop = self._loop()
        if not self.channel.closed:
            if loop is not None and not loop.is_closed():
                loop.remove_reader(self.channel.fileno())
            self.channel.close()


_registry_lock = threading.Lock()
# client -> {loop: _LoopChannel}; both weak, so neither outlives its user.
_channels: "weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Any, _LoopChannel]]" = (
    weakref.WeakKeyDictionary())


def _loop_channel(client: "Client", engine: Any) -> _LoopChannel:
    loop = asyncio.get_running_loop()
    with _registry_lock:
        per_loop = _channels.get(client)
        if per_loop is None:
            per_loop = _channels[client] = weakref.WeakKeyDictionary()
        lc = per_loop.get(loop)
        if lc is not None and lc.engine is engine and not lc.channel.closed:
            return lc
        if lc is not None:          # the client re-made its engine (fork, reopen)
            lc.close()
        # A new loop: first let go of the channels of loops that have closed
        # since (asyncio.run makes one per run), so their descriptors close now.
        for old_loop, old in list(per_loop.items()):
            if old_loop.is_closed():
                old.close()
                del per_loop[old_loop]
        lc = per_loop[loop] = _LoopChannel(engine, loop)
        return lc


def forget(client: "Client") -> None:
    """Close the channels of a client being closed, on each loop's own
    thread once the calls awaited there have delivered their (cancelled)
    end."""
    with _registry_lock:
        per_loop = _channels.pop(client, None)
    for lc in list(per_loop.values()) if per_loop else ():
        loop = lc._loop()
        if loop is None or loop.is_closed():
            lc.close()
        else:
            try:
                loop.call_soon_threadsafe(lc.close_when_idle)
            except RuntimeError:    # closed meanwhile
                lc.close()


# ---------------------------------------------------------------------------
# Ctrl-C while a loop in the main thread awaits llmretry

class _SigintCancels:
    """Cancel the tasks awaiting llmretry when SIGINT comes, then run the
    handler that was there.

    asyncio.run's own handler cancels its main task, which cancels the
    call; but a Jupyter kernel's handler does not reach a cell's awaits
    (ipykernel issue 881: an awaiting cell runs on to its end), so a
    notebook's interrupt would leave the call running. While some task of
    the main thread awaits a call, this handler chains in front of the
    host's: each waiting task is cancelled (CancelledError propagates, the
    call is cancelled on the engine), unless the host's handler already
    cancels it (asyncio.run: one cancellation, so it still ends in
    KeyboardInterrupt). Outside such awaits the host's handler is left
    alone."""

    def __init__(self) -> None:
        self.tasks: Dict["asyncio.Task[Any]", int] = {}
        self.prev: Any = None

    def add(self, task: "asyncio.Task[Any]") -> None:
        n = self.tasks.get(task, 0)
        self.tasks[task] = n + 1
        if len(self.tasks) == 1 and n == 0:
            prev = signal.getsignal(signal.SIGINT)
            if callable(prev) and prev != self.handler:
                self.prev = prev
                signal.signal(signal.SIGINT, self.handler)

    def discard(self, task: "asyncio.Task[Any]") -> None:
        n = self.tasks.pop(task, 0) - 1
        if n > 0:
            self.tasks[task] = n
        elif not self.tasks and self.prev is not None:
            # Put the host's handler back before forgetting it: a SIGINT
            # handled in between (Python runs handlers between any two
            # bytecodes) still finds it in self.prev and is passed on.
            if signal.getsignal(signal.SIGINT) == self.handler:
                signal.signal(signal.SIGINT, self.prev)
            self.prev = None

    def handler(self, signum: int, frame: Any) -> None:
        by_loop: Dict[Any, List["asyncio.Task[Any]"]] = {}
        for task in self.tasks:
            by_loop.setdefault(task.get_loop(), []).append(task)
        for loop, tasks in by_loop.items():
            if not loop.is_closed():
                loop.call_soon_threadsafe(_cancel_waiting, tasks)
        prev = self.prev
        if not callable(prev):      # never swallow a Ctrl-C: Python's own
            prev = signal.default_int_handler
        prev(signum, frame)         # asyncio.run's, a kernel's, or KeyboardInterrupt


def _cancel_waiting(tasks: List["asyncio.Task[Any]"]) -> None:
    for task in tasks:
        # Already being cancelled (asyncio.run's handler ran first): once is
        # enough, and asyncio.run counts on it being once.
        cancelling = getattr(task, "cancelling", None)     # Python 3.11+
        if not task.done() and not (cancelling is not None and cancelling()):
            task.cancel()


_sigint = _SigintCancels()
_main_thread = threading.main_thread()


def _waiting_task(loop: Optional[asyncio.AbstractEventLoop] = None
                  ) -> Optional["asyncio.Task[Any]"]:
    """The current task when Ctrl-C should reach it (main thread), else None.
    ``loop``: the running loop when the caller has it (asyncio looks it up
    otherwise, with a getpid() system call each time)."""
    if threading.current_thread() is not _main_thread:
        return None
    task = asyncio.current_task(loop)
    if task is not None:
        _sigint.add(task)
    return task


# ---------------------------------------------------------------------------
# The pool of amap_with_concurrency's calls (its _APool: _aio_batch.py)

_current_pool: "contextvars.ContextVar[Optional[_APool]]" = contextvars.ContextVar(
    "llmretry_async_pool", default=None)


def _group_kw(engine: Any) -> Dict[str, Any]:
    pool = _current_pool.get()
    return {} if pool is None else {"group": pool.group_for(engine)}


# ---------------------------------------------------------------------------
# One call

async def acall(client: "Client", engine: Any, payload: bytes, extra: Dict[str, Any],
                kwargs: Dict[str, Any], finish: Callable[[Any], "Result"]) -> "Result":
    """Run one prepared call on this loop's channel; its Result (finish)."""
    lc = _loop_channel(client, engine)
    call = lc.channel.call(payload, as_result=True, **_group_kw(engine), **extra, **kwargs)
    fut: "asyncio.Future[Any]" = lc.loop.create_future()

    def on_news() -> None:
        try:
            if call.try_chunk() is None:        # the call's end (its mail delivered)
                lc.waiting.pop(call, None)
                if not fut.done():
                    fut.set_result(call.outcome())
        except Exception as exc:                # a validator or a value that failed
            lc.waiting.pop(call, None)
            call.cancel()
            if not fut.done():
                fut.set_exception(exc)
        except BaseException:                   # KeyboardInterrupt, SystemExit: the loop's
            lc.waiting.pop(call, None)
            call.cancel()
            raise

    lc.waiting[call] = on_news
    task = _waiting_task(lc.loop)
    try:
        out = await fut
    except asyncio.CancelledError:
        if not call.done:
            await lc.cancel_and_wait(call)
        raise
    except BaseException:           # GeneratorExit (the loop is going): no waiting
        if not call.done:
            call.cancel()
            lc.drain_then_forget(call)
        raise
    finally:
        if task is not None:
            _sigint.discard(task)
    return finish(out)


# ---------------------------------------------------------------------------
# Streams

class AsyncStream(StreamBase):
    """One streaming call on the event loop (see :func:`llmretry.astream_llm`).

    ``async with`` it; ``async for chunk in s`` yields each chunk as it
    arrives (the parsed JSON of one event), ``s.text_deltas()`` only the
    content strings, ``await s.result()`` the assembled :class:`Result`.
    The rules are :class:`~llmretry.Stream`'s: until you have read a chunk,
    a failed attempt is retried; after that a failure raises
    :class:`~llmretry.StreamInterruptedError`. Leaving the block early
    cancels the call (its last event is delivered before the block ends).

    Attributes:
        request_id: the call's request id (sent as ``X-Client-Request-Id``).
        chunks_read: how many chunks you have read so far.
    """

    __slots__ = ("_lc", "_waiter")

    def __init__(self, call: Any, lc: _LoopChannel, finish: Callable[[Any], Any],
                 parse: Callable[[bytes], Any]) -> None:
        super().__init__(call, finish, parse)
        self._lc = lc
        self._waiter: Optional["asyncio.Future[None]"] = None
        lc.waiting[call] = self._on_news

    def _on_news(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def __aenter__(self) -> "AsyncStream":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def _next(self) -> Optional[Tuple[Optional[str], bytes]]:
        """The next raw chunk, None at the end; waits on the loop."""
        call = self._raw
        while True:
            item = call.try_chunk()             # delivers events, validation on the way
            if item is not False:
                if item is None:
                    self._lc.waiting.pop(call, None)
                return item  # type: ignore[no-any-return]
            self._waiter = self._lc.loop.create_future()
            task = _waiting_task()
            try:
                await self._waiter
            except asyncio.CancelledError:
                self._waiter = None
                if not call.done:
                    self._closed = True
                    await self._lc.cancel_and_wait(call)
                raise
            except BaseException:       # GeneratorExit: no waiting
                self._waiter = None
                if not call.done:
                    call.cancel()
                    self._closed = True
                    self._lc.drain_then_forget(call)
                raise
            finally:
                if task is not None:
                    _sigint.discard(task)
            self._waiter = None

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[Any]:
        async for _event, chunk in self.events():
            yield chunk

    async def events(self) -> AsyncIterator[Tuple[str, Any]]:
        """Each chunk with its SSE event name (see :meth:`Stream.events`)."""
        while True:
            item = await self._next()
            if item is None:
                break
            got = self._chunk(item)
            if got is not None:
                yield got
        self._end()

    async def text_deltas(self) -> AsyncIterator[str]:
        """Only the content strings of choice 0 (of a typed stream, its
        ``response.output_text.delta`` texts), as they arrive."""
        async for event, chunk in self.events():
            for text in content_deltas(chunk, event):
                yield text

    async def result(self) -> "Result":
        """Wait for the end (reading what is left) and return the assembled
        :class:`Result`, or raise the call's :class:`LLMError`."""
        async for _ in self._chunks():
            pass
        if self._error is not None:
            raise self._error
        return self._outcome  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        """Cancel the call if it is still running and wait for its end (its
        last event is delivered here). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if not self._raw.done:
            self._raw.cancel()
            while await self._next() is not None:
                pass                # chunks after the cancel: dropped


def astream(client: "Client", engine: Any, payload: bytes, extra: Dict[str, Any],
            kwargs: Dict[str, Any], finish: Callable[[Any], Any],
            parse: Callable[[bytes], Any]) -> AsyncStream:
    """Start a prepared streaming call on this loop's channel."""
    lc = _loop_channel(client, engine)
    call = lc.channel.stream(payload, as_result=True, **_group_kw(engine), **extra, **kwargs)
    return AsyncStream(call, lc, finish, parse)
