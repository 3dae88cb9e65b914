"""Write Python's typed surface and the options table of the docs from the
core's own tables (as curl's optiontable.pl writes easyoptions.c).

The core describes its call options (core/src/option_table.c), the shapes it
hands to hosts (core/src/shapes.c: meta, errors, ...) and its error kinds and
reasons; the built extension reports them all (``_llmretry.describe()``).
From them this script writes the blocks between ``BEGIN GENERATED <name>``
and ``END GENERATED <name>`` markers of:

* python/llmretry/_options.py: the ``CallOptions`` TypedDicts of every call
  keyword;
* python/llmretry/_results.py: Meta's slots, annotations and constructor;
* python/llmretry/errors.py: LLMError's fields, their defaults and
  constructor, and the kind -> exception map;
* python/llmretry/_llmretry.pyi: the extension's typed keywords
  (``EngineOptions``) and the kinds and reasons as Literal types;
* docs/reliability.md: the options table (type, default, range, what it does);
* python/llmretry/_api.py: call_llm's docstring's paragraph, before its
  example, giving the built-in default of each call keyword its prose does
  not show as ``name=value`` (none today): a docstring cannot hold comment
  markers, so the paragraph is found by its first words
  (CALL_DEFAULTS_HEAD);
* from this script's own BATCH_KEYWORDS (Python's batch keywords), the
  keywords of the call_many, acall_many, map_with_concurrency and
  amap_with_concurrency signatures (module and Client), the calls that pass
  them on, and docs/batch.md's table of them.

It also checks what stays hand-written beside them: Meta's and LLMError's
docstrings name every field, errors.py's docstring every kind, LLMError's
every reason, StreamInterruptedError's every stream reason.

Usage (after ``make build-python``; ``make generate`` runs it)::

    python3 tools/gen_surface.py            # rewrite the blocks
    python3 tools/gen_surface.py --check    # exit 1, with a diff, if any is stale
    python3 tools/gen_surface.py --root DIR # another checkout (tests)

tests/python/test_generated.py runs ``--check``: a table changed in the core
without regenerating fails the suite.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.machinery
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

HERE = Path(__file__).resolve().parent.parent
NOTE = "(tools/gen_surface.py, from the core's tables: do not edit)"

# ---- Python's own decisions about the core's tables -------------------------
# (which options Python takes elsewhere, how names read; everything else
# about an option or a field comes from the core).

# Core options that are not call keywords in Python, and why.
NOT_KEYWORDS = {
    "model": "read from the body (or a policy)",
    "policy": "call_llm's own keyword: the name of one of the client's policies",
    "stream_buffer_bytes": "a keyword of the stream functions alone",
    "estimated_tokens": "counted by the package (tiktoken when installed)",
    "event_mask": "made from the logger's level",
}
# Python's own call keywords, after the core's: (name, type, what it does).
PYTHON_KEYWORDS = (
    ("response_model", "Any", "a pydantic model: its strict schema is the call's schema, "
                              "its instance result.parsed"),
    ("validate", "Optional[Validate]", "validate(data): raising or returning False rejects "
                                       "a response (invalid_response)"),
    ("logger", "Any", "where events go: the \"llmretry\" logger, None, a Logger or a callable"),
)
# A batch's own deadline is call_many's deadline_ms; each call's is call_deadline_ms.
BATCH_RENAMED = ("deadline_ms",)
# Meta's first fields are positional (as Meta was first published); later
# ones take a default, so that code that builds a Meta keeps working.
META_POSITIONAL = 10
# Exception class names that are not the kind's CamelCase + "Error". A kind
# the core adds gets that name: the class must then be written in errors.py
# (the import fails until it is).
EXCEPTION_NAMES = {"http_status": "HTTPStatusError", "timeout": "RequestTimeoutError",
                   "cancelled": "CallCancelledError"}

# Python types of the core's option types: (as call_llm takes it, as the extension does).
OPTION_TYPES = {
    "text": ("str", "str"),
    "int": ("int", "int"),
    "bool": ("bool", "bool"),
    "statuses": ("Sequence[int]", "Sequence[int]"),
    "headers": ("Mapping[str, str]", "Sequence[str]"),
    "number": ("float", "float"),
    "targets": ("Sequence[Mapping[str, Any]]", "str"),
    "schema": ("Union[Mapping[str, Any], str, bool]", "str"),
}
# Python types of the core's field types (lists are of their item shape's dicts).
FIELD_TYPES = {"int": "int", "str": "str", "bool": "bool", "usage": "Dict[str, int]",
               "list": "List[Dict[str, Any]]", "json": "List[Dict[str, str]]"}
NULLABLE = 1          # LLMRETRY_OPTFLAG_NULLABLE
POLICY = 2            # LLMRETRY_OPTFLAG_POLICY
PER_CALL = 8          # LLMRETRY_OPTFLAG_PER_CALL
POLICY_AUTO = 16      # LLMRETRY_OPTFLAG_POLICY_AUTO

# The batch keywords, Python's own: the core's group takes a limit, a deadline
# and adaptive (llmretry_group_options) but the record, the progress bar and
# the callbacks are the host's, and Lua's call_many takes a different set.
# "many": call_many and acall_many (module and Client); "map":
# map_with_concurrency and amap_with_concurrency (module and Client). Each
# signature, each forwarding call and docs/batch.md's table are written from
# these rows: (name, type, default, sets, what it does).
BATCH_KEYWORDS = (
    ("return_exceptions", "bool", "False", "map",
     "a failed item's exception in its place; False: the first stops the batch and is raised"),
    ("deadline_ms", "Optional[int]", "None", "many map",
     "a budget for the whole batch; items not started in time fail with "
     "DeadlineExceededError"),
    ("call_deadline_ms", "Optional[int]", "DEFAULT", "many",
     "each call's own deadline (``deadline_ms`` of call_llm)"),
    ("failures_path", 'Optional[Union[str, "os.PathLike[str]"]]', "None", "many map",
     "each failed item appended here as a JSON line, each success's index to ``.done``"),
    ("resume", "bool", "False", "many map",
     "run only what an earlier run with the same ``failures_path`` did not complete"),
    ("progress", "Union[bool, Callable[[int, int, int], Any]]", "False", "many map",
     "True: a progress bar; a callable: ``(done, total, failed)`` after each item"),
    ("adaptive", "bool", "True", "many map",
     "halve the calls in flight on a burst of 429s, grow back on successes"),
    ("on_result", "Optional[Callable[[int, Any], Any]]", "None", "many map",
     "``on_result(index, value)`` as each item finishes; raising stops the batch"),
    ("policy", "Optional[str]", "None", "many",
     "the name of one of the client's policies, for every call"),
    ("keep_results", "bool", "True", "many",
     "False: values go only to ``on_result`` (and the failures file); memory stays flat"),
    ("logger", "Any", "DEFAULT", "map",
     "where the batch summary goes (a Client's: its default logger)"),
)


def load_tables(root: Path, extension: Optional[Path]) -> Dict[str, Any]:
    """The core's tables, from the built extension (under root/python unless
    given), loaded by path: importing the package would check Meta against
    the core, and a stale Meta is what this script is here to fix."""
    found = [extension] if extension else sorted(
        (root / "python" / "llmretry").glob("_llmretry*.so"))
    if not found:
        sys.exit(f"gen_surface: no built extension in {root / 'python' / 'llmretry'} "
                 "(run `make build-python` first)")
    loader = importlib.machinery.ExtensionFileLoader("llmretry._llmretry", str(found[0]))
    spec = importlib.util.spec_from_file_location("llmretry._llmretry", str(found[0]),
                                                  loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    tables: Dict[str, Any] = module.describe()
    return tables


def literal(names: Sequence[str]) -> str:
    return "Literal[" + ", ".join(json.dumps(n) for n in names) + "]"


def optional(t: str, nullable: bool) -> str:
    if not nullable:
        return t
    if t.startswith("Union["):
        return t[:-1] + ", None]"
    return f"Optional[{t}]"


def option_type(opt: Dict[str, Any], extension: bool) -> str:
    if opt["type"] == "enum":
        t = literal(opt["choices"])
    else:
        t = OPTION_TYPES[opt["type"]][1 if extension else 0]
    return optional(t, bool(opt["flags"] & NULLABLE))


def field_type(f: Dict[str, Any]) -> str:
    return optional(FIELD_TYPES[f["type"]], f["nullable"])


def field_default(f: Dict[str, Any]) -> str:
    if f["nullable"]:
        return "None"
    return {"int": "0", "bool": "False", "str": '""'}[f["type"]]


def comment(text: str, indent: str) -> List[str]:
    """`text` as `#: ` comment lines under 92 columns."""
    words, lines, line = text.split(), [], ""
    for w in words:
        if line and len(indent) + 3 + len(line) + 1 + len(w) > 92:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}" if line else w
    lines.append(line)
    return [f"{indent}#: {ln}" for ln in lines]


# ---- the blocks -----------------------------------------------------------------

def call_options(t: Dict[str, Any]) -> List[str]:
    keywords = [o for o in t["options"] if o["name"] not in NOT_KEYWORDS]
    shared = [o for o in keywords
              if not o["flags"] & PER_CALL and o["name"] not in BATCH_RENAMED]
    own = [o for o in keywords if o not in shared]
    out = ["class BatchOptions(TypedDict, total=False):",
           '    """The call keywords the calls of a batch share (``**options`` of',
           "    call_many and acall_many, whose ``deadline_ms`` is the batch's and",
           '    ``call_deadline_ms`` each call\'s), each as docs/reliability.md says."""',
           ""]
    out += keys([(o["name"], option_type(o, False), o["doc"]) for o in shared])
    out += keys(PYTHON_KEYWORDS)
    out += ["", "", "class CallOptions(BatchOptions, total=False):",
            '    """Every keyword of call_llm besides ``body``, ``client`` and ``policy``',
            "    (the same for Client(), stream_llm, acall_llm, astream_llm and their",
            '    Client methods): a batch\'s, and these that are each call\'s own."""',
            ""]
    return out + keys([(o["name"], option_type(o, False), o["doc"]) for o in own])


