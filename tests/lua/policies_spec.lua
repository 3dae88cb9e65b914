-- Named policies (issue 9): loading, validation, the shared vector with
-- Python, and resolution on a client (explicit > policy > client defaults >
-- built-in) observed through the mock.

local H = require("helpers")
local llm = require("llmretry")
local check = H.check

local EXAMPLE = H.REPO .. "/examples/policies.json"

local function load_json(path)
  local data, err = llm.decode(H.read_file(path))
  check(data ~= nil, "cannot decode %s: %s", path, tostring(err))
  return data
end

local function tmp_json(text)
  local path = os.tmpname() .. "_policies.json"
  H.write_file(path, text)
  return path
end

describe("policies", function()
  it("examples/policies.json resolves to the shared vector", function()
    local want = load_json(H.REPO .. "/tests/policies/resolved.json").resolved
    local p = llm.load_policies(EXAMPLE)
    local got = p:resolved()
    check(H.same(got, want), "resolved\n%s\nwant\n%s", H.dump(got), H.dump(want))
    local names = p:names()
    check(H.list_eq(names, { "autocomplete", "background_analysis", "support_summary", "unsafe" }),
      "names %s", H.list_str(names))
    for _, name in ipairs(names) do
      for k, v in pairs(got[name]) do
        -- Whole numbers come as integers (retry_budget_ratio may be a fraction).
        if type(v) == "number" and v == math.floor(v) then
          check(H.is_int(v), "%s.%s is not an integer", name, k)
        end
      end
    end
    -- The same from a table, and a client's resolved() over its defaults.
    local again = llm.load_policies(load_json(EXAMPLE)):resolved()
    check(H.same(again, want), "from a table %s", H.dump(again))
    local c = llm.client{ policies = EXAMPLE, max_retries = 7, model = "m-default" }
    local r = c:resolved()
    check(r.autocomplete.max_retries == 1 and r.support_summary.max_retries == 3
      and r.unsafe.max_retries == 7 and r.unsafe.model == "m-default", "client %s", H.dump(r))
  end)

  it("refuses every bad file of tests/policies/bad.json, from a table and from a file",
    function()
      local cases = load_json(H.REPO .. "/tests/policies/bad.json").cases
      check(#cases >= 9, "cases: %d", #cases)
      for i, case in ipairs(cases) do
        local text = llm.encode(case.text)
        -- From a table.
        local msg = H.raises(llm.load_policies, llm.decode(text))
        for _, w in ipairs(case.must_contain) do
          check(msg:find(w, 1, true), "case %d (%s): %q lacks %q", i, case.why, msg, w)
        end
        -- From a file: the message also names the file.
        local path = tmp_json(text)
        local fmsg = H.raises(llm.load_policies, path)
        os.remove(path)
        for _, w in ipairs(case.must_contain) do
          check(fmsg:find(w, 1, true), "case %d (%s) from a file: %q lacks %q", i, case.why,
            fmsg, w)
        end
        check(fmsg:find(path, 1, true), "case %d: %q does not name the file", i, fmsg)
        -- A client refuses it the same way, at construction.
        local cmsg = H.raises(llm.client, { policies = llm.decode(text) })
        check(cmsg:find(case.must_contain[1], 1, true), "client case %d: %q", i, cmsg)
      end
    end)

  it("reads like 'file: policy: key must be ...'", function()
    local path = tmp_json('{"fast": {"timeout_ms": "5000"}}')
    local msg = H.raises(llm.load_policies, path)
    os.remove(path)
    check(msg:find("llmretry: " .. path .. ": policy 'fast': timeout_ms must be an integer (got "
      .. "string)", 1, true), "message %q", msg)
    msg = H.raises(llm.load_policies, { fast = { max_retries = 1.5 } })
    check(msg:find("policy 'fast': max_retries must be an integer (got number)", 1, true), msg)
    msg = H.raises(llm.load_policies, { fast = { max_retries = 101 } })
    check(msg:find("max_retries must be 0..100", 1, true), msg)
    msg = H.raises(llm.load_policies, { fast = { retry_statuses = { 429, 700 } } })
    check(msg:find("retry_statuses[1] must be an HTTP status", 1, true), msg)  -- JSON's index
    msg = H.raises(llm.load_policies, { fast = { retry_invalid_response = "yes" } })
    check(msg:find("retry_invalid_response must be a boolean (got string)", 1, true), msg)
    msg = H.raises(llm.load_policies, { fast = { base_url = 5 } })
    check(msg:find("base_url must be a string (got number)", 1, true), msg)
    msg = H.raises(llm.load_policies, { fast = { timeout_ms = llm.null } })
    check(msg:find("timeout_ms must be an integer (got null)", 1, true), msg)
    -- null unsets an optional key (as in Python): no deadline.
    local unset = llm.load_policies({ fast = { deadline_ms = llm.null } }):resolved()
    check(unset.fast.deadline_ms == llm.null, "deadline %s", H.dump(unset.fast))
    -- a string in the wrong key is not repeated (it could be a pasted key)
    msg = H.raises(llm.load_policies, { fast = { jitter = "sk-SECRET-jitter" } })
    check(msg:find("jitter must be one of", 1, true) and not msg:find("SECRET", 1, true), msg)
    msg = H.raises(llm.load_policies, { fast = { idempotency_key = "sk-SECRET-key" } })
    check(msg:find('must be "auto"', 1, true) and not msg:find("SECRET", 1, true), msg)
    msg = H.raises(llm.load_policies, 42)
    check(msg:find("policies must be a table", 1, true), msg)
    msg = H.raises(llm.load_policies, "/nonexistent/policies.json")
    check(msg:find("/nonexistent/policies.json", 1, true), msg)
    path = tmp_json("{not json")
    msg = H.raises(llm.load_policies, path)
    os.remove(path)
    check(msg:find(path, 1, true) and msg:find("JSON", 1, true), msg)
    -- Valid values, integral floats included (LuaJIT has no integer type).
    local p = llm.load_policies({ ok = { timeout_ms = 1000.0, retry_statuses = { 429, 503 },
      retry_invalid_response = false, idempotency_key = "auto", base_url = "http://x/v1",
      model = "m", max_retries = 0, deadline_ms = 0 }, empty = {} })
    local r = p:resolved()
    check(r.ok.timeout_ms == 1000 and H.is_int(r.ok.timeout_ms), "timeout %s", H.dump(r.ok))
    check(H.list_eq(r.ok.retry_statuses, { 429, 503 }) and r.empty.retry_statuses == llm.null,
      "statuses %s", H.dump(r))
  end)

  it("refuses tests/policies/errors.json word for word, as C and Python do", function()
    local doc = load_json(H.REPO .. "/tests/policies/errors.json")
    check(#doc.cases >= 20, "cases: %d", #doc.cases)
    for i, case in ipairs(doc.cases) do
      local path = tmp_json(llm.encode(case.text))
      local ok, msg = pcall(llm.load_policies, path)
      os.remove(path)
      check(not ok and msg == "llmretry: " .. path .. ": " .. case.error,
        "case %d: %q, want %q", i, tostring(msg), case.error)
      -- From a table when Lua can hold it (a JSON document, not a Lua value).
      if not (type(case.text) == "table" and case.text[1] ~= nil) then
        ok, msg = pcall(llm.load_policies, case.text)
        check(not ok and msg == "llmretry: " .. case.error, "case %d from a table: %q", i,
          tostring(msg))
      end
    end
    for i, case in ipairs(doc.accepted) do
      local ok, err = pcall(llm.load_policies, case.text)
      check(ok, "accepted case %d (%s): %s", i, case.why, tostring(err))
    end
  end)

  it("refuses a .toml path, saying Lua reads the JSON form", function()
    local msg = H.raises(llm.load_policies, H.REPO .. "/examples/policies.toml")
    check(msg:find("policies.toml", 1, true) and msg:find("JSON", 1, true), "message %q", msg)
  end)

  describe("on a client", function()
    local mock

    setup(function() mock = H.start_mock() end)
    teardown(function() if mock then mock:stop() end end)

    local function client(scen, extra)
      return llm.client(H.merge({
        policies = {
          quick = { timeout_ms = 1500, max_retries = 1, base_delay_ms = 10, jitter = "none" },
          slow = { timeout_ms = 7000, max_retries = 2, base_delay_ms = 10, jitter = "none",
            model = "policy-model" },
          sidefx = { timeout_ms = 3000, max_retries = 2, base_delay_ms = 10, jitter = "none",
            retry_mode = "unsafe", idempotency_key = "auto" },
          keyed = { max_retries = 2, base_delay_ms = 10, jitter = "none",
            idempotency_key = "auto" },
        },
        base_url = scen.url, api_key = H.SECRET_KEY, timeout_ms = 4000, max_retries = 0,
        base_delay_ms = 10, jitter = "none",
      }, extra))
    end

    it("explicit options > the policy > the client's defaults > built-in", function()
      local scen = mock:scen("order")
      scen.script({}, { status = 503 })
      local c = client(scen)
      local function run(opts)
        local rec = H.recorder()
        local res, err = c:call_llm(H.merge({ body = H.secret_body(scen.name), logger = rec.fn },
          opts))
        check(res == nil and err, "expected a failure")
        local started = rec.of("llm_request_started")
        return started[1].timeout_ms, err.attempts, started[1].policy, rec
      end
      -- The policy over the client's defaults.
      local t, n, pol = run({ policy = "quick" })
      check(t == 1500 and n == 2 and pol == "quick", "quick: %s %s %s", t, n, tostring(pol))
      -- Explicit over the policy.
      t, n = run({ policy = "quick", timeout_ms = 2500, max_retries = 0 })
      check(t == 2500 and n == 1, "explicit: %s %s", t, n)
      -- No policy: the client's defaults; events carry policy = null.
      t, n, pol = run({})
      check(t == 4000 and n == 1 and pol == llm.null, "defaults: %s %s %s", t, n, tostring(pol))
      -- Nothing anywhere: built-in (60 s).
      local bare = llm.client{ policies = { p = {} }, base_url = scen.url, api_key = H.SECRET_KEY,
        max_retries = 0 }
      local rec = H.recorder()
      bare:call_llm{ body = H.secret_body(scen.name), logger = rec.fn, policy = "p" }
      local st = rec.of("llm_request_started")[1]
      check(st.timeout_ms == 60000 and st.policy == "p", "built-in %s", H.dump(st))
    end)

    it("every event carries the policy name", function()
      local scen = mock:scen("names")
      scen.script({ { status = 503 } })
      local rec = H.recorder()
      local res, err = client(scen):call_llm{ body = H.secret_body(scen.name), policy = "slow",
        logger = rec.fn }
      check(res, "failed: %s", tostring(err))
      check(#rec.events >= 4, "events %s", H.list_str(rec.names()))
      for _, ev in ipairs(rec.events) do
        check(ev.policy == "slow", "%s.policy = %s", ev.event, tostring(ev.policy))
      end
    end)

    it("a policy's model fills a body without one; base_url explicit wins", function()
      local scen = mock:scen("model")
      local other = mock:scen("other")
      local c = client(scen, { policies = { m = { model = "policy-model",
        base_url = other.url } } })
      local body = H.secret_body(scen.name)
      body.model = nil
      local rec = H.recorder()
      local res, err = c:call_llm{ body = body, policy = "m", logger = rec.fn }
      check(res, "failed: %s", tostring(err))
      check(body.model == nil, "the caller's body was changed")
      check(rec.events[1].model == "policy-model", "model %s", tostring(rec.events[1].model))
      check(#other.requests() == 1 and #scen.requests() == 0, "policy base_url not used")
      -- The body's own model wins; an explicit base_url wins.
      rec = H.recorder()
      res = c:call_llm{ body = H.secret_body(scen.name, "own"), policy = "m", logger = rec.fn,
        base_url = scen.url }
      check(res and rec.events[1].model == "own", "own model %s", tostring(rec.events[1].model))
      check(#scen.requests() == 1 and #other.requests() == 1, "explicit base_url not used")
    end)

    it("the endpoint is one setting: a policy's base_url beats a client's url", function()
      local scen, other, third = mock:scen("ep"), mock:scen("ep_other"), mock:scen("ep_third")
      local c = llm.client{ policies = { p = { base_url = third.url }, q = { timeout_ms = 5000 } },
        url = other.url .. "/chat/completions", api_key = H.SECRET_KEY, max_retries = 0 }
      local body = H.secret_body(scen.name)
      check(c:call_llm{ body = body, policy = "p", logger = false } ~= nil, "policy p failed")
      check(#third.requests() == 1 and #other.requests() == 0, "policy base_url lost to url")
      check(c:call_llm{ body = body, policy = "q", logger = false } ~= nil, "policy q failed")
      check(#other.requests() == 1, "client url not used under a policy without an endpoint")
      check(c:call_llm{ body = body, policy = "q", base_url = scen.url, logger = false } ~= nil,
        "explicit base_url failed")
      check(#scen.requests() == 1, "explicit base_url lost to the client's url")
      check(c:call_llm{ body = body, policy = "p", url = scen.url .. "/chat/completions",
        logger = false } ~= nil, "explicit url failed")
      check(#scen.requests() == 2 and #third.requests() == 1, "explicit url lost to the policy")
    end)

    it("idempotency_key auto: the same key on every attempt, a new one per call", function()
      local scen = mock:scen("idem")
      scen.script({ { status = 503 }, {}, { status = 503 }, {} })
      local c = client(scen)
      for _ = 1, 2 do
        local res, err = c:call_llm{ body = H.secret_body(scen.name), policy = "keyed" }
        check(res, "failed: %s", tostring(err))
      end
      local recs = scen.requests()
      check(#recs == 4, "requests %d", #recs)
      local k = {}
      for i, r in ipairs(recs) do k[i] = r.headers["idempotency-key"] end
      check(type(k[1]) == "string" and #k[1] >= 32, "key %s", tostring(k[1]))
      check(k[1] == k[2] and k[3] == k[4], "keys differ across attempts: %s", H.list_str(k))
      check(k[1] ~= k[3], "the same key for two calls: %s", k[1])
      -- An explicit key wins; no policy: no key.
      c:call_llm{ body = H.secret_body(scen.name), policy = "keyed", idempotency_key = "mine" }
      c:call_llm{ body = H.secret_body(scen.name), policy = "quick" }
      recs = scen.requests()
      check(recs[5].headers["idempotency-key"] == "mine", "explicit key")
      check(recs[6].headers["idempotency-key"] == nil, "a key nobody asked for")
    end)

    it("call_many applies the policy, one key per item", function()
      local scen = mock:scen("many")
      local c = client(scen)
      local rec = H.recorder()
      local outs = c:call_many({ H.secret_body("a"), H.secret_body("b"), H.secret_body("c") },
        { policy = "sidefx", limit = 2, logger = rec.fn })
      check(outs.n == 3, "n")
      for i = 1, 3 do check(not llm.is_error(outs[i]), "item %d: %s", i, tostring(outs[i])) end
      local keys = {}
      for _, r in ipairs(scen.requests()) do
        local key = r.headers["idempotency-key"]
        check(key and not keys[key], "key %s missing or reused", tostring(key))
        keys[key] = true
      end
      local started = rec.of("llm_request_started")
      check(#started == 3, "%d started events for 3 items", #started)
      for _, ev in ipairs(started) do
        check(ev.policy == "sidefx" and ev.timeout_ms == 3000, "started %s", H.dump(ev))
      end
    end)

    it("map_with_concurrency workers use the policies", function()
      local scen = mock:scen("pool")
      local c = client(scen)
      local rec = H.recorder()
      local results = c:map_with_concurrency({ "quick", "slow", "sidefx" }, 3, function(name)
        local res, err = c:call_llm{ body = H.secret_body(scen.name), policy = name }
        if not res then error(err) end
        return name
      end, { logger = rec.fn })
      check(results.n == 3 and results[3] == "sidefx", "results")
      local seen = {}
      for _, ev in ipairs(rec.of("llm_request_started")) do seen[ev.policy] = ev.timeout_ms end
      check(seen.quick == 1500 and seen.slow == 7000 and seen.sidefx == 3000, "seen %s",
        H.dump(seen))
      -- opts.policy: the pool's calls without one of their own.
      rec = H.recorder()
      results = c:map_with_concurrency({ 1, 2 }, 2, function()
        return (c:call_llm{ body = H.secret_body(scen.name) })
      end, { logger = rec.fn, policy = "slow" })
      check(results.n == 2 and results[1] and results[2], "pool policy results %s",
        H.dump(results))
      local started = rec.of("llm_request_started")
      check(#started == 2, "%d started events for the pool's 2 calls", #started)
      for _, ev in ipairs(started) do
        check(ev.policy == "slow" and ev.timeout_ms == 7000, "pool policy %s", H.dump(ev))
      end
    end)

    it("an unknown policy raises before any I/O, naming it and the known ones", function()
      local scen = mock:scen("unknown")
      local c = client(scen)
      local msg = H.raises(c.call_llm, c, { body = H.secret_body(scen.name), policy = "fsat" })
      check(msg:find("'fsat'", 1, true) and msg:find("'quick'", 1, true)
        and msg:find("'sidefx'", 1, true), "message %q", msg)
      msg = H.raises(c.call_many, c, { H.secret_body(scen.name) }, { policy = "fsat" })
      check(msg:find("'fsat'", 1, true), "call_many %q", msg)
      msg = H.raises(c.map_with_concurrency, c, { 1 }, 1, function()
        return c:call_llm{ body = H.secret_body(scen.name) }
      end, { policy = "fsat" })
      check(msg:find("'fsat'", 1, true), "pool %q", msg)
      msg = H.raises(llm.client, { policies = { a = {} }, policy = "b" })
      check(msg:find("'b'", 1, true) and msg:find("'a'", 1, true), "client %q", msg)
      check(#scen.requests() == 0, "the mock saw a request")
    end)
  end)
end)
