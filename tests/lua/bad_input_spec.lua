-- Bad input for every public Lua function (issue 8, item 6), complementing
-- args_spec.lua (which has the first table of call_llm options): wrong
-- type, out of range, unknown value -> error() naming the argument, raised
-- where the caller called, before any request reaches the mock. Then bodies
-- that cannot be serialised, enormous bodies, and invalid UTF-8:
--
--   * strings inside a table body (values and keys, as for llm.encode) must
--     be valid UTF-8: error() naming the path, never showing the text;
--   * a string body is the caller's JSON text, sent byte for byte;
--   * text from a server reaches Lua as valid UTF-8 (res.data, events, err
--     fields; invalid bytes become U+FFFD, as in Python); res.body is raw.

local H = require("helpers")
local llm = require("llmretry")
local check = H.check

local THIS_FILE = "bad_input_spec.lua"
local SECRETS = { "SECRET", "sk-test" }
local NAN, INF = 0 / 0, math.huge

-- Calls f(...) from this file, not as a tail call, so that an error raised
-- at our level carries this file's position.
local function from_here(f, ...)
  local r = f(...)
  return r
end

-- f(...) (run from here) must raise a string naming every needle, with
-- this file's position (unless o.raw: the core's data messages have none).
local function raises(needles, f, o)
  o = o or {}
  local ok, e = pcall(from_here, f)
  check(not ok, "no error (expected one naming %s)", needles[1])
  check(type(e) == "string", "raised a %s, not a message: %s", type(e), H.dump(e))
  if not o.raw then
    check(e:find("^[^:]*" .. THIS_FILE .. ":%d+: llmretry: "),
      "not raised at the caller's line, or no 'llmretry: ': %s", e)
  end
  for _, n in ipairs(needles) do
    check(e:find(n, 1, true), "message does not name %q: %s", n, e)
  end
  H.check_no_secrets(SECRETS, e)
  return e
end

local function cyclic()
  local t = { model = "m" }
  t.messages = { { role = "user", content = "SECRET-PROMPT-cycle", again = t } }
  return t
end

local function nested(depth)
  local t = { model = "m" }
  local cur = t
  for _ = 1, depth do
    cur.x = {}
    cur = cur.x
  end
  return t
end

-- A chat body with `content` as the user's message (plus `extra` fields).
local function body_with(content, extra)
  local b = { model = "gpt-test", messages = { { role = "user", content = content } } }
  for k, v in pairs(extra or {}) do b[k] = v end
  return b
end

-- Bodies no JSON can hold: {case, needles}. Each names "body" and the path.
local UNSERIALISABLE = {
  { "a function", body_with(print), { "body.messages[1].content", "function" } },
  { "userdata", body_with(io.stdout), { "body.messages[1].content", "userdata" } },
  { "a coroutine", body_with(coroutine.create(print)), { "body.messages[1].content", "thread" } },
  { "a cycle", cyclic(), { "body.messages[1].again", "cycle" } },
  { "nesting past 100 levels", nested(150), { "body.x.x", "nested too deeply" } },
  { "NaN", body_with("SECRET-PROMPT", { temperature = NAN }), { "body.temperature", "NaN" } },
  { "inf", body_with("SECRET-PROMPT", { temperature = INF }), { "body.temperature", "inf" } },
  { "-inf", body_with("SECRET-PROMPT", { temperature = -INF }), { "body.temperature", "inf" } },
  { "an inf key", body_with("SECRET-PROMPT", { logit_bias = { [INF] = 1 } }),
    { "body.logit_bias", "key", "inf" } },
  { "a boolean key", body_with("SECRET-PROMPT", { [true] = 1 }), { "body", "key", "boolean" } },
  { "a table key", body_with("SECRET-PROMPT", { [{}] = 1 }), { "body", "key", "table" } },
  { "mixed keys (an array with a field)",
    { model = "m", messages = { { role = "user", content = "SECRET-PROMPT" }, n = 1 } },
    { "body.messages", "mixes number and string keys" } },
  { "mixed keys (a name written twice)", { model = "m", logit_bias = { [1] = 1, ["1"] = 2 } },
    { "body.logit_bias", "mixes" } },
  -- Invalid UTF-8: a stray continuation byte, Latin-1, an overlong "/", a
  -- UTF-16 surrogate, a code point past U+10FFFF, a truncated sequence.
  { "a stray continuation byte", body_with("SECRET-PROMPT \128"),
    { "body.messages[1].content", "not valid UTF-8", "byte 14" } },
  { "Latin-1 text", body_with("SECRET-PROMPT caf\233"), { "body.messages[1].content", "UTF-8" } },
  { "an overlong encoding", body_with("\192\175SECRET-PROMPT"), { "UTF-8", "byte 0" } },
  { "a surrogate", body_with("SECRET-PROMPT\237\160\128"), { "UTF-8" } },
  { "a code point past U+10FFFF", body_with("\244\144\128\128SECRET-PROMPT"), { "UTF-8" } },
  { "a truncated sequence", body_with("SECRET-PROMPT\226\130"), { "UTF-8" } },
  { "a key that is not UTF-8", body_with("SECRET-PROMPT", { ["caf\233"] = 1 }),
    { "body", "key that is not valid UTF-8" } },
}

