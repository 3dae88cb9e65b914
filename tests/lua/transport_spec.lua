-- Transport faults beyond statuses, and the key never sent elsewhere
-- (issue 8, items 4 and 5; the Lua twin of tests/python/test_transport.py).
--
-- Through llm.call_llm (and llm.call_many for some) against real local
-- servers: connections closed mid-body, servers that never answer or
-- trickle, unknown hosts, TLS to a self-signed server (and ca_file), a proxy
-- variable pointing nowhere, redirects to another local server. Every
-- failure is also checked for leaks: no key, prompt, Authorization text or
-- body fragment in tostring(err), any err field or any event (H.check_no_leak).

local H = require("helpers")
local llm = require("llmretry")
local check = H.check

local function names_are(out, want)
  local got = out.events.names()
  check(H.list_eq(got, want), "events %s, expected %s", H.list_str(got), H.list_str(want))
end

local function error_kinds(out)
  return out.events.field("llm_request_error", "error_kind")
end

local function kinds_are(out, want)
  local got = error_kinds(out)
  check(H.list_eq(got, want), "error kinds %s, expected %s", H.list_str(got), H.list_str(want))
end

-- The checks of every failed outcome here: events, gave_up, leaks.
local function finish(out, attempts)
  check(out.err ~= nil, "expected a failure, got %s", out.res and H.dump(out.res.meta))
  H.check_event_sequence(out.events.events, attempts, out.err.request_id)
  local gave_up = out.events.of("llm_request_gave_up")
  check(#gave_up == 1 and gave_up[1].reason == out.err.reason, "gave_up %s vs reason %s",
    H.dump(gave_up), tostring(out.err.reason))
  H.check_no_leak(out)
end

-- A target that is not a mock scenario (run_call needs only url and name).
local function target(url)
  return { url = url, name = "target" }
end

-- One TLS recorder for the whole file (making its certificate takes a
-- while); tests compare its records before and after. A missing openssl
-- tool fails the test: tools/ensure-deps.sh installs it.
local tls_srv, tls_why
local function tls_recorder()
  if not tls_srv and not tls_why then
    tls_srv, tls_why = H.start_recorder({ tls = true })
  end
  check(tls_srv, "the TLS recorder did not start: %s (the openssl command line tool: "
    .. "tools/ensure-deps.sh installs it)", tostring(tls_why))
  return tls_srv
end

-- What reached srv since `before` (an earlier srv:records()).
local function since(srv, before)
  local now = srv:records()
  local reqs = {}
  for i = #before.requests + 1, #now.requests do reqs[#reqs + 1] = now.requests[i] end
  return { connections = now.connections - before.connections,
    handshake_failures = now.handshake_failures - before.handshake_failures, requests = reqs }
end

