"""llmretry's asyncio API in a real Jupyter kernel (issue 17), and
``progress=True``'s widget there (issue 32).

A notebook cell runs on the kernel's own, already running event loop, so
``await llmretry.acall_many(...)`` at the top level of a cell is the way a
notebook user calls the package (``asyncio.run`` fails there). The test builds
a notebook, runs it in an ipykernel through nbclient (what ``jupyter nbconvert
--execute`` does), and fails if any cell raised.

The kernel is a separate process: it gets this repository's package through
PYTHONPATH (conftest.child_env), and starts its own mock server in a cell, so
the notebook also runs as is in Jupyter with llmretry installed.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any, Iterator, List

import pytest

from conftest import PYTHON_DIR, child_env

# make test installs them (tools/ensure-deps.sh); missing, the module fails.
import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
import ipykernel  # noqa: F401  (the kernel the notebook runs in)

pytestmark = pytest.mark.slow  # a kernel starts: a few seconds


@pytest.fixture(autouse=True)
def keep_recursion_limit() -> Iterator[None]:
    """Starting a kernel imports IPython and jedi in this process, and jedi
    raises the recursion limit to 3000 for good: later tests on this worker
    that count on the default (test_correctness_batch's too-deep JSON line)
    would see another limit."""
    limit = sys.getrecursionlimit()
    yield
    sys.setrecursionlimit(limit)

# Each cell is a plain string; the kernel's IPython runs top-level awaits on
# its loop (autoawait).
SETUP = """\
import asyncio, os, time
import llmretry
from llmretry.testing import MockServer

# The llmretry under test, not another one installed in the kernel's Python.
assert os.path.realpath(llmretry.__file__).startswith(os.environ["LLMRETRY_EXPECT_DIR"]), \
    llmretry.__file__
mock = MockServer().start()
mock.script("slow", [{"delay_ms": 500, "content": "slow answer"}])
url = mock.base_url
"""

# The machinery itself (kernel, PYTHONPATH, mock) with the blocking API.
SYNC_CALL = """\
res = llmretry.call_llm({"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                        base_url=url, api_key="k", logger=None)
assert res.data["choices"][0]["message"]["content"] == "ok", res.data
"""

BATCH = """\
bodies = [{"model": "m", "messages": [{"role": "user", "content": f"item {i}"}]}
          for i in range(200)]
out = await llmretry.acall_many(bodies, limit=16, base_url=url, api_key="k", logger=None)
assert out.summary.ok == 200, out.summary
assert len(out) == 200
assert all(r.data["choices"][0]["message"]["content"] == "ok" for r in out)
assert len(mock.requests("default")) == 201  # the 200, and SYNC_CALL's
"""

# A ticker task on the kernel's loop: during the slow call it must keep
# ticking every ~10 ms. A call that blocked the loop for its 0.5 s would leave
# one gap of >= 0.5 s between ticks.
TICKER = """\
ticks = []
async def ticker():
    while True:
        ticks.append(time.monotonic())
        await asyncio.sleep(0.01)
task = asyncio.create_task(ticker())
await asyncio.sleep(0.05)
t0 = time.monotonic()
res = await llmretry.acall_llm({"model": "m", "messages": [{"role": "user", "content": "s"}]},
                               base_url=mock.scenario_url("slow"), api_key="k", logger=None)
t1 = time.monotonic()
task.cancel()
assert res.data["choices"][0]["message"]["content"] == "slow answer"
assert t1 - t0 >= 0.45, t1 - t0
during = [t for t in ticks if t0 <= t <= t1]
gaps = [b - a for a, b in zip(ticks, ticks[1:]) if b >= t0 and a <= t1]
assert len(during) >= 10, (len(during), t1 - t0)
assert max(gaps) < 0.25, f"the loop stalled {max(gaps):.3f} s during acall_llm"
"""

TEARDOWN = """\
mock.stop()
print("NOTEBOOK-DONE", out.summary.ok, len(during))
"""


def build_notebook() -> Any:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# llmretry asyncio in a kernel")]
    nb.cells += [nbformat.v4.new_code_cell(src)
                 for src in (SETUP, SYNC_CALL, BATCH, TICKER, TEARDOWN)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


def run_notebook(nb: Any, tmp_path: Path) -> None:
    """Execute ``nb`` in place in a fresh ipykernel; fail on a cell's error."""
    env = child_env()
    env["LLMRETRY_EXPECT_DIR"] = str(PYTHON_DIR.resolve())
    # Keep the kernel away from the user's IPython/Jupyter config and state.
    env["IPYTHONDIR"] = str(tmp_path / "ipython")
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
    client = NotebookClient(nb, kernel_name="python3", timeout=120,
                            resources={"metadata": {"path": str(tmp_path)}})
    # Raises CellExecutionError (with the cell's traceback) if a cell raises;
    # the keywords go to the kernel manager's start_kernel.
    try:
        client.execute(env=env)
    except CellExecutionError as exc:
        # The kernel's traceback, without its terminal colours.
        pytest.fail(re.sub(r"\x1b\[[0-9;]*m", "", str(exc)), pytrace=False)


def test_async_api_in_a_jupyter_kernel(tmp_path: Path) -> None:
    nb = build_notebook()
    run_notebook(nb, tmp_path)

    outputs: List[Any] = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors, errors
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "NOTEBOOK-DONE 200" in text, text  # every cell ran, to the last


# call_many(progress=True) as a notebook user writes it. The summary event is
# INFO; a handler on the "llmretry" logger that passes just that event shows
# it in the cell's output (stderr), where it must come after the bar.
PROGRESS = """\
import logging, os, sys
import llmretry
from llmretry.testing import MockServer

assert os.path.realpath(llmretry.__file__).startswith(os.environ["LLMRETRY_EXPECT_DIR"]), \\
    llmretry.__file__
handler = logging.StreamHandler(sys.stderr)
handler.addFilter(lambda record: record.getMessage().startswith("llm_batch_summary"))
log = logging.getLogger("llmretry")
log.addHandler(handler)
log.setLevel(logging.INFO)
mock = MockServer().start()
bodies = [{"model": "m", "messages": [{"role": "user", "content": f"item {i}"}]}
          for i in range(20)]
out = llmretry.call_many(bodies, limit=4, base_url=mock.base_url, api_key="k",
                         progress=True)
mock.stop()
assert out.summary.ok == 20, out.summary
"""

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def test_progress_is_a_widget_in_a_notebook(tmp_path: Path) -> None:
    """progress=True in Jupyter is tqdm.auto's widget (tqdm and ipywidgets
    installed: tools/ensure-deps.sh), not a text bar in the cell's stderr;
    it reaches 20 of 20, and the summary event prints after it."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(PROGRESS)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    run_notebook(nb, tmp_path)

    outputs: List[Any] = nb.cells[0].outputs
    widgets = [i for i, o in enumerate(outputs)
               if o.output_type == "display_data" and WIDGET_VIEW in o.get("data", {})]
    summaries = [i for i, o in enumerate(outputs) if o.output_type == "stream"
                 and "llm_batch_summary" in o.get("text", "")]
    stderr = "".join(o.get("text", "") for o in outputs
                     if o.output_type == "stream" and o.name == "stderr")
    assert len(widgets) == 1, outputs
    assert "it/s" not in stderr and "item/s" not in stderr, stderr  # no text bar
    assert len(summaries) == 1 and summaries[0] > widgets[0], outputs
    assert re.search(r'"ok":\s*20\b', stderr), stderr
    # The widgets' last state, kept in the notebook (nbclient's
    # store_widget_state): some progress bar ended at 20 of 20.
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    bars = [m["state"] for m in state.values() if m.get("model_name") == "FloatProgressModel"]
    assert any(b.get("value") == 20 and b.get("max") == 20 for b in bars), state


def test_a_kernel_interrupt_cancels_the_awaited_call(tmp_path: Path) -> None:
    """Interrupting the kernel (the notebook's stop button: SIGINT) while a
    cell awaits acall_llm ends the cell at once, closes the call's
    connection (the server sees it) and leaves the kernel usable."""
    from jupyter_client.manager import start_new_kernel
    from test_aio import HangingServer

    env = child_env()
    env["IPYTHONDIR"] = str(tmp_path / "ipython")
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
    hang = HangingServer()
    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=60, env=env)

    def run_cell(code: str, timeout: float = 30) -> List[Any]:
        """Execute code; its iopub messages until the kernel is idle again."""
        msg_id = kc.execute(code)
        msgs: List[Any] = []
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                msg = kc.get_iopub_msg(timeout=1)
            except Exception:       # queue.Empty
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            msgs.append(msg)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return msgs
        pytest.fail(f"cell did not finish: {code!r}")

    try:
        run_cell("import llmretry")
        msg_id = kc.execute(
            "await llmretry.acall_llm({'model': 'm', 'messages': []}, "
            f"base_url={hang.url!r}, api_key='k', logger=None, timeout_ms=60000, "
            "max_retries=0)")
        # The request is out: the cell awaits its answer.
        assert hang.wait(lambda: hang.received >= 1, 20)
        assert hang.accepted == 1
        t0 = time.monotonic()
        km.interrupt_kernel()
        assert hang.wait_closed(1, 5.0), "the interrupt did not close the connection"
        assert hang.closed_at[0] - t0 < 2.0
        errors: List[str] = []
        end = time.monotonic() + 20
        while time.monotonic() < end:
            try:
                msg = kc.get_iopub_msg(timeout=1)
            except Exception:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "error":
                errors.append(msg["content"]["ename"])
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        assert errors and errors[0] in ("KeyboardInterrupt", "CancelledError"), errors
        out = run_cell("print('still-alive', 6 * 7)")
        text = "".join(m["content"].get("text", "") for m in out if m["msg_type"] == "stream")
        assert "still-alive 42" in text
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        hang.close()
