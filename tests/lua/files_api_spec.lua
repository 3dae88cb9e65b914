-- The method, content_type and raw_response options (issue 35: the Batch
-- API's Files calls as engine calls), from the option table: a GET of a
-- file the mock holds, its content as text (JSON Lines), retried on a 503.

local H = require("helpers")
local llm = require("llmretry")
local json = H.json
local check = H.check

describe("files API", function()
  local mock
  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  it("a GET without a body, its content raw and retried", function()
    local lines = '{"custom_id": "a"}\n{"custom_id": "b"}\n'
    local b = "llmretry-lua-boundary"
    local upload = "--" .. b .. '\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n' ..
      "batch\r\n--" .. b .. '\r\nContent-Disposition: form-data; name="file"; ' ..
      'filename="in.jsonl"\r\n\r\n' .. lines .. "\r\n--" .. b .. "--\r\n"
    local common = { api_key = H.SECRET_KEY, logger = false, base_delay_ms = 1,
      max_delay_ms = 5 }
    local function opts(t)
      for k, v in pairs(common) do t[k] = v end
      return t
    end
    local f, err = llm.call_llm(opts{ url = mock.base_url .. "/files", body = upload,
      content_type = "multipart/form-data; boundary=" .. b })
    check(f ~= nil, "upload failed: %s", H.dump(err))
    local id = f.data.id

    local code = mock:http("PUT", "/_mock/batches", json.encode({ fail = 1 }))
    check(code == 204, "PUT /_mock/batches: %s", tostring(code))
    local res
    res, err = llm.call_llm(opts{ url = mock.base_url .. "/files/" .. id .. "/content",
      method = "GET", raw_response = true })
    check(res ~= nil, "GET content failed: %s", H.dump(err))
    check(res.data == lines, "content %s", H.dump(res and res.data))
    check(res.meta.attempts == 2, "attempts %s", H.dump(res and res.meta))

    res, err = llm.call_llm(opts{ url = mock.base_url .. "/files/" .. id, method = "GET" })
    check(res ~= nil and res.data.purpose == "batch", "GET file: %s", H.dump(err or res))

    local msg = H.raises(llm.call_llm, opts{ url = mock.base_url .. "/files/" .. id,
      method = "GET", body = "{}" })
    check(msg:find("a GET sends no body", 1, true), "message %s", msg)
  end)
end)
