"""Python's typed surface is generated from the core's tables (issue 33):
tools/gen_surface.py writes CallOptions, Meta's slots, LLMError's fields,
the kind -> exception map, the extension's EngineOptions and
docs/reliability.md's option table from ``_llmretry.describe()``.

The committed files must be what the generator writes now (a table changed
in the core without ``make generate`` fails here), a change to the tables
must show as stale, and what the package does at run time must be the
core's lists, not copies of them.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

import llmretry
from llmretry import _llmretry, _logging, _options, errors
from conftest import ROOT, SECRET_KEY, Scenario, child_env, secret_body

# Reads sources and the extension's tables: nothing for the sanitizer pass.
pytestmark = pytest.mark.pure_python

GENERATOR = ROOT / "tools" / "gen_surface.py"


def generate(*args: str) -> subprocess.CompletedProcess[str]:
    env = child_env()
    env.pop("LD_PRELOAD", None)
    cmd = [sys.executable, str(GENERATOR), "--root", str(ROOT),
           "--extension", str(Path(_llmretry.__file__)), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def test_the_generated_blocks_are_current() -> None:
    proc = generate("--check")
    assert proc.returncode == 0, (
        "generated files are stale: run `make generate` and commit them\n"
        f"{proc.stdout}{proc.stderr}")


def changed(tables: Dict[str, Any]) -> Dict[str, Any]:
    """The core's tables with one more option, meta field, error field and
    kind: what a core change that nobody regenerated for looks like."""
    t = json.loads(json.dumps(tables))     # lists, not tuples
    t["options"].append(dict(t["options"][0], name="brand_new_option",
                             doc="a new option", flags=1))
    t["shapes"]["meta"].append(dict(t["shapes"]["meta"][0], name="brand_new_meta"))
    t["shapes"]["error"].append(dict(t["shapes"]["error"][0], name="brand_new_error"))
    t["error_kinds"].append("brand_new_kind")
    return t


def test_a_change_to_the_core_tables_shows_as_stale(tmp_path: Path) -> None:
    path = tmp_path / "tables.json"
    path.write_text(json.dumps(changed(_llmretry.describe())), encoding="utf-8")
    proc = generate("--check", "--tables", str(path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    added: Dict[str, List[str]] = {}      # file -> the lines the diff adds
    for part in proc.stdout.split("--- a/")[1:]:
        file = part.split("\n", 1)[0]
        added[file] = [ln for ln in part.splitlines() if ln.startswith("+")]
    for name, file in (("brand_new_option", "python/llmretry/_options.py"),
                       ("brand_new_option", "docs/reliability.md"),
                       ("brand_new_option", "python/llmretry/_llmretry.pyi"),
                       ("brand_new_meta", "python/llmretry/_results.py"),
                       ("brand_new_error", "python/llmretry/errors.py"),
                       ("BrandNewKindError", "python/llmretry/errors.py")):
        assert any(name in ln for ln in added.get(file, [])), (name, file, proc.stdout)
    # The hand-written docstrings beside the blocks are checked too.
    assert "does not name 'brand_new_meta'" in proc.stderr
    assert "does not name 'brand_new_kind'" in proc.stderr


def test_the_package_uses_the_cores_lists() -> None:
    t = _llmretry.describe()
    names = {shape: [f["name"] for f in fields] for shape, fields in t["shapes"].items()}
    assert list(llmretry.Meta.__slots__) == names["meta"]
    assert list(errors._FIELDS) == [n for n in names["error"] if n != "message"]
    assert list(errors._ERROR_BY_KIND) == list(t["error_kinds"])
    for kind, cls in errors._ERROR_BY_KIND.items():
        assert cls.kind == kind and issubclass(cls, llmretry.LLMError)
    options = {o["name"] for o in t["options"]}
    python_own = {"response_model", "validate", "logger"}
    elsewhere = {"model", "policy", "stream_buffer_bytes", "estimated_tokens", "event_mask"}
    assert _options._OPTION_NAMES == (options - elsewhere) | python_own
    assert set(_options.CallOptions.__annotations__) == _options._OPTION_NAMES
    # A batch shares all but each call's own (and its deadline is its own).
    per_call = {o["name"] for o in t["options"] if o["flags"] & 8}
    assert set(_options.BatchOptions.__annotations__) == (
        _options._OPTION_NAMES - per_call - {"deadline_ms"})


def test_outcomes_carry_the_cores_fields(scen: Scenario) -> None:
    """What the extension hands over is the core's shapes, walked: a
    success's meta fields, a failure's error fields, stats' fields."""
    t = _llmretry.describe()
    names = {shape: {f["name"] for f in fields} for shape, fields in t["shapes"].items()}
    scen.script([{"usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}},
                 {"status": 400}])
    engine = _llmretry.Engine()
    try:
        body = json.dumps(secret_body("gen")).encode()
        ok = engine.call(body, base_url=scen.url, api_key=SECRET_KEY)
        failed = engine.call(body, base_url=scen.url, api_key=SECRET_KEY)
        stats: List[Dict[str, Any]] = engine.endpoint_stats()
        group = engine.group(2).stats()
    finally:
        engine.close()
    assert set(ok) == {"ok", "body"} | names["meta"]
    assert set(failed) == {"ok"} | names["error"], set(failed) ^ ({"ok"} | names["error"])
    assert failed["kind"] == "http_status" and failed["status"] == 400
    assert set(ok["usage"]) == names["usage"]
    assert stats and all(set(s) == names["endpoint"] for s in stats)
    assert set(group) == names["group"]


def test_the_extension_exports_its_init_function_only() -> None:
    # Issue 33 item 8: the binding's helpers (put, set_int, ...) are private
    # to it; an exported unprefixed name could clash with another extension
    # loaded into the same process.
    out = subprocess.run(["nm", "-D", "--defined-only", _llmretry.__file__],
                         capture_output=True, text=True, check=True).stdout
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert names == ["PyInit__llmretry"], names


def load_generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_surface", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BATCH_FUNCTIONS = (
    ("many", llmretry.call_many), ("many", llmretry.acall_many),
    ("many", llmretry.Client.call_many), ("many", llmretry.Client.acall_many),
    ("map", llmretry.map_with_concurrency), ("map", llmretry.amap_with_concurrency),
    ("map", llmretry.Client.map_with_concurrency),
    ("map", llmretry.Client.amap_with_concurrency),
)


