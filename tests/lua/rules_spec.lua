-- The core's rules, kept nowhere else: the shared vectors of
-- tests/vectors/rules/ (also run by tests/c/test_rules.c and
-- tests/python/test_rules.py). Here the extra headers' rule
-- (llmretry_check_header) through the headers option: a Lua table has no
-- order, so an invalid name is told as "a header's name", never repeated.

local H = require("helpers")
local core = require("llmretry.core")
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
end)
