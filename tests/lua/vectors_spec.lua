-- Every shared scenario of tests/vectors/ through llm.call_llm.
--
-- Mirrors tests/c/test_vectors.c and tests/python/test_vectors.py: the
-- vector's `expect` plus the invariants every runner checks
-- (tests/vectors/README.md). One `it` per vector file, in sorted order, all
-- on one engine.

local H = require("helpers")
local llm = require("llmretry")
local lfs = require("lfs")
local json = H.json
local check = H.check

local OPTION_NAMES = {
  timeout_ms = true, max_retries = true, base_delay_ms = true, max_delay_ms = true,
  jitter = true, deadline_ms = true, retry_mode = true, retry_statuses = true,
  max_retry_after_ms = true, retry_invalid_response = true, max_response_bytes = true,
  idempotency_key = true, request_id = true, headers = true, idle_timeout_ms = true,
  retry_budget_ratio = true, retry_budget_min = true, breaker_failures = true,
  breaker_cooldown_ms = true, schema = true, endpoint = true,
}

local files = {}
for _, dir in ipairs({ "", "schema/" }) do
  local found = {}
  for entry in lfs.dir(H.VECTOR_DIR .. "/" .. dir) do
    if entry:match("%.json$") then found[#found + 1] = dir .. entry end
  end
  table.sort(found)
  for _, f in ipairs(found) do files[#files + 1] = f end
end

local function per_event(rec, name, field)
  local out = {}
  for _, e in ipairs(rec.of(name)) do out[#out + 1] = e[field] end
  return out
end

local function nullable(v)
  if v == json.null then return nil end
  return v
end

describe("shared vectors", function()
  local mock, engine

  setup(function()
    mock = H.start_mock()
    engine = llm.new_engine()
  end)

  teardown(function()
    if engine then engine:close() end
    if mock then mock:stop() end
  end)

  it("finds the vector files", function()
    check(#files >= 18, "only %d vectors in %s", #files, H.VECTOR_DIR)
  end)

  for _, file in ipairs(files) do
    local path = file:gsub("%.json$", "")
    local stem = path:gsub("^.*/", "")
    it(path, function()
      local vec = json.decode(H.read_file(H.VECTOR_DIR .. "/" .. file), 1, json.null)
      check(type(vec) == "table", "%s is not JSON", file)
      check(vec.name == stem, "name %s must equal the file name", tostring(vec.name))
      local exp, script = vec.expect, vec.script
      check(type(exp) == "table" and type(script) == "table", "expect/script missing")
      for _, key in ipairs({ "outcome", "events", "attempts", "requests", "status" }) do
        check(exp[key] ~= nil, "expect lacks %s", key)
      end
      local options = {}
      for k, v in pairs(vec.options or {}) do
        check(OPTION_NAMES[k], "unknown option %s", tostring(k))
        options[k] = v
      end

      mock:put_scenario(stem, script)
      local body = vec.body
      local rec = H.recorder()
      options.body = body
      options.base_url = mock:scenario_url(stem)
      options.api_key = H.SECRET_KEY
      options.logger = rec.fn
      options.engine = engine
      if exp.outcome == "invalid_argument" then
        -- Refused before any I/O, naming the mistake.
        local ok, msg = pcall(llm.call_llm, options)
        check(not ok and tostring(msg):find(exp.message_contains, 1, true),
          "expected an argument error with %s, got %s", exp.message_contains, tostring(msg))
        check(#rec.events == 0, "events for a refused call")
        check(#mock:requests(stem) == 0, "the server saw a request")
        return
      end
      local t0 = H.now_ms()
      local res, err = llm.call_llm(options)
      local wall = H.now_ms() - t0

      -- the result ---------------------------------------------------------
      local want_ok = exp.outcome == "ok"
      check((res ~= nil) == want_ok, "outcome: expected %s, got %s", exp.outcome,
        err and tostring(err) or "ok")
      check(want_ok or err ~= nil, "no error table with a nil result")
      local got = res and res.meta or err
      check(got.attempts == exp.attempts, "attempts %s, expected %s", tostring(got.attempts),
        tostring(exp.attempts))
      check(got.attempt == got.attempts - 1, "attempt %s", tostring(got.attempt))
      check(got.status == nullable(exp.status), "status %s, expected %s", H.dump(got.status),
        H.dump(nullable(exp.status)))
      check(type(got.request_id) == "string" and got.request_id ~= "", "request_id")
      check(got.model == "gpt-test", "model %s", H.dump(got.model))
      check(H.is_int(got.total_ms) and H.is_int(got.duration_ms), "total_ms/duration_ms types")
      check(got.total_ms >= got.duration_ms and got.duration_ms >= 0, "total_ms %d duration_ms %d",
        got.total_ms, got.duration_ms)
      if exp.min_total_ms then
        check(got.total_ms >= exp.min_total_ms, "total_ms %d < %d", got.total_ms, exp.min_total_ms)
      end
      if exp.max_total_ms then
        check(got.total_ms <= exp.max_total_ms, "total_ms %d > %d", got.total_ms, exp.max_total_ms)
        check(wall <= exp.max_total_ms, "wall %.0f ms > %d", wall, exp.max_total_ms)
      end
      if exp.request_id then
        check(got.request_id == exp.request_id, "request_id %s", got.request_id)
      end
      if exp.usage_total then
        check(H.same(got.usage_total, exp.usage_total), "usage_total %s", H.dump(got.usage_total))
      end

      if want_ok then
        check(type(res.data) == "table", "data is not the parsed JSON body")
        local object = exp.object or "chat.completion"
        check(res.data.object == object, "data.object %s", H.dump(res.data.object))
        check(type(res.body) == "string" and llm.decode(res.body).object == object,
          "res.body is not the raw body")
        check(H.is_int(res.meta.status) and res.meta.status >= 200 and res.meta.status < 300,
          "meta.status %s", H.dump(res.meta.status))
        if exp.content then
          local msg = res.data.choices[1].message
          check(msg.content == exp.content, "content %s, expected %s", H.dump(msg.content),
            H.dump(exp.content))
        end
        if exp.chunks then
          check(res.meta.stream == true and res.meta.chunks == exp.chunks, "chunks %s",
            H.dump(res.meta.chunks))
        end
        if exp.usage then
          check(H.same(res.meta.usage, exp.usage), "usage %s, expected %s", H.dump(res.meta.usage),
            H.dump(exp.usage))
        end
        if exp.response_model then
          check(res.meta.response_model == exp.response_model, "response_model %s",
            H.dump(res.meta.response_model))
        end
        if exp.system_fingerprint then
          check(res.meta.system_fingerprint == exp.system_fingerprint, "system_fingerprint %s",
            H.dump(res.meta.system_fingerprint))
        end
      else
        H.check_error(err, exp.error_kind, { reason = exp.reason })
        if exp.error_code then
          check(err.error_code == exp.error_code, "error_code %s", H.dump(err.error_code))
        end
        if exp.retry_after_ms then
          check(err.retry_after_ms == exp.retry_after_ms, "retry_after_ms %s",
            H.dump(err.retry_after_ms))
        end
        if exp.body_preview_contains then
          check(err.body_preview and err.body_preview:find(exp.body_preview_contains, 1, true),
            "body_preview %s", H.dump(err.body_preview))
        end
        check(H.same(err.validation_errors, exp.validation_errors), "validation_errors %s",
          H.dump(err.validation_errors))
      end

      -- the events ---------------------------------------------------------
      check(H.list_eq(rec.names(), exp.events), "events %s, expected %s", H.list_str(rec.names()),
        H.list_str(exp.events))
      if exp.delay_sources then
        local got_s = per_event(rec, "llm_retry_scheduled", "delay_source")
        check(H.list_eq(got_s, exp.delay_sources), "delay_sources %s", H.list_str(got_s))
      end
      if exp.delays_ms then
        local got_d = per_event(rec, "llm_retry_scheduled", "delay_ms")
        check(H.list_eq(got_d, exp.delays_ms), "delays_ms %s, expected %s", H.list_str(got_d),
          H.list_str(exp.delays_ms))
      end
      if exp.attempt_errors then
        local got_k = per_event(rec, "llm_request_error", "error_kind")
        check(H.list_eq(got_k, exp.attempt_errors), "attempt_errors %s", H.list_str(got_k))
      end
      local errors_seen = rec.of("llm_request_error")
      for i, e in ipairs(errors_seen) do
        local want = exp.validation_paths and nullable(exp.validation_paths[i])
        check(nullable(e.validation_path) == want, "validation_path %s, expected %s",
          H.dump(e.validation_path), H.dump(want))
      end
      if exp.validation_paths then
        check(#errors_seen == #exp.validation_paths, "%d error events", #errors_seen)
      end
      H.check_event_sequence(rec.events, got.attempts, got.request_id)
      if err then
        local gave_up = rec.of("llm_request_gave_up")
        gave_up = gave_up[#gave_up]
        check(gave_up.reason == err.reason, "gave_up.reason %s", tostring(gave_up.reason))
        check(gave_up.error_kind == err.kind, "gave_up.error_kind %s", tostring(gave_up.error_kind))
        check(gave_up.attempts == err.attempts, "gave_up.attempts %s", tostring(gave_up.attempts))
      else
        local succ = rec.of("llm_request_succeeded")
        succ = succ[#succ]
        check(succ.status == res.meta.status, "succeeded.status %s", tostring(succ.status))
        if exp.usage then
          check(H.same(succ.usage, exp.usage), "succeeded.usage %s", H.dump(succ.usage))
        end
      end

      local secrets = H.body_secrets(body)
      for _, ev in ipairs(rec.events) do H.check_no_secrets(secrets, ev) end
      if err then
        H.check_no_secrets(secrets, err, err.message, tostring(err))
      else
        H.check_no_secrets(secrets, res.meta)
      end

      -- what the server saw --------------------------------------------------
      local recs = mock:requests(stem)
      check(#recs == exp.requests, "server saw %d requests, expected %d", #recs, exp.requests)
      -- One attempt is one request, but for the engine's free re-sends.
      check(#recs == got.attempts + (exp.resends or 0), "one attempt must be one request")
      -- Sent as encoded, but a streaming table asks for its usage (docs/streaming.md).
      local sent_text, sent = llm.encode(body), body
      if body.stream == true and body.stream_options == nil then
        sent_text = sent_text:sub(1, -2) .. ',"stream_options":{"include_usage":true}}'
        sent = {}
        for k, v in pairs(body) do sent[k] = v end
        sent.stream_options = { include_usage = true }
      end
      H.check_requests(recs, got.request_id, sent_text, sent)
      for _, r in ipairs(recs) do
        for hname, value in pairs(exp.request_headers or {}) do
          check(r.headers[hname] == value, "header %s: %s", hname, H.dump(r.headers[hname]))
        end
        if options.idempotency_key == nil then
          check(r.headers["idempotency-key"] == nil, "an idempotency-key nobody asked for")
        end
      end
    end)
  end
end)