def keys(rows: Sequence[Tuple[str, str, str]]) -> List[str]:
    """A TypedDict's keys: each one's doc as a comment, then its line."""
    out = []
    for name, typ, doc in rows:
        out += comment(doc, "    ") + [f"    {name}: {typ}"]
    return out


def meta_block(t: Dict[str, Any]) -> List[str]:
    fields = t["shapes"]["meta"]
    names = [f["name"] for f in fields]
    out = hanging("    __slots__ = (", [json.dumps(n) for n in names], "    )", " " * 8) + [""]
    out += [f"    {f['name']}: {field_type(f)}" for f in fields]
    params = []
    for i, f in enumerate(fields):
        p = f"{f['name']}: {field_type(f)}"
        params.append(p if i < META_POSITIONAL else f"{p} = {field_default(f)}")
    out += [""] + wrap_call("    def __init__(self, ", params, ") -> None:", " " * 17)
    out += wrap_call("        for name, value in zip(self.__slots__, (", names, ")):", " " * 48)
    out.append("            object.__setattr__(self, name, value)")
    return out


def wrap_call(head: str, items: Sequence[str], tail: str, indent: str) -> List[str]:
    """head + items joined with ", " + tail, wrapped under 92 columns."""
    lines, line, fresh = [], head, True
    for i, item in enumerate(items):
        piece = item + (", " if i < len(items) - 1 else tail)
        if not fresh and len(line) + len(piece.rstrip()) > 92:
            lines.append(line.rstrip())
            line = indent
        line += piece
        fresh = False
    lines.append(line)
    return lines


