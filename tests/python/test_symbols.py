"""What the extension module exports."""

from __future__ import annotations


def test_extension_exports_only_its_init() -> None:
    # Issue 33 item 8: -fvisibility=hidden: the core's and the binding's names
    # (put, state_of, lr_*, llmretry_*) stay inside the module, so no other
    # library in the process can bind to them or clash with them.
    import subprocess
    import llmretry._llmretry as ext
    out = subprocess.run(["nm", "-D", "--defined-only", ext.__file__], capture_output=True,
                         text=True, check=True).stdout
    names = sorted(line.split()[-1] for line in out.splitlines() if line.strip())
    assert names == ["PyInit__llmretry"], names[:10]
