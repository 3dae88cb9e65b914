"""LLM calls inside a Ray Data job against one per-key limit (issue 29).

N rows (default 3,000) on a 2-actor Ray job against the mock server enforcing
a limit per key in a sliding window (default 100 requests in any second, the
``limits`` of llmretry.testing, which answer 429 with Retry-After and the
rate-limit headers), each answer after a 50 ms delay. Three ways to make the
calls:

* ``llmretry``: ``llmretry.ray.map_calls(ds, concurrency=2, limit=16,
  shared="shm:...", rpm=<the limit>)``: both actors pace against one budget.
* ``ray-data-llm``: Ray's own ``ray.data.llm.HttpRequestProcessorConfig``
  with ``qps`` = the limit divided by the actors (as its docs suggest),
  ``concurrency=2``, ``max_retries=3`` (its default is 0).
* ``openai-udf``: a hand-written ``map_batches`` callable class holding an
  ``openai.OpenAI`` client (``max_retries=3``, its default 2; it honours
  Retry-After) and a thread pool of 16, one call per row; a row whose call
  raises is recorded as failed (the job goes on).

For each: rows that came back answered, rows failed (or the job's exception
when it raised), the requests the mock saw, refused for the limit and (with
``--outage-ms``) answered 503 in the outage, and the wall time of the job
(actor start-up included; rows / limit is the floor). llmretry's failed rows
then get one ``retry_failed`` pass (the note says how many it answered).
Prints a markdown table.

Usage: python3 bench/bench_cluster.py [--rows 3000] [--rps 100] [--latency-ms 50]
       [--clients llmretry,ray-data-llm,openai-udf] [--runs 1]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Tuple

import ray
import ray.data

import llmretry
import llmretry.ray

ACTORS = 2
LIMIT = 16


class Mock:
    """The mock server in a process of its own (the driver stays Ray's)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "llmretry.testing", "--port", "0"],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.root = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"

    def _call(self, method: str, path: str, doc: Any = None) -> Any:
        data = None if doc is None else json.dumps(doc).encode()
        req = urllib.request.Request(self.root + path, data=data, method=method)
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def script(self, name: str, rps: int, latency_ms: int, outage_ms: int) -> str:
        doc: Dict[str, Any] = {"steps": [], "after": {"delay_ms": latency_ms},
                               "limits": {"rpm": rps, "window_ms": 1000}}
        if outage_ms:
            # 503s from 5 s after the first request, as a provider's hiccup.
            doc["outage"] = {"mode": "503", "from_ms": 5000, "to_ms": 5000 + outage_ms}
        self._call("PUT", f"/_mock/scenarios/{name}", doc)
        return f"{self.root}/s/{name}/v1"

    def limits(self, name: str) -> Dict[str, int]:
        stats: Dict[str, int] = self._call("GET", f"/_mock/limits/{name}")
        stats["outage"] = self._call("GET", f"/_mock/outage/{name}")["during"]
        return stats

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def body(i: int) -> str:
    return json.dumps({"model": "gpt-4o-mini", "max_tokens": 16,
                       "messages": [{"role": "user", "content": f"Summarise ticket {i}"}]})


# llmretry's rows answered after its resume pass, per run (for the verdict).
RESUMED: List[int] = []


def run_llmretry(ds: Any, url: str, rps: int) -> Tuple[int, int, str]:
    store = f"bench-cluster-{uuid.uuid4().hex[:10]}"
    options: Dict[str, Any] = dict(concurrency=ACTORS, limit=LIMIT, shared=f"shm:{store}",
                                   base_url=url, api_key="sk-bench", rpm=rps * 60,
                                   max_retries=3, logger=None)
    try:
        out = llmretry.ray.map_calls(ds, **options).materialize()
        s = llmretry.ray.summarize(out)
        if not s["failed"]:
            RESUMED.append(s["ok"])
            return s["ok"], 0, ""
        # The resume: the failed rows once more (on the same budget), the
        # others kept.
        t0 = time.monotonic()
        again = llmretry.ray.summarize(llmretry.ray.retry_failed(out, **options).materialize())
    finally:
        try:
            os.unlink(f"/dev/shm/llmretry-{store}")
        except FileNotFoundError:
            pass
    RESUMED.append(again["ok"])
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(s["failed_by_kind"].items()))
    return s["ok"], s["failed"], (f"failed: {kinds}; after one retry_failed pass "
                                  f"({time.monotonic() - t0:.0f} s): {again['ok']} ok")


