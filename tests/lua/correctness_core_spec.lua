-- What the core decides once for every host (issue 13, the correctness
-- round): request ids, caller headers, the text of HTTP errors, and JSON
-- strings holding NUL. The Python twin is tests/python/test_correctness_core.py.

local H = require("helpers")
local llm = require("llmretry")
local check = H.check

local function raises(needle, f, ...)
  local ok, e = pcall(f, ...)
  check(not ok, "no error (expected one naming %s)", needle)
  check(type(e) == "string" and e:find(needle, 1, true), "message does not name %q: %s", needle,
    tostring(e))
  return e
end

describe("the core's checks, seen from Lua", function()
  local mock

  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  local function opts(scen, extra)
    return H.merge({ body = H.secret_body(scen.name), base_url = scen.url,
      api_key = H.SECRET_KEY, max_retries = 0 }, extra)
  end

  it("takes a request_id of 256 bytes whole and refuses a longer one", function()
    local scen = mock:scen("lua_rid")
    scen.script({})
    local id = string.rep("r", 256)
    local res, err = llm.call_llm(opts(scen, { request_id = id }))
    check(res, "%s", tostring(err))
    check(res.meta.request_id == id, "request_id %s", tostring(res.meta.request_id))
    check(scen.requests()[1].headers["x-client-request-id"] == id, "sent id was cut")
    raises("request_id", llm.call_llm, opts(scen, { request_id = id .. "r" }))
    check(#scen.requests() == 1, "a refused call reached the server")
  end)

  it("refuses framing headers and a second Authorization, before any I/O", function()
    local scen = mock:scen("lua_hdr")
    scen.script({})
    raises("Content-Length", llm.call_llm, opts(scen, { headers = { ["content-length"] = "3" } }))
    raises("Transfer-Encoding", llm.call_llm,
      opts(scen, { headers = { ["Transfer-Encoding"] = "chunked" } }))
    raises("Host", llm.call_llm, opts(scen, { headers = { Host = "evil.example" } }))
    local e = raises("Authorization", llm.call_llm,
      opts(scen, { headers = { Authorization = "Bearer other-SECRET" } }))
    check(not e:find("other-SECRET", 1, true), "the header value is in the message: %s", e)
    check(#scen.requests() == 0, "a refused call reached the server")
  end)

  it("sends a TAB inside a header value, as Python does", function()
    local scen = mock:scen("lua_tab")
    scen.script({})
    local res, err = llm.call_llm(opts(scen, { headers = { ["X-Tab"] = "a\tb" } }))
    check(res, "%s", tostring(err))
    check(scen.requests()[1].headers["x-tab"] == "a\tb", "x-tab %s",
      tostring(scen.requests()[1].headers["x-tab"]))
    raises("control characters", llm.call_llm, opts(scen, { headers = { ["X-A"] = "a\1b" } }))
  end)

  it("escapes the provider's text in tostring(err), names the path, not the query", function()
    local body = '{"error": {"message": "echoed SECRET-PROMPT", "code": "c\\nINFO forged\\r"}}'
    local srv = H.start_recorder({ status = 400, body = body })
    finally(function() srv:stop() end)
    local res, err = llm.call_llm({ body = H.secret_body("lua_esc"), max_retries = 0,
      url = srv.base_url .. "/chat/completions?sig=Q-SECRET", api_key = H.SECRET_KEY })
    check(not res, "a 400 succeeded")
    local text = tostring(err)
    check(not text:find("[\r\n]"), "raw CR/LF in %q", text)
    check(text:find("HTTP 400 from ", 1, true) and text:find("/chat/completions (c\\nINFO forged\\r);",
      1, true), "message %q", text)
    check(not text:find("SECRET-PROMPT", 1, true), "the prompt is in %q", text)
    check(not text:find("Q-SECRET", 1, true), "the query string is in %q", text)
    check(err.error_code == "c\nINFO forged\r", "error_code is data, kept raw: %q",
      tostring(err.error_code))
  end)

  it("keeps a JSON string whole across a \\u0000 escape", function()
    local v = llm.decode('{"a": "x\\u0000y", "k\\u0000": [1, "\\u00e9\\u0000\\ud83d\\ude00"]}')
    check(v.a == "x\0y", "a = %q", v.a)
    check(v["k\0"] and v["k\0"][2] == "\195\169\0\240\159\152\128", "k = %s", H.dump(v))
    local scen = mock:scen("lua_nul")
    scen.script({ { content = "before\0after" } })
    local res, err = llm.call_llm(opts(scen))
    check(res, "%s", tostring(err))
    check(res.data.choices[1].message.content == "before\0after", "content %q",
      tostring(res.data.choices[1].message.content))
  end)
end)

describe("the default endpoint", function()
  it("without a key fails at once naming OPENAI_API_KEY", function()
    -- lua-test.sh unsets OPENAI_API_KEY and OPENAI_BASE_URL.
    local t0 = H.now_ms()
    local ok, e = pcall(llm.call_llm, { body = H.secret_body("nokey") })
    check(not ok and tostring(e):find("OPENAI_API_KEY", 1, true), "got %s", tostring(e))
    check(H.now_ms() - t0 < 1000, "took %d ms", H.now_ms() - t0)
  end)
end)
