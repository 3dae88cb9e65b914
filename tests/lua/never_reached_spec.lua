-- A connection that never worked says so (issue 32 item 6): a call that gives
-- up unable to connect to an origin (scheme://host:port) that nothing of its
-- engine ever reached says it never reached it and to check base_url, with
-- the retries as ever; an origin that answered before and is down now gets
-- the ordinary message. (The rule is the core's: tests/c/test_raw.c.)

local H = require("helpers")
local llm = require("llmretry")
local check = H.check

local function opts(extra)
  return H.merge(H.FAST, { body = H.secret_body("never"), api_key = H.SECRET_KEY,
    logger = false }, extra)
end

describe("a network failure", function()
  it("to an origin never reached says so, and to check base_url", function()
    local eng = llm.new_engine()
    local port = H.closed_port()
    local res, err = llm.call_llm(opts({ engine = eng, max_retries = 2,
      base_url = string.format("http://127.0.0.1:%d/v1", port) }))
    eng:close()
    check(res == nil, "a closed port answered")
    H.check_error(err, "network", { reason = "retries_exhausted", attempts = 3, status = false })
    local want = string.format("; never reached http://127.0.0.1:%d (no connection to it has "
      .. "worked yet): check base_url; gave up after 3 attempts", port)
    check(err.message:find(want, 1, true), "message: %s", err.message)
    check(not tostring(err):find(H.SECRET_KEY, 1, true), "the key in %s", tostring(err))
  end)

  it("to an origin that answered before is the ordinary one", function()
    local eng = llm.new_engine()
    local mock = H.start_mock()
    local url = mock.base_url
    local res, err = llm.call_llm(opts({ engine = eng, base_url = url }))
    check(res ~= nil, "the mock did not answer: %s", tostring(err))
    mock:stop()
    res, err = llm.call_llm(opts({ engine = eng, base_url = url, max_retries = 1 }))
    eng:close()
    check(res == nil, "a stopped mock answered")
    H.check_error(err, "network", { attempts = 2 })
    check(not err.message:find("never reached", 1, true), "message: %s", err.message)
  end)
end)

describe("a 404", function()
  it("through a base_url ending with the endpoint's path says which part to drop", function()
    local mock = H.start_mock()
    local scen = mock:scen("twice").script({ { status = 404 } })
    local res, err = llm.call_llm(opts({ base_url = scen.url .. "/chat/completions" }))
    mock:stop()
    check(res == nil, "the 404 was a success")
    H.check_error(err, "http_status", { status = 404, attempts = 1 })
    check(err.message:find("; check base_url: it ends with /chat/completions, which each call "
      .. "appends (give the API's base, such as https://api.openai.com/v1, or the whole URL "
      .. "as url); gave up after 1 attempt", 1, true), "message: %s", err.message)
  end)
end)
