"""The engine against a real HTTP/2 server: Debian's nginx with TLS.

nginx rotates HTTP/2 connections: after ``keepalive_requests`` requests on a
connection it sends GOAWAY, and streams above its last-stream-id are refused
(never processed). Those requests must be sent again at once, in the same
attempt, in both retry modes. And more calls in flight than one connection's
stream limit must share a few connections, not open one each.

nginx and its echo module are installed with apt-get when missing
(tools/ensure-deps.sh installs them too, and openssl); when that is
impossible the tests fail, they never skip. nginx logs ``$connection
$connection_requests`` per request, so the tests count the requests the
server saw and the connections they used.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

import llmretry
from tls_server import make_self_signed

ECHO_MODULE = Path("/usr/lib/nginx/modules/ngx_http_echo_module.so")
COMPLETION = ('{"id":"chatcmpl-h2","object":"chat.completion","created":1,"model":"m",'
              '"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},'
              '"finish_reason":"stop"}],'
              '"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}')
BODY = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}

CONF = """
worker_processes 1;
pid nginx.pid;
error_log error.log;
load_module {echo};
events {{ worker_connections 4096; }}
http {{
  log_format conns '$connection $connection_requests $server_protocol $request_uri';
  access_log access.log conns;
  client_body_temp_path body;
  proxy_temp_path proxy;
  fastcgi_temp_path fastcgi;
  uwsgi_temp_path uwsgi;
  scgi_temp_path scgi;
  keepalive_requests {keepalive_requests};
  server {{
    listen 127.0.0.1:{port} ssl http2;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    location = /v1/chat/completions {{
      default_type application/json;
      echo_read_request_body;
      echo '{completion}';
    }}
    location = /slow/v1/chat/completions {{
      default_type application/json;
      echo_read_request_body;
      echo_sleep 0.5;
      echo '{completion}';
    }}
  }}
}}
"""


def _nginx_binary() -> str:
    """nginx with the echo module, installed with apt-get if missing."""
    have = shutil.which("nginx") or Path("/usr/sbin/nginx").exists()
    if not have or not ECHO_MODULE.exists():
        sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        try:
            subprocess.run(sudo + ["apt-get", "install", "-y", "-qq", "nginx",
                                   "libnginx-mod-http-echo", "openssl"],
                           check=True, env=env, capture_output=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as exc:
            pytest.fail(f"nginx with the echo module is not installed and apt-get "
                        f"could not install it (tools/ensure-deps.sh does): {exc}",
                        pytrace=False)
    return shutil.which("nginx") or "/usr/sbin/nginx"


class Nginx:
    """One nginx worker with TLS + HTTP/2 on a free loopback port."""

    def __init__(self, keepalive_requests: int) -> None:
        self.binary = _nginx_binary()
        self.prefix = Path(tempfile.mkdtemp(prefix="llmretry-h2."))
        os.chmod(self.prefix, 0o755)
        self.cert, key = make_self_signed(self.prefix)
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        (self.prefix / "nginx.conf").write_text(CONF.format(
            echo=ECHO_MODULE, port=self.port, cert=self.cert, key=key,
            keepalive_requests=keepalive_requests, completion=COMPLETION))
        self.base_url = f"https://127.0.0.1:{self.port}/v1"
        self.slow_url = f"https://127.0.0.1:{self.port}/slow/v1"

    def _args(self) -> List[str]:
        return [self.binary, "-p", f"{self.prefix}/", "-e", str(self.prefix / "error.log"),
                "-c", str(self.prefix / "nginx.conf")]

    def start(self) -> "Nginx":
        res = subprocess.run(self._args(), capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"nginx did not start: {res.stderr}")
        end = time.monotonic() + 10
        while not (self.prefix / "nginx.pid").exists():
            if time.monotonic() > end:
                raise RuntimeError("nginx wrote no pid file")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        subprocess.run(self._args() + ["-s", "stop"], capture_output=True)
        end = time.monotonic() + 5
        while (self.prefix / "nginx.pid").exists() and time.monotonic() < end:
            time.sleep(0.05)
        shutil.rmtree(self.prefix, ignore_errors=True)

    def log(self) -> List[Tuple[int, int, str, str]]:
        """(connection, its request number, protocol, uri) per request."""
        out = []
        path = self.prefix / "access.log"
        for line in path.read_text().splitlines() if path.exists() else []:
            conn, n, proto, uri = line.split()
            out.append((int(conn), int(n), proto, uri))
        return out

    def clear_log(self) -> None:
        # Truncated in place: nginx appends (O_APPEND) to the same file, and a
        # reopen (whenever it lands) opens that file again: nothing to wait for.
        (self.prefix / "access.log").write_text("")
        subprocess.run(self._args() + ["-s", "reopen"], capture_output=True)


def _log_of(nginx: Nginx, n: int) -> List[Tuple[int, int, str, str]]:
    """nginx's log once it holds n lines (it writes each after its answer),
    or as it is after 10 s."""
    end = time.monotonic() + 10
    while len(log := nginx.log()) < n and time.monotonic() < end:
        time.sleep(0.01)
    return log


@pytest.fixture(scope="module")
def nginx() -> Iterator[Nginx]:
    if not shutil.which("openssl"):
        pytest.fail("openssl is not installed (needed for a test certificate; "
                    "tools/ensure-deps.sh installs it)", pytrace=False)
    n = Nginx(keepalive_requests=100).start()
    yield n
    n.stop()


@pytest.fixture(scope="module")
def nginx_stock() -> Iterator[Nginx]:
    """nginx as shipped: keepalive_requests 1000. The connection-count test
    runs here: at 100 requests per connection, 256 streams in flight are
    refused by construction (128 per connection > 100), and libcurl re-sends
    each refused stream itself, on a connection of its own, out of the
    engine's sight (the rotation tests above cover those re-sends)."""
    if not shutil.which("openssl"):
        pytest.fail("openssl is not installed (needed for a test certificate; "
                    "tools/ensure-deps.sh installs it)", pytrace=False)
    n = Nginx(keepalive_requests=1000).start()
    yield n
    n.stop()


