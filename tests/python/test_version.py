"""One version number: LLMRETRY_VERSION in core/include/llmretry.h.

Everything that states a version must agree with it: the Python package,
the core it runs (llmretry_version()), setup.py's metadata, the newest
heading of CHANGELOG.md and the versioned rockspec that `make rock` writes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import llmretry
from llmretry import _llmretry

# Python only (the mock server, the type checker, version files): the
# sanitizer and pipe-notifier passes skip it (tools/check.sh, pipe-notifier-test.sh).
pytestmark = pytest.mark.pure_python

ROOT = Path(__file__).resolve().parents[2]


def header_version() -> str:
    text = (ROOT / "core" / "include" / "llmretry.h").read_text(encoding="utf-8")
    found = re.findall(r'^#define LLMRETRY_VERSION "([^"]+)"$', text, re.MULTILINE)
    assert len(found) == 1, f"LLMRETRY_VERSION defined {len(found)} times"
    return str(found[0])


def test_the_package_and_its_core_report_the_header_version() -> None:
    version = header_version()
    assert llmretry.__version__ == version
    assert _llmretry.CORE_VERSION == version, "the extension links another build of the core"


def test_setup_py_metadata_reads_the_header() -> None:
    out = subprocess.run([sys.executable, "setup.py", "--version"], cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=120).stdout
    assert out.split()[-1] == header_version()


def test_changelog_newest_heading_is_the_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (\S+)", text, re.MULTILINE)
    assert headings, "CHANGELOG.md has no '## <version>' heading"
    assert headings[0] == header_version(), (
        f"CHANGELOG.md's newest heading is {headings[0]}, LLMRETRY_VERSION {header_version()}")


@pytest.mark.skipif(shutil.which("luarocks") is None, reason="luarocks is not installed")
def test_make_rock_writes_the_versioned_rockspec(tmp_path: Path) -> None:
    version = header_version()
    subprocess.run([str(ROOT / "tools" / "make-rock.sh"), str(tmp_path)], check=True,
                   capture_output=True, timeout=120)
    spec = tmp_path / f"llmretry-{version}-1.rockspec"
    text = spec.read_text(encoding="utf-8")
    assert re.search(rf'^version = "{re.escape(version)}-1"$', text, re.MULTILINE), text
    assert (tmp_path / f"llmretry-{version}-1.src.rock").is_file()
    # The development rockspec keeps its scm version.
    scm = (ROOT / "rockspecs" / "llmretry-scm-1.rockspec").read_text(encoding="utf-8")
    assert re.search(r'^version = "scm-1"$', scm, re.MULTILINE)