def hanging(head: str, items: Sequence[str], close: str, indent: str) -> List[str]:
    """head, then items joined with ", " on lines under 92 columns, then close."""
    lines, line = [head], indent
    for i, item in enumerate(items):
        piece = item + ","
        if line != indent and len(line) + 1 + len(piece) > 92:
            lines.append(line)
            line = indent
        line += (" " if line != indent else "") + piece
    return lines + [line, close]


def error_fields(t: Dict[str, Any]) -> List[str]:
    fields = [f for f in t["shapes"]["error"] if f["name"] != "message"]
    out = ["# The attributes every LLMError carries besides ``message`` (the core's",
           "# error shape, in its order); also the keys read from a failure outcome,",
           "# and each one's value when an outcome lacks it."]
    out += hanging("_FIELDS: Tuple[str, ...] = (", [json.dumps(f["name"]) for f in fields],
                   ")", "    ")
    out += hanging("_DEFAULTS: Dict[str, Any] = {",
                   [f'"{f["name"]}": {field_default(f)}' for f in fields], "}", "    ")
    return out


def error_init(t: Dict[str, Any]) -> List[str]:
    fields = [f for f in t["shapes"]["error"] if f["name"] != "message"]
    params = ["message: str", "*"] + [f"{f['name']}: {field_type(f)} = {field_default(f)}"
                                      for f in fields]
    out = wrap_call("    def __init__(self, ", params, ") -> None:", " " * 17)
    out += ["        super().__init__(message)", "        self.message = message"]
    for f in fields:
        if f["name"] == "kind":     # unset: the class's own kind
            out.append("        self.kind = kind if kind is not None else type(self).kind")
        else:
            out.append(f"        self.{f['name']} = {f['name']}")
    return out


