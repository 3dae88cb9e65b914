"""The OpenResty host test's machinery (tests/openresty/host_check.py runs it).

An nginx on loopback filled from nginx.conf.in (Nginx), the mock model
server's control API (Mock), a plain HTTP client (http) and a raw one that
sees a response as it arrives (Raw, sse_payloads), the location examples of
the docs (doc_locations), and the small helpers every test uses: check,
wait_for, alive, percentile, free_port.

Two module globals are shared with the tests: FIGURES, one dict the tests
fill (never rebound, so it may be imported by name), and TRANSPORT_OPTS,
which host_check.py's main() rebinds: read it as harness.TRANSPORT_OPTS, at
call time.
"""

import getpass
import grp
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

FIGURES = {}
# init_worker's options for every nginx of the run: --transport cosocket
# runs every test with the worker's engine thread-less (llmretry.cosocket).
# main() rebinds it: read it as harness.TRANSPORT_OPTS, not imported by name.
TRANSPORT_OPTS = ""


DOCS = ["README.md", "docs/openresty.md"]


def doc_locations(repo):
    """The ```nginx blocks of DOCS that are a location, as written."""
    out = []
    for doc in DOCS:
        with open(os.path.join(repo, doc)) as f:
            text = f.read()
        for block in re.findall(r"^```nginx\n(.*?)^```", text, re.S | re.M):
            if block.lstrip().startswith("location"):
                out.append(f"# {doc}\n{block}")
    return out


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http(method, url, body=None, timeout=30):
    """-> (status, text, seconds)"""
    data = None
    headers = {}
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        status = e.code
    return status, text, time.monotonic() - t0


class Mock:
    def __init__(self, root):
        self.root = root.rstrip("/")

    def script(self, name, steps, after=None, limits=None):
        doc = {"steps": steps}
        if after is not None:
            doc["after"] = after
        if limits is not None:
            doc["limits"] = limits
        status, text, _ = http("PUT", f"{self.root}/_mock/scenarios/{name}", doc)
        assert status == 204, f"PUT scenario {name}: {status} {text}"

    def outage(self, name, mode):
        status, text, _ = http("PUT", f"{self.root}/_mock/outage/{name}", {"mode": mode})
        assert status == 204, f"PUT outage {name}: {status} {text}"

    def wait_requests(self, name, n, timeout=5.0):
        deadline = time.monotonic() + timeout
        while True:
            recs = self.requests(name)
            if len(recs) >= n or time.monotonic() > deadline:
                return recs
            time.sleep(0.01)

    def requests(self, name):
        status, text, _ = http("GET", f"{self.root}/_mock/requests/{name}")
        assert status == 200, f"GET requests {name}: {status}"
        return json.loads(text)


