"""llmretry.openresty's transport "cosocket" against LiteLLM's proxy (uvicorn:
a server nobody here wrote). The worker's engine has no thread there: the
engine writes each request and parses each response (core/src/http1.c) that
the worker's cosockets carry, so this is where its HTTP/1.1 reading meets a
real server. Run by tools/interop.sh (``make interop``). Each check prints
one line; exits 1 when any fails. Usage: check_openresty.py BASE_URL
"""

from __future__ import annotations

import getpass
import grp
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from interop_util import Checks

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
KEY = "sk-1234"

CONF = """
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
@USER@
worker_processes 1;
daemon off;
pid @PREFIX@/nginx.pid;
error_log @PREFIX@/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path @PREFIX@/cb;
  proxy_temp_path @PREFIX@/px;
  fastcgi_temp_path @PREFIX@/fc;
  uwsgi_temp_path @PREFIX@/uw;
  scgi_temp_path @PREFIX@/sc;
  lua_package_path "@REPO@/lua/?.lua;@REPO@/lua/?/init.lua;;";
  lua_package_cpath "@REPO@/build-lua/5.1/lib/lua/5.1/?.so;;";
  init_worker_by_lua_block {
    require("llmretry.openresty").init_worker{ transport = "cosocket" }
  }
  server {
    listen 127.0.0.1:@PORT@;
    # ?model=NAME&retries=N: one call through LiteLLM; its outcome as JSON.
    location = /call {
      content_by_lua_block {
        local llm = require("llmretry.openresty")
        local args = ngx.req.get_uri_args()
        local res, err = llm.call_llm{
          base_url = "@BASE@", api_key = "@KEY@",
          body = { model = args.model, messages = { { role = "user", content = "hi" } } },
          max_retries = tonumber(args.retries) or 0, base_delay_ms = 100, jitter = "none",
          timeout_ms = 20000,
        }
        if res then
          ngx.say(llm.encode({ ok = true, content = res.data.choices[1].message.content,
            attempts = res.meta.attempts, tokens = res.meta.usage and res.meta.usage.total_tokens }))
        else
          ngx.say(llm.encode({ ok = false, kind = err.kind, status = err.status,
            attempts = err.attempts, message = err.message }))
        end
      }
    }
    location = /stats {
      content_by_lua_block { ngx.say(require("llmretry").encode(require("llmretry.openresty").stats())) }
    }
  }
}
"""


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read().decode())


def main(base_url: str) -> int:
    checks = Checks()
    check = checks.check
    prefix = tempfile.mkdtemp(prefix="llmretry-interop-openresty-")
    os.chmod(prefix, 0o755)
    port = free_port()
    user = (f"user {getpass.getuser()} {grp.getgrgid(os.getgid()).gr_name};"
            if os.geteuid() == 0 else "")
    conf = CONF
    for k, v in {"@PREFIX@": prefix, "@PORT@": str(port), "@REPO@": REPO, "@BASE@": base_url,
                 "@KEY@": KEY, "@USER@": user}.items():
        conf = conf.replace(k, v)
    with open(os.path.join(prefix, "nginx.conf"), "w") as f:
        f.write(conf)
    cmd = ["nginx", "-p", prefix, "-c", os.path.join(prefix, "nginx.conf"),
           "-e", os.path.join(prefix, "error.log")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    gw = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                get(gw + "/stats")
                break
            except (OSError, ValueError):
                time.sleep(0.1)

        def transport() -> str:
            st = get(gw + "/stats")
            assert st["transport"] == "cosocket" and st["engine"], st
            return "the worker's engine has no thread"

        def one_call() -> str:
            out = get(gw + "/call?model=fake-ok")
            assert out == {"ok": True, "content": "hello from litellm", "attempts": 1,
                           "tokens": out.get("tokens")}, out
            return f"{out['content']!r}, usage {out['tokens']} tokens"

        def server_error_retried() -> str:
            out = get(gw + "/call?model=fake-500&retries=2")
            assert not out["ok"] and out["kind"] == "http_status" and out["status"] == 500 \
                and out["attempts"] == 3, out
            return "500 three times: http_status after 3 attempts"

        def unknown_model() -> str:
            out = get(gw + "/call?model=no-such-model&retries=2")
            assert not out["ok"] and out["status"] in (400, 404) and out["attempts"] == 1, out
            return f"HTTP {out['status']}, not retried"

        def many_at_once() -> str:
            n = 200
            outs: list = [None] * n

            def one(i: int) -> None:
                try:
                    outs[i] = get(gw + "/call?model=fake-ok")
                except (OSError, ValueError) as exc:
                    outs[i] = {"ok": False, "error": repr(exc)}

            t0 = time.monotonic()
            threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            bad = [o for o in outs if not (o and o.get("ok") and o["content"] == "hello from litellm")]
            assert not bad, bad[:3]
            return f"{n} of {n} ok in {time.monotonic() - t0:.1f} s"

        check("cosocket transport: init_worker made it", transport)
        check("cosocket transport: one call, the answer read by the core's HTTP/1.1 parser", one_call)
        check("cosocket transport: a 500 retried to max_retries", server_error_retried)
        check("cosocket transport: an unknown model's error, not retried", unknown_model)
        check("cosocket transport: 200 calls at once", many_at_once)

        def quiet_log() -> str:
            with open(os.path.join(prefix, "error.log")) as f:
                errors = [line for line in f if "[error]" in line or "[crit]" in line]
            assert not errors, errors[:3]
            return "none"

        check("cosocket transport: no error in nginx's log", quiet_log)
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(prefix, ignore_errors=True)
    return checks.summary("openresty")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
