-- Wrong arguments are programming errors: error() naming the argument, at
-- once, before any I/O (the mock records nothing), pointing at the caller.

local H = require("helpers")
local llm = require("llmretry")
local check = H.check

local THIS_FILE = "args_spec.lua"

-- f(...) must raise a string starting "llmretry:" that contains every needle.
local function raises(needles, f, ...)
  local ok, e = pcall(f, ...)
  check(not ok, "no error (expected one naming %s)", needles[1])
  check(type(e) == "string", "raised a %s, not a message: %s", type(e), H.dump(e))
  check(e:find("llmretry: ", 1, true), "message lacks 'llmretry: ': %s", e)
  for _, n in ipairs(needles) do
    check(e:find(n, 1, true), "message does not name %q: %s", n, e)
  end
  return e
end

describe("bad arguments", function()
  local mock, scen

  setup(function()
    mock = H.start_mock()
    scen = mock:scen("args")
  end)
  teardown(function() if mock then mock:stop() end end)

  local function opts(extra)
    return H.merge({ body = H.secret_body("args"), base_url = scen.url, api_key = H.SECRET_KEY },
      extra)
  end

  local bad_call_options = {
    { "body", { body = false } },
    { "body", { body = 42 } },
    { "body", { body = "" } },
    { "body", { body = { model = "m", messages = { { content = function() end } } } } },
    { "body", { body = { model = "m", f = io.stdout } } },
    { "timeout_ms", { timeout_ms = "5000" } },
    { "timeout_ms", { timeout_ms = 1.5 } },
    { "timeout_ms", { timeout_ms = 0 } },
    { "max_retries", { max_retries = -1 } },
    { "max_retries", { max_retries = "3" } },
    { "base_delay_ms", { base_delay_ms = -1 } },
    { "max_delay_ms", { max_delay_ms = true } },
    { "jitter", { jitter = "sometimes" } },
    { "jitter", { jitter = 1 } },
    { "deadline_ms", { deadline_ms = -5 } },
    { "deadline_ms", { deadline_ms = "soon" } },
    { "retry_mode", { retry_mode = "yolo" } },
    { "retry_statuses", { retry_statuses = "429" } },
    { "retry_statuses", { retry_statuses = { "x" } } },
    { "retry_statuses", { retry_statuses = { 429, 99 } } },
    { "max_retry_after_ms", { max_retry_after_ms = -1 } },
    { "retry_invalid_response", { retry_invalid_response = "yes" } },
    { "max_response_bytes", { max_response_bytes = 0 } },
    { "headers", { headers = "X-A: 1" } },
    { "headers", { headers = { ["X-A"] = true } } },
    { "headers", { headers = { ["Bad Name"] = "v" } } },
    { "headers", { headers = { [1] = "v" } } },
    { "headers", { headers = { ["X-A"] = "line\r\nInjected: 1" } } },
    { "request_id", { request_id = 5 } },
    { "idempotency_key", { idempotency_key = {} } },
    { "api_key", { api_key = 5 } },
    { "base_url", { base_url = 5 } },
    { "url", { url = false } },
    { "model", { model = 7 } },
    { "event_mask", { event_mask = -1 } },
    { "timeout", { timeout = 5000 } },  -- a typo of timeout_ms
    { "logger", { logger = "print" } },
    { "validate", { validate = "strict" } },
    { "engine", { engine = {} } },
    { "engine", { engine = io.stdout } },
  }

  for _, case in ipairs(bad_call_options) do
    local name, extra = case[1], case[2]
    it("call_llm names " .. name .. " (" .. H.dump(extra):sub(1, 50) .. ")", function()
      local e = raises({ name }, llm.call_llm, opts(extra))
      H.check_no_secrets({ H.SECRET_KEY, "SECRET-PROMPT-args" }, e)
    end)
  end

  it("call_llm needs an options table", function()
    raises({ "opts", "nil" }, llm.call_llm)
    raises({ "opts", "string" }, llm.call_llm, "hello")
  end)

  it("call_llm's errors point at the caller", function()
    -- Called from a Lua function (pcall itself has no position to give).
    for _, extra in ipairs({ { timeout_ms = "x" }, { logger = 1 }, { body = 1 } }) do
      local e = raises({ "llmretry:" }, function()
        local r = llm.call_llm(opts(extra))
        return r
      end)
      check(e:find(THIS_FILE .. ":%d+: llmretry: "), "no position of the caller in %q", e)
    end
    local e = raises({ "limit" }, function()
      local r = llm.map_with_concurrency({}, 0, print)
      return r
    end)
    check(e:find(THIS_FILE .. ":%d+: llmretry: "), "no position of the caller in %q", e)
  end)

  it("map_with_concurrency names its arguments", function()
    local w = function() end
    raises({ "items" }, llm.map_with_concurrency, nil, 2, w)
    raises({ "items" }, llm.map_with_concurrency, "abc", 2, w)
    raises({ "limit" }, llm.map_with_concurrency, { 1 }, 0, w)
    raises({ "limit" }, llm.map_with_concurrency, { 1 }, 1.5, w)
    raises({ "limit" }, llm.map_with_concurrency, { 1 }, "2", w)
    raises({ "limit" }, llm.map_with_concurrency, { 1 }, nil, w)
    raises({ "worker" }, llm.map_with_concurrency, { 1 }, 2, nil)
    raises({ "worker" }, llm.map_with_concurrency, { 1 }, 2, "f")
    raises({ "opts" }, llm.map_with_concurrency, { 1 }, 2, w, 5)
    raises({ "return_errors" }, llm.map_with_concurrency, { 1 }, 2, w, { return_errors = 1 })
    raises({ "logger" }, llm.map_with_concurrency, { 1 }, 2, w, { logger = 1 })
    raises({ "engine" }, llm.map_with_concurrency, { 1 }, 2, w, { engine = 1 })
    raises({ "engine" }, llm.map_with_concurrency, { 1 }, 2, w, { engine = io.stdout })
    raises({ "limt" }, llm.map_with_concurrency, { 1 }, 2, w, { limt = 3 })
  end)

  it("call_many names its arguments", function()
    raises({ "bodies" }, llm.call_many, nil, {})
    raises({ "bodies[2]" }, llm.call_many, { H.secret_body("a"), 5 }, { base_url = scen.url })
    raises({ "bodies[1]" }, llm.call_many, { { f = function() end } }, { base_url = scen.url })
    raises({ "opts" }, llm.call_many, {}, "x")
    raises({ "limit" }, llm.call_many, { H.secret_body("a") }, { limit = 0, base_url = scen.url })
    raises({ "timeout_ms" }, llm.call_many, { H.secret_body("a") },
      { timeout_ms = -1, base_url = scen.url })
    raises({ "logger" }, llm.call_many, { H.secret_body("a") }, { logger = 1, base_url = scen.url })
    raises({ "bogus" }, llm.call_many, { H.secret_body("a") }, { bogus = 1, base_url = scen.url })
  end)

  it("the helpers name their arguments", function()
    raises({ "meta" }, llm.log_usage, nil)
    raises({ "label" }, llm.log_usage, { attempt = 0 }, 5)
    raises({ "logger" }, llm.log_usage, { attempt = 0 }, "x", 5)
    raises({ "text" }, llm.extract_json, 5)
    raises({ "path" }, llm.assert_shape, {}, {}, 5)
    raises({ "max_in_flight" }, llm.new_engine, "many")
    raises({ "max_in_flight" }, llm.new_engine, 0)
    local e = llm.new_engine()
    raises({ "opts" }, e.submit, e, nil)
    local ch = e:channel()
    raises({ "timeout_ms" }, ch.wait, ch, "x")
    raises({ "max" }, ch.poll, ch, 0)
    raises({ "self" }, e.submit, nil, {})
    e:close()
    raises({ "engine is closed" }, e.submit, e, { body = "{}" })
  end)

  it("made no request at all", function()
    local recs = scen.requests()
    check(#recs == 0, "the server saw %d requests from bad arguments", #recs)
  end)
end)

describe("argument errors never echo a value that may be a secret", function()
  it("jitter and retry_mode", function()
    for _, name in ipairs({ "jitter", "retry_mode" }) do
      local ok, err = pcall(llm.call_llm, { body = "{}", [name] = H.SECRET_KEY })
      check(not ok and tostring(err):find(name, 1, true), "%s: %s", name, tostring(err))
      check(not tostring(err):find(H.SECRET_KEY, 1, true), "%s error echoes the value: %s",
        name, tostring(err))
    end
  end)
end)

-- llmretry.api hands a call's options for the core (split_call_options's
-- sub) back once submitted, and the next call fills the same table: nothing
-- of one call's options may reach the next (issue 36).
describe("the options table a call hands back", function()
  local args = require("llmretry.args")
  local HOST_KEYS = { logger = true, validate = true, engine = true }

  it("is filled afresh: none of the last call's options is left in it", function()
    local first = args.split_call_options({ url = "http://a.test/v1", model = "leak",
      timeout_ms = 5, idempotency_key = "k" }, 1, HOST_KEYS)
    args.release_sub(first)
    local second = args.split_call_options({ url = "http://b.test/v1" }, 1, HOST_KEYS)
    check(second == first, "the table handed back was not reused")
    check(second.model == nil and second.timeout_ms == nil and second.idempotency_key == nil,
      "the last call's options are left in it: %s", H.dump(second))
    check(second.url == "http://b.test/v1" and second.event_mask == 0,
      "not this call's options: %s", H.dump(second))
  end)

  it("is never the options of two calls at once", function()
    local a = args.split_call_options({ url = "http://a.test/v1" }, 1, HOST_KEYS)
    local b = args.split_call_options({ url = "http://b.test/v1" }, 1, HOST_KEYS)
    check(a ~= b and a.url == "http://a.test/v1", "two calls share one table: %s", H.dump(a))
  end)

  it("carries nothing from one call_llm to the next", function()
    local mock = H.start_mock()
    local scen = mock:scen("handed_back")
    local ok, err = pcall(function()
      local first = assert(llm.call_llm{ body = H.secret_body("handed_back", "body-model"),
        base_url = scen.url, api_key = H.SECRET_KEY, model = "first-call-model" })
      check(first.meta.model == "first-call-model", "first: meta.model %s",
        tostring(first.meta.model))
      local second = assert(llm.call_llm{ body = H.secret_body("handed_back", "body-model"),
        base_url = scen.url, api_key = H.SECRET_KEY })
      check(second.meta.model == "body-model",
        "the second call's model is %s: the first call's option reached it",
        tostring(second.meta.model))
    end)
    mock:stop()
    assert(ok, err)
  end)
end)