class Nginx:
    """One nginx on loopback. init_worker: make the worker's engine in
    init_worker_by_lua (else on the first call), with init_opts (Lua table
    text) as its options; workers: worker_processes, listening with
    reuseport when more than one (the kernel spreads the connections)."""

    def __init__(self, repo, mock_url, init_worker=True, init_opts="", workers=1):
        if TRANSPORT_OPTS:
            init_opts = ("{ " + TRANSPORT_OPTS
                         + (", " + init_opts.strip()[1:-1] if init_opts else "") + " }")
        self.repo = repo
        self.prefix = tempfile.mkdtemp(prefix="llmretry-openresty-")
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = None
        # What /llm_env finds in the environment (kept by nginx's env directives).
        self.env = {"OPENAI_BASE_URL": mock_url.rstrip("/") + "/s/from_env/v1",
                    "OPENAI_API_KEY": "sk-test-FROM-ENV"}
        # The workers run as whoever runs the test (a root master would
        # switch them to nobody, who may not read the checkout).
        user = getpass.getuser()
        group = grp.getgrgid(os.getgid()).gr_name
        user_line = f"user {user} {group};" if os.geteuid() == 0 else ""
        init = ('init_worker_by_lua_block { require("llmretry.openresty").init_worker('
                + init_opts + ') }' if init_worker else "")
        with open(os.path.join(repo, "tests/openresty/nginx.conf.in")) as f:
            conf = f.read()
        # Two self-signed certificates naming 127.0.0.1 (an IP SAN for
        # libcurl, a DNS SAN for nginx's host check): one trusted, one not.
        tls = {}
        for name in ("trusted", "untrusted"):
            cert = os.path.join(self.prefix, f"{name}.crt")
            key = os.path.join(self.prefix, f"{name}.key")
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                            "-days", "2", "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", cert,
                            "-addext", "subjectAltName=IP:127.0.0.1,DNS:127.0.0.1"],
                           check=True, capture_output=True)
            tls[name] = (cert, key, free_port())
        self.tls_port = tls["trusted"][2]
        for k, v in {"@TLS_CERT@": tls["trusted"][0], "@TLS_KEY@": tls["trusted"][1],
                     "@TLS_PORT@": str(tls["trusted"][2]),
                     "@TLS_UNTRUSTED_CERT@": tls["untrusted"][0],
                     "@TLS_UNTRUSTED_KEY@": tls["untrusted"][1],
                     "@TLS_UNTRUSTED_PORT@": str(tls["untrusted"][2]),
                     "@PREFIX@": self.prefix, "@PORT@": str(self.port), "@REPO@": repo,
                     "@MOCK@": mock_url.rstrip("/"), "@USER_LINE@": user_line,
                     "@INIT_WORKER@": init, "@WORKERS@": str(workers),
                     "@LISTEN_OPTS@": " reuseport" if workers > 1 else "",
                     "@DOC_LOCATIONS@": "\n".join(doc_locations(repo))}.items():
            conf = conf.replace(k, v)
        left = re.findall(r"@[A-Z_]+@", conf)
        assert not left, f"unfilled placeholders in nginx.conf: {left}"
        self.conf = os.path.join(self.prefix, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write(conf)

    def cmd(self, *extra):
        return ["nginx", "-p", self.prefix, "-c", self.conf,
                "-e", os.path.join(self.prefix, "error.log"), *extra]

    def start(self):
        t = subprocess.run(self.cmd("-t"), capture_output=True, text=True)
        if t.returncode != 0:
            raise RuntimeError("nginx -t failed:\n" + t.stdout + t.stderr)
        self.out = open(os.path.join(self.prefix, "nginx.out"), "w")
        env = dict(os.environ)
        env.update(self.env)
        self.proc = subprocess.Popen(self.cmd(), stdout=self.out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 10
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited with {self.proc.returncode}")
            try:
                status, text, _ = http("GET", self.base + "/ping", timeout=2)
                if status == 200 and text.strip() == "pong":
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("nginx did not answer /ping within 10 s")
            time.sleep(0.05)

    def stats(self):
        status, text, _ = http("GET", self.base + "/stats", timeout=5)
        check(status == 200, f"/stats: {status} {text}")
        return json.loads(text)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)   # graceful: lets calls in flight finish
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc:
            self.out.close()

    def error_log(self):
        try:
            with open(os.path.join(self.prefix, "error.log")) as f:
                return f.read()
        except OSError:
            return ""

    def cleanup(self):
        shutil.rmtree(self.prefix, ignore_errors=True)


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def wait_for(cond, timeout, step=0.01):
    """cond() until true or timeout seconds: the seconds it took, or None."""
    t0 = time.monotonic()
    while True:
        if cond():
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            return None
        time.sleep(step)


def alive(pid):
    return os.path.exists(f"/proc/{pid}")


def percentile(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


class Raw:
    """A raw HTTP/1.1 GET, read as it arrives: what a downstream client sees."""

    def __init__(self, ngx, path):
        self.sock = socket.create_connection(("127.0.0.1", ngx.port), timeout=10)
        self.t0 = time.monotonic()
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        self.pieces = []            # (seconds since the request, bytes)

    def read_some(self):
        data = self.sock.recv(65536)
        if data:
            self.pieces.append((time.monotonic() - self.t0, data))
        return data

    def read_all(self):
        while self.read_some():
            pass
        return b"".join(d for _, d in self.pieces)

    def close(self):
        self.sock.close()


def sse_payloads(raw):
    """The data: payloads of a chunked SSE response (chunk framing removed)."""
    head, _, body = raw.partition(b"\r\n\r\n")
    text = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        text += rest[:size]
        body = rest[size + 2:]
    return head, [line[6:] for line in text.decode().split("\n") if line.startswith("data: ")]
