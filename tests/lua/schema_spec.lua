-- Structured outputs seen from Lua (issue 31, docs/structured-outputs.md):
-- the core's validation (tests/c/test_schema.c, tests/vectors/schema/)
-- reaches Lua callers through the `schema` option in each of its forms,
-- err.validation_errors and the kind "refusal".

local H = require("helpers")
local llm = require("llmretry")
local check = H.check

local PERSON = {
  type = "object",
  properties = { name = { type = "string" }, age = { type = "integer", minimum = 0 } },
  required = { "name", "age" },
  additionalProperties = false,
}
local GOOD = '{"name": "Ann", "age": 3}'

describe("schema", function()
  local mock

  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  local function base(scen, extra)
    return H.merge({ body = H.secret_body("schema"), base_url = scen.url,
      api_key = H.SECRET_KEY, timeout_ms = 5000, base_delay_ms = 10, jitter = "none" }, extra)
  end

  it("takes a table, JSON text or a boolean", function()
    local scen = mock:scen("lua_schema_forms")
    for _, schema in ipairs({ PERSON, llm.encode(PERSON) }) do
      scen.script({ { content = '{"name": "Ann"}' }, { content = "```json\n" .. GOOD .. "\n```" } })
      local res, err = llm.call_llm(base(scen, { schema = schema }))
      check(res and res.meta.attempts == 2, "%s", H.dump(err))
    end
    -- true: any JSON (the answer must still be JSON)
    scen.script({ { content = "no json here" }, { content = "[1]" } })
    local res, err = llm.call_llm(base(scen, { schema = true }))
    check(res and res.meta.attempts == 2, "%s", H.dump(err))
  end)

  it("lists what did not match", function()
    local scen = mock:scen("lua_schema_errors")
    scen.script({}, { content = '{"name": 1, "age": 2}' })
    local res, err = llm.call_llm(base(scen, { schema = PERSON, max_retries = 0 }))
    check(res == nil, "a mismatch succeeded")
    H.check_error(err, "invalid_response", { reason = "retries_exhausted" })
    check(H.same(err.validation_errors, { { path = "$.name", message = "expected string" } }),
      "validation_errors %s", H.dump(err.validation_errors))
  end)

  it("refuses a bad schema before any request", function()
    local scen = mock:scen("lua_schema_bad")
    local ok, msg = pcall(llm.call_llm, base(scen, { schema = { oneOf = { { type = "string" } } } }))
    check(not ok and tostring(msg):find("schema: unsupported keyword 'oneOf' at $", 1, true),
      "%s", tostring(msg))
    ok, msg = pcall(llm.call_llm, base(scen, { schema = 3 }))
    check(not ok and tostring(msg):find("schema must be a table (a JSON Schema) or JSON text",
      1, true), "%s", tostring(msg))
    check(#scen.requests() == 0, "the server saw a request")
  end)

  it("repairs: the retry carries the failed answer and its errors", function()
    local scen = mock:scen("lua_schema_repair")
    scen.script({ { content = '{"name": "Ann"}' }, { content = GOOD } })
    local res, err = llm.call_llm(base(scen, { schema = PERSON, repair = true }))
    check(res and res.meta.attempts == 2, "%s", H.dump(err))
    local second = llm.decode(scen.requests()[2].body)
    local n = #second.messages
    check(second.messages[n - 1].role == "assistant"
      and second.messages[n - 1].content == '{"name": "Ann"}', "%s", H.dump(second.messages))
    check(second.messages[n].content:find("$.age: required property is missing", 1, true),
      "%s", H.dump(second.messages[n]))
  end)

  it("knows the refusal kind", function()
    check(llm.errors.REFUSAL == "refusal", "llm.errors.REFUSAL")
  end)
end)
