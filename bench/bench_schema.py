"""Structured outputs: what checking an answer against its schema costs (issue 31).

1. Per answer: a ~2 KB answer against a 40-property schema, checked by the core
   (``_llmretry.schema_errors``: the text validated in place, no tree built, the
   schema compiled once and kept, as the engine checks each answer), by ``jsonschema`` (json.loads +
   a Draft 2020-12 validator built once), by ``jsonschema-rs`` (json.loads +
   a validator built once) and by pydantic 2's ``model_validate_json``. Each
   the median of ROUNDS runs of N answers, in microseconds per answer.
2. ``call_many`` against the project's mock with the schema on and off
   (``schema=`` of the same schema, every answer valid), alternating rounds:
   throughput, and this process's CPU per call (user + system, every thread:
   the caller's and the engine's). The mock runs in a process of its own, so
   neither figure counts its work; the CPU figure is the one a loaded machine
   leaves steady.

Run with bench/run_schema.sh (a venv holding the peers); prints markdown.
Knobs: N=20000 ROUNDS=5 CALLS=2000 LIMIT=64 BATCH_ROUNDS=6.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import urllib.request
from typing import Any, Callable, Dict, List, Optional, Tuple

import llmretry
from llmretry import _llmretry

N = int(os.environ.get("N", "20000"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
CALLS = int(os.environ.get("CALLS", "2000"))
LIMIT = int(os.environ.get("LIMIT", "64"))
BATCH_ROUNDS = int(os.environ.get("BATCH_ROUNDS", "6"))


def make_schema() -> Dict[str, Any]:
    """40 properties of every kind strict mode has: bounded strings, integers
    and numbers, enums, arrays, a nested object, a nullable field."""
    props: Dict[str, Any] = {}
    for i in range(40):
        kind = i % 8
        if kind == 0:
            props[f"text_{i}"] = {"type": "string", "maxLength": 200}
        elif kind == 1:
            props[f"count_{i}"] = {"type": "integer", "minimum": 0}
        elif kind == 2:
            props[f"score_{i}"] = {"type": "number", "minimum": 0, "maximum": 1}
        elif kind == 3:
            props[f"label_{i}"] = {"type": "string", "enum": ["low", "medium", "high"]}
        elif kind == 4:
            props[f"tags_{i}"] = {"type": "array", "items": {"type": "string"}, "maxItems": 10}
        elif kind == 5:
            props[f"flag_{i}"] = {"type": "boolean"}
        elif kind == 6:
            props[f"note_{i}"] = {"type": ["string", "null"]}
        else:
            props[f"point_{i}"] = {"type": "object", "additionalProperties": False,
                                   "required": ["x", "y"],
                                   "properties": {"x": {"type": "number"},
                                                  "y": {"type": "number"}}}
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}


def make_answer(schema: Dict[str, Any]) -> str:
    values: Dict[str, Any] = {}
    for name in schema["properties"]:
        kind = name.split("_")[0]
        values[name] = {"text": "A sentence of the answer, in plain words, of some length: "
                                "long enough that the answer as a whole is about two KB.",
                        "count": 42, "score": 0.75, "label": "medium",
                        "tags": ["alpha", "beta", "gamma", "delta"], "flag": True,
                        "note": "a short note, with a few more words in it to say",
                        "point": {"x": 1.5, "y": -2.25}}[kind]
    return json.dumps(values)


def per_answer(check: Callable[[str], Any], answer: str) -> float:
    """Median µs per answer over ROUNDS runs of N checks."""
    check(answer)
    runs = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(N):
            check(answer)
        runs.append((time.perf_counter() - t0) / N * 1e6)
    return statistics.median(runs)


def pydantic_model(schema: Dict[str, Any]) -> Any:
    import pydantic
    from typing import List as L, Literal, Optional as O

    class Point(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        x: float
        y: float

    fields: Dict[str, Any] = {}
    for name in schema["properties"]:
        kind = name.split("_")[0]
        fields[name] = {
            "text": (pydantic.constr(max_length=200), ...),
            "count": (pydantic.conint(ge=0), ...),
            "score": (pydantic.confloat(ge=0, le=1), ...),
            "label": (Literal["low", "medium", "high"], ...),
            "tags": (pydantic.conlist(str, max_length=10), ...),
            "flag": (bool, ...),
            "note": (O[str], ...),
            "point": (Point, ...),
        }[kind]
    return pydantic.create_model("Answer", __config__=pydantic.ConfigDict(extra="forbid"),
                                 **fields)


def main() -> None:
    schema = make_schema()
    schema_text = json.dumps(schema)
    answer = make_answer(schema)
    assert _llmretry.schema_errors(schema_text, answer) is None
    rows: List[List[str]] = []

    rows.append(["llmretry core (the text validated in place)",
                 f"{per_answer(lambda a: _llmretry.schema_errors(schema_text, a), answer):.1f}"])
    try:
        import jsonschema
        v = jsonschema.Draft202012Validator(schema)
        assert v.is_valid(json.loads(answer))
        version = importlib.metadata.version("jsonschema")
        rows.append([f"jsonschema {version} (json.loads + is_valid)",
                     f"{per_answer(lambda a: v.is_valid(json.loads(a)), answer):.1f}"])
    except ImportError:
        rows.append(["jsonschema", "not installed"])
    try:
        import jsonschema_rs
        rv = jsonschema_rs.validator_for(schema)
        assert rv.is_valid(json.loads(answer))
        rows.append([f"jsonschema-rs {importlib.metadata.version('jsonschema-rs')} "
                     "(json.loads + is_valid)",
                     f"{per_answer(lambda a: rv.is_valid(json.loads(a)), answer):.1f}"])
    except ImportError:
        rows.append(["jsonschema-rs", "not installed"])
    try:
        import pydantic
        model = pydantic_model(schema)
        model.model_validate_json(answer)
        rows.append([f"pydantic {pydantic.VERSION} (model_validate_json)",
                     f"{per_answer(model.model_validate_json, answer):.1f}"])
    except ImportError:
        rows.append(["pydantic", "not installed"])

    print(f"## Checking one answer ({len(answer)} bytes, 40 properties; "
          f"median of {ROUNDS} x {N})\n")
    print("| checker | µs per answer |\n|---|---:|")
    for name, us in rows:
        print(f"| {name} | {us} |")
    print()
    batch(schema, answer)


def _start_mock() -> Tuple[subprocess.Popen, str]:
    """The mock in its own process (``python -m llmretry.testing --port 0``)."""
    proc = subprocess.Popen([sys.executable, "-m", "llmretry.testing", "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = int(proc.stdout.readline().split()[-1])
    return proc, f"http://127.0.0.1:{port}"


def _script(base: str, name: str, after: Dict[str, Any]) -> str:
    req = urllib.request.Request(f"{base}/_mock/scenarios/{name}", method="PUT",
                                 data=json.dumps({"steps": [], "after": after}).encode(),
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req).read()
    return f"{base}/s/{name}/v1"


def _cpu() -> float:
    # getrusage, not os.times: its clock ticks (10 ms) were a few percent
    # of a round's CPU.
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def batch(schema: Dict[str, Any], answer: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    proc, base = _start_mock()
    try:
        url = _script(base, "b", {"content": answer})
        client = llmretry.Client(api_key="k", logger=None, base_url=url)
        rates: Dict[str, List[float]] = {"off": [], "on": []}
        cpus: Dict[str, List[float]] = {"off": [], "on": []}
        client.call_many([body] * 100, limit=LIMIT)          # warm-up
        for _ in range(BATCH_ROUNDS):
            for mode in ("off", "on"):
                options: Dict[str, Optional[Any]] = {"schema": schema} if mode == "on" else {}
                c0, t0 = _cpu(), time.perf_counter()
                out = client.call_many([body] * CALLS, limit=LIMIT, **options)
                wall, cpu = time.perf_counter() - t0, _cpu() - c0
                rates[mode].append(CALLS / wall)
                cpus[mode].append(cpu / CALLS * 1e6)
                assert out.summary.failed == 0
        client.close()
    finally:
        proc.terminate()
        proc.wait()
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    coff, con = statistics.median(cpus["off"]), statistics.median(cpus["on"])
    print(f"## call_many against the mock in its own process ({CALLS} calls, limit {LIMIT}, "
          f"median of {BATCH_ROUNDS} alternating rounds)\n")
    print("| schema | calls/s | CPU µs per call | rounds (calls/s) | rounds (CPU µs) |")
    print("|---|---:|---:|---|---|")
    for mode, rate, cpu in (("off", off, coff), ("on", on, con)):
        print(f"| {mode} | {rate:.0f} | {cpu:.1f} | {' '.join(f'{r:.0f}' for r in rates[mode])} "
              f"| {' '.join(f'{c:.0f}' for c in cpus[mode])} |")
    print(f"\non / off: {on / off:.2f} in calls/s; {coff / con:.2f} in CPU per call "
          f"(+{con - coff:.1f} µs per call with the schema)")

if __name__ == "__main__":
    main()
