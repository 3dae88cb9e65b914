"""What `import llmretry` costs: asyncio, uuid (with platform) and the Batch
API's urllib.request are imported on first use, not by every script and
every `llmretry call` from a shell; the names that need them still work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import llmretry
from conftest import Scenario

PACKAGE_PARENT = str(Path(llmretry.__file__).resolve().parent.parent)
LEFT_FOR_FIRST_USE = ("asyncio", "uuid", "urllib.request", "llmretry._aio",
                      "llmretry._aio_batch", "llmretry.batch_api")


def _fresh(code: str) -> str:
    """Run ``code`` in a fresh interpreter with no site (nothing a site's
    .pth imports can hide what llmretry imports), llmretry on its path."""
    env = dict(os.environ, PYTHONPATH=PACKAGE_PARENT)
    done = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_import_leaves_asyncio_and_the_rare_modules_to_first_use() -> None:
    out = _fresh("import sys, json\n"
                 f"names = {LEFT_FOR_FIRST_USE!r}\n"
                 "before = [m for m in names if m in sys.modules]\n"
                 "import llmretry\n"
                 "print(json.dumps([before, [m for m in names if m in sys.modules]]))")
    before, after = json.loads(out)
    assert before == [], f"the bare interpreter has {before} already: the test cannot tell"
    assert after == []


def test_the_command_leaves_the_batch_api_to_its_flag() -> None:
    # `llmretry call` and a realtime batch: no Batch API, no asyncio.
    out = _fresh("import sys, llmretry.cli\n"
                 "print(sorted(m for m in ('asyncio', 'llmretry.batch_api', 'urllib.request')"
                 " if m in sys.modules))")
    assert out.strip() == "[]"


def test_the_names_left_to_first_use_are_the_modules_own() -> None:
    out = _fresh("import llmretry, sys\n"
                 "from llmretry import _aio, _aio_batch\n"
                 "assert llmretry.AsyncStream is _aio.AsyncStream\n"
                 "assert llmretry.amap_with_concurrency is _aio_batch.amap_with_concurrency\n"
                 "assert llmretry.batch_api is sys.modules['llmretry.batch_api']\n"
                 "ns = {}\n"
                 "exec('from llmretry import *', ns)\n"
                 "assert ns['AsyncStream'] is _aio.AsyncStream\n"
                 "assert ns['amap_with_concurrency'] is _aio_batch.amap_with_concurrency\n"
                 "missing = [n for n in llmretry.__all__ if n not in ns]\n"
                 "print(missing)")
    assert out.strip() == "[]"


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    out = _fresh("import llmretry\n"
                 "try:\n"
                 "    llmretry.acall_lmm\n"
                 "except AttributeError as exc:\n"
                 "    print(exc)\n")
    assert out.strip() == "module 'llmretry' has no attribute 'acall_lmm'"


def test_a_client_closed_without_asyncio_does_not_import_it() -> None:
    out = _fresh("import sys, llmretry\n"
                 "c = llmretry.Client(base_url='http://127.0.0.1:9/v1', api_key='k')\n"
                 "c.close()\n"
                 "print('asyncio' in sys.modules, 'llmretry._aio' in sys.modules)")
    assert out.split() == ["False", "False"]


def test_an_await_after_a_plain_import_runs_on_the_engine(scen: Scenario) -> None:
    # acall_llm imports llmretry._aio on its first await: the call is made.
    out = _fresh("import asyncio, json, llmretry\n"
                 f"c = llmretry.Client(base_url={scen.url!r}, api_key='k')\n"
                 "body = {'model': 'm', 'messages': [{'role': 'user', 'content': 'hi'}]}\n"
                 "res = asyncio.run(c.acall_llm(body, max_retries=0))\n"
                 "c.close()\n"
                 "print(json.dumps(res.data['choices'][0]['message']['role']))")
    assert json.loads(out) == "assistant"
    assert len(scen.requests()) == 1
