-- The endpoint option (issue 32): the API path appended to base_url, url
-- winning, from a call or a policy (url too), and embeddings' usage.

local H = require("helpers")
local llm = require("llmretry")
local check = H.check

describe("endpoint", function()
  local mock
  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  local function path_of(scen, i) return scen.requests()[i].path end

  it("embeddings: its path and usage without completion tokens", function()
    local scen = mock:scen("embed")
    local res, err = llm.call_llm{ body = { model = "e", input = { "SECRET-PROMPT-a", "b" } },
      base_url = scen.url, endpoint = "embeddings", api_key = H.SECRET_KEY, logger = false }
    check(res ~= nil, "call failed: %s", H.dump(err))
    check(path_of(scen, 1) == "/s/" .. scen.name .. "/v1/embeddings", "path %s", path_of(scen, 1))
    check(#res.data.data == 2, "vectors %s", H.dump(res.data))
    check(res.meta.usage.prompt_tokens == 8 and res.meta.usage.completion_tokens == 0
      and res.meta.usage.total_tokens == 8, "usage %s", H.dump(res.meta.usage))
  end)

  it("a bad endpoint is refused naming the option; url wins", function()
    local scen = mock:scen("bad")
    local msg = H.raises(llm.call_llm, { body = { model = "e", input = "x" }, base_url = scen.url,
      endpoint = "/v1/embeddings", logger = false })
    check(msg:find("endpoint must be one of", 1, true), "message %s", msg)
    local res = llm.call_llm{ body = { model = "e", input = "x" }, url = scen.url .. "/embeddings",
      endpoint = "responses", logger = false }
    check(res and res.data.object == "list", "url lost to endpoint: %s", H.dump(res))
  end)

  it("a policy may set endpoint or a whole url", function()
    local scen, other = mock:scen("pol"), mock:scen("pol_other")
    local c = llm.client{ base_url = scen.url, logger = false, policies = {
      embed = { endpoint = "embeddings" }, whole = { url = other.url .. "/responses" } } }
    check(c:call_llm{ body = { model = "e", input = "x" }, policy = "embed" } ~= nil, "embed")
    check(c:call_llm{ body = { model = "r", input = "x" }, policy = "whole" } ~= nil, "whole")
    check(path_of(scen, 1) == "/s/" .. scen.name .. "/v1/embeddings", "path %s", path_of(scen, 1))
    check(path_of(other, 1) == "/s/" .. other.name .. "/v1/responses", "path %s",
      path_of(other, 1))
  end)

  it("a base_url's query follows the path; stats show no user info or query", function()
    local scen = mock:scen("shown")
    local origin, path = scen.url:match("^http://([^/]+)(/.*)$")
    local e = llm.new_engine()
    local res, err = llm.call_llm{ body = { model = "m", messages = {} }, engine = e,
      base_url = "http://user:pw-SECRET@" .. origin .. path .. "?api-version=7&key=QSECRET",
      api_key = H.SECRET_KEY, logger = false }
    check(res ~= nil, "call failed: %s", H.dump(err))
    check(path_of(scen, 1) == path .. "/chat/completions?api-version=7&key=QSECRET", "path %s",
      path_of(scen, 1))
    local stats = llm.endpoint_stats(e)
    check(#stats == 1 and stats[1].url == "http://***@" .. origin .. path
      .. "/chat/completions?***", "stats %s", H.dump(stats))
    e:close()
  end)

  it("a client's tostring shows its endpoint without user info or query, never the key", function()
    local base = "http://user:pw-SECRET@h.example/v1?key=QSECRET"
    local c = llm.client{ base_url = base, api_key = H.SECRET_KEY, timeout_ms = 5000,
      logger = false }
    local shown = tostring(c)
    check(shown == 'llmretry.client(base_url="http://***@h.example/v1?***", timeout_ms=5000, '
      .. "api_key=<set>)", "tostring %s", shown)
    check(not shown:find("SECRET", 1, true), "a secret in %s", shown)
    check(tostring(llm.client{ logger = false }) == "llmretry.client(base_url=nil, api_key=<unset>)",
      "bare: %s", tostring(llm.client{ logger = false }))
    local core = require("llmretry.core")
    check(core.url_join(base, "/files") == "http://user:pw-SECRET@h.example/v1/files?key=QSECRET",
      "url_join %s", core.url_join(base, "/files"))
  end)
end)
