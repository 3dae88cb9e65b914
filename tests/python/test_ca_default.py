"""A call without ca_file on a system that keeps its CA bundle elsewhere.

libcurl has one CA bundle path built in (Debian's, in the libcurl a wheel
bundles); where it is missing (Fedora, RHEL, openSUSE) the core must use
the bundle the system has (core/src/ca_bundle.c), not fail every HTTPS call.
The test makes such a system in a mount namespace: /etc/ssl replaced by a
directory holding only openSUSE's ca-bundle.pem, which trusts the test's
self-signed server. Needs root and unshare (CI has both; skipped otherwise).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Tuple

import pytest

from conftest import child_env
from tls_server import RecordingServer, make_self_signed, tls_context

# Bundles that come before openSUSE's in the core's list: present, they would be chosen.
EARLIER = ("/etc/pki/tls/certs/ca-bundle.crt",)

CHILD = """
import sys
import llmretry
body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
data, meta = llmretry.call_llm(body, base_url=sys.argv[1], api_key="k", logger=None,
                               max_retries=0, timeout_ms=10000)
print(data["choices"][0]["message"]["content"])
"""


def can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(not can_unshare(), reason="needs root and unshare -m")


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[Tuple[RecordingServer, Path]]:
    # tools/ensure-deps.sh installs openssl: missing, the test fails, never skips.
    try:
        (tmp_path / "tls").mkdir()
        cert, key = make_self_signed(tmp_path / "tls")
    except FileNotFoundError:
        pytest.fail("the openssl command line tool is not installed "
                    "(tools/ensure-deps.sh installs it)", pytrace=False)
    with RecordingServer(tls_context(cert, key)) as srv:
        yield srv, cert


def test_https_without_ca_file_uses_the_bundle_the_system_has(
        tls_server: Tuple[RecordingServer, Path], tmp_path: Path) -> None:
    if any(os.path.exists(p) for p in EARLIER):
        pytest.skip("this system has a bundle the core would choose first")
    server, cert = tls_server
    ssl_dir = tmp_path / "etc-ssl"
    ssl_dir.mkdir()
    shutil.copy(cert, ssl_dir / "ca-bundle.pem")
    script = 'mount --bind "$1" /etc/ssl && exec "$2" -c "$3" "$4"'
    out = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", str(ssl_dir),
                          sys.executable, CHILD, server.base_url],
                         capture_output=True, text=True, env=child_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "over tls"
    assert len(server.requests) == 1