def exception_name(kind: str) -> str:
    return EXCEPTION_NAMES.get(kind) or "".join(w.capitalize() for w in kind.split("_")) + "Error"


def error_kinds(t: Dict[str, Any]) -> List[str]:
    out = ["# The exception of each error kind the core has (a kind it adds needs its",
           "# class above: until it is written, this fails at import).",
           "_ERROR_BY_KIND: Dict[str, Type[LLMError]] = {"]
    out += [f"    {json.dumps(k)}: {exception_name(k)}," for k in t["error_kinds"]]
    out.append("}")
    return out


def pyi_block(t: Dict[str, Any]) -> List[str]:
    out: List[str] = []
    for alias, key in (("ErrorKind", "error_kinds"), ("Reason", "reasons"),
                       ("StreamReason", "stream_reasons")):
        out += hanging(f"{alias} = Literal[", [json.dumps(n) for n in t[key]], "]", "    ")
    out += ["", "",
            "class EngineOptions(TypedDict, total=False):",
            '    """Engine.call\'s keywords from the core\'s option table, as this module',
            "    takes them (headers as \"Name: value\" lines, fallbacks and schema as",
            '    JSON text); ranges are checked by the core (ValueError naming the option)."""',
            ""]
    return out + keys([(o["name"], option_type(o, True), o["doc"]) for o in t["options"]])


# docs/reliability.md's table.
DOC_TYPES = {"text": "text", "int": "integer", "bool": "boolean", "enum": "one of",
             "statuses": "list of statuses", "headers": "map of header names to values",
             "number": "number", "targets": "list of targets", "schema": "JSON Schema"}


def doc_default(opt: Dict[str, Any]) -> str:
    value = json.loads(opt["builtin"])
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"`{value}`"
    if isinstance(value, int) and opt["name"].endswith("_bytes") and value % (1 << 20) == 0:
        return f"{value >> 20} MiB"
    return str(value)


def doc_range(opt: Dict[str, Any]) -> str:
    if opt["type"] == "enum":
        return ", ".join(f"`{c}`" for c in opt["choices"])
    if opt["type"] == "statuses":
        return f"each {opt['min']}..{opt['max']}"
    return opt["range"] or ""


def doc_table(t: Dict[str, Any]) -> List[str]:
    out = ["| option | type | default | range | policy key | what it does |",
           "|---|---|---|---|---|---|"]
    for o in t["options"]:
        typ = DOC_TYPES[o["type"]] if o["type"] != "enum" else "text"
        if o["flags"] & NULLABLE and o["type"] != "text":
            typ += " or null"
        doc = o["doc"]
        for choice in o["choices"]:     # "none: ..." says what that choice does
            doc = re.sub(rf"(^|; |: ){re.escape(choice)}:", rf"\1`{choice}`:", doc)
        policy = "auto only" if o["flags"] & POLICY_AUTO else "yes" if o["flags"] & POLICY else ""
        out.append(f"| `{o['name']}` | {typ} | {doc_default(o)} | {doc_range(o)} | {policy} "
                   f"| {doc} |")
    return out


# ---- call_llm's docstring ----------------------------------------------------------

CALL_DEFAULTS_HEAD = "Built-in defaults of the other keywords:"


def call_defaults(doc: str, t: Dict[str, Any]) -> str:
    """call_llm's docstring ``doc`` with its generated paragraph: the built-in
    default of each call keyword the rest of it does not show as
    ``name=value``, before the example (no paragraph when it shows them all).
    Written here rather than at import, so that the source, IDEs and help()
    all show it."""
    doc = re.sub(rf"^    {re.escape(CALL_DEFAULTS_HEAD)}.*?\n\n", "", doc, flags=re.S | re.M)
    shown = []
    for o in t["options"]:
        value = json.loads(o["builtin"])
        if o["name"] in NOT_KEYWORDS or value is None or f"``{o['name']}=" in doc:
            continue
        text = f'"{value}"' if isinstance(value, str) else repr(value)
        if "\\" in text or '"""' in text:   # would end or escape the docstring
            raise SystemExit(f"gen_surface: {o['name']}'s default {text} cannot go into "
                             "call_llm's docstring")
        shown.append(f"``{o['name']}={text}``")
    if not shown:
        return doc
    head, sep, example = doc.partition("    Example::")
    if not sep:
        raise SystemExit("gen_surface: call_llm's docstring in python/llmretry/_api.py has "
                         "no '    Example::' to put the built-in defaults before")
    lines, line = [], "   "
    for word in f"{CALL_DEFAULTS_HEAD} {', '.join(shown)}.".split(" "):
        if len(line) + 1 + len(word) > 76:
            lines.append(line)
            line = "   "
        line += " " + word
    return head + "\n".join(lines + [line]) + "\n\n" + sep + example