def test_the_batch_signatures_are_the_batch_table() -> None:
    """Every batch function shows (help(), type checkers) each keyword of
    its set in BATCH_KEYWORDS with the table's type and default, and no
    other keyword of its own."""
    gen = load_generator()
    for which, fn in BATCH_FUNCTIONS:
        params = inspect.signature(fn).parameters
        own = [p for p in params.values() if p.kind is p.KEYWORD_ONLY and p.name != "client"]
        rows = [r for r in gen.BATCH_KEYWORDS if which in r[3].split()]
        assert [p.name for p in own] == [r[0] for r in rows], fn.__qualname__
        for p, (name, typ, default, _, _) in zip(own, rows):
            # (annotations are their source text, quotes as Python prints them)
            assert p.annotation.replace("'", "\"") == typ, (fn.__qualname__, name)
            assert p.default is eval(default, vars(_logging)), (fn.__qualname__, name)
    doc = (ROOT / "docs" / "batch.md").read_text(encoding="utf-8")
    for name, *_ in gen.BATCH_KEYWORDS:
        assert f"| `{name}` |" in doc, name


def test_a_hand_edit_of_a_batch_signature_shows_as_stale(tmp_path: Path) -> None:
    """The batch blocks are checked like the core's: a copy edited by hand
    (a default changed in one signature) fails --check, naming the file."""
    gen = load_generator()
    tables = tmp_path / "tables.json"
    tables.write_text(json.dumps(_llmretry.describe()), encoding="utf-8")
    for file in gen.render(ROOT, _llmretry.describe()):
        (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / file).write_text((ROOT / file).read_text(encoding="utf-8"),
                                     encoding="utf-8")
    pool = tmp_path / "python" / "llmretry" / "_pool.py"
    text = pool.read_text(encoding="utf-8")
    assert text.count("resume: bool = False,") == 1
    pool.write_text(text.replace("resume: bool = False,", "resume: bool = True,"),
                    encoding="utf-8")
    env = child_env()
    env.pop("LD_PRELOAD", None)
    proc = subprocess.run([sys.executable, str(GENERATOR), "--root", str(tmp_path), "--check",
                           "--tables", str(tables)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "b/python/llmretry/_pool.py" in proc.stdout
    assert "+                         resume: bool = False," in proc.stdout


def test_a_new_batch_keyword_reaches_every_batch_signature() -> None:
    """A row added to BATCH_KEYWORDS is written into every signature of its
    set, every call that passes the set on, and docs/batch.md's table."""
    gen = load_generator()
    gen.BATCH_KEYWORDS = gen.BATCH_KEYWORDS + (
        ("brand_new_batch", "int", "7", "many map", "a new batch keyword"),)
    out = gen.render(ROOT, _llmretry.describe())
    # file -> (signatures, forwarding calls) of the batch functions there
    places = {"python/llmretry/_api.py": (2, 2), "python/llmretry/_client.py": (4, 4),
              "python/llmretry/_client_batch.py": (1, 0), "python/llmretry/_pool.py": (1, 0),
              "python/llmretry/_aio_batch.py": (1, 0)}
    for file, (signatures, calls) in places.items():
        assert out[file].count("brand_new_batch: int = 7,") == signatures, file
        assert out[file].count("brand_new_batch=brand_new_batch,") == calls, file
        before = (ROOT / file).read_text(encoding="utf-8")
        assert before.count("# BEGIN GENERATED m") == signatures + calls, file
    assert "| `brand_new_batch` | `int` | `7` |" in out["docs/batch.md"]


def run_generator(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = child_env()
    env.pop("LD_PRELOAD", None)
    return subprocess.run([sys.executable, str(GENERATOR), "--root", str(root), *args],
                          env=env, capture_output=True, text=True, timeout=120)


def test_a_stale_call_llm_defaults_paragraph_fails_check(tmp_path: Path) -> None:
    """call_llm's docstring's built-in defaults are a generated block: in a
    scratch copy whose prose stops showing ``max_retries=3`` the paragraph
    is missing (stale), gen_surface.py writes it, and a hand edit of it is
    stale again."""
    tables = tmp_path / "tables.json"
    tables.write_text(json.dumps(_llmretry.describe()), encoding="utf-8")
    for file in load_generator().render(ROOT, _llmretry.describe()):
        (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / file).write_text((ROOT / file).read_text(encoding="utf-8"),
                                     encoding="utf-8")
    api = tmp_path / "python" / "llmretry" / "_api.py"
    text = api.read_text(encoding="utf-8")
    assert text.count("``max_retries=3``") == 1
    api.write_text(text.replace("``max_retries=3``", "three retries"), encoding="utf-8")
    proc = run_generator(tmp_path, "--check", "--tables", str(tables))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "b/python/llmretry/_api.py" in proc.stdout
    assert "+    Built-in defaults of the other keywords: ``max_retries=3``." in proc.stdout
    proc = run_generator(tmp_path, "--tables", str(tables))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = api.read_text(encoding="utf-8")
    assert "    Built-in defaults of the other keywords: ``max_retries=3``.\n\n" \
           "    Example::" in text
    assert run_generator(tmp_path, "--check", "--tables", str(tables)).returncode == 0
    api.write_text(text.replace("keywords: ``max_retries=3``", "keywords: ``max_retries=5``"),
                   encoding="utf-8")
    proc = run_generator(tmp_path, "--check", "--tables", str(tables))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "-    Built-in defaults of the other keywords: ``max_retries=5``." in proc.stdout
    assert "+    Built-in defaults of the other keywords: ``max_retries=3``." in proc.stdout


def test_a_new_option_reaches_call_llm_help_with_no_hand_edit(tmp_path: Path) -> None:
    """A row added to the core's option table shows in help(call_llm), with
    its default, once gen_surface.py has run: in a scratch copy of the
    package (the tables given as JSON, as a rebuilt core would report
    them), imported by a fresh interpreter."""
    t = json.loads(json.dumps(_llmretry.describe()))
    t["options"].append(dict(t["options"][0], name="brand_new_option", type="int",
                             builtin="7", flags=0, doc="a new option"))
    tables = tmp_path / "tables.json"
    tables.write_text(json.dumps(t), encoding="utf-8")
    package = tmp_path / "python" / "llmretry"
    shutil.copytree(ROOT / "python" / "llmretry", package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    extension = Path(_llmretry.__file__)
    if not (package / extension.name).exists():     # an extension built elsewhere
        shutil.copy2(extension, package / extension.name)
    for doc in ("reliability.md", "batch.md"):
        (tmp_path / "docs").mkdir(exist_ok=True)
        shutil.copy2(ROOT / "docs" / doc, tmp_path / "docs" / doc)
    proc = run_generator(tmp_path, "--tables", str(tables))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    env = child_env()
    env.pop("LD_PRELOAD", None)
    env["PYTHONPATH"] = str(tmp_path / "python")
    proc = subprocess.run(
        [sys.executable, "-c", "import pydoc, llmretry; print(llmretry.__file__); "
         "print(pydoc.render_doc(llmretry.call_llm, renderer=pydoc.plaintext))"],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(str(package)), proc.stdout.splitlines()[0]
    listed = proc.stdout.split("Built-in defaults of the other keywords:")[1]
    assert "``brand_new_option=7``" in listed.split("Example::")[0], proc.stdout
    # The real package's help is unchanged: nothing is added at import.
    assert "brand_new_option" not in (llmretry.call_llm.__doc__ or "")
