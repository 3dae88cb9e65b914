-- JSON both ways (lua-cjson conventions), extract_json, assert_shape,
-- log_usage, the module's surface, and no global variables.

local H = require("helpers")
local llm = require("llmretry")
local check = H.check
local json = H.json

describe("module surface", function()
  it("exports the documented names", function()
    for _, name in ipairs({ "call_llm", "map_with_concurrency", "call_many", "extract_json",
      "assert_shape", "log_usage", "new_engine", "encode", "decode", "is_error" }) do
      check(type(llm[name]) == "function", "llm.%s is a %s", name, type(llm[name]))
    end
    check(type(llm.VERSION) == "string" and llm.VERSION:match("^%d+%.%d+%.%d+"), "VERSION %s",
      tostring(llm.VERSION))
    check(type(llm.null) == "userdata", "null is a %s", type(llm.null))
    check(type(llm.array_mt) == "table", "array_mt")
    check(llm.empty_array ~= nil, "empty_array")
    check(type(llm.error_mt) == "table" and type(llm.error_mt.__tostring) == "function", "error_mt")
    local kinds = {}
    for _, v in pairs(llm.errors) do kinds[v] = true end
    for k in pairs(H.KINDS) do check(kinds[k], "llm.errors lacks %s", k) end
    check(#llm.EVENT_NAMES == 8, "EVENT_NAMES")
    for _, n in ipairs(llm.EVENT_NAMES) do check(H.EVENT_FIELDS[n], "event name %s", n) end
  end)

  it("matches lua-cjson's null when lua-cjson is installed", function()
    local ok, cjson = pcall(require, "cjson")
    if ok then check(cjson.null == llm.null, "llm.null differs from cjson.null") end
  end)

  it("builds error tables Lua code can make and recognise", function()
    local e = setmetatable({ kind = "timeout", reason = "deadline", message = "m",
      request_id = "r1" }, llm.error_mt)
    check(llm.is_error(e), "is_error")
    check(tostring(e) == "llmretry: timeout (deadline): m [request_id=r1]", "tostring %s",
      tostring(e))
    check(not llm.is_error({ kind = "timeout" }), "a plain table is not an error")
    check(not llm.is_error("timeout"), "a string is not an error")
  end)

  it("sets no global variable", function()
    -- Load a fresh copy of init.lua whose global environment refuses writes:
    -- every function it defines sees that environment, so a global assigned
    -- at load or at any later call raises.
    local path = assert(package.searchpath("llmretry", package.path))
    local writes = {}
    local env = setmetatable({}, {
      __index = _G,
      __newindex = function(_, k) writes[#writes + 1] = tostring(k); error("global " .. k, 2) end,
    })
    local chunk
    if setfenv then
      chunk = assert(loadfile(path))
      setfenv(chunk, env)
    else
      chunk = assert(loadfile(path, "t", env))
    end
    local fresh = chunk("llmretry")
    fresh.decode(fresh.encode({ a = { 1, 2 } }))
    fresh.extract_json('x {"a": 1} y')
    fresh.assert_shape({ a = "b" }, { a = "string" })
    fresh.map_with_concurrency({ 1, 2 }, 2, function(x) coroutine.yield() return x end)
    pcall(fresh.map_with_concurrency, { 1 }, 1, function() error("x") end)
    fresh.map_with_concurrency({ 1 }, 1, function() error("x") end, { return_errors = true })
    fresh.log_usage({ attempt = 0 }, "l", function() end)
    fresh.call_many({}, {})
    pcall(fresh.call_llm, { body = "{}", timeout_ms = -1 })
    pcall(fresh.call_many, { "{}" }, { timeout_ms = -1 })
    local port = H.closed_port()
    local res, err = fresh.call_llm({ body = "{}", base_url = "http://127.0.0.1:" .. port,
      max_retries = 0, logger = function() end, validate = function() return true end })
    check(res == nil and err.kind == "network", "call %s", tostring(err))
    check(#writes == 0, "global variables written: %s", table.concat(writes, ", "))
  end)
end)

describe("encode and decode", function()
  it("write arrays, objects, null, empty arrays and numbers", function()
    local t = llm.decode(llm.encode({ list = { 1, 2, 3 }, obj = { a = "b" }, none = llm.null,
      empty_obj = {}, empty_arr = setmetatable({}, llm.array_mt), sentinel = llm.empty_array,
      f = 0.25, yes = true, no = false }))
    check(H.list_eq(t.list, { 1, 2, 3 }), "list %s", H.dump(t.list))
    check(t.obj.a == "b", "obj")
    check(t.none == llm.null, "none %s", H.dump(t.none))
    check(next(t.empty_obj) == nil and getmetatable(t.empty_obj) ~= llm.array_mt, "empty_obj")
    check(next(t.empty_arr) == nil and getmetatable(t.empty_arr) == llm.array_mt, "empty_arr")
    check(next(t.sentinel) == nil and getmetatable(t.sentinel) == llm.array_mt, "sentinel")
    check(t.f == 0.25 and t.yes == true and t.no == false, "scalars %s", H.dump(t))
    check(llm.encode({}) == "{}", "empty table: %s", llm.encode({}))
    check(llm.encode(setmetatable({}, llm.array_mt)) == "[]", "array_mt")
    check(llm.encode(llm.empty_array) == "[]", "empty_array")
    check(llm.encode({ 1, 2 }) == "[1,2]", "array %s", llm.encode({ 1, 2 }))
    check(llm.encode("caf\195\169") == '"caf\195\169"', "UTF-8 kept: %s", llm.encode("caf\195\169"))
    check(llm.encode(3) == "3", "integer %s", llm.encode(3))
  end)

  it("encodes a table met twice (not a cycle) each time, and refuses a cycle at any depth", function()
    local shared = { 1, { x = "y" } }
    local text = llm.encode({ a = shared, b = { shared, shared } })
    local back = llm.decode(text)
    check(back.a[2].x == "y" and back.b[1][1] == 1 and back.b[2][2].x == "y", "shared %s", text)
    -- After an encode that raised, the next one starts clean (no table left
    -- marked as open).
    local deep = { l1 = { l2 = { l3 = {} } } }
    deep.l1.l2.l3.back = deep.l1
    local ok, err = pcall(llm.encode, deep)
    check(not ok and tostring(err):find("value.l1.l2.l3.back contains a cycle", 1, true),
      "cycle: %s", tostring(err))
    deep.l1.l2.l3.back = nil
    check(llm.encode(deep) == '{"l1":{"l2":{"l3":{}}}}', "after: %s", llm.encode(deep))
  end)

  it("decodes arrays with array_mt, so they round-trip", function()
    local v = llm.decode('{"a": [], "b": [1, {"c": null}], "d": {}}')
    check(getmetatable(v.a) == llm.array_mt and getmetatable(v.b) == llm.array_mt, "array_mt")
    check(llm.encode(v.a) == "[]" and llm.encode(v.d) == "{}", "round trip")
    check(v.b[2].c == llm.null, "null")
  end)

  it("decodes integers as integers on 5.4", function()
    local v = llm.decode('{"n": 42, "big": 9007199254740992, "f": 1.5}')
    check(v.n == 42 and v.f == 1.5 and v.big == 9007199254740992, "values %s", H.dump(v))
    if H.IS_54 then
      check(math.type(v.n) == "integer" and math.type(v.big) == "integer", "integer types")
      check(math.type(v.f) == "float", "float type")
    end
  end)

  it("refuses what JSON cannot hold, naming the path", function()
    local e = H.raises(llm.encode, { messages = { { content = function() end } } })
    check(e:find("messages", 1, true) and e:find("function", 1, true), "message %s", e)
    local cyc = {}
    cyc.self = cyc
    H.raises(llm.encode, cyc)
    H.raises(llm.encode, { x = 0 / 0 })
    H.raises(llm.encode, { x = math.huge })
  end)

  it("returns nil and a message for text that is not JSON", function()
    local v, err = llm.decode("{not json")
    check(v == nil and type(err) == "string" and #err > 0, "decode %s %s", H.dump(v), H.dump(err))
  end)
end)

describe("extract_json", function()
  local cases = {
    { "fenced", 'Here you go:\n```json\n{"a": 1}\n```\nThanks!', { a = 1 } },
    { "fence_no_tag", "```\n[1, 2, 3]\n```", { 1, 2, 3 } },
    { "bare", '{"a": [1, 2, {"b": 3}]}', { a = { 1, 2, { b = 3 } } } },
    { "prose", 'Sure! Here is the JSON: {"a": 1}. Let me know.', { a = 1 } },
    { "unicode", "\231\187\147\230\158\156: {\"n\": \"\229\188\160\"} ok",
      { n = "\229\188\160" } },
    { "braces_in_strings", 'Result: {"msg": "use } and { freely", "n": [1]} done',
      { msg = "use } and { freely", n = { 1 } } },
    { "scalar", "42", 42 },
  }
  for _, c in ipairs(cases) do
    it("finds JSON: " .. c[1], function()
      local got, err = llm.extract_json(c[2])
      check(got ~= nil, "nothing found: %s", tostring(err))
      check(H.same(got, c[3]), "got %s, expected %s", H.dump(got), H.dump(c[3]))
    end)
  end

  it("returns nil, message when there is none", function()
    for _, text in ipairs({ "", "I cannot help with that.", "{'a': 1}", "```json\n{a: 1}\n```" }) do
      local got, err = llm.extract_json(text)
      check(got == nil and type(err) == "string" and #err > 0, "%q gave %s", text, H.dump(got))
    end
  end)
end)

describe("assert_shape", function()
  it("returns the value when it fits", function()
    local value = { user = { name = "a", id = 1 }, tags = { "x", "y" }, ok = true, extra = llm.null }
    local shape = { user = { name = "string", id = "number" }, tags = { "string" }, ok = "boolean" }
    check(llm.assert_shape(value, shape) == value, "not the same value")
  end)

  local failures = {
    { { user = { name = 5 } }, { user = { name = "string" } }, nil,
      "invalid response at root.user.name: expected string" },
    { { items = { { name = "a" }, { name = 7 } } }, { items = { { name = "string" } } }, nil,
      "invalid response at root.items[1].name: expected string" },
    { { name = "" }, { name = "string" }, "response",
      "invalid response at response.name: expected string" },
    { { 1, "2" }, { "number" }, nil, "invalid response at root[1]: expected number" },
  }
  for i, c in ipairs(failures) do
    it("raises the core's message on a mismatch (" .. i .. ")", function()
      local ok, e = pcall(llm.assert_shape, c[1], c[2], c[3])
      check(not ok, "no error")
      check(e == c[4], "message %q, expected %q", tostring(e), c[4])
    end)
  end

  it("raises on a bad shape", function()
    local ok, e = pcall(llm.assert_shape, { x = 1 }, { x = "strng" })
    check(not ok and tostring(e):find("invalid shape at root.x", 1, true), "message %s",
      tostring(e))
  end)
end)

describe("log_usage", function()
  local KEYS = { "label", "attempt", "duration_ms", "prompt_tokens", "completion_tokens",
    "total_tokens", "request_id", "model" }
  local mock, scen

  setup(function()
    mock = H.start_mock()
    scen = mock:scen("usage")
  end)
  teardown(function() if mock then mock:stop() end end)

  local function a_meta(step)
    scen.script({ step })
    local res = assert(llm.call_llm({ body = { model = "gpt-test", messages = {} },
      base_url = scen.url, api_key = H.SECRET_KEY, request_id = "req-usage" }))
    return res
  end

  it("prints one JSON line to stdout, keys in order", function()
    local res = a_meta({ usage = { prompt_tokens = 7, completion_tokens = 5, total_tokens = 12 } })
    local out, rec = H.capture_stdout(llm.log_usage, res.meta, "batch-1")
    check(select(2, out:gsub("\n", "")) == 1 and out:sub(-1) == "\n", "not one line: %q", out)
    local d = json.decode(out)
    check(H.same(d, { label = "batch-1", attempt = 0, duration_ms = res.meta.duration_ms,
      prompt_tokens = 7, completion_tokens = 5, total_tokens = 12, request_id = "req-usage",
      model = "gpt-test" }), "line %s", out)
    check(H.same(rec, d), "returned %s", H.dump(rec))
    local pos = 0
    for _, k in ipairs(KEYS) do
      local p = out:find('"' .. k .. '":', 1, true)
      check(p and p > pos, "key %s out of order in %s", k, out)
      pos = p
    end
  end)

  it("uses the default label, takes a whole result, and writes null for no usage", function()
    local res = a_meta({ body = { object = "chat.completion", choices = {
      { index = 0, message = { role = "assistant", content = "ok" }, finish_reason = "stop" } } } })
    local out, rec = H.capture_stdout(llm.log_usage, res)
    check(rec.label == "request", "label %s", tostring(rec.label))
    check(rec.prompt_tokens == llm.null and rec.total_tokens == llm.null, "tokens %s", H.dump(rec))
    local d = json.decode(out, 1, json.null)
    check(d.prompt_tokens == json.null and d.completion_tokens == json.null
      and d.total_tokens == json.null, "line %s", out)
    check(d.request_id == "req-usage", "request_id")
  end)

  it("calls a logger function instead of printing", function()
    local res = a_meta({})
    local got = {}
    local out, rec = H.capture_stdout(llm.log_usage, res.meta, "C", function(d)
      got[#got + 1] = d
    end)
    check(out == "", "printed %q with a logger", out)
    check(#got == 1 and got[1] == rec and rec.label == "C" and rec.total_tokens == 15,
      "logger got %s", H.dump(got))
  end)
end)

-- decode reads strict JSON with the core's pull reader and hands anything
-- else to cJSON (issue 36): both must give the values dkjson, an unrelated
-- decoder, reads from the same text.
describe("decode, strict text and lenient text", function()
  -- a (core.decode's) against b (dkjson's): core.null for null, array_mt
  -- on arrays, the same keys, strings and numbers.
  local function agree(a, b, path)
    if b == json.null then
      return a == llm.null or error(path .. ": not core.null: " .. H.dump(a))
    end
    if type(b) ~= "table" then
      if a ~= b then error(path .. ": " .. H.dump(a) .. " vs " .. H.dump(b)) end
      return true
    end
    check(type(a) == "table", "%s: %s", path, H.dump(a))
    local is_array = getmetatable(b) and getmetatable(b).__jsontype == "array"
    check((getmetatable(a) == llm.array_mt) == (is_array and true or false),
      "%s: array marker %s", path, tostring(getmetatable(a)))
    for k, v in pairs(b) do agree(a[k], v, path .. "." .. tostring(k)) end
    for k in pairs(a) do check(b[k] ~= nil, "%s.%s: extra", path, tostring(k)) end
    return true
  end

  it("gives the values of the text, escapes, numbers and nesting included", function()
    local texts = {
      '{"a":1,"b":[1,2.5,-3e2,0,-0.0,1E+2,12345678901234],"c":{"d":null,"e":true,"f":false}}',
      '  [ "x" , "\\u00e9\\ud83d\\ude00\\n\\t\\"\\\\\\/" , [] , {} , [[[]]] ]  ',
      '{"k\\u0000ey":"a\\u0000b","dup":1,"dup":2,"":""}',
      '"just a string"', '42', '-0.5e-3', 'true', 'null',
      '{"choices":[{"index":0,"message":{"role":"assistant","content":"h\\u00e9llo"}}],'
        .. '"usage":{"prompt_tokens":12,"total_tokens":15}}',
      '{"big":9007199254740992,"neg":-9007199254740992,"frac":0.1,"exp":1e-310}',
    }
    for _, t in ipairs(texts) do
      local mine, err = llm.decode(t)
      check(mine ~= nil or t == "null", "decode(%s): %s", t, tostring(err))
      local want = json.decode(t, 1, json.null)
      agree(mine, want, t)
    end
    local dup = llm.decode('{"dup":1,"dup":2}')
    check(dup.dup == 2, "a repeated key kept %s", tostring(dup.dup))
    local nul = llm.decode('{"k\\u0000ey":"a\\u0000b"}')
    check(nul["k\0ey"] == "a\0b", "a \\u0000 cut a string: %s", H.dump(nul))
  end)

  it("hands lenient text to cJSON and refuses what cJSON refuses, as before", function()
    -- cJSON takes these (the pull reader does not): the values are cJSON's.
    local t = llm.decode('{"a":"raw\tcontrol","b":"\255x"}')
    check(t and t.a == "raw\tcontrol" and t.b == "\239\191\189x", "lenient: %s", H.dump(t))
    for _, bad in ipairs({ "{", "[1,]", '{"a" 1}', "tru", "1 2", "" }) do
      local v, err = llm.decode(bad)
      check(v == nil and type(err) == "string" and err:find("invalid JSON", 1, true),
        "decode(%q): %s %s", bad, H.dump(v), tostring(err))
    end
  end)
end)