def run_ray_data_llm(ds: Any, url: str, rps: int) -> Tuple[int, int, str]:
    from ray.data.llm import HttpRequestProcessorConfig, build_processor
    config = HttpRequestProcessorConfig(url=url + "/chat/completions",
                                        headers={"Authorization": "Bearer sk-bench"},
                                        qps=max(1, rps // ACTORS), concurrency=ACTORS,
                                        max_retries=3, batch_size=64)
    processor = build_processor(
        config,
        preprocess=lambda row: dict(payload=json.loads(row["body"])),
        postprocess=lambda row: dict(id=row["id"],
                                     ok=bool(row["http_response"].get("choices"))))
    rows = processor(ds).select_columns(["ok"]).take_all()
    ok = sum(1 for r in rows if r["ok"])
    return ok, len(rows) - ok, ""


class OpenAIUDF:
    """What a user writes by hand: the openai SDK in a thread pool."""

    def __init__(self, url: str) -> None:
        import openai
        self.client = openai.OpenAI(base_url=url, api_key="sk-bench", max_retries=3,
                                    timeout=60)
        self.pool = ThreadPoolExecutor(LIMIT)

    def one(self, text: str) -> str:
        try:
            r = self.client.chat.completions.create(**json.loads(text))
            return r.choices[0].message.content or ""
        except Exception as exc:     # the row fails, the job goes on
            return f"ERROR {type(exc).__name__}"

    def __call__(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        answers = list(self.pool.map(self.one, list(batch["body"])))
        return {"id": batch["id"], "ok": [not a.startswith("ERROR ") for a in answers]}


def run_openai_udf(ds: Any, url: str, rps: int) -> Tuple[int, int, str]:
    out = ds.map_batches(OpenAIUDF, fn_constructor_kwargs={"url": url}, batch_size=4 * LIMIT,
                         compute=ray.data.ActorPoolStrategy(size=ACTORS), num_cpus=0.25)
    rows = out.take_all()
    ok = sum(1 for r in rows if r["ok"])
    return ok, len(rows) - ok, ""


CLIENTS: Dict[str, Callable[[Any, str, int], Tuple[int, int, str]]] = {
    "llmretry": run_llmretry, "ray-data-llm": run_ray_data_llm, "openai-udf": run_openai_udf}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--rps", type=int, default=100)
    ap.add_argument("--latency-ms", type=int, default=50)
    ap.add_argument("--clients", default=",".join(CLIENTS))
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--outage-ms", type=int, default=0,
                    help="503s for this long from 5 s after the first request")
    args = ap.parse_args()
    # Logical CPUs: enough that no peer's stages wait for one (each actor of
    # ray.data.llm reserves a whole CPU; their pre/postprocess tasks need more).
    ray.init(num_cpus=8, include_dashboard=False, logging_level=logging.ERROR,
             log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.wait_for_min_actors_s = 300      # time from when both actors are up
    mock = Mock()
    lines: List[str] = []
    refused: List[float] = []
    try:
        for run in range(args.runs):
            for name in args.clients.split(","):
                scenario = f"{name}-{run}-{uuid.uuid4().hex[:6]}"
                url = mock.script(scenario, args.rps, args.latency_ms, args.outage_ms)
                ds = ray.data.from_items([{"id": i, "body": body(i)} for i in range(args.rows)],
                                         override_num_blocks=max(1, args.rows // 100))
                t0 = time.monotonic()
                try:
                    ok, failed, note = CLIENTS[name](ds, url, args.rps)
                except Exception as exc:     # the job raised: rows lost
                    ok, failed = 0, 0
                    note = f"the job raised {type(exc).__name__}"
                    text = str(exc)
                    if "Reached maximum retries" in text:
                        # Its message goes on with the row's payload (the
                        # prompt): only the words before it.
                        note += ": " + text[text.index("Reached maximum retries"):].split(
                            " for input row")[0] + " for a row"
                elapsed = time.monotonic() - t0
                st = mock.limits(scenario)
                seen = st["admitted"] + st["refused"] + st["outage"]
                raised = note.startswith("the job raised")
                line = (f"| {name} | {ok} | {'-' if raised else failed} | {seen} | "
                        f"{st['refused']} ({100.0 * st['refused'] / max(seen, 1):.1f} %) | "
                        f"{st['outage']} | {elapsed:.1f} | {note} |")
                print("RESULT", line, flush=True)
                if name == "llmretry":
                    refused.append(100.0 * st["refused"] / max(seen, 1))
                lines.append(line)
    finally:
        mock.stop()
        ray.shutdown()
    print()
    print(f"{args.rows} rows, limit {args.rps} requests in any second (floor "
          f"{args.rows / args.rps:.0f} s), {args.latency_ms} ms per answer, {ACTORS} actors, "
          + (f"503s for {args.outage_ms / 1000:.0f} s from 5 s in, " if args.outage_ms else "")
          + f"llmretry {llmretry.__version__}, Ray {ray.__version__}")
    print()
    print("| client | rows ok | rows failed | requests | refused by the limit (429) | "
          "met the outage (503) | time, s | note |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for line in lines:
        print(line)
    if RESUMED:
        lost = max(args.rows - n for n in RESUMED)
        worst = max(refused)
        print()
        print(f"- llmretry: 0 rows lost, after its `retry_failed` pass: "
              f"**{'met' if lost == 0 else f'not met ({lost} lost)'}**; ≤ 1 % of requests "
              f"refused: **{'met' if worst <= 1.0 else 'not met'}** ({worst:.1f} %).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