def call_llm_docstring(text: str) -> "re.Match[str]":
    """call_llm's docstring in _api.py's text, as written (group 1): indented,
    where Python 3.13's ``__doc__`` is not."""
    m = re.search(r'^def call_llm\(.*?:\n    """(.*?)"""', text, re.S | re.M)
    if not m:
        raise SystemExit("gen_surface: python/llmretry/_api.py has no call_llm docstring")
    return m


def call_llm_doc(text: str, t: Dict[str, Any]) -> str:
    """_api.py's text with call_llm's docstring as call_defaults writes it."""
    m = call_llm_docstring(text)
    return text[:m.start(1)] + call_defaults(m.group(1), t) + text[m.end(1):]


# ---- checks of what stays hand-written ------------------------------------------

# ---- the batch keywords (BATCH_KEYWORDS) ---------------------------------------

def batch_rows(which: str) -> List[Tuple[str, str, str, str, str]]:
    return [row for row in BATCH_KEYWORDS if which in row[3].split()]


def batch_params(which: str) -> Callable[[str], List[str]]:
    """A signature's batch keywords, one a line at the markers' indent."""
    return lambda indent: [f"{indent}{name}: {typ} = {default},"
                           for name, typ, default, _, _ in batch_rows(which)]


def batch_forward(which: str) -> Callable[[str], List[str]]:
    """The batch keywords passed on as they came (``name=name``), wrapped."""
    def lines(indent: str) -> List[str]:
        out, line = [], indent
        for name, *_ in batch_rows(which):
            piece = f"{name}={name},"
            if line != indent and len(line) + 1 + len(piece) > 92:
                out.append(line)
                line = indent
            line += (" " if line != indent else "") + piece
        return out + [line]
    return lines


def batch_doc_table() -> List[str]:
    sets = {"many": "call_many", "map": "map_with_concurrency"}
    out = ["| keyword | type | default | of | what it does |",
           "| --- | --- | --- | --- | --- |"]
    for name, typ, default, which, doc in BATCH_KEYWORDS:
        shown = "not given: the client's" if default == "DEFAULT" else f"`{default}`"
        of = ", ".join(sets[w] for w in which.split())
        out.append(f"| `{name}` | `{typ}` | {shown} | {of} | {doc} |")
    return out


def docstring_of(text: str, cls: Optional[str]) -> str:
    """The module's docstring (cls None) or class cls's, from source text."""
    if cls is None:
        m = re.match(r'\s*"""(.*?)"""', text, re.S)
    else:
        m = re.search(rf'^class {cls}\b.*?:\n\s+"""(.*?)"""', text, re.S | re.M)
    if not m:
        raise SystemExit(f"gen_surface: no docstring for {cls or 'the module'}")
    return m.group(1)


def check_docs(root: Path, t: Dict[str, Any]) -> List[str]:
    problems = []
    results = (root / "python/llmretry/_results.py").read_text(encoding="utf-8")
    errors = (root / "python/llmretry/errors.py").read_text(encoding="utf-8")
    wants: List[Tuple[str, str, Optional[str], Sequence[str], str]] = [
        ("_results.py", results, "Meta", [f["name"] for f in t["shapes"]["meta"]], r"\s{name}:"),
        ("errors.py", errors, "LLMError",
         [f["name"] for f in t["shapes"]["error"] if f["name"] != "message"], r"\s{name}:"),
        ("errors.py", errors, None, t["error_kinds"], r"``{name}``"),
        ("errors.py", errors, "LLMError", t["reasons"], r"``{name}``"),
        ("errors.py", errors, "StreamInterruptedError", t["stream_reasons"], r"``{name}``"),
    ]
    for file, text, cls, names, pattern in wants:
        doc = docstring_of(text, cls)
        for name in names:
            if not re.search(pattern.format(name=re.escape(name)), doc):
                problems.append(f"{file}: the docstring of {cls or 'the module'} does not "
                                f"name {name!r} (the core has it): document it there")
    return problems


# ---- writing the blocks -----------------------------------------------------------

Lines = Union[List[str], Callable[[str], List[str]]]
BATCH_NOTE = "(tools/gen_surface.py's BATCH_KEYWORDS: do not edit)"