def _run_many(client: llmretry.Client, n: int, limit: int, **kw: Any) -> List[Any]:
    return list(client.call_many([BODY] * n, limit=limit, **kw))


@pytest.mark.parametrize("mode", ["unsafe", "safe"])
def test_goaway_rotation_is_free(nginx: Nginx, mode: str) -> None:
    """Every 100 requests nginx sends GOAWAY; refused streams are re-sent at
    once, never an error (unsafe) nor a retry with backoff (safe)."""
    nginx.clear_log()
    client = llmretry.Client(max_in_flight=64)
    try:
        results = _run_many(client, 1500, 32, base_url=nginx.base_url, api_key="k",
                            ca_file=str(nginx.cert), retry_mode=mode, base_delay_ms=5000,
                            timeout_ms=10000, logger=None)
    finally:
        client.close()
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, f"{len(errors)} of 1500 failed, first: {errors[0]!r}"
    retried = [r for r in results if r.meta.attempts != 1]
    assert not retried, f"{len(retried)} calls needed a second attempt"
    log = _log_of(nginx, 1500)
    assert len(log) == 1500, f"nginx saw {len(log)} requests for 1500 calls"
    assert {p for _, _, p, _ in log} == {"HTTP/2.0"}
    assert max(n for _, n, _, _ in log) <= 100
    assert len({c for c, _, _, _ in log}) >= 15, "no connection rotation happened"


def test_many_in_flight_share_few_connections(nginx_stock: Nginx) -> None:
    """256 slow calls at once over HTTP/2: a handful of connections (nginx
    allows 128 streams on each), not one per call past the first 100 (issue
    13 item 5: before the origin gate of core/src/origins.c, 157 connections,
    153 of them used once)."""
    nginx_stock.clear_log()
    client = llmretry.Client(max_in_flight=256)
    try:
        t0 = time.monotonic()
        results = _run_many(client, 256, 256, base_url=nginx_stock.slow_url, api_key="k",
                            ca_file=str(nginx_stock.cert), timeout_ms=20000, logger=None)
        wall = time.monotonic() - t0
    finally:
        client.close()
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, f"{len(errors)} failed, first: {errors[0]!r}"
    log = _log_of(nginx_stock, 256)
    assert len(log) == 256
    conns = {c for c, _, _, _ in log}
    assert len(conns) <= 3, f"256 calls in flight used {len(conns)} connections"
    # All ran concurrently: 0.5 s each, so well under two rounds.
    assert wall < 5.0, f"256 concurrent 0.5 s calls took {wall:.1f} s"
