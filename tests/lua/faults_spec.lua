-- The fault matrix through llm.call_llm against the mock server.
--
-- Status classes, every Retry-After form, x-should-retry, rate-limit resets,
-- insufficient_quota, delays and timeouts, stalls, resets, closes, truncated /
-- invalid / huge bodies, deadlines and unsafe mode. Each checks the error
-- table, the events (exact fields, invariants), what the server saw, and that
-- neither the key nor the prompt leaks anywhere (H.common).

local H = require("helpers")
local llm = require("llmretry")
local check = H.check

local RETRY_FLOW = { "llm_request_started", "llm_request_failed", "llm_retry_scheduled",
  "llm_request_started", "llm_request_succeeded" }
local ERROR_FLOW = { "llm_request_started", "llm_request_error", "llm_retry_scheduled",
  "llm_request_started", "llm_request_succeeded" }
local STOP_FLOW = { "llm_request_started", "llm_request_failed", "llm_request_gave_up" }

local function names_are(out, want)
  local got = out.events.names()
  check(H.list_eq(got, want), "events %s, expected %s", H.list_str(got), H.list_str(want))
end

local function field_is(out, ev, key, want)
  local got = out.events.field(ev, key)
  check(H.list_eq(got, want), "%s.%s = %s, expected %s", ev, key, H.list_str(got),
    H.list_str(want))
end

local function ok_result(out)
  check(out.ok, "expected success, got %s", tostring(out.err))
  return out.res
end

local function http_date(ts, form)
  if form == "imf" then return os.date("!%a, %d %b %Y %H:%M:%S GMT", ts) end
  if form == "rfc850" then return os.date("!%A, %d-%b-%y %H:%M:%S GMT", ts) end
  local day = tonumber(os.date("!%d", ts))
  return os.date("!%a %b ", ts) .. string.format("%2d", day) .. os.date("! %H:%M:%S %Y", ts)
end

