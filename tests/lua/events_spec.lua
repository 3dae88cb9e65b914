-- Events (docs/reliability.md), loggers, validate, and what never leaks.

local H = require("helpers")
local llm = require("llmretry")
local check = H.check

local function call(scen, extra)
  return llm.call_llm(H.merge(H.FAST, { body = H.secret_body(scen.name), base_url = scen.url,
    api_key = H.SECRET_KEY }, extra))
end

describe("events", function()
  local mock

  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  it("come in order with exactly their fields, nulls as llm.null", function()
    local scen = mock:scen("all_fields")
    -- truncate, not reset: a reset on the reused connection before any byte
    -- would be retried at once, not after the backoff checked below.
    scen.script({ { status = 503, retry_after = "0.05" }, { fault = "truncate" },
      { status = 200, usage = { prompt_tokens = 7, completion_tokens = 5, total_tokens = 12 },
        system_fingerprint = "fp_ev" } })
    local rec = H.recorder()
    local res, err = call(scen, { logger = rec.fn, request_id = "req-ev-1" })
    check(res, "failed: %s", tostring(err))
    local names = rec.names()
    check(H.list_eq(names, { "llm_request_started", "llm_request_failed", "llm_retry_scheduled",
      "llm_request_started", "llm_request_error", "llm_retry_scheduled", "llm_request_started",
      "llm_request_succeeded" }), "events %s", H.list_str(names))
    H.check_event_sequence(rec.events, 3, "req-ev-1")
    local ev = rec.events
    -- started: no deadline -> deadline_left_ms null
    check(ev[1].timeout_ms == 5000 and ev[1].deadline_left_ms == llm.null, "started %s",
      H.dump(ev[1]))
    -- failed: the raw Retry-After, the provider's code, the response preview
    check(ev[2].status == 503 and ev[2].retry_after == "0.05"
      and ev[2].error_code == "server_error" and ev[2].body_preview:find("mock error 503", 1, true),
      "failed %s", H.dump(ev[2]))
    check(ev[3].delay_ms == 50 and ev[3].delay_source == "retry_after" and ev[3].next_attempt == 1,
      "retry %s", H.dump(ev[3]))
    check(ev[5].error_kind == "network" and #ev[5].error_message > 0, "error %s", H.dump(ev[5]))
    check(ev[6].delay_source == "backoff" and ev[6].delay_ms == 40, "retry 2 %s", H.dump(ev[6]))
    check(ev[8].status == 200 and H.same(ev[8].usage, { prompt_tokens = 7, completion_tokens = 5,
      total_tokens = 12 }) and ev[8].response_model == "gpt-test"
      and ev[8].system_fingerprint == "fp_ev", "succeeded %s", H.dump(ev[8]))
    check(H.is_int(ev[8].duration_ms), "duration_ms")
  end)

  it("reports a give-up with its reason, attempts, total and status", function()
    local scen = mock:scen("gave_up")
    scen.script({}, { status = 500 })
    local rec = H.recorder()
    local res, err = call(scen, { logger = rec.fn, max_retries = 1, deadline_ms = 5000 })
    check(res == nil, "expected a failure")
    local last = rec.events[#rec.events]
    check(last.event == "llm_request_gave_up" and last.reason == "retries_exhausted"
      and last.attempts == 2 and last.error_kind == "http_status" and last.status == 500
      and last.total_ms >= 20, "gave_up %s", H.dump(last))
    check(last.total_ms <= err.total_ms + 5, "gave_up.total_ms %d vs err %d", last.total_ms,
      err.total_ms)
    local started = rec.of("llm_request_started")
    check(H.is_int(started[1].deadline_left_ms) and started[1].deadline_left_ms <= 5000
      and started[1].deadline_left_ms > 4000, "deadline_left_ms %s",
      H.dump(started[1].deadline_left_ms))
  end)

  it("gives a null status on a give-up without any response", function()
    local rec = H.recorder()
    local _, err = llm.call_llm(H.merge(H.FAST, { body = H.secret_body("nostatus"),
      base_url = string.format("http://127.0.0.1:%d/v1", H.closed_port()),
      api_key = H.SECRET_KEY, max_retries = 0, logger = rec.fn }))
    check(err and err.status == nil, "err.status %s", H.dump(err and err.status))
    local last = rec.events[#rec.events]
    check(last.status == llm.null, "gave_up.status %s", H.dump(last.status))
    H.check_event_shape(last)
  end)

  it("are not made without a logger, or with logger = false", function()
    local scen = mock:scen("no_logger")
    local res = call(scen, { logger = false })
    check(res and res.meta.status == 200, "call failed")
    res = call(scen, {})
    check(res and res.meta.status == 200, "call failed")
  end)

  it("go to a callable table too", function()
    local scen = mock:scen("callable")
    local got = {}
    local logger = setmetatable({}, { __call = function(_, ev) got[#got + 1] = ev.event end })
    local res = call(scen, { logger = logger })
    check(res, "call failed")
    check(H.list_eq(got, { "llm_request_started", "llm_request_succeeded" }), "events %s",
      H.list_str(got))
  end)

  it("honour event_mask", function()
    local scen = mock:scen("mask")
    scen.script({ { status = 503 } })
    local rec = H.recorder()
    -- bit 4: llm_request_succeeded only (core.EVENT_NAMES order)
    local names = llm.EVENT_NAMES
    check(names[5] == "llm_request_succeeded", "EVENT_NAMES %s", H.list_str(names))
    local res = call(scen, { logger = rec.fn, event_mask = 16 })
    check(res, "call failed")
    check(H.list_eq(rec.names(), { "llm_request_succeeded" }), "events %s",
      H.list_str(rec.names()))
  end)
end)

describe("a logger that raises", function()
  local mock

  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  it("keeps the result, gets every event, and is reported once", function()
    local scen = mock:scen("raising_logger")
    scen.script({ { status = 503 } }, { content = "still here" })
    local calls = {}
    local text, res, err = H.capture_stderr(function()
      return call(scen, { logger = function(ev)
        calls[#calls + 1] = ev.event
        error("logger exploded")
      end })
    end)
    check(res, "the call was lost: %s", tostring(err))
    check(res.data.choices[1].message.content == "still here", "content")
    check(res.meta.attempts == 2, "attempts")
    check(H.list_eq(calls, { "llm_request_started", "llm_request_failed", "llm_retry_scheduled",
      "llm_request_started", "llm_request_succeeded" }), "logger saw %s", H.list_str(calls))
    local n = select(2, text:gsub("logger exploded", ""))
    check(n == 1, "reported %d times on stderr: %s", n, text)
    check(text:find(res.meta.request_id, 1, true), "the report lacks the request id: %s", text)
    H.check_no_secrets(H.body_secrets(H.secret_body(scen.name)), text)
  end)

  it("keeps the error on the error path", function()
    local scen = mock:scen("raising_logger_err")
    scen.script({ { status = 400 } })
    local text, res, err = H.capture_stderr(function()
      return call(scen, { logger = function() error({ "a table error" }) end })
    end)
    check(res == nil, "expected a failure")
    H.check_error(err, "http_status", { reason = "not_retryable", status = 400, attempts = 1 })
    check(#text > 0, "nothing reported")
  end)
end)

describe("validate", function()
  local mock

  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  it("gets the decoded body; false rejects and the policy retries", function()
    local scen = mock:scen("validate_false")
    scen.script({ { content = "nope" }, { content = "yes" } })
    local seen = {}
    local rec = H.recorder()
    local res, err = call(scen, { logger = rec.fn, validate = function(data)
      seen[#seen + 1] = data.choices[1].message.content
      return data.choices[1].message.content == "yes"
    end })
    check(res, "failed: %s", tostring(err))
    check(H.list_eq(seen, { "nope", "yes" }), "validate saw %s", H.list_str(seen))
    check(res.data.choices[1].message.content == "yes", "data")
    check(H.list_eq(rec.names(), { "llm_request_started", "llm_request_error",
      "llm_retry_scheduled", "llm_request_started", "llm_request_succeeded" }), "events %s",
      H.list_str(rec.names()))
    local e = rec.of("llm_request_error")[1]
    check(e.error_kind == "invalid_response", "error_kind %s", e.error_kind)
  end)

  it("rejects on nil, message and on a raise, with the message", function()
    local scen = mock:scen("validate_msg")
    scen.script({ {}, {} }, { content = "fine" })
    local n = 0
    local rec = H.recorder()
    local res, err = call(scen, { logger = rec.fn, validate = function(data)
      n = n + 1
      if n == 1 then return nil, "first is not good" end
      if n == 2 then error("second exploded") end
      return data
    end })
    check(res, "failed: %s", tostring(err))
    local msgs = rec.field("llm_request_error", "error_message")
    check(#msgs == 2, "%d errors", #msgs)
    check(msgs[1]:find("first is not good", 1, true), "message 1: %s", msgs[1])
    check(msgs[2]:find("second exploded", 1, true), "message 2: %s", msgs[2])
  end)

  it("accepts on nil (an assert-style validator)", function()
    local scen = mock:scen("validate_nil")
    local res, err = call(scen, { validate = function(data)
      llm.assert_shape(data, { choices = { { message = { content = "string" } } } })
    end })
    check(res, "failed: %s", tostring(err))
  end)

  it("ends with invalid_response when retries are off", function()
    local scen = mock:scen("validate_final")
    scen.script({}, { content = "bad" })
    local res, err = call(scen, { retry_invalid_response = false, validate = function()
      return false, "never good"
    end })
    check(res == nil, "expected a failure")
    H.check_error(err, "invalid_response", { reason = "not_retryable", attempts = 1, status = 200 })
    check(err.message:find("never good", 1, true), "message %s", err.message)
    check(#scen.requests() == 1, "requests")
  end)

  it("exhausts retries when nothing is ever good", function()
    local scen = mock:scen("validate_never")
    local res, err = call(scen, { max_retries = 2, validate = function() return false end })
    check(res == nil, "expected a failure")
    H.check_error(err, "invalid_response", { reason = "retries_exhausted", attempts = 3 })
  end)
end)

describe("secrets", function()
  local mock

  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  it("never appear in events, errors, tostring(err) or results", function()
    local scen = mock:scen("secrets_all")
    local cases = {
      { steps = { {} } },
      { steps = { { status = 401 } } },
      { steps = { { status = 503 } }, after = { status = 503 }, opts = { max_retries = 1 } },
      { steps = { { fault = "reset" } }, opts = { max_retries = 0 } },
      { steps = { { delay_ms = 800 } }, opts = { timeout_ms = 150, max_retries = 0 } },
      { steps = { { fault = "invalid_json" } }, opts = { retry_invalid_response = false } },
      { steps = { {} }, opts = { validate = function() error("nope") end, max_retries = 0 } },
    }
    for _, c in ipairs(cases) do
      scen.script(c.steps, c.after)
      local o = H.run_call(scen, nil, c.opts or {})
      H.check_outcome_secrets(o)
      if o.err then
        H.check_no_secrets(H.body_secrets(o.body), tostring(o.err), o.err.message,
          o.err.body_preview)
      else
        H.check_no_secrets(H.body_secrets(o.body), o.res.meta, tostring(o.res))
      end
    end
  end)

  it("are not echoed by argument errors", function()
    -- A closed port: should an argument slip through, nothing goes out.
    local url = string.format("http://127.0.0.1:%d/v1", H.closed_port())
    local cases = {
      { timeout_ms = "SECRET-PROMPT-argleak" },
      { api_key = { H.SECRET_KEY } },
      { headers = { Authorization = true } },
      { headers = { ["Bad Name"] = H.SECRET_KEY } },
      { request_id = { H.SECRET_KEY } },
      { timeout_ms = 0 },
      { unknown_option = H.SECRET_KEY },
    }
    for _, extra in ipairs(cases) do
      local ok, e = pcall(llm.call_llm, H.merge({ body = H.secret_body("argleak"),
        api_key = H.SECRET_KEY, base_url = url }, extra))
      check(not ok, "no error for %s", H.dump(extra))
      H.check_no_secrets({ H.SECRET_KEY, "SECRET-PROMPT-argleak", "SECRET-SYSTEM-argleak" },
        tostring(e))
    end
  end)
end)
