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
    local body = '{"error": {"message": "no\\nINFO forged\\r", "code": "c\\nINFO forged\\r"}}'
    local srv = H.start_recorder({ status = 400, body = body })
    finally(function() srv:stop() end)
    local res, err = llm.call_llm({ body = H.secret_body("lua_esc"), max_retries = 0,
      url = srv.base_url .. "/chat/completions?sig=Q-SECRET", api_key = H.SECRET_KEY })
    check(not res, "a 400 succeeded")
    local text = tostring(err)
    check(not text:find("[\r\n]"), "raw CR/LF in %q", text)
    -- The code is free text, not a token: replaced; the message is escaped.
    check(text:find("HTTP 400 from ", 1, true) and text:find(
      '/chat/completions (invalid_code): "no\\nINFO forged\\r";', 1, true), "message %q", text)
    check(not text:find("Q-SECRET", 1, true), "the query string is in %q", text)
    check(err.error_code == "invalid_code", "error_code %q", tostring(err.error_code))
  end)

  -- What a server's error may show (issue 27): its code only as a short
  -- token, its message unless that echoes the request. The Python twin is in
  -- tests/python/test_correctness_core.py, the C one in tests/c/test_raw.c.
  local function shown(out)
    local events = {}
    for i, e in ipairs(out.events.events) do
      local copy = {}
      for k, v in pairs(e) do if k ~= "body_preview" then copy[k] = v end end
      events[i] = copy
    end
    return tostring(out.err) .. " " .. tostring(out.err.error_code) .. " " .. H.dump(events)
  end

  it("replaces an error code that is not a short token, body and stream alike", function()
    local codes = { string.rep("c", 200000), "not a token", "SECRET-PROMPT-lua_code",
      "echo: SECRET-PROMPT-lua_code", string.rep("x", 65) }
    for _, stream in ipairs({ false, true }) do
      for _, code in ipairs(codes) do
        local scen = mock:scen("lua_code")
        local body = H.secret_body("lua_code")
        local steps = { { status = 400, body = { error = { message = "bad", code = code } } } }
        if stream then
          body.stream = true
          steps = { { stream = { ["end"] = "error_event", after = 0, error_code = code,
            error_message = "bad" } } }
        end
        local out = H.run_call(scen, steps, { body = body, max_retries = 0 })
        check(out.err and out.err.error_code == "invalid_code", "code %s: error_code %s",
          code:sub(1, 40), out.err and tostring(out.err.error_code):sub(1, 80))
        local failed = out.events.field("llm_request_failed", "error_code")
        check(#failed == 1 and failed[1] == "invalid_code", "events' code %s",
          tostring(failed[1]):sub(1, 80))
        local text = shown(out)
        for _, secret in ipairs({ code:sub(1, 64), "SECRET-PROMPT-lua_code", "not a token" }) do
          check(not text:find(secret, 1, true), "%s in %s", secret:sub(1, 40), text:sub(1, 300))
        end
        if not stream then
          check(tostring(out.err):find('(invalid_code): "bad"; gave up', 1, true), "%s",
            tostring(out.err))
        end
      end
    end
  end)

  it("shows a 4xx's message in tostring(err), withholds one echoing the request", function()
    local scen = mock:scen("lua_msg")
    local said = "Invalid value for 'temperature': must be <= 2."
    local out = H.run_call(scen, { { status = 400, body = { error = { message = said,
      type = "invalid_request_error" } } } }, { max_retries = 0 })
    local text = tostring(out.err)
    check(text:find('(invalid_request_error): "' .. said .. '"; gave up after 1 attempt', 1,
      true), "%s", text)
    local events = shown(out):sub(#text + 2)
    check(not events:find("temperature", 1, true), "the message is in the events: %s", events)
    local prompt = "SECRET-PROMPT-lua_echo"
    for _, case in ipairs({ { "unknown input " .. prompt:sub(3, 18), true },
                            { "unknown input " .. prompt:sub(3, 17), false },
                            { "cannot use " .. H.SECRET_KEY, true } }) do
      scen = mock:scen("lua_echo")
      out = H.run_call(scen, { { status = 400, body = { error = { message = case[1] } } } },
        { body = H.secret_body("lua_echo"), max_retries = 0 })
      text = tostring(out.err)
      if case[2] then
        check(text:find("(the server's message is withheld because it echoes the request)",
          1, true), "%s", text)
        check(not shown(out):find(case[1], 1, true), "%s", shown(out))
      else
        check(text:find(': "' .. case[1] .. '"; gave up', 1, true), "%s", text)
      end
      check(not shown(out):find(prompt, 1, true) and not shown(out):find(H.SECRET_KEY, 1, true),
        "a secret in %s", shown(out))
    end
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