describe("bad input", function()
  local mock, scen

  setup(function()
    mock = H.start_mock()
    scen = mock:scen("bad_input")
  end)
  teardown(function() if mock then mock:stop() end end)

  local function opts(extra)
    return H.merge({ body = H.secret_body("bad"), base_url = scen.url, api_key = H.SECRET_KEY },
      extra)
  end

  -- call_llm options beyond args_spec.lua's table ------------------------------

  local bad_options = {
    { "ca_file", { ca_file = 5 } },
    { "ca_file", { ca_file = "" } },
    { "ca_file", { ca_file = "/tmp/ca\0.pem" } },
    { "timeout_ms", { timeout_ms = true } },
    { "timeout_ms", { timeout_ms = -5 } },
    { "timeout_ms", { timeout_ms = NAN } },
    { "timeout_ms", { timeout_ms = INF } },
    { "timeout_ms", { timeout_ms = 1e300 } },
    { "max_retries", { max_retries = 1.5 } },
    { "max_retries", { max_retries = 101 } },
    { "max_retries", { max_retries = 2 ^ 40 } },
    { "max_retries", { max_retries = true } },
    { "base_delay_ms", { base_delay_ms = "800" } },
    { "max_delay_ms", { max_delay_ms = -1 } },
    { "max_retry_after_ms", { max_retry_after_ms = "soon" } },
    { "max_response_bytes", { max_response_bytes = true } },
    { "max_response_bytes", { max_response_bytes = -1 } },
    { "deadline_ms", { deadline_ms = true } },
    { "deadline_ms", { deadline_ms = NAN } },
    { "jitter", { jitter = "" } },
    { "jitter", { jitter = true } },
    { "retry_mode", { retry_mode = true } },
    { "retry_mode", { retry_mode = "SAFE" } },
    { "retry_statuses", { retry_statuses = {} } },
    { "retry_statuses", { retry_statuses = { 700 } } },
    { "retry_statuses", { retry_statuses = { true } } },
    { "retry_statuses", { retry_statuses = { 429, x = 1 } } },
    { "retry_statuses", { retry_statuses = (function()
      local t = {}
      for i = 1, 65 do t[i] = 500 end
      return t
    end)() } },
    { "retry_invalid_response", { retry_invalid_response = 1 } },
    { "headers", { headers = { ["X-A"] = "a\0b" } } },
    { "headers", { headers = { [""] = "v" } } },
    { "headers", { headers = { ["X-A"] = {} } } },
    { "request_id", { request_id = "" } },
    { "request_id", { request_id = "bad\nid" } },
    { "request_id", { request_id = "caf\195\169" } },
    { "idempotency_key", { idempotency_key = "a\r\nb" } },
    { "idempotency_key", { idempotency_key = 5 } },
    { "api_key", { api_key = H.SECRET_KEY .. "\r\nX-Injected: 1" } },
    { "api_key", { api_key = {} } },
    { "base_url", { base_url = "" } },
    { "base_url", { base_url = "http://127.0.0.1/\r\nv1" } },
    { "url", { url = "" } },
    { "url", { url = "ftp://127.0.0.1/v1" } },
    { "url", { url = "file:///etc/passwd" } },
    { "model", { model = {} } },
    { "policy", { policy = 5 } },
    { "event_mask", { event_mask = 256 } },
    { "event_mask", { event_mask = 1.5 } },
    { "logger", { logger = {} } },
    { "logger", { logger = true } },
    { "validate", { validate = 1 } },
    { "group", { group = 1 } },
    { "option names", { [1] = "x" } },
    { "'timeout_sec'", { timeout_sec = 5, retries = 3 }, "'retries'" },
  }
  for _, case in ipairs(bad_options) do
    local name, extra = case[1], case[2]
    it("call_llm names " .. name .. " (" .. H.dump(extra):sub(1, 40) .. ")", function()
      raises({ name, case[3] }, function() return llm.call_llm(opts(extra)) end)
    end)
  end

  -- Bodies that cannot be serialised, through call_llm, call_many and encode --

  for _, case in ipairs(UNSERIALISABLE) do
    local what, body, needles = case[1], case[2], case[3]
    it("refuses a body with " .. what, function()
      raises(needles, function() return llm.call_llm(opts({ body = body })) end)
      -- call_many names the item.
      local many = { "bodies[2]" }
      for _, n in ipairs(needles) do many[#many + 1] = (n:gsub("^body", "")) end
      raises(many, function()
        return llm.call_many({ H.secret_body("ok"), body }, { base_url = scen.url })
      end)
      -- llm.encode says "value" where call_llm says "body".
      local enc = {}
      for i, n in ipairs(needles) do enc[i] = (n:gsub("^body", "value")) end
      raises(enc, function() return llm.encode(body) end)
    end)
  end

  it("made no request for any of the above", function()
    local n = #scen.requests()
    check(n == 0, "the mock saw %d requests from bad arguments", n)
  end)

  -- call_many -------------------------------------------------------------------

  describe("call_many", function()
    local many_scen
    before_each(function() many_scen = mock:scen("many_bad") end)
    after_each(function()
      -- Checked after each case: a batch must not start, then raise.
      local n = #many_scen.requests()
      check(n == 0, "the mock saw %d requests", n)
    end)

    local B = function() return H.secret_body("many") end
    local cases = {
      { { "bodies", '"a"' }, function() return { a = B() } end },
      { { "bodies", "must be an array" }, function() return { B(), nil, B() } end },
      { { "bodies", "1.5" }, function() return { B(), [1.5] = B() } end },
      { { "bodies[2]", "empty" }, function() return { B(), "" } end },
      { { "bodies[1]", "boolean" }, function() return { true } end },
    }
    for i, case in ipairs(cases) do
      it("names the bad item (" .. i .. ")", function()
        raises(case[1], function() return llm.call_many(case[2](), { base_url = many_scen.url }) end)
      end)
    end

    local bad_opts = {
      { "call_deadline_ms", { call_deadline_ms = -1 } },
      { "call_deadline_ms", { call_deadline_ms = "5" } },
      { "deadline_ms", { deadline_ms = -1 } },
      { "adaptive", { adaptive = 1 } },
      { "limit", { limit = 1.5 } },
      { "limit", { limit = "2" } },
      { "limit", { limit = INF } },
      { "group", { group = {} } },
      { "body", { body = "{}" } },
      { "validate", { validate = true } },
      -- Options checked by the engine, now before the first call:
      { "jitter", { jitter = "wobbly" } },
      { "max_retries", { max_retries = -1 } },
      { "api_key", { api_key = "sk-test-SECRET\n" } },
      { "headers", { headers = { ["Bad Name"] = "v" } } },
      { "tiemout_ms", { tiemout_ms = 5 } },
    }
    for _, case in ipairs(bad_opts) do
      local name, extra = case[1], case[2]
      it("names " .. name .. " (" .. H.dump(extra):sub(1, 40) .. ")", function()
        raises({ name }, function()
          return llm.call_many({ B(), B() }, H.merge({ base_url = many_scen.url }, extra))
        end)
      end)
    end

    it("takes table.pack's n", function()
      local outs = llm.call_many(table.pack(B(), B()), { base_url = many_scen.url,
        max_retries = 0 })
      check(outs.n == 2 and not llm.is_error(outs[1]) and not llm.is_error(outs[2]),
        "outs %s", H.dump(outs))
      -- Those two requests were meant: clear them for after_each.
      mock:http("DELETE", "/_mock/requests/" .. many_scen.name)
    end)
  end)

  -- map_with_concurrency, client, load_policies, helpers, engines --------------

  it("map_with_concurrency names items, limit and worker; the worker never runs", function()
    local ran = 0
    local w = function() ran = ran + 1 end
    raises({ "items", '"a"' }, function() return llm.map_with_concurrency({ a = 1 }, 2, w) end)
    raises({ "items", "must be an array" }, function()
      return llm.map_with_concurrency({ 1, nil, 3 }, 2, w)
    end)
    raises({ "limit" }, function() return llm.map_with_concurrency({ 1 }, INF, w) end)
    raises({ "limit" }, function() return llm.map_with_concurrency({ 1 }, NAN, w) end)
    raises({ "limit" }, function() return llm.map_with_concurrency({ 1 }, true, w) end)
    raises({ "worker" }, function() return llm.map_with_concurrency({ 1 }, 2, {}) end)
    raises({ "opts.logger" }, function()
      return llm.map_with_concurrency({ 1 }, 2, w, { logger = "print" })
    end)
    check(ran == 0, "the worker ran %d times", ran)
    -- table.pack's n is not an item.
    local res = llm.map_with_concurrency(table.pack(1, 2), 2, function(x) return x * 10 end)
    check(res.n == 2 and res[1] == 10 and res[2] == 20, "results %s", H.dump(res))
  end)

  it("client{} checks its defaults when it is made, naming them", function()
    local cases = {
      { { "tiemout_ms" }, { tiemout_ms = 5 } },
      { { "timeout_ms" }, { timeout_ms = -1 } },
      { { "timeout_ms" }, { timeout_ms = "5" } },
      { { "jitter" }, { jitter = "sometimes" } },
      { { "retry_statuses" }, { retry_statuses = { 99 } } },
      { { "headers" }, { headers = { ["Bad Name"] = "v" } } },
      { { "api_key" }, { api_key = H.SECRET_KEY .. "\n" } },
      { { "request_id" }, { request_id = "a\nb" } },
      { { "ca_file" }, { ca_file = 5 } },
      { { "logger" }, { logger = 5 } },
      { { "validate" }, { validate = "yes" } },
      { { "engine" }, { engine = {} } },
      { { "policies" }, { policies = 5 } },
      { { "'fast'" }, { policies = { slow = {} }, policy = "fast" } },
      { { "opts" }, "defaults" },
    }
    for _, case in ipairs(cases) do
      raises(case[1], function() return llm.client(case[2]) end)
    end
  end)

  it("client methods name their arguments", function()
    local c = llm.client({ base_url = scen.url, api_key = H.SECRET_KEY })
    raises({ "colon" }, function() return c.call_llm({ body = H.secret_body("c") }) end)
    raises({ "colon" }, function() return c.call_many({ H.secret_body("c") }) end)
    raises({ "colon" }, function() return c.map_with_concurrency({ 1 }, 1, print) end)
    raises({ "opts" }, function() return c:call_llm("body") end)
    raises({ "jitter" }, function() return c:call_llm({ body = H.secret_body("c"), jitter = 1 }) end)
    raises({ "policy" }, function() return c:call_llm({ body = H.secret_body("c"), policy = 5 }) end)
    raises({ "bodies" }, function() return c:call_many(5) end)
    raises({ "bodies[1]" }, function() return c:call_many({ body_with(print) }) end)
    raises({ "limit" }, function() return c:map_with_concurrency({ 1 }, 0, print) end)
    check(#scen.requests() == 0, "the mock saw a request")
  end)

  it("load_policies names the source, the policy and the key", function()
    raises({ "policies", "nil" }, function() return llm.load_policies(nil) end)
    raises({ "policies", "boolean" }, function() return llm.load_policies(true) end)
    raises({ "/nonexistent/p.json", "cannot read" }, function()
      return llm.load_policies("/nonexistent/p.json")
    end)
    local bad = os.tmpname()
    finally(function() os.remove(bad) end)
    H.write_file(bad, '{"fast": {"timeout_ms": 5')
    raises({ bad, "not valid JSON" }, function() return llm.load_policies(bad) end)
    raises({ "policies must be a table of policies by name (got array)" }, function()
      return llm.load_policies({ { timeout_ms = 5 } })
    end)
    raises({ "fast", "model" }, function() return llm.load_policies({ fast = { model = 5 } }) end)
  end)

  it("the JSON helpers and log_usage name their arguments", function()
    raises({ "text", "nil" }, function() return llm.decode(nil) end)
    raises({ "text", "table" }, function() return llm.extract_json({}) end)
    raises({ "encode needs a value" }, function() return llm.encode() end)
    raises({ "shape" }, function() return llm.assert_shape({}) end)
    raises({ "value.x", "function" }, function() return llm.assert_shape({ x = print }, {}) end)
    raises({ "shape.x", "UTF-8" }, function()
      return llm.assert_shape({ x = 1 }, { x = "\255" })
    end)
    -- A shape that is not one is about the data: the core's message, as is.
    raises({ "invalid shape at root" }, function() return llm.assert_shape({ x = 1 }, 5) end,
      { raw = true })
    raises({ "meta" }, function() return llm.log_usage("meta") end)
    raises({ "label", "table" }, function() return llm.log_usage({}, {}) end)
    -- Printed as JSON, the label must be UTF-8; the message names it.
    local out = H.capture_stdout(function()
      raises({ "label", "UTF-8" }, function() return llm.log_usage({}, "caf\233") end)
    end)
    check(out == "", "log_usage printed %q before raising", out)
  end)

  it("engines, groups and handles name their arguments", function()
    local e = llm.new_engine()
    finally(function() e:close() end)
    raises({ "max_in_flight" }, function() return llm.new_engine(1.5) end)
    raises({ "max_in_flight" }, function() return llm.new_engine(INF) end)
    raises({ "opts" }, function() return e:group(5) end)
    raises({ "limit" }, function() return e:group({ limit = 0 }) end)
    raises({ "deadline_ms" }, function() return e:group({ deadline_ms = -1 }) end)
    raises({ "adaptive" }, function() return e:group({ adaptive = 1 }) end)
    raises({ "'bogus'" }, function() return e:group({ bogus = 1 }) end)
    raises({ "max" }, function() return e:channel():poll("x") end)
    local g = e:group({ limit = 1 })
    raises({ "self", "group" }, function() return g.channel(nil) end)
    raises({ "timeout_ms" }, function() return g:channel():wait("x") end)
    g:close()
    raises({ "group is closed" }, function() return g:channel() end)
    raises({ "group is closed" }, function()
      return e:submit({ body = "{}", base_url = scen.url, group = g })
    end)
    -- A call that will not finish soon: the mock delays it.
    local slow = mock:scen("slow_handle")
    slow.script({ { delay_ms = 3000 } })
    local h = e:submit({ body = "{}", base_url = slow.url, max_retries = 0, event_mask = 0 })
    raises({ "not finished" }, function() return h:result() end)
    raises({ "ok", "boolean" }, function() return h:validated("yes") end)
    raises({ "message" }, function() return h:validated(true, 5) end)
    raises({ "no validation is pending" }, function() return h:validated(true) end)
    raises({ "self", "handle" }, function() return h.next(nil) end)
    raises({ "timeout_ms" }, function() return h:wait("x") end)
    h:cancel()
    check(h:wait(5000), "the cancelled call did not end")
    local res, err = h:result()
    check(res == nil and err.kind == "cancelled", "after cancel: %s", tostring(err))
    e:close()
    raises({ "engine is closed" }, function() return e:channel() end)
    raises({ "engine is closed" }, function() return e:group({}) end)
  end)

  it("made no request from the helpers either", function()
    local n = #scen.requests()
    check(n == 0, "the mock saw %d requests from bad arguments", n)
  end)
end)

-- ---------------------------------------------------------------------------

describe("bodies that can be sent", function()
  local mock

  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  it("a 20 MB message goes out whole, as valid JSON", function()
    local scen = mock:scen("huge_request")
    local content = "SECRET-PROMPT-huge " .. string.rep("x", 20 * 1024 * 1024)
    local body = body_with(content)
    local out = H.run_call(scen, nil, { body = body, timeout_ms = 30000, max_retries = 0,
      logger = false })
    check(out.ok, "a 20 MB body failed: %s", tostring(out.err))
    local recs = scen.requests()
    check(#recs == 1, "the mock saw %d requests", #recs)
    local sent = H.json.decode(recs[1].body)
    check(type(sent) == "table" and sent.messages[1].content == content,
      "the body arrived changed (%d bytes)", #recs[1].body)
    check(tonumber(recs[1].headers["content-length"]) == #llm.encode(body), "content-length %s",
      tostring(recs[1].headers["content-length"]))
  end)

  it("a 20 MB JSON string body goes out whole; an empty one is refused", function()
    local scen = mock:scen("huge_string")
    local text = llm.encode(body_with(string.rep("y", 20 * 1024 * 1024)))
    local out = H.run_call(scen, nil, { body = text, timeout_ms = 30000, max_retries = 0 })
    check(out.ok, "a 20 MB string body failed: %s", tostring(out.err))
    local recs = scen.requests()
    check(#recs == 1 and recs[1].body == text, "the body arrived changed")
    check(not pcall(llm.call_llm, { body = "", base_url = scen.url }), "an empty body was sent")
  end)

  it("valid UTF-8 of every length, and number keys, go out as they are", function()
    local scen = mock:scen("utf8_ok")
    -- 1 to 4 bytes, the largest code point, U+FFFD itself, a NUL.
    local content = "a \195\169 \226\130\172 \240\159\152\128 \244\143\191\191 \239\191\189 \0 end"
    local body = body_with(content, { logit_bias = { [50256] = -100, [15] = 5 } })
    local out = H.run_call(scen, nil, { body = body })
    check(out.ok, "%s", tostring(out.err))
    local sent = H.json.decode(scen.requests()[1].body)
    check(sent.messages[1].content == content, "content arrived as %q", sent.messages[1].content)
    check(sent.logit_bias["50256"] == -100 and sent.logit_bias["15"] == 5, "logit_bias %s",
      H.dump(sent.logit_bias))
  end)

  it("a string body is sent byte for byte, even when it is not UTF-8", function()
    local scen = mock:scen("raw_string")
    local text = '{"model": "gpt-test", "messages": [{"role": "user", "content": "caf\233"}]}'
    local out = H.run_call(scen, nil, { body = text })
    check(out.ok, "%s", tostring(out.err))
    local rec = scen.requests()[1]
    -- The mock shows the stray byte as U+FFFD; the length shows it went as 1 byte.
    check(tonumber(rec.headers["content-length"]) == #text, "content-length %s for %d bytes",
      tostring(rec.headers["content-length"]), #text)
    check(rec.body:find("caf\239\191\189", 1, true), "body %q", rec.body)
  end)
end)

describe("invalid UTF-8 from a server", function()
  local function serve(status, body)
    local srv = H.start_recorder({ status = status, body = body })
    finally(function() srv:stop() end)
    return srv
  end

  -- Every string in v (keys too) is valid UTF-8: llm.encode takes it.
  local function encodable(v, what)
    local ok, e = pcall(llm.encode, v)
    check(ok, "%s cannot be encoded back: %s", what, tostring(e))
  end

  -- The body of a 2xx must be UTF-8 JSON (the core decides, for every host:
  -- issue 13 item 10): anything else is an invalid response, retried, and
  -- no event says it succeeded.
  it("in a 2xx body is an invalid response, retried, never a success", function()
    local raw = '{"id": "x", "object": "chat.completion", "model": "m\255", '
      .. '"choices": [{"index": 0, "message": '
      .. '{"role": "assistant", "content": "caf\233 \192\175"}, "finish_reason": "stop"}]}'
    local srv = serve(200, raw)
    local out = H.run_call({ name = "utf8", url = srv.base_url }, nil, { max_retries = 1 })
    check(not out.ok, "a body that is not UTF-8 was a success")
    H.check_error(out.err, "invalid_response", { reason = "retries_exhausted", attempts = 2,
      status = 200 })
    check(#out.events.of("llm_request_succeeded") == 0, "an event says it succeeded")
    check(#out.events.of("llm_request_error") == 2, "%d error events",
      #out.events.of("llm_request_error"))
    for _, ev in ipairs(out.events.events) do encodable(ev, ev.event) end
  end)

  it("reaches err and failure events as U+FFFD", function()
    local raw = '{"error": {"message": "bad \255 input", "type": "x", "code": "c\255d"}}'
    local srv = serve(400, raw)
    local out = H.run_call({ name = "utf8err", url = srv.base_url }, nil, {})
    H.check_error(out.err, "http_status", { reason = "not_retryable", attempts = 1, status = 400 })
    -- A code that is not a token ([A-Za-z0-9_.:-]) is replaced (issue 27);
    -- the message shows the byte escaped.
    check(out.err.error_code == "invalid_code", "error_code %q", tostring(out.err.error_code))
    check(tostring(out.err):find('"bad \\xff input"', 1, true), "%s", tostring(out.err))
    check(out.err.body_preview:find("bad \239\191\189 input", 1, true), "body_preview %q",
      tostring(out.err.body_preview))
    local failed = out.events.of("llm_request_failed")[1]
    check(failed.body_preview == out.err.body_preview and failed.error_code == out.err.error_code,
      "event %s", H.dump(failed))
    local copy = {}
    for k, v in pairs(out.err) do copy[k] = v end
    encodable(copy, "err")
  end)

  it("llm.decode and extract_json replace it too", function()
    check(llm.decode('"a\255b"') == "a\239\191\189b", "decode %q", llm.decode('"a\255b"'))
    local v = llm.extract_json('Here: {"k": "\192\175"} done')
    check(v and v.k == "\239\191\189\239\191\189", "extract_json %s", H.dump(v))
    -- Valid text is untouched.
    check(llm.decode('"\240\159\152\128"') == "\240\159\152\128", "emoji")
  end)
end)