def replace_block(text: str, name: str, lines: Lines, file: str, note: str = NOTE) -> str:
    """text with every block `name` replaced by lines (a list, or a function
    of the markers' indent: a block inside a signature or a call)."""
    pat = re.compile(rf"^([ \t]*)(#|<!--) BEGIN GENERATED {re.escape(name)}\b[^\n]*\n"
                     rf"(.*?)^[ \t]*(#|<!--) END GENERATED {re.escape(name)}\b[^\n]*\n",
                     re.S | re.M)

    def block(m: "re.Match[str]") -> str:
        indent, opener = m.group(1), m.group(2)
        closer = " -->" if opener == "<!--" else ""
        body = "".join(line + "\n" for line in (lines(indent) if callable(lines) else lines))
        return (f"{indent}{opener} BEGIN GENERATED {name} {note}{closer}\n{body}"
                f"{indent}{opener} END GENERATED {name}{closer}\n")

    out, n = pat.subn(block, text)
    if not n:
        raise SystemExit(f"gen_surface: {file} has no block {name!r} "
                         f"(markers 'BEGIN GENERATED {name}' / 'END GENERATED {name}')")
    return out


def render(root: Path, t: Dict[str, Any]) -> Dict[str, str]:
    """Every file with its blocks as they should be."""
    blocks: Dict[str, List[Tuple[str, Lines]]] = {
        "python/llmretry/_options.py": [("call-options", call_options(t))],
        "python/llmretry/_results.py": [("meta", meta_block(t))],
        "python/llmretry/errors.py": [("error-fields", error_fields(t)),
                                      ("error-init", error_init(t)),
                                      ("error-kinds", error_kinds(t))],
        "python/llmretry/_llmretry.pyi": [("engine-options", pyi_block(t))],
        "docs/reliability.md": [("options", doc_table(t))],
    }
    # The batch signatures (every copy of a block in a file is written).
    batch: Dict[str, List[Tuple[str, Lines]]] = {
        "python/llmretry/_api.py": [("many-keywords", batch_params("many")),
                                    ("many-forward", batch_forward("many"))],
        "python/llmretry/_client.py": [("many-keywords", batch_params("many")),
                                       ("many-forward", batch_forward("many")),
                                       ("map-keywords", batch_params("map")),
                                       ("map-forward", batch_forward("map"))],
        "python/llmretry/_client_batch.py": [("many-keywords", batch_params("many"))],
        "python/llmretry/_pool.py": [("map-keywords", batch_params("map"))],
        "python/llmretry/_aio_batch.py": [("map-keywords", batch_params("map"))],
        "docs/batch.md": [("batch-keywords", batch_doc_table())],
    }
    out = {}
    for group, note in ((blocks, NOTE), (batch, BATCH_NOTE)):
        for file, parts in group.items():
            text = out.get(file) or (root / file).read_text(encoding="utf-8")
            for name, lines in parts:
                text = replace_block(text, name, lines, file, note)
            out[file] = text
    api = "python/llmretry/_api.py"
    out[api] = call_llm_doc(out[api], t)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 with a diff when a block is stale")
    ap.add_argument("--root", type=Path, default=HERE, help="the checkout (default: this one)")
    ap.add_argument("--extension", type=Path, default=None,
                    help="the built extension to read the tables from (default: under --root)")
    ap.add_argument("--tables", type=Path, default=None,
                    help="read the tables from this JSON file (describe()'s) instead")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    if args.tables is not None:
        tables = json.loads(args.tables.read_text(encoding="utf-8"))
    else:
        tables = load_tables(root, args.extension)
    stale = 0
    for file, text in render(root, tables).items():
        path = root / file
        old = path.read_text(encoding="utf-8")
        if old == text:
            continue
        stale += 1
        if args.check:
            sys.stdout.writelines(difflib.unified_diff(
                old.splitlines(True), text.splitlines(True), f"a/{file}", f"b/{file}"))
        else:
            path.write_text(text, encoding="utf-8")
            print(f"gen_surface: wrote {file}")
    problems = check_docs(root, tables)
    for p in problems:
        print(f"gen_surface: {p}", file=sys.stderr)
    if args.check and stale:
        print(f"gen_surface: {stale} file(s) stale: run `make generate` "
              "(python3 tools/gen_surface.py) and commit them", file=sys.stderr)
    return 1 if (args.check and stale) or problems else 0


if __name__ == "__main__":
    sys.exit(main())