describe("fault matrix", function()
  local mock

  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  -- Status classes ----------------------------------------------------------

  for _, status in ipairs({ 200, 201, 202 }) do
    it("treats " .. status .. " as success", function()
      local scen = mock:scen("ok" .. status)
      local out = H.run_call(scen, { { status = status, content = "hello" } })
      local res = ok_result(out)
      H.common(out, scen, 1)
      check(res.meta.status == status, "status %s", tostring(res.meta.status))
      check(res.data.choices[1].message.content == "hello", "content")
      names_are(out, { "llm_request_started", "llm_request_succeeded" })
      check(H.same(res.meta.usage, { prompt_tokens = 12, completion_tokens = 3,
        total_tokens = 15 }), "usage %s", H.dump(res.meta.usage))
      check(res.meta.response_model == "gpt-test", "response_model")
      check(res.meta.system_fingerprint == "fp_mock", "system_fingerprint")
    end)
  end

  it("retries a 204 without a body as an invalid response", function()
    local scen = mock:scen("s204")
    local out = H.run_call(scen, { { status = 204 } })
    local res = ok_result(out)
    H.common(out, scen, 2)
    names_are(out, ERROR_FLOW)
    field_is(out, "llm_request_error", "error_kind", { "invalid_response" })
    check(res.meta.status == 200, "status")
  end)

  it("does not follow a redirect", function()
    local scen = mock:scen("redirect")
    local out = H.run_call(scen, { { status = 302,
      headers = { Location = scen.url .. "/chat/completions" } } })
    H.check_error(out.err, "http_status", { reason = "not_retryable", attempts = 1, status = 302 })
    H.common(out, scen, 1)
    names_are(out, STOP_FLOW)
  end)

  for _, status in ipairs({ 400, 401, 403, 404, 409, 422, 501, 505 }) do
    it("does not retry " .. status, function()
      local scen = mock:scen("noretry" .. status)
      local out = H.run_call(scen, { { status = status } })
      local err = out.err
      H.check_error(err, "http_status", { reason = "not_retryable", attempts = 1, status = status })
      H.common(out, scen, 1)
      names_are(out, STOP_FLOW)
      check(err.error_code == "server_error", "error_code %s", H.dump(err.error_code))
      check(err.retry_after_ms == nil, "retry_after_ms %s", H.dump(err.retry_after_ms))
      check(err.body_preview and err.body_preview:find("mock error " .. status, 1, true),
        "body_preview %s", H.dump(err.body_preview))
      local failed = out.events.of("llm_request_failed")[1]
      check(failed.status == status, "failed.status")
      check(failed.retry_after == llm.null, "failed.retry_after %s", H.dump(failed.retry_after))
      check(failed.error_code == "server_error", "failed.error_code")
      check(failed.body_preview:find("mock error " .. status, 1, true), "failed.body_preview")
    end)
  end

  for _, status in ipairs({ 408, 429, 500, 502, 503, 504, 599 }) do
    it("retries " .. status .. " then succeeds", function()
      local scen = mock:scen("retry" .. status)
      local out = H.run_call(scen, { { status = status } })
      local res = ok_result(out)
      H.common(out, scen, 2)
      names_are(out, RETRY_FLOW)
      field_is(out, "llm_retry_scheduled", "delay_source", { "backoff" })
      field_is(out, "llm_retry_scheduled", "delay_ms", { 20 })
      check(res.meta.status == 200 and res.meta.attempt == 1, "meta %s", H.dump(res.meta))
    end)
  end

  it("gives up when retries are exhausted", function()
    local scen = mock:scen("exhausted")
    local out = H.run_call(scen, {}, { _after = { status = 500 } })
    H.check_error(out.err, "http_status", { reason = "retries_exhausted", attempts = 4,
      status = 500 })
    H.common(out, scen, 4)
    field_is(out, "llm_retry_scheduled", "delay_ms", { 20, 40, 80 })
    check(out.err.total_ms >= 140, "total_ms %d", out.err.total_ms)
  end)

  it("keeps the provider's error code", function()
    local scen = mock:scen("code")
    local out = H.run_call(scen, { { status = 400, error_code = "context_length_exceeded" } })
    H.check_error(out.err, "http_status", { reason = "not_retryable", attempts = 1, status = 400 })
    H.common(out, scen, 1)
    check(out.err.error_code == "context_length_exceeded", "error_code")
    check(out.events.of("llm_request_failed")[1].error_code == "context_length_exceeded",
      "event error_code")
  end)

  it("honours retry_statuses", function()
    local scen = mock:scen("custom418")
    local out = H.run_call(scen, { { status = 418 } }, { retry_statuses = { 418 } })
    ok_result(out)
    H.common(out, scen, 2)
    local other = mock:scen("custom503")
    out = H.run_call(other, { { status = 503 } }, { retry_statuses = { 429 } })
    H.check_error(out.err, "http_status", { reason = "not_retryable", attempts = 1, status = 503 })
    H.common(out, other, 1)
  end)

  for _, jitter in ipairs({ "additive", "full" }) do
    it("keeps " .. jitter .. " jitter within bounds", function()
      local scen = mock:scen("jitter_" .. jitter)
      local out = H.run_call(scen, {}, { _after = { status = 503 }, jitter = jitter })
      H.check_error(out.err, "http_status", { reason = "retries_exhausted", attempts = 4 })
      H.common(out, scen, 4)
      local delays = out.events.field("llm_retry_scheduled", "delay_ms")
      check(#delays == 3, "%d delays", #delays)
      for n, d in ipairs(delays) do
        local e = 20 * 2 ^ (n - 1)
        if jitter == "additive" then
          check(d >= e and d < e + 20, "additive delay %d: %d", n, d)
        else
          check(d >= 0 and d < e, "full delay %d: %d", n, d)
        end
      end
    end)
  end

  it("caps the backoff at max_delay_ms", function()
    local scen = mock:scen("cap")
    local out = H.run_call(scen, { { status = 500 }, { status = 500 }, { status = 500 } },
      { base_delay_ms = 50, max_delay_ms = 60 })
    ok_result(out)
    H.common(out, scen, 4)
    field_is(out, "llm_retry_scheduled", "delay_ms", { 50, 60, 60 })
  end)

  it("makes one attempt with max_retries 0", function()
    local scen = mock:scen("zero")
    local out = H.run_call(scen, { { status = 502 } }, { max_retries = 0 })
    H.check_error(out.err, "http_status", { reason = "retries_exhausted", attempts = 1,
      status = 502 })
    H.common(out, scen, 1)
  end)

  -- Retry-After and friends -------------------------------------------------

  local server_delays = {
    { "seconds_decimal", { status = 429, retry_after = "0.25" }, 250, "retry_after" },
    { "seconds_on_503", { status = 503, retry_after = "0.2" }, 200, "retry_after" },
    { "retry_after_ms", { status = 429, retry_after_ms = "120" }, 120, "retry_after" },
    { "ms_wins", { status = 429, retry_after_ms = "100", retry_after = "10" }, 100, "retry_after" },
    { "reset_requests", { status = 429, ratelimit_reset_requests = "200ms" }, 200,
      "ratelimit_reset" },
    { "reset_tokens", { status = 429, ratelimit_reset_tokens = "150ms" }, 150, "ratelimit_reset" },
    { "reset_later_of_two", { status = 429, ratelimit_reset_requests = "100ms",
      ratelimit_reset_tokens = "0.25s" }, 250, "ratelimit_reset" },
  }
  for _, case in ipairs(server_delays) do
    local id, step, delay, source = case[1], case[2], case[3], case[4]
    it("waits a server-given delay as is: " .. id, function()
      local scen = mock:scen(id)
      -- max_delay_ms 50, full jitter: a server value is neither capped nor jittered.
      local out = H.run_call(scen, { step }, { max_delay_ms = 50, jitter = "full" })
      local res = ok_result(out)
      H.common(out, scen, 2)
      names_are(out, RETRY_FLOW)
      field_is(out, "llm_retry_scheduled", "delay_source", { source })
      field_is(out, "llm_retry_scheduled", "delay_ms", { delay })
      check(res.meta.total_ms >= delay - 10, "total_ms %d", res.meta.total_ms)
      local recs = scen.requests()
      check(recs[2].time - recs[1].time >= (delay - 10) / 1000, "requests %.3f s apart",
        recs[2].time - recs[1].time)
      if step.retry_after and not step.retry_after_ms then
        check(out.events.of("llm_request_failed")[1].retry_after == step.retry_after,
          "failed.retry_after")
      end
    end)
  end

  for _, case in ipairs({ { "garbage", "soon-ish" }, { "zero", "0" }, { "negative", "-5" },
    { "empty", "" }, { "past_date", "Wed, 21 Oct 2015 07:28:00 GMT" } }) do
    it("falls back to backoff on an unusable Retry-After: " .. case[1], function()
      local scen = mock:scen("unusable_" .. case[1])
      local out = H.run_call(scen, { { status = 429, retry_after = case[2] } })
      ok_result(out)
      H.common(out, scen, 2)
      field_is(out, "llm_retry_scheduled", "delay_source", { "backoff" })
      field_is(out, "llm_retry_scheduled", "delay_ms", { 20 })
    end)
  end

  it("ignores x-ratelimit-reset on a 503", function()
    local scen = mock:scen("reset503")
    local out = H.run_call(scen, { { status = 503, ratelimit_reset_requests = "5s" } })
    ok_result(out)
    H.common(out, scen, 2)
    field_is(out, "llm_retry_scheduled", "delay_source", { "backoff" })
    field_is(out, "llm_retry_scheduled", "delay_ms", { 20 })
  end)

  for _, form in ipairs({ "imf", "rfc850", "asctime" }) do
    it("parses a Retry-After HTTP-date (" .. form .. ")", function()
      local scen = mock:scen("date_" .. form)
      local value = http_date(os.time() + 100, form)
      local out = H.run_call(scen, { { status = 429, retry_after = value } },
        { max_retry_after_ms = 10000 })
      H.check_error(out.err, "http_status", { reason = "retry_after_too_long", attempts = 1,
        status = 429 })
      H.common(out, scen, 1)
      check(out.err.retry_after_ms and out.err.retry_after_ms >= 95000
        and out.err.retry_after_ms <= 101000, "%s: retry_after_ms %s", value,
        H.dump(out.err.retry_after_ms))
      check(out.events.of("llm_request_failed")[1].retry_after == value, "failed.retry_after")
      check(out.err.total_ms < 3000, "total_ms %d", out.err.total_ms)
    end)
  end

  it("ends the call on a Retry-After above max_retry_after_ms", function()
    local scen = mock:scen("too_long")
    local out = H.run_call(scen, { { status = 429, retry_after = "30" } },
      { max_retry_after_ms = 1000 })
    H.check_error(out.err, "http_status", { reason = "retry_after_too_long", attempts = 1,
      status = 429 })
    H.common(out, scen, 1)
    check(out.err.retry_after_ms == 30000, "retry_after_ms %s", H.dump(out.err.retry_after_ms))
    check(out.err.total_ms < 3000, "total_ms")
    names_are(out, STOP_FLOW)
  end)

  it("ends the call on a rate-limit reset above max_retry_after_ms", function()
    local scen = mock:scen("reset_too_long")
    local out = H.run_call(scen, { { status = 429, ratelimit_reset_tokens = "6m0s" } },
      { max_retry_after_ms = 10000 })
    H.check_error(out.err, "http_status", { reason = "retry_after_too_long", attempts = 1 })
    H.common(out, scen, 1)
  end)

  -- x-should-retry, insufficient_quota ------------------------------------

  for _, case in ipairs({ { 400, "true" }, { 422, "True" }, { 501, "true" } }) do
    it("retries " .. case[1] .. " with x-should-retry: " .. case[2], function()
      local scen = mock:scen("should_true_" .. case[1])
      local out = H.run_call(scen, { { status = case[1], should_retry = case[2] } })
      ok_result(out)
      H.common(out, scen, 2)
      names_are(out, RETRY_FLOW)
    end)
  end

  for _, status in ipairs({ 429, 500, 503 }) do
    it("does not retry " .. status .. " with x-should-retry: false", function()
      local scen = mock:scen("should_false_" .. status)
      local out = H.run_call(scen, { { status = status, should_retry = "false" } })
      H.check_error(out.err, "http_status", { reason = "not_retryable", attempts = 1,
        status = status })
      H.common(out, scen, 1)
    end)
  end

  it("stops on insufficient_quota", function()
    local scen = mock:scen("quota")
    local out = H.run_call(scen, { { status = 429, error_code = "insufficient_quota",
      retry_after = "1" } })
    H.check_error(out.err, "http_status", { reason = "not_retryable", attempts = 1, status = 429 })
    H.common(out, scen, 1)
    check(out.err.error_code == "insufficient_quota", "error_code")
    check(out.err.total_ms < 900, "total_ms %d", out.err.total_ms)
    check((out.err.body_preview or ""):find("insufficient_quota", 1, true), "body_preview")
  end)

  it("retries a 429 with another code", function()
    local scen = mock:scen("ratelimit_code")
    local out = H.run_call(scen, { { status = 429, error_code = "rate_limit_exceeded" } })
    ok_result(out)
    H.common(out, scen, 2)
  end)

  -- Delays, timeouts, stalls, broken connections and bodies ---------------

  it("waits for a slow answer within the timeout", function()
    local scen = mock:scen("slow")
    local out = H.run_call(scen, { { delay_ms = 200 } }, { timeout_ms = 3000 })
    local res = ok_result(out)
    H.common(out, scen, 1)
    check(res.meta.duration_ms >= 180, "duration_ms %d", res.meta.duration_ms)
  end)

  it("retries an attempt timeout", function()
    local scen = mock:scen("attempt_timeout")
    local out = H.run_call(scen, { { delay_ms = 1500 } }, { timeout_ms = 300 })
    local res = ok_result(out)
    H.common(out, scen, 2)
    names_are(out, ERROR_FLOW)
    field_is(out, "llm_request_error", "error_kind", { "timeout" })
    check(out.events.of("llm_request_started")[1].timeout_ms == 300, "started.timeout_ms")
    check(res.meta.total_ms >= 290 and res.meta.total_ms < 1400, "total_ms %d", res.meta.total_ms)
  end)

  it("gives up after timeouts", function()
    local scen = mock:scen("timeouts")
    local out = H.run_call(scen, {}, { _after = { delay_ms = 1500 }, timeout_ms = 300,
      max_retries = 1 })
    H.check_error(out.err, "timeout", { reason = "retries_exhausted", attempts = 2,
      status = false })
    H.common(out, scen, 2)
    field_is(out, "llm_request_error", "error_kind", { "timeout", "timeout" })
    check(out.wall_ms >= 550 and out.wall_ms < 3000, "wall %.0f", out.wall_ms)
  end)

  for _, fault in ipairs({ "stall_body", "no_headers" }) do
    it("times out a stall (" .. fault .. ")", function()
      local scen = mock:scen("stall_" .. fault)
      local out = H.run_call(scen, { { fault = fault, stall_ms = 3000 } },
        { timeout_ms = 500, max_retries = 0 })
      local o = { reason = "retries_exhausted", attempts = 1 }
      if fault == "no_headers" then o.status = false end -- no response ever came
      H.check_error(out.err, "timeout", o)
      H.common(out, scen, 1)
      check(out.wall_ms >= 450 and out.wall_ms < 2000, "wall %.0f", out.wall_ms)
      field_is(out, "llm_request_error", "error_kind", { "timeout" })
    end)
  end

  it("times out a trickle (the timeout covers the whole transfer)", function()
    local scen = mock:scen("trickle")
    local out = H.run_call(scen, { { fault = "trickle", interval_ms = 50 } },
      { timeout_ms = 600, max_retries = 0 })
    H.check_error(out.err, "timeout", { reason = "retries_exhausted", attempts = 1 })
    H.common(out, scen, 1)
    check(out.wall_ms < 2000, "wall %.0f", out.wall_ms)
  end)

  for _, fault in ipairs({ "reset", "close", "truncate" }) do
    it("retries a broken connection (" .. fault .. ")", function()
      local scen = mock:scen("broken_" .. fault)
      local fresh = llm.new_engine()    -- see "gives up on broken connections"
      local out = H.run_call(scen, { { fault = fault } }, { engine = fresh })
      fresh:close()
      ok_result(out)
      H.common(out, scen, 2)
      names_are(out, ERROR_FLOW)
      field_is(out, "llm_request_error", "error_kind", { "network" })
    end)

    it("gives up on broken connections (" .. fault .. ")", function()
      local scen = mock:scen("broken_all_" .. fault)
      -- A fresh engine: on a reused keep-alive connection the same fault is
      -- retried at once, without a backoff (below, tests/c/test_resend.c).
      local fresh = llm.new_engine()
      local out = H.run_call(scen, {}, { _after = { fault = fault }, max_retries = 2,
        engine = fresh })
      fresh:close()
      local o = { reason = "retries_exhausted", attempts = 3 }
      if fault ~= "truncate" then o.status = false end -- no status line was read
      H.check_error(out.err, "network", o)
      H.common(out, scen, 3)
      field_is(out, "llm_request_error", "error_kind", { "network", "network", "network" })
    end)
  end

  -- Requests the server may have seen: at most 1 + max_retries (issue 27
  -- item 6). The server reads each request after the first and resets the
  -- connection unanswered (a proxy dropping generations it started, each
  -- billed); the first such request goes out on the first call's kept-alive
  -- connection, which libcurl would send again by itself (before: a free
  -- re-send, 4 requests for max_retries = 2).
  for _, mode in ipairs({ "safe", "unsafe" }) do
    it("bounds what a server resetting after each read saw (" .. mode .. ")", function()
      local scen = mock:scen("reset_after_read_" .. mode)
      scen.script({ {} }, { fault = "reset" })
      local own = llm.new_engine()    -- its own connections: the first call's is reused
      ok_result(H.run_call(scen, nil, { engine = own }))
      local out = H.run_call(scen, nil, { engine = own, max_retries = 2, retry_mode = mode })
      own:close()
      local recs = scen.requests()
      check(type(recs[1].connection) == "number" and recs[2].connection == recs[1].connection,
        "not the kept-alive connection")
      if mode == "unsafe" then
        H.check_error(out.err, "network", { reason = "unsafe_mode", attempts = 1, status = false })
        check(#recs == 1 + 1, "the server saw %d requests for 1 attempt", #recs - 1)
      else
        H.check_error(out.err, "network", { reason = "retries_exhausted", attempts = 3,
          status = false })
        check(#recs == 1 + 3, "the server saw %d requests for 3 attempts", #recs - 1)
        -- The lost written request is retried at once, the next one (a new
        -- connection, a plain network error) after the backoff.
        field_is(out, "llm_retry_scheduled", "delay_ms", { 0, 40 })
      end
      check(out.err.resends == 0, "%s free re-sends", tostring(out.err.resends))
    end)

    -- A kept-alive connection the server closed while it idled (uvicorn's
    -- 5 s keep-alive timeout; here 20 ms) never carries the next request.
    it("spends no attempt on a connection closed while idle (" .. mode .. ")", function()
      local scen = mock:scen("idle_closed_" .. mode)
      scen.script({ { idle_close_ms = 20 } })
      local own = llm.new_engine()
      ok_result(H.run_call(scen, nil, { engine = own }))
      check(H.wait_until(function() return scen.requests()[1].idle_closed == true end),
        "the mock never closed the idle connection")
      local out = H.run_call(scen, nil, { engine = own, retry_mode = mode })
      own:close()
      ok_result(out)
      check(out.res.meta.attempts == 1, "%s attempts", tostring(out.res.meta.attempts))
      names_are(out, { "llm_request_started", "llm_request_succeeded" })
      local recs = scen.requests()
      check(#recs == 2, "the server saw %d requests", #recs)
      check(recs[2].connection ~= recs[1].connection, "sent on the closed connection")
    end)
  end

  for _, mode in ipairs({ "safe", "unsafe" }) do
    it("retries a refused connection in " .. mode .. " mode (never sent)", function()
      local rec = H.recorder()
      local opts = H.merge(H.FAST, { body = { model = "gpt-test", messages = {} },
        base_url = string.format("http://127.0.0.1:%d/v1", H.closed_port()),
        api_key = H.SECRET_KEY, logger = rec.fn, retry_mode = mode, max_retries = 2 })
      local res, err = llm.call_llm(opts)
      check(res == nil, "a refused connection succeeded")
      H.check_error(err, "network", { reason = "retries_exhausted", attempts = 3, status = false })
      local n = 0
      for _, name in ipairs(rec.names()) do if name == "llm_request_error" then n = n + 1 end end
      check(n == 3, "%d request_error events", n)
    end)
  end

  it("retries invalid JSON", function()
    local scen = mock:scen("invalid_json")
    local out = H.run_call(scen, { { fault = "invalid_json" } })
    ok_result(out)
    H.common(out, scen, 2)
    field_is(out, "llm_request_error", "error_kind", { "invalid_response" })
  end)

  it("gives up on invalid JSON", function()
    local scen = mock:scen("invalid_json_all")
    local out = H.run_call(scen, {}, { _after = { fault = "invalid_json" }, max_retries = 1 })
    H.check_error(out.err, "invalid_response", { reason = "retries_exhausted", attempts = 2,
      status = 200 })
    H.common(out, scen, 2)
  end)

  it("does not retry invalid JSON with retry_invalid_response = false", function()
    local scen = mock:scen("invalid_json_once")
    local out = H.run_call(scen, { { fault = "invalid_json" } }, { retry_invalid_response = false })
    H.check_error(out.err, "invalid_response", { reason = "not_retryable", attempts = 1,
      status = 200 })
    H.common(out, scen, 1)
    names_are(out, { "llm_request_started", "llm_request_error", "llm_request_gave_up" })
  end)

  it("fails a huge body as response_too_large, not retried", function()
    local scen = mock:scen("huge")
    local out = H.run_call(scen, { { fault = "huge", size = 2 * 1024 * 1024 } },
      { max_response_bytes = 1024 * 1024 })
    H.check_error(out.err, "response_too_large", { reason = "not_retryable", attempts = 1 })
    H.common(out, scen, 1)
    field_is(out, "llm_request_error", "error_kind", { "response_too_large" })
    check(out.wall_ms < 5000, "wall %.0f", out.wall_ms)
  end)

  it("takes a large body within max_response_bytes", function()
    local scen = mock:scen("large_ok")
    local size = 3 * 1024 * 1024
    local out = H.run_call(scen, { { fault = "huge", size = size, content = "BIG" } },
      { max_response_bytes = 4 * 1024 * 1024 })
    local res = ok_result(out)
    H.common(out, scen, 1)
    local content = res.data.choices[1].message.content
    check(content:sub(1, 3) == "BIG" and #content > size - 1000, "content of %d bytes", #content)
  end)

  -- Deadlines ----------------------------------------------------------------

  it("cuts an attempt at the deadline", function()
    local scen = mock:scen("deadline_attempt")
    local out = H.run_call(scen, { { delay_ms = 2000 } }, { deadline_ms = 300 })
    H.check_error(out.err, "deadline_exceeded", { reason = "deadline", attempts = 1 })
    H.common(out, scen, 1)
    check(out.wall_ms >= 250 and out.wall_ms < 1500, "wall %.0f", out.wall_ms)
    local started = out.events.of("llm_request_started")[1]
    check(started.timeout_ms > 0 and started.timeout_ms <= 300, "timeout_ms %d", started.timeout_ms)
    check(H.is_int(started.deadline_left_ms) and started.deadline_left_ms > 0
      and started.deadline_left_ms <= 300, "deadline_left_ms %s", H.dump(started.deadline_left_ms))
  end)

  it("stops at once when the server's wait passes the deadline", function()
    local scen = mock:scen("deadline_wait")
    local out = H.run_call(scen, { { status = 429, retry_after = "2" } }, { deadline_ms = 500 })
    H.check_error(out.err, "deadline_exceeded", { reason = "deadline", attempts = 1, status = 429 })
    H.common(out, scen, 1)
    check(out.err.retry_after_ms == 2000, "retry_after_ms %s", H.dump(out.err.retry_after_ms))
    check(out.wall_ms < 450, "wall %.0f", out.wall_ms)
    names_are(out, STOP_FLOW)
  end)

  it("stops when the backoff passes the deadline", function()
    local scen = mock:scen("deadline_backoff")
    local out = H.run_call(scen, {}, { _after = { status = 500 }, base_delay_ms = 300,
      max_delay_ms = 10000, deadline_ms = 800 })
    H.check_error(out.err, "deadline_exceeded", { reason = "deadline", attempts = 2, status = 500 })
    H.common(out, scen, 2)
    field_is(out, "llm_retry_scheduled", "delay_ms", { 300 })
    check(out.wall_ms < 800, "wall %.0f", out.wall_ms)
  end)

  it("has no deadline by default", function()
    local scen = mock:scen("no_deadline")
    local out = H.run_call(scen, { {} })
    ok_result(out)
    local started = out.events.of("llm_request_started")[1]
    check(started.deadline_left_ms == llm.null, "deadline_left_ms %s",
      H.dump(started.deadline_left_ms))
    check(started.timeout_ms == H.FAST.timeout_ms, "timeout_ms %d", started.timeout_ms)
  end)

  -- Unsafe mode ----------------------------------------------------------------

  local unsafe_cases = {
    { "503", { status = 503 }, "http_status" },
    { "429", { status = 429, retry_after = "0" }, "http_status" },
    { "reset", { fault = "reset" }, "network" },
    { "invalid_json", { fault = "invalid_json" }, "invalid_response" },
    { "timeout", { delay_ms = 1500 }, "timeout" },
  }
  for _, case in ipairs(unsafe_cases) do
    it("never resends in unsafe mode: " .. case[1], function()
      local scen = mock:scen("unsafe_" .. case[1])
      local out = H.run_call(scen, { case[2] }, { retry_mode = "unsafe", timeout_ms = 400 })
      H.check_error(out.err, case[3], { reason = "unsafe_mode", attempts = 1 })
      H.common(out, scen, 1)
      for _, name in ipairs(out.events.names()) do
        check(name ~= "llm_retry_scheduled", "a retry was scheduled in unsafe mode")
      end
    end)
  end

  it("succeeds in unsafe mode", function()
    local scen = mock:scen("unsafe_ok")
    local out = H.run_call(scen, { {} }, { retry_mode = "unsafe" })
    ok_result(out)
    H.common(out, scen, 1)
  end)

  -- Request ids, idempotency keys, headers, url ---------------------------

  it("sends the request id and idempotency key on every attempt", function()
    local scen = mock:scen("ids")
    local out = H.run_call(scen, { { status = 500 }, { status = 502 } },
      { request_id = "req-lua-0001", idempotency_key = "idem-lua-1" })
    local res = ok_result(out)
    H.common(out, scen, 3)
    check(res.meta.request_id == "req-lua-0001", "request_id")
    for _, r in ipairs(scen.requests()) do
      check(r.headers["x-client-request-id"] == "req-lua-0001", "x-client-request-id")
      check(r.headers["idempotency-key"] == "idem-lua-1", "idempotency-key")
    end
    for _, ev in ipairs(out.events.events) do
      check(ev.request_id == "req-lua-0001", "event request_id %s", ev.request_id)
    end
  end)

  it("makes distinct UUID v4 request ids", function()
    local scen = mock:scen("uuids")
    local seen = {}
    for _ = 1, 3 do
      local out = H.run_call(scen, { {} })
      local rid = ok_result(out).meta.request_id
      check(rid:match("^%x%x%x%x%x%x%x%x%-%x%x%x%x%-4%x%x%x%-[89ab]%x%x%x%-%x+$") and #rid == 36,
        "not a UUID v4: %s", rid)
      check(not seen[rid], "request id %s repeated", rid)
      seen[rid] = true
    end
  end)

  it("puts the request id on errors", function()
    local scen = mock:scen("rid_err")
    local out = H.run_call(scen, { { status = 400 } }, { request_id = "req-err-7" })
    check(out.err.request_id == "req-err-7", "request_id")
    check(tostring(out.err):find("req-err-7", 1, true), "tostring lacks the request id")
    check(scen.requests()[1].headers["x-client-request-id"] == "req-err-7", "header")
  end)

  it("sends the caller's headers on every attempt", function()
    local scen = mock:scen("headers")
    local out = H.run_call(scen, { { status = 503 } },
      { headers = { ["X-Custom-Trace"] = "trace-42", ["OpenAI-Organization"] = "org-x" } })
    ok_result(out)
    H.common(out, scen, 2)
    for _, r in ipairs(scen.requests()) do
      check(r.headers["x-custom-trace"] == "trace-42", "x-custom-trace")
      check(r.headers["openai-organization"] == "org-x", "openai-organization")
    end
  end)

  it("uses a full url as is", function()
    local scen = mock:scen("full_url")
    local res, err = llm.call_llm({ body = { model = "gpt-test", messages = {} },
      url = scen.url .. "/chat/completions", api_key = H.SECRET_KEY })
    check(res, "error %s", tostring(err))
    local recs = scen.requests()
    check(#recs == 1, "%d requests", #recs)
    check(recs[1].path:find("/v1/chat/completions$"), "path %s", recs[1].path)
    check(not recs[1].path:find("/chat/completions/chat/completions", 1, true), "path doubled")
  end)

  it("sends a JSON string body byte for byte", function()
    local scen = mock:scen("string_body")
    local text = '{"model": "gpt-str", "messages": [{"role": "user", "content": "h\\u00e9"}]}'
    local res, err = llm.call_llm({ body = text, base_url = scen.url, api_key = H.SECRET_KEY })
    check(res, "error %s", tostring(err))
    check(res.meta.model == "gpt-str", "model from a string body: %s", H.dump(res.meta.model))
    check(scen.requests()[1].body == text, "body changed on the way")
  end)

  it("names the call by a table body's model, as by a string body's", function()
    local scen = mock:scen("table_body_model")
    local model = "gpt-caf\195\169 \"q\""
    local res, err = llm.call_llm({ body = { model = model, messages = {} }, base_url = scen.url,
      api_key = H.SECRET_KEY })
    check(res, "error %s", tostring(err))
    check(res.meta.model == model, "model from a table body: %s", H.dump(res.meta.model))
    -- not a string: no model, as when the core reads the text
    res, err = llm.call_llm({ body = { model = 7, messages = {} }, base_url = scen.url,
      api_key = H.SECRET_KEY })
    check(res, "error %s", tostring(err))
    check(res.meta.model == nil, "model 7 named the call: %s", H.dump(res.meta.model))
    -- the model option wins over the body's
    res, err = llm.call_llm({ body = { model = "in-body", messages = {} }, model = "opt",
      base_url = scen.url, api_key = H.SECRET_KEY })
    check(res, "error %s", tostring(err))
    check(res.meta.model == "opt", "model option lost: %s", H.dump(res.meta.model))
  end)

  it("encodes a table body as JSON with arrays, objects, null and UTF-8", function()
    local scen = mock:scen("table_body")
    local body = { model = "gpt-test", messages = { { role = "user", content = "caf\195\169" } },
      stop = llm.null, tools = setmetatable({}, llm.array_mt), extra = {}, n = 2, t = 0.5,
      flag = true }
    local res, err = llm.call_llm({ body = body, base_url = scen.url, api_key = H.SECRET_KEY })
    check(res, "error %s", tostring(err))
    local sent = H.json.decode(scen.requests()[1].body, 1, H.json.null)
    check(sent.messages[1].content == "caf\195\169", "content %s", H.dump(sent.messages[1]))
    check(sent.stop == H.json.null, "stop is not null")
    check(type(sent.tools) == "table" and next(sent.tools) == nil
      and getmetatable(sent.tools).__jsontype == "array", "tools is not []")
    check(getmetatable(sent.extra).__jsontype == "object", "extra is not {}")
    check(sent.n == 2 and sent.t == 0.5 and sent.flag == true, "scalars %s", H.dump(sent))
    check(scen.requests()[1].body:find('"n":2[,}]'), "integer written as a float: %s",
      scen.requests()[1].body)
  end)

  -- Secrets across every kind of outcome ------------------------------------

  local secret_cases = {
    { "ok", { {} }, {} },
    { "400", { { status = 400 } }, {} },
    { "429", { { status = 429, retry_after = "0.05" } }, {} },
    { "timeout", { { delay_ms = 1000 } }, { timeout_ms = 200, max_retries = 0 } },
    { "reset", { { fault = "reset" } }, { max_retries = 0 } },
    { "invalid", { { fault = "invalid_json" } }, { retry_invalid_response = false } },
    { "deadline", { { delay_ms = 1000 } }, { deadline_ms = 200 } },
  }
  for _, case in ipairs(secret_cases) do
    it("leaks no key or prompt: " .. case[1], function()
      local scen = mock:scen("secret_" .. case[1])
      local out = H.run_call(scen, case[2], case[3])
      H.check_outcome_secrets(out)
      if out.err then
        H.check_no_secrets(H.body_secrets(out.body), tostring(out.err), out.err.body_preview)
      end
    end)
  end
end)
