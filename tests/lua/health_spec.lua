-- Fallbacks, retry budgets and circuit breakers seen from Lua (issue 19):
-- the core's rules (tests/c/test_health.c) reach Lua callers with the same
-- options, error kinds and fields, meta.target and endpoint_stats().

local H = require("helpers")
local llm = require("llmretry")
local json = require("dkjson")
local check = H.check

local DEAD = { status = 503 }

describe("endpoint health", function()
  local mock

  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  local function stats_of(engine, scen)
    for _, s in ipairs(llm.endpoint_stats(engine)) do
      if s.url:find("/s/" .. scen.name .. "/", 1, true) then return s end
    end
    error("no stats for " .. scen.name)
  end

  local function base(scen, extra)
    return H.merge({ body = H.secret_body("health"), base_url = scen.url,
      api_key = H.SECRET_KEY, timeout_ms = 5000, base_delay_ms = 10, jitter = "none" }, extra)
  end

  it("bounds a retry storm with the retry budget", function()
    local scen = mock:scen("lua_storm")
    scen.script({}, DEAD)
    local engine = llm.new_engine()
    local bodies = {}
    for i = 1, 40 do bodies[i] = H.secret_body("s" .. i) end
    local outs = llm.call_many(bodies, { limit = 40, base_url = scen.url, engine = engine,
      api_key = H.SECRET_KEY, max_retries = 3, base_delay_ms = 10, jitter = "none",
      adaptive = false })
    local exhausted = 0
    for i = 1, 40 do
      check(llm.is_error(outs[i]), "item %d: %s", i, H.dump(outs[i]))
      if outs[i].reason == "retry_budget_exhausted" then exhausted = exhausted + 1 end
    end
    local n = #scen.requests()
    -- 160 without a budget; 40 + 0.2 x 40 + 10 with the default one
    check(n >= 50 and n <= 58, "%d requests", n)
    check(exhausted >= 30, "%d gave up on the budget", exhausted)
    local s = stats_of(engine, scen)
    check(s.requests == 40 and s.retries == n - 40, "stats %s", H.dump(s))
    check(s.retries_refused == exhausted and s.has_key == true, "stats %s", H.dump(s))
    engine:close()
  end)

  it("opens the breaker, fails at once, probes and closes", function()
    local scen = mock:scen("lua_breaker")
    scen.script({ DEAD, DEAD })
    local engine = llm.new_engine()
    local opts = base(scen, { engine = engine, max_retries = 0, breaker_failures = 2,
      breaker_cooldown_ms = 200 })
    for _ = 1, 2 do
      local res, err = llm.call_llm(opts)
      check(res == nil and err.kind == "http_status", "%s", H.dump(err))
    end
    check(stats_of(engine, scen).breaker == "open", "open")
    local t0 = H.now_ms()
    local res, err = llm.call_llm(opts)
    check(res == nil, "failed")
    check(err.kind == llm.errors.CIRCUIT_OPEN and err.reason == "circuit_open" and
      err.attempts == 0, "%s", H.dump(err))
    check(H.now_ms() - t0 < 150, "at once")
    check(#scen.requests() == 2, "nothing sent while open")
    H.sleep_ms(250)   -- the client's own 200 ms cooldown: real time must pass
    res, err = llm.call_llm(opts)
    check(res ~= nil, "probe: %s", H.dump(err))
    local s = stats_of(engine, scen)
    check(s.breaker == "closed" and s.breaker_opened == 1 and s.short_circuited == 1,
      "%s", H.dump(s))
    engine:close()
  end)

  it("falls back to another endpoint, with its own model and no primary key", function()
    local scen, backup = mock:scen("lua_fb"), mock:scen("lua_fb_backup")
    scen.script({}, DEAD)
    local rec = H.recorder()
    local res, err = llm.call_llm(base(scen, { max_retries = 1, logger = rec.fn,
      fallbacks = { { model = "backup-model", base_url = backup.url,
                      headers = { ["X-Backup"] = "yes" } } } }))
    check(res ~= nil, "%s", H.dump(err))
    check(res.meta.target == 1 and res.meta.attempts == 3 and res.meta.model == "backup-model",
      "%s", H.dump(res.meta))
    local recs = backup.requests()
    check(#recs == 1, "%d backup requests", #recs)
    check(json.decode(recs[1].body).model == "backup-model", "body %s", recs[1].body)
    check(recs[1].headers["x-backup"] == "yes" and recs[1].headers.authorization == nil,
      "%s", H.dump(recs[1].headers))
    local fb
    for _, ev in ipairs(rec.events) do
      H.check_event_shape(ev)
      if ev.delay_source == "fallback" then fb = ev end
    end
    check(fb and fb.target == 1 and fb.delay_ms == 0 and fb.model == "backup-model",
      "%s", H.dump(fb))
    H.check_no_secrets({ H.SECRET_KEY }, rec.events)
  end)

  it("lists what each target returned when all fail, and not after a 400", function()
    local scen, backup = mock:scen("lua_fb_all"), mock:scen("lua_fb_all_b")
    scen.script({}, DEAD)
    backup.script({}, { status = 504 })
    local res, err = llm.call_llm(base(scen, { max_retries = 0,
      fallbacks = { { model = "m2", base_url = backup.url } } }))
    check(res == nil and err.status == 504 and err.target == 1, "%s", H.dump(err))
    check(#err.targets == 2 and err.targets[1].status == 503 and err.targets[1].attempts == 1 and
      err.targets[2].model == "m2" and err.targets[2].kind == "http_status", "%s",
      H.dump(err.targets))
    check(err.message:find("on 2 targets", 1, true), "%s", err.message)
    local bad, bad_b = mock:scen("lua_fb_400"), mock:scen("lua_fb_400_b")
    bad.script({ { status = 400 } })
    res, err = llm.call_llm(base(bad, { fallbacks = { { base_url = bad_b.url } } }))
    check(res == nil and err.status == 400 and err.target == 0, "%s", H.dump(err))
    check(#bad_b.requests() == 0, "no fallback after a 400")
  end)

  it("takes fallbacks from a policy, which may not hold a key", function()
    local scen, backup = mock:scen("lua_fb_pol"), mock:scen("lua_fb_pol_b")
    scen.script({}, DEAD)
    local c = llm.client{ api_key = H.SECRET_KEY, base_url = scen.url, policies = {
      resilient = { max_retries = 0, breaker_failures = 5,
                    fallbacks = { { model = "b", base_url = backup.url,
                                    api_key_env = "LLMRETRY_UNSET_KEY_VAR" } } } } }
    local res, err = c:call_llm{ policy = "resilient", body = H.secret_body("pol") }
    check(res and res.meta.target == 1 and res.meta.model == "b", "%s", H.dump(err))
    check(#backup.requests() == 1 and backup.requests()[1].headers.authorization == nil,
      "backup %s", H.dump(backup.requests()))
    local ok, e = pcall(llm.client, { policies = { p = { fallbacks = {
      { base_url = backup.url, api_key = "sk-SECRET-P" } } } } })
    check(not ok and tostring(e):find("api_key cannot be in a policy", 1, true) and
      not tostring(e):find("sk-SECRET", 1, true), "%s", tostring(e))
  end)

  it("refuses bad options naming the field, never the key", function()
    local scen = mock:scen("lua_fb_bad")
    local cases = {
      { { fallbacks = "x" }, "fallbacks must be a list of targets" },
      { { fallbacks = { { modle = "x" } } }, "fallbacks[0]: unknown key 'modle'" },
      { { fallbacks = { { api_key = "sk-SECRET-Z" } } }, "needs the target's own url" },
      { { fallbacks = { { base_url = "ftp://x" } } }, "must start with http:// or https://" },
      { { retry_budget_ratio = -1 }, "retry_budget_ratio must be >= 0" },
      { { retry_budget_ratio = "0.2" }, "retry_budget_ratio must be a number" },
      { { breaker_cooldown_ms = 0 }, "breaker_cooldown_ms must be > 0" },
    }
    for _, c in ipairs(cases) do
      local ok, e = pcall(llm.call_llm, base(scen, c[1]))
      check(not ok and tostring(e):find(c[2], 1, true), "%s: %s", c[2], tostring(e))
      check(not tostring(e):find("sk-SECRET", 1, true), "key in %s", tostring(e))
    end
    -- {} is no fallbacks at all
    local res = llm.call_llm(base(scen, { fallbacks = {} }))
    check(res and res.meta.target == 0, "empty fallbacks")
  end)

  -- Shared budgets (issue 28): two engines stand for two processes; only
  -- the store links them. Unshared, the second knows nothing.
  it("shares a breaker between engines through a shared store", function()
    local name = "test-lua-" .. tostring(os.time()) .. "-" .. tostring(math.random(1e6))
    for _, shared in ipairs({ true, false }) do
      local scen = mock:scen(shared and "lua_shared_down" or "lua_lone_down")
      scen.script({}, DEAD)
      local spec = shared and ("shm:" .. name) or nil
      local a, b = llm.new_engine(nil, nil, spec), llm.new_engine(nil, nil, spec)
      local opts = { max_retries = 0, breaker_failures = 3, breaker_cooldown_ms = 60000 }
      for _ = 1, 3 do
        local _, err = llm.call_llm(base(scen, H.merge(opts, { engine = a })))
        check(err and err.status == 503, "a 503")
      end
      check(#scen.requests() == 3, "3 requests")
      local res, err = llm.call_llm(base(scen, H.merge(opts, { engine = b })))
      check(res == nil, "no success")
      if shared then
        check(err.kind == "circuit_open" and err.attempts == 0, "fails fast: " .. tostring(err))
        check(#scen.requests() == 3, "nothing sent")
        check(stats_of(b, scen).breaker == "open", "open for b")
      else
        check(err.status == 503, "b's own call: " .. tostring(err))
        check(#scen.requests() == 4, "sent")
      end
      a:close(); b:close()
    end
    os.remove("/dev/shm/llmretry-" .. name)
    local ok, why = pcall(llm.new_engine, nil, nil, "shm:../x")
    check(not ok and tostring(why):find("shared", 1, true), "bad store refused: " .. tostring(why))
    ok, why = pcall(llm.new_engine, nil, nil, 7)
    check(not ok and tostring(why):find("shared", 1, true), "a number refused: " .. tostring(why))
  end)

  -- A client's `shared` gives its calls an engine on that store: two
  -- clients naming one store see one breaker.
  it("shares through a client's shared option", function()
    local name = "test-lua-client-" .. tostring(os.time()) .. "-" .. tostring(math.random(1e6))
    local scen = mock:scen("lua_client_shared_down")
    scen.script({}, DEAD)
    local opts = { max_retries = 0, breaker_failures = 2, breaker_cooldown_ms = 60000 }
    local a = llm.client(H.merge(opts, { shared = "shm:" .. name }))
    local b = llm.client(H.merge(opts, { shared = "shm:" .. name }))
    for _ = 1, 2 do
      local _, err = a:call_llm(base(scen, {}))
      check(err and err.status == 503, "a 503: %s", tostring(err))
    end
    local res, err = b:call_llm(base(scen, {}))
    check(res == nil and err.kind == "circuit_open", "b fails fast: %s", tostring(err))
    check(#scen.requests() == 2, "%d requests: b sent", #scen.requests())
    os.remove("/dev/shm/llmretry-" .. name)
    local ok, why = pcall(llm.client, { shared = 7 })
    check(not ok and tostring(why):find("opts.shared", 1, true), "a number: %s", tostring(why))
    ok, why = pcall(llm.client, { shared = "shm:x", engine = llm.new_engine() })
    check(not ok and tostring(why):find("give one", 1, true), "both: %s", tostring(why))
    ok, why = pcall(llm.client, { shared = "shm:../x" })
    check(not ok and tostring(why):find("NAME", 1, true), "bad name: %s", tostring(why))
  end)
end)
