-- Issue 13, the batch side: a body nested ~990 levels deep (cJSON allows
-- 1000) and a 429 whose Retry-After is longer than max_retry_after_ms, through
-- llm.call_llm and llm.call_many.

local H = require("helpers")
local llm = require("llmretry")
local check = H.check

local LEVELS = 990
local DEEP = '{"a":' .. string.rep("[", LEVELS) .. string.rep("]", LEVELS) .. "}"

describe("correctness (batch)", function()
  local mock

  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  -- Item 9 --------------------------------------------------------------------

  -- The core refuses a 2xx body nested deeper than 256 levels
  -- (LLMRETRY_MAX_BODY_DEPTH), in Lua as in Python: an invalid response,
  -- retried like any other.
  it("takes a body nested ~990 levels as an invalid response, retried; never raises", function()
    local scen = mock:scen("deep")
    local ok, out = pcall(H.run_call, scen, {}, { _after = { body = DEEP } })
    check(ok, "call_llm raised: %s", tostring(out))
    check(not out.res and llm.is_error(out.err) and out.err.kind == "invalid_response",
      "error %s", tostring(out.err))
    check(out.err.attempts == 1 + H.FAST.max_retries, "attempts %s", tostring(out.err.attempts))
    check(tostring(out.err):find("nests deeper than 256 levels", 1, true), tostring(out.err))
    check(out.err.request_id ~= nil, "no request id")
    ok, out = pcall(H.run_call, mock:scen("deep_once"), { { body = DEEP }, {} })
    check(ok and out.res and out.res.meta.attempts == 2, "deep then ok: %s",
      tostring(ok and (out.err or out.res.meta.attempts) or out))
  end)

  it("call_many with a deep body: the other items still succeed", function()
    local scen = mock:scen("deep_many")
    scen.script({ {}, { body = DEEP }, {} })
    local ok, outs = pcall(llm.call_many,
      { H.secret_body("d1"), H.secret_body("d2"), H.secret_body("d3") },
      H.merge(H.FAST, { limit = 1, base_url = scen.url, api_key = H.SECRET_KEY,
        max_retries = 0 }))
    check(ok, "call_many raised: %s", tostring(outs))
    check(outs.n == 3, "n %s", tostring(outs.n))
    check(not llm.is_error(outs[1]) and not llm.is_error(outs[3]), "the others failed")
    check(llm.is_error(outs[2]) and outs[2].kind == "invalid_response", "item 2: %s",
      tostring(outs[2]))
  end)

  -- Item 18 (the core's, through the binding) --------------------------------

  it("refuses a ca_file that cannot be read, before any I/O", function()
    local scen = mock:scen("cafile")
    local ok, why = pcall(llm.call_llm, H.merge(H.FAST, { body = H.secret_body("ca"),
      base_url = scen.url, api_key = H.SECRET_KEY, ca_file = "/nonexistent/ca.pem" }))
    check(not ok and tostring(why):find("ca_file cannot be read", 1, true),
      "expected an error naming ca_file, got %s", tostring(why))
    check(#scen.requests() == 0, "a request went out")
  end)

  it("does not retry https:// to a plain-HTTP port", function()
    local scen = mock:scen("plain")
    local url = "https://" .. scen.url:sub(#"http://" + 1)
    local res, err = llm.call_llm(H.merge(H.FAST, { body = H.secret_body("tls"),
      base_url = url, api_key = H.SECRET_KEY, max_retries = 3 }))
    check(res == nil and llm.is_error(err), "expected nil, err")
    check(err.attempts == 1 and err.reason == "not_retryable", "%d attempts, %s: %s",
      err.attempts, tostring(err.reason), tostring(err))
  end)

  -- Item 3 --------------------------------------------------------------------
  -- ENGINE-DEPENDENT (core/src/engine.c handle_failure / llmretry_pacer_on_429):
  -- fails until the batch pause ignores a Retry-After above max_retry_after_ms.

  it("a Retry-After above max_retry_after_ms never pauses call_many #engine_pause", function()
    local scen = mock:scen("long_ra")
    scen.script({ { status = 429, headers = { ["Retry-After"] = "100000" } } },
      { delay_ms = 5 })
    local bodies = {}
    for i = 1, 6 do bodies[i] = H.secret_body("ra" .. i) end
    local t0 = H.now_ms()
    local outs = llm.call_many(bodies, H.merge(H.FAST, { limit = 2, base_url = scen.url,
      api_key = H.SECRET_KEY, max_retry_after_ms = 1000, deadline_ms = 6000 }))
    local wall = H.now_ms() - t0
    local gave_up, ok_n = 0, 0
    for i = 1, 6 do
      local v = outs[i]
      if llm.is_error(v) then
        check(v.reason == "retry_after_too_long", "item %d: %s (%s)", i, tostring(v.reason),
          tostring(v))
        gave_up = gave_up + 1
      else
        ok_n = ok_n + 1
      end
    end
    check(gave_up == 1 and ok_n == 5, "%d gave up, %d ok", gave_up, ok_n)
    check(wall < 5000, "the batch took %d ms (paused for the server's wait?)", wall)
  end)
end)
