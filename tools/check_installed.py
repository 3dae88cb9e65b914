"""The Python quick start through an installed llmretry wheel (tools/check-pip-install.sh).

Run by the venv's Python from an empty directory, with a PATH that holds no
compiler: checks that the package is the venv's copy, that no compiler can
be found, that the libcurl and cJSON in this process are the copies bundled
in the wheel (llmretry.libs/), not the system's, and that the versions
agree; then one call_llm against the package's own mock server, through a
429 with Retry-After. Exits non-zero (an AssertionError) on any failure.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import List

import llmretry
from llmretry import _llmretry
from llmretry.testing import MockServer


def mapped_files() -> List[str]:
    """The files mapped into this process (its executable and shared libraries)."""
    paths = set()
    for line in Path("/proc/self/maps").read_text(encoding="utf-8").splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            paths.add(fields[5])
    return sorted(paths)


def check_install() -> None:
    where = Path(llmretry.__file__).resolve().parent
    assert "site-packages" in where.parts, f"llmretry imported from {where}, not the venv"
    for name in ("py.typed", "_llmretry.pyi"):
        assert (where / name).exists(), f"{name} is not installed"
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    for tool in ("cc", "gcc", "clang", "c99", cc):
        assert shutil.which(tool) is None, f"a compiler is on PATH: {shutil.which(tool)}"

    bundled = where.parent / "llmretry.libs"
    assert bundled.is_dir(), f"{bundled} is missing: not a repaired wheel"
    files = mapped_files()
    for lib in ("libcurl", "libcjson"):
        loaded = [f for f in files if os.path.basename(f).startswith(lib)]
        assert loaded, f"no {lib} is loaded: {files}"
        stray = [f for f in loaded if Path(f).parent != bundled]
        assert not stray, f"{lib} loaded from outside the wheel: {stray}"

    dist = importlib.metadata.version("llmretry")
    assert dist == llmretry.__version__ == _llmretry.CORE_VERSION, (
        dist, llmretry.__version__, _llmretry.CORE_VERSION)


def quick_start() -> int:
    """The README's first call: a 429 with Retry-After, then a JSON answer; its attempts."""
    body = {"model": "gpt-4.1-mini",
            "messages": [{"role": "user", "content": "Summarise: all good."}]}
    with MockServer() as mock:
        mock.script("flaky", [{"status": 429, "retry_after": "0.2"},
                              {"content": '{"summary": "All good."}'}])
        data, meta = llmretry.call_llm(body, base_url=mock.scenario_url("flaky"),
                                       timeout_ms=5000, deadline_ms=20000, logger=None)
        answer = llmretry.extract_json(data["choices"][0]["message"]["content"])
        llmretry.assert_shape(answer, {"summary": "string"})
        assert answer["summary"] == "All good.", answer
        assert meta.status == 200 and meta.attempts == 2, meta
        assert len(mock.requests("flaky")) == 2
    return int(meta.attempts)


def main() -> None:
    check_install()
    attempts = quick_start()
    print(f"check-pip-install: llmretry {llmretry.__version__} (libcurl "
          f"{_llmretry.LIBCURL_VERSION}, bundled) answered after {attempts} attempts "
          f"with Python {sys.version.split()[0]} and no compiler on PATH")


if __name__ == "__main__":
    main()