describe("transport faults", function()
  local mock

  setup(function() mock = H.start_mock() end)
  teardown(function()
    if mock then mock:stop() end
    if tls_srv then tls_srv:stop() end
  end)

  -- 1. Broken, silent and trickling servers --------------------------------

  it("a close mid-body is a network error, retried", function()
    local scen = mock:scen("close_mid_body")
    -- Headers and half the body, a short stall, then FIN.
    local out = H.run_call(scen, {}, { _after = { fault = "stall_body", stall_ms = 300 },
      max_retries = 1 })
    H.check_error(out.err, "network", { reason = "retries_exhausted", attempts = 2 })
    kinds_are(out, { "network", "network" })
    check(#out.events.of("llm_retry_scheduled") == 1, "retry_scheduled events")
    finish(out, 2)
    H.common(out, scen, 2)
    -- Closed well before the 5 s attempt timeout: not a timeout in disguise.
    check(out.wall_ms >= 500 and out.wall_ms < 3000, "took %d ms", out.wall_ms)

    -- ... and a retry after one succeeds.
    local again = mock:scen("close_then_ok")
    local ok = H.run_call(again, { { fault = "stall_body", stall_ms = 300 } })
    check(ok.ok, "no success after one mid-body close: %s", tostring(ok.err))
    check(ok.res.meta.attempts == 2, "attempts %s", tostring(ok.res.meta.attempts))
    kinds_are(ok, { "network" })
    H.common(ok, again, 2)
  end)

  it("a server that never sends headers times out at timeout_ms", function()
    local scen = mock:scen("no_headers")
    local out = H.run_call(scen, {}, { _after = { fault = "no_headers", stall_ms = 5000 },
      timeout_ms = 500, max_retries = 1 })
    H.check_error(out.err, "timeout", { reason = "retries_exhausted", attempts = 2,
      status = false })
    kinds_are(out, { "timeout", "timeout" })
    for _, d in ipairs(out.events.field("llm_request_error", "duration_ms")) do
      check(d >= 450 and d < 1500, "an attempt lasted %d ms with timeout_ms = 500", d)
    end
    finish(out, 2)
    H.common(out, scen, 2)
    -- 2 attempts x 500 ms + 20 ms backoff, with generous slack.
    check(out.wall_ms >= 950 and out.wall_ms < 2500, "took %d ms", out.wall_ms)
  end)

  it("a trickle of one byte a second is still bounded by timeout_ms", function()
    local scen = mock:scen("trickle")
    local timeout = 1200
    local out = H.run_call(scen, {}, { _after = { fault = "trickle", interval_ms = 1000 },
      timeout_ms = timeout, max_retries = 1 })
    H.check_error(out.err, "timeout", { reason = "retries_exhausted", attempts = 2 })
    kinds_are(out, { "timeout", "timeout" })
    for _, d in ipairs(out.events.field("llm_request_error", "duration_ms")) do
      check(d >= timeout - 50 and d < timeout + 800, "an attempt lasted %d ms", d)
    end
    finish(out, 2)
    H.common(out, scen, 2)
    check(out.wall_ms >= 2 * (timeout - 50) and out.wall_ms < 2 * timeout + 1500, "took %d ms",
      out.wall_ms)
  end)

  -- 2. Never connected: unknown host ---------------------------------------

  for _, mode in ipairs({ "safe", "unsafe" }) do
    it("an unknown host is a network error, retried even in " .. mode .. " mode", function()
      -- .invalid never resolves (RFC 6761): provably never sent.
      local out = H.run_call(target("http://llmretry-test.invalid/v1"), nil,
        { max_retries = 2, retry_mode = mode })
      H.check_error(out.err, "network", { reason = "retries_exhausted", attempts = 3,
        status = false })
      check(out.err.message:lower():find("resolve", 1, true), "message %q", out.err.message)
      kinds_are(out, { "network", "network", "network" })
      finish(out, 3)
      check(out.wall_ms < 5000, "took %d ms", out.wall_ms)
    end)
  end

  -- 3. TLS ------------------------------------------------------------------

  describe("TLS", function()
    it("to a self-signed server fails without retry and says why", function()
      local srv = tls_recorder()
      local before = srv:records()
      local out = H.run_call(target(srv.base_url), nil, { max_retries = 3 })
      H.check_error(out.err, "network", { reason = "not_retryable", attempts = 1,
        status = false })
      check(out.err.message:find("TLS verification", 1, true), "message does not say why: %q",
        out.err.message)
      check(out.err.message:find("not retried", 1, true), "message %q", out.err.message)
      names_are(out, { "llm_request_started", "llm_request_error", "llm_request_gave_up" })
      finish(out, 1)
      -- One connection, whose handshake the client aborted; no HTTP request
      -- (so no Authorization header) reached the unverified server.
      srv:wait_for(function(r) return r.handshake_failures > before.handshake_failures end)
      local d = since(srv, before)
      check(d.handshake_failures == 1, "no TLS handshake was attempted: %s", H.dump(d))
      check(d.connections == 1 and #d.requests == 0, "the server saw %s", H.dump(d))
    end)

    it("ca_file makes it work, per call: a later call without it still fails", function()
      local srv = tls_recorder()
      local before = srv:records()
      local engine = llm.new_engine()
      finally(function() engine:close() end)
      local out = H.run_call(target(srv.base_url), nil, { ca_file = srv.cert, engine = engine })
      check(out.ok, "with ca_file: %s", tostring(out.err))
      check(out.res.data.choices[1].message.content == "over tls", "data %s",
        H.dump(out.res.data))
      check(out.res.meta.attempts == 1, "attempts %s", tostring(out.res.meta.attempts))
      -- The same engine (its connection cache), no ca_file: verified again,
      -- and refused.
      out = H.run_call(target(srv.base_url), nil, { engine = engine })
      H.check_error(out.err, "network", { reason = "not_retryable", attempts = 1 })
      check(out.err.message:find("TLS verification", 1, true), "message %q", out.err.message)
      finish(out, 1)
      -- A client's default ca_file works too.
      local c = llm.client({ ca_file = srv.cert, api_key = H.SECRET_KEY })
      local res, err = c:call_llm({ body = H.secret_body("tls"), base_url = srv.base_url })
      check(res, "client with ca_file: %s", tostring(err))
      local reqs = since(srv, before).requests
      check(#reqs == 2, "the server saw %d requests, expected 2", #reqs)
      for _, r in ipairs(reqs) do
        check(r.headers.authorization == "Bearer " .. H.SECRET_KEY, "authorization %s",
          tostring(r.headers.authorization))
      end
    end)

    -- Refused before any I/O, as a wrong argument (issue 13, item 18): it used
    -- to cost one attempt and read "TLS verification failed".
    it("a ca_file that cannot be read raises, naming it, sending nothing", function()
      local srv = tls_recorder()
      local before = srv:records()
      local missing = "/nonexistent/llmretry-ca.pem"
      local ok, why = pcall(H.run_call, target(srv.base_url), nil, { ca_file = missing })
      check(not ok, "expected an error")
      why = tostring(why)
      check(why:find("ca_file cannot be read: " .. missing, 1, true), "message %q", why)
      check(not why:find(H.SECRET_KEY, 1, true), "the key in %q", why)
      check(#since(srv, before).requests == 0, "a request reached the server")
    end)
  end)

  -- 4. Proxy variables --------------------------------------------------------
  --
  -- libcurl reads them from the process environment, which Lua cannot set:
  -- the call runs in a child interpreter (this one) with the variables set.

  local CHILD = [[
local H = require("helpers")
local llm = require("llmretry")
local url, mode, port = arg[1], arg[2], arg[3]
local out = H.run_call({ url = url, name = "proxy" }, nil,
  { max_retries = 1, engine = llm.new_engine() })
if mode == "dead" then
  H.check_error(out.err, "network", { reason = "retries_exhausted", attempts = 2, status = false })
  -- The proxy's port, not the mock's: the variable was used.
  H.check(out.err.message:find(port, 1, true), "message %q lacks the proxy port %s",
    out.err.message, port)
  H.check(#out.events.of("llm_request_error") == 2, "error events")
  H.check_event_sequence(out.events.events, 2, out.err.request_id)
  H.check_no_leak(out)
else
  H.check(out.ok, "NO_PROXY did not bypass the proxy: %s", tostring(out.err))
  H.check(out.res.meta.attempts == 1, "attempts %s", tostring(out.res.meta.attempts))
end
io.write("CHILD-OK\n")
]]

  local PROXY_VARS = { "http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY",
    "ALL_PROXY" }

  -- Run CHILD with every proxy variable pointing at `port`; `no_proxy` (or
  -- nil) for NO_PROXY. Returns the child's output (it must end well).
  local function run_child(url, mode, port, no_proxy)
    local script = os.tmpname()
    H.write_file(script, CHILD)
    local env = { "env -u no_proxy -u NO_PROXY" }
    for _, v in ipairs(PROXY_VARS) do
      env[#env + 1] = string.format("%s=http://127.0.0.1:%d", v, port)
    end
    if no_proxy then
      env[#env + 1] = "no_proxy=" .. no_proxy
      env[#env + 1] = "NO_PROXY=" .. no_proxy
    end
    local cmd = string.format("%s %s %s %s %s %d 2>&1", table.concat(env, " "),
      H.shell_quote(H.interpreter()), H.shell_quote(script), H.shell_quote(url), mode, port)
    local p = assert(io.popen(cmd, "r"))
    local text = p:read("*a")
    p:close()
    os.remove(script)
    check(text:find("CHILD-OK", 1, true), "the child failed:\n%s", text)
    return text
  end

  it("a proxy variable pointing nowhere is a network error; NO_PROXY bypasses it", function()
    local scen = mock:scen("proxy")
    local port = H.closed_port()
    run_child(scen.url, "dead", port, nil)
    check(#scen.requests() == 0, "the request went around the proxy")
    run_child(scen.url, "bypass", port, "127.0.0.1")
    check(#scen.requests() == 1, "NO_PROXY: the mock saw %d requests", #scen.requests())
  end)

  -- 5. Redirects are not followed: the key never reaches another host -------

  describe("redirects", function()
    local other

    setup(function() other = H.start_recorder() end)
    teardown(function() if other then other:stop() end end)

    for _, status in ipairs({ 307, 301, 302, 303, 308 }) do
      it("a " .. status .. " to another host is not followed", function()
        local scen = mock:scen("redirect" .. status)
        local out = H.run_call(scen, { { status = status,
          headers = { Location = other.base_url .. "/chat/completions" } } }, { max_retries = 3 })
        H.check_error(out.err, "http_status", { reason = "not_retryable", attempts = 1,
          status = status })
        names_are(out, { "llm_request_started", "llm_request_failed", "llm_request_gave_up" })
        finish(out, 1)
        H.common(out, scen, 1) -- the key went to the mock, once
        H.sleep_ms(100)        -- give a (wrongly) followed redirect time to land
        local recs = other:records()
        check(recs.connections == 0 and #recs.requests == 0,
          "the client went to the redirect target: %s", H.dump(recs))
      end)
    end
  end)

  -- 6. Secrets across the rest of the fault matrix ------------------------------
  -- (The cases above each end in H.check_no_leak already.)

  local matrix = {
    -- name, the mock's `after` step (nil: a refused port), kind, attempts
    { "refused", nil, "network", 2 },
    { "400", { status = 400 }, "http_status", 1 },
    { "429", { status = 429, retry_after = "0.02" }, "http_status", 2 },
    { "503", { status = 503 }, "http_status", 2 },
    { "timeout", { delay_ms = 1500 }, "timeout", 2 },
    { "invalid_json", { fault = "invalid_json" }, "invalid_response", 2 },
    { "reset", { fault = "reset" }, "network", 2 },
  }
  for _, case in ipairs(matrix) do
    local name, after, kind, attempts = case[1], case[2], case[3], case[4]
    it("leaks nothing: " .. name, function()
      local scen = mock:scen("matrix_" .. name)
      local t, steps = scen, {}
      if not after then
        t, steps = target(string.format("http://127.0.0.1:%d/v1", H.closed_port())), nil
      end
      local out = H.run_call(t, steps, { _after = after, max_retries = 1, timeout_ms = 300 })
      H.check_error(out.err, kind, { attempts = attempts })
      finish(out, attempts)
    end)
  end

  it("the leak check can fail: a server echoing the prompt in its error body", function()
    local scen = mock:scen("echo")
    local out = H.run_call(scen, { { status = 400,
      body = { error = { message = "bad: SECRET-PROMPT-" .. scen.name } } } })
    H.check_error(out.err, "http_status", { attempts = 1, status = 400 })
    -- The response body is the server's: it does reach body_preview ...
    check(out.err.body_preview:find("SECRET-PROMPT-", 1, true), "body_preview %q",
      tostring(out.err.body_preview))
    -- ... and the checker catches it.
    local ok, e = pcall(H.check_no_leak, out)
    check(not ok and tostring(e):find("leaked into", 1, true), "the leak went unnoticed: %s",
      tostring(e))
  end)

  -- 7. The same faults through call_many ---------------------------------------

  describe("call_many", function()
    local function many(bodies, opts)
      local rec = H.recorder()
      local t0 = H.now_ms()
      local outs = llm.call_many(bodies, H.merge(H.FAST, { api_key = H.SECRET_KEY,
        logger = rec.fn }, opts))
      return outs, rec, H.now_ms() - t0
    end

    -- Every item failed with `kind`; nothing leaked anywhere.
    local function all_failed(outs, rec, bodies, kind, reason)
      check(outs.n == #bodies, "outs.n %s", tostring(outs.n))
      for i = 1, #bodies do
        H.check_error(outs[i], kind, { reason = reason })
        local evs = {}
        for _, ev in ipairs(rec.events) do
          if ev.request_id == outs[i].request_id then evs[#evs + 1] = ev end
        end
        H.check_event_sequence(evs, outs[i].attempts, outs[i].request_id)
        H.check_no_leak({ err = outs[i], events = { events = evs }, body = bodies[i] })
      end
      H.check_no_leak({ events = rec, body = bodies[1] })
    end

    it("silent servers: every item times out, concurrently", function()
      local scen = mock:scen("many_no_headers")
      scen.script({}, { fault = "no_headers", stall_ms = 5000 })
      local bodies = { H.secret_body("m1"), H.secret_body("m2"), H.secret_body("m3") }
      local outs, rec, wall = many(bodies, { base_url = scen.url, timeout_ms = 400,
        max_retries = 0, limit = 3 })
      all_failed(outs, rec, bodies, "timeout", "retries_exhausted")
      check(#scen.requests() == 3, "the mock saw %d requests", #scen.requests())
      check(wall < 2500, "took %d ms for 3 concurrent 400 ms timeouts", wall)
    end)

    it("a close mid-body, then success", function()
      local scen = mock:scen("many_close")
      scen.script({ { fault = "stall_body", stall_ms = 200 } })
      local bodies = { H.secret_body("c1"), H.secret_body("c2") }
      local outs, rec = many(bodies, { base_url = scen.url, limit = 1 })
      for i = 1, 2 do
        check(not llm.is_error(outs[i]), "item %d: %s", i, tostring(outs[i]))
      end
      check(outs[1].meta.attempts == 2 and outs[2].meta.attempts == 1, "attempts %s %s",
        tostring(outs[1].meta.attempts), tostring(outs[2].meta.attempts))
      local kinds = rec.field("llm_request_error", "error_kind")
      check(H.list_eq(kinds, { "network" }), "error kinds %s", H.list_str(kinds))
      H.check_no_leak({ events = rec, body = bodies[1] })
    end)

    it("an unknown host", function()
      local bodies = { H.secret_body("d1"), H.secret_body("d2") }
      local outs, rec = many(bodies, { base_url = "http://llmretry-test.invalid/v1",
        max_retries = 1 })
      all_failed(outs, rec, bodies, "network", "retries_exhausted")
    end)

    it("TLS: a self-signed server fails every item unretried; ca_file fixes it", function()
      local srv = tls_recorder()
      local before = srv:records()
      local bodies = { H.secret_body("t1"), H.secret_body("t2") }
      local outs, rec = many(bodies, { base_url = srv.base_url })
      all_failed(outs, rec, bodies, "network", "not_retryable")
      for i = 1, 2 do
        check(outs[i].attempts == 1 and outs[i].message:find("TLS verification", 1, true),
          "item %d: %s", i, tostring(outs[i]))
      end
      check(#since(srv, before).requests == 0, "a request reached the unverified server")
      outs = many(bodies, { base_url = srv.base_url, ca_file = srv.cert })
      for i = 1, 2 do
        check(not llm.is_error(outs[i]), "item %d with ca_file: %s", i, tostring(outs[i]))
      end
      local n = #since(srv, before).requests
      check(n == 2, "the server saw %d requests", n)
    end)
  end)
end)
