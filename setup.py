"""Build the llmretry package: the pure-Python layer and the C extension.

The extension compiles the C core (core/src/*.c) together with the CPython
shim (bindings/python/*.c) and links libcurl, cJSON and hiredis (the
Redis store of shared budgets), found with pkg-config. The version is read from core/include/llmretry.h, the only place
it is defined.
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup

ROOT = Path(__file__).resolve().parent
HEADER = ROOT / "core" / "include" / "llmretry.h"
DEBIAN_HINT = "apt-get install pkg-config libcurl4-openssl-dev libcjson-dev libhiredis-dev"


def read_version() -> str:
    match = re.search(r'^#define\s+LLMRETRY_VERSION\s+"([^"]+)"',
                      HEADER.read_text(encoding="utf-8"), re.MULTILINE)
    if not match:
        sys.exit(f"setup.py: LLMRETRY_VERSION not found in {HEADER}")
    return match.group(1)


def pkg_config(*packages: str) -> list:
    """Compiler and linker flags for ``packages``, or exit naming what to install."""
    if shutil.which("pkg-config") is None:
        sys.exit("setup.py: pkg-config is not installed; llmretry needs it to find "
                 f"libcurl, cJSON and hiredis. On Debian/Ubuntu: {DEBIAN_HINT}")
    missing = [p for p in packages
               if subprocess.run(["pkg-config", "--exists", p]).returncode != 0]
    if missing:
        sys.exit(f"setup.py: pkg-config cannot find {', '.join(missing)} (development "
                 f"files for libcurl, cJSON and hiredis are needed). On Debian/Ubuntu: "
                 f"{DEBIAN_HINT}")
    out = subprocess.run(["pkg-config", "--cflags", "--libs", *packages],
                         check=True, capture_output=True, text=True).stdout
    return out.split()


def extension() -> Extension:
    flags = pkg_config("libcurl", "libcjson", "hiredis")
    sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "core" / "src").glob("*.c"))
    # The public header's parts, one per concern (core/include/llmretry/).
    parts_dir = ROOT / "core" / "include" / "llmretry"
    parts = sorted(str(p.relative_to(ROOT)) for p in parts_dir.glob("*.h"))
    # The binding's files, one per concern (bindings/python/binding.h lists them).
    sources += sorted(str(p.relative_to(ROOT)) for p in (ROOT / "bindings" / "python").glob("*.c"))
    return Extension(
        "llmretry._llmretry",
        sources=sources,
        include_dirs=["core/include", "core/src", "bindings/python"]
        + [f[2:] for f in flags if f.startswith("-I")],
        library_dirs=[f[2:] for f in flags if f.startswith("-L")],
        libraries=[f[2:] for f in flags if f.startswith("-l")],
        define_macros=[("_GNU_SOURCE", None)],
        # Only PyInit__llmretry is the module's to export: the core's and the
        # binding's names stay inside it (no clash with another copy of
        # libcurl's users or of llmretry in the same process).
        extra_compile_args=["-std=c11", "-O2", "-fvisibility=hidden"]
        + [f for f in flags if f.startswith("-") and f[:2] not in ("-I", "-L", "-l")],
        # Every private header: a change to any rebuilds the extension.
        depends=[str(HEADER.relative_to(ROOT)), *parts,
                 *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "core" / "src").glob("*.h")),
                 *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "bindings" / "python").glob("*.h"))],
    )


setup(
    version=read_version(),
    package_dir={"": "python"},
    packages=["llmretry", "llmretry.testing"],
    package_data={"llmretry": ["py.typed", "*.pyi"]},
    ext_modules=[extension()],
    zip_safe=False,
    # Keep setuptools' objects out of build/, which is CMake's.
    options={"build": {"build_base": "build-python"}},
)
