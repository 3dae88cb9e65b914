-- The core's rules, kept nowhere else: the shared vectors of
-- tests/vectors/rules/ (also run by tests/c/test_rules.c and
-- tests/python/test_rules.py). Here the extra headers' rule
-- (llmretry_check_header) through the headers option (a Lua table has no
-- order, so an invalid name is told as "a header's name", never repeated),
-- and the body sent for a table (llmretry_stream_body) as the mock server
-- receives it from stream_llm and call_llm.

local H = require("helpers")
local core = require("llmretry.core")
local llm = require("llmretry")
local check = H.check

describe("the core's rules", function()
  it("checks each header as the other hosts do (rules/headers.json)", function()
    local vec = H.json.decode(H.read_file(H.VECTOR_DIR .. "/rules/headers.json"))
    check(#vec.cases >= 10, "only %d cases", #vec.cases)
    for i, case in ipairs(vec.cases) do
      local opts = { base_url = "http://127.0.0.1:9/v1", api_key = "k",
                     headers = { [case.name] = case.value } }
      local ok, err = pcall(core.check_options, opts)
      if case.error == H.json.null or case.error == nil then
        check(ok, "case %d refused: %s", i, tostring(err))
      elseif case.error == "name" then
        check(not ok and err:find("headers: a header's name is invalid", 1, true),
          "case %d: %s", i, tostring(err))
        check(case.name == "" or not err:find(case.name, 1, true),
          "case %d repeats the name: %s", i, err)
      else
        local want = string.format('headers["%s"] must not contain CR, LF, NUL or other ' ..
          "control characters", case.name)
        check(not ok and err:find(want, 1, true), "case %d: %s", i, tostring(err))
      end
    end
  end)

  it("sends a table body as the other hosts do (rules/stream_bodies.json)", function()
    local vec = H.json.decode(H.read_file(H.VECTOR_DIR .. "/rules/stream_bodies.json"))
    local mock = H.start_mock()
    local ok, err = pcall(function()
      local n = 0
      for i, case in ipairs(vec.cases) do
        if case.body then
          n = n + 1
          local scen = mock:scen("rules" .. i)
          local opts = { base_url = scen.url, endpoint = case.endpoint, api_key = H.SECRET_KEY,
                         body = case.body, logger = false, max_retries = 0, timeout_ms = 5000 }
          local before = H.dump(case.body)
          if case.streamed then
            llm.stream_llm(opts, function() end)
          else
            llm.call_llm(opts)
          end
          check(H.dump(case.body) == before, "case %d: the caller's table was changed", i)
          local recs = scen.requests()
          check(#recs == 1, "case %d: %d requests", i, #recs)
          local sent = H.json.decode(recs[1].body)
          check(H.dump(sent) == H.dump(case.sent), "case %d (%s) sent %s", i, case.name,
            recs[1].body)
        end
      end
      check(n >= 6, "only %d cases", n)
    end)
    mock:stop()
    assert(ok, err)
  end)
end)
