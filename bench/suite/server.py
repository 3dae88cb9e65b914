"""The local nginx the suite measures against (bench/nginx.conf).

The Python twin of bench/nginx.sh: installs nginx and the echo module with
apt-get when missing, starts one worker on a free loopback port with every
file in a temporary prefix, and stops it. Access logs are off and the worker
may hold 8192 connections (nginx.conf), far above the suite's 1024 in flight.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
ECHO_MODULE = Path("/usr/lib/nginx/modules/ngx_http_echo_module.so")
CONF_PORT = "127.0.0.1:18089"   # the port written in bench/nginx.conf
SLOW_LATENCY_S = 0.05           # echo_sleep of the /slow endpoint


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def apt_install(packages: list[str]) -> None:
    """apt-get install (as root, else through sudo)."""
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    log(f"== apt-get install {' '.join(packages)}")
    subprocess.run(sudo + ["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(sudo + ["apt-get", "install", "-y", "-qq", *packages],
                   check=True, env=env, stdout=subprocess.DEVNULL)


def nginx_binary() -> str:
    """The nginx binary, installing nginx + the echo module when missing."""
    have_nginx = shutil.which("nginx") or Path("/usr/sbin/nginx").exists()
    if not have_nginx or not ECHO_MODULE.exists():
        apt_install(["nginx", "libnginx-mod-http-echo"])
    return shutil.which("nginx") or "/usr/sbin/nginx"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Nginx:
    """One nginx worker serving bench/nginx.conf on 127.0.0.1:port."""

    def __init__(self, port: Optional[int] = None) -> None:
        self.binary = nginx_binary()
        self.port = port or free_port()
        self.prefix = ""
        self.base_fast = f"http://127.0.0.1:{self.port}/v1"
        self.base_slow = f"http://127.0.0.1:{self.port}/slow/v1"

    def _args(self) -> list[str]:
        return [self.binary, "-p", self.prefix + "/", "-e",
                self.prefix + "/error.log", "-c", self.prefix + "/nginx.conf"]

    def start(self) -> "Nginx":
        self.prefix = tempfile.mkdtemp(prefix="llmretry-bench-suite.")
        os.chmod(self.prefix, 0o755)   # the worker may run as nobody
        conf = (ROOT / "bench" / "nginx.conf").read_text()
        if CONF_PORT not in conf:
            raise RuntimeError(f"bench/nginx.conf does not listen on {CONF_PORT}")
        conf = conf.replace(CONF_PORT, f"127.0.0.1:{self.port}")
        Path(self.prefix, "nginx.conf").write_text(conf)
        res = subprocess.run(self._args(), capture_output=True, text=True)
        if res.returncode != 0:
            err = Path(self.prefix, "error.log")
            detail = err.read_text() if err.exists() else ""
            raise RuntimeError(f"nginx failed to start on port {self.port}: "
                               f"{res.stderr.strip()} {detail.strip()}")
        for base in (self.base_fast, self.base_slow):
            self._wait_answer(base + "/chat/completions")
        return self

    @staticmethod
    def _wait_answer(url: str) -> None:
        end = time.monotonic() + 10
        while True:
            try:
                req = urllib.request.Request(url, data=b"{}", method="POST")
                with urllib.request.urlopen(req, timeout=2) as resp:
                    resp.read()
                    return
            except OSError:
                if time.monotonic() > end:
                    raise RuntimeError(f"nginx does not answer at {url}")
                time.sleep(0.1)

    def accepted(self) -> Optional[int]:
        """Connections accepted so far (stub_status), None if unreadable."""
        try:
            url = f"http://127.0.0.1:{self.port}/status"
            with urllib.request.urlopen(url, timeout=2) as resp:
                lines = resp.read().decode().splitlines()
            return int(lines[2].split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def stop(self) -> None:
        if not self.prefix:
            return
        pid_file = Path(self.prefix, "nginx.pid")
        if pid_file.exists():
            subprocess.run(self._args() + ["-s", "stop"], capture_output=True)
            end = time.monotonic() + 5
            while pid_file.exists() and time.monotonic() < end:
                time.sleep(0.05)
        shutil.rmtree(self.prefix, ignore_errors=True)
        self.prefix = ""

    def __enter__(self) -> "Nginx":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def version(binary: str) -> str:
    res = subprocess.run([binary, "-v"], capture_output=True, text=True)
    return (res.stderr or res.stdout).strip().rsplit("/", 1)[-1]


if __name__ == "__main__":
    # python3 bench/suite/server.py [--port P]: the suite's nginx, by hand.
    ap = argparse.ArgumentParser(description="the benchmark nginx, until Ctrl-C")
    ap.add_argument("--port", type=int, default=0, help="default: a free port")
    # SIGTERM too ends with nginx stopped (the with block's exit).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with Nginx(ap.parse_args().port or None) as server:
        print(f"0 ms:  {server.base_fast}\n50 ms: {server.base_slow}", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
