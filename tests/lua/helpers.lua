-- Shared helpers of the Lua suite (busted, under lua5.4 and luajit).
--
-- The mock server is the Python package's llmretry.testing, started as a
-- subprocess (`python3 -m llmretry.testing --port 0`); scenarios are scripted
-- through its control API with the curl CLI (tests/mock_protocol.md).
-- JSON for the test side (vectors, control API) is dkjson, so the checks do
-- not depend on the encoder under test.
--
-- Secrets: every call made through these helpers uses the key SECRET_KEY and
-- prompts "SECRET-PROMPT-..."; check_no_secrets looks for them anywhere.

local json = require("dkjson")
local system = require("system")
local llm = require("llmretry")

local H = {}

H.json = json
H.llm = llm
H.SECRET_KEY = "sk-test-SECRET-KEY-123"
H.FAST = { timeout_ms = 5000, max_retries = 3, base_delay_ms = 20, max_delay_ms = 1000,
  jitter = "none" }
H.IS_54 = math.type ~= nil

local function repo_root()
  local env = os.getenv("LLMRETRY_REPO")
  if env and env ~= "" then return env end
  local src = debug.getinfo(1, "S").source:gsub("^@", "")
  local dir = src:match("^(.*)/tests/lua/[^/]*$")
  if dir and dir ~= "" then return dir end
  return "."
end
H.REPO = repo_root()
H.VECTOR_DIR = H.REPO .. "/tests/vectors"

-- ---------------------------------------------------------------------------
-- Small utilities

function H.now_ms() return system.gettime() * 1000.0 end
-- A bare sleep is for time that must pass (a client's own timeout, cooldown
-- or deadline, a look for something that must not come); to wait for
-- something to happen, use H.wait_until.
function H.sleep_ms(ms) system.sleep(ms / 1000.0) end

-- Poll cond() every 10 ms until it gives a true value (returned) or
-- timeout_ms (default 10 s: a loaded machine is slow, not wrong) pass; then
-- its last, false value.
function H.wait_until(cond, timeout_ms)
  local deadline = H.now_ms() + (timeout_ms or 10000)
  while true do
    local got = cond()
    if got or H.now_ms() > deadline then return got end
    H.sleep_ms(10)
  end
end

local function fail(level, fmt, ...)
  error(string.format(fmt, ...), level + 1)
end

-- check(cond, fmt, ...): raise a test failure naming what went wrong.
function H.check(cond, fmt, ...)
  if not cond then fail(2, fmt or "check failed", ...) end
  return cond
end
local check = H.check

function H.shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
local q = H.shell_quote

function H.read_file(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

function H.write_file(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

function H.is_int(v)
  if type(v) ~= "number" then return false end
  if math.type then return math.type(v) == "integer" end
  return v == math.floor(v)
end

function H.is_null(v) return v == llm.null end

-- A deterministic dump of any value (events hold llm.null, a lightuserdata,
-- that no JSON encoder takes): for secret checks and failure messages.
function H.dump(v, seen)
  seen = seen or {}
  local t = type(v)
  if t == "string" then return string.format("%q", v) end
  if t ~= "table" then
    if v == llm.null then return "null" end
    return tostring(v)
  end
  if seen[v] then return "<cycle>" end
  seen[v] = true
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  local parts = {}
  for _, k in ipairs(keys) do
    parts[#parts + 1] = tostring(k) .. "=" .. H.dump(v[k], seen)
  end
  seen[v] = nil
  return "{" .. table.concat(parts, ", ") .. "}"
end

-- Deep equality of plain data (tables by content, metatables ignored).
function H.same(a, b)
  if type(a) ~= type(b) then return false end
  if type(a) ~= "table" then return a == b end
  for k, v in pairs(a) do
    if not H.same(v, b[k]) then return false end
  end
  for k in pairs(b) do
    if a[k] == nil then return false end
  end
  return true
end

function H.list_eq(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

function H.list_str(a)
  local parts = {}
  for i = 1, #a do parts[i] = tostring(a[i]) end
  return "[" .. table.concat(parts, ", ") .. "]"
end

-- A JSON object marker for dkjson (an empty Lua table encodes as []).
function H.obj(t) return setmetatable(t or {}, { __jsontype = "object" }) end

local function steps_json(steps)
  local out = {}
  for i, s in ipairs(steps or {}) do
    if next(s) == nil then out[i] = H.obj() else out[i] = s end
  end
  return setmetatable(out, { __jsontype = "array" })
end

-- ---------------------------------------------------------------------------
-- The mock server

-- Helper processes (the mock, curl) run without a sanitizer preloaded into
-- the interpreter under test: an LD_PRELOADed libasan hangs curl at start.
H.CLEAN_ENV = "env -u LD_PRELOAD -u ASAN_OPTIONS -u UBSAN_OPTIONS "

local Mock = {}
Mock.__index = Mock

-- Start the mock; `scenarios` (optional): name -> {steps=, after=} loaded at start.
function H.start_mock(scenarios)
  local file = os.tmpname()
  local sc = H.obj()
  for name, s in pairs(scenarios or {}) do
    sc[name] = H.obj({ steps = steps_json(s.steps), after = s.after })
  end
  H.write_file(file, json.encode(sc))
  local log = os.tmpname()
  -- `exec` keeps the shell's pid for the server's (timeout's) own; timeout
  -- bounds a server a crashed test run would leave behind, and forwards
  -- SIGTERM to it.
  local cmd = string.format(
    "cd %s && echo $$ && PYTHONPATH=%s exec " .. H.CLEAN_ENV
      .. "timeout -s TERM 1200 python3 -m llmretry.testing "
      .. "--host 127.0.0.1 --port 0 --scenarios %s 2>>%s",
    q(H.REPO), q(H.REPO .. "/python"), q(file), q(log))
  local p = assert(io.popen(cmd, "r"))
  local pid = p:read("*l")
  local port = p:read("*l")
  if not (pid and port and tonumber(port)) then
    p:close()
    error("the mock server did not start: " .. tostring(H.read_file(log)))
  end
  local m = setmetatable({ pipe = p, pid = tonumber(pid), port = tonumber(port),
    scenario_file = file, log = log, counter = 0 }, Mock)
  m.base_url = string.format("http://127.0.0.1:%d/v1", m.port)
  m.root = string.format("http://127.0.0.1:%d", m.port)
  return m
end

function Mock:stop()
  if not self.pipe then return end
  os.execute("kill -TERM " .. self.pid .. " 2>/dev/null")
  self.pipe:close()
  self.pipe = nil
  os.remove(self.scenario_file)
  os.remove(self.log)
end

function Mock:scenario_url(name)
  return string.format("http://127.0.0.1:%d/s/%s/v1", self.port, name)
end

-- curl: method, path, optional body text -> status code, response text
function Mock:http(method, path, body)
  local bodyfile
  local data = ""
  if body then
    bodyfile = os.tmpname()
    H.write_file(bodyfile, body)
    data = " -H 'Content-Type: application/json' --data-binary @" .. q(bodyfile)
  end
  local out = os.tmpname()
  local cmd = string.format(H.CLEAN_ENV .. "curl -sS -m 20 -o %s -w '%%{http_code}' -X %s%s %s",
    q(out), method, data, q(self.root .. path))
  local p = assert(io.popen(cmd, "r"))
  local code = p:read("*a")
  p:close()
  local text = H.read_file(out)
  os.remove(out)
  if bodyfile then os.remove(bodyfile) end
  return tonumber(code), text
end

-- PUT a scenario. `script` is {steps=, after=} (from a vector: dkjson tables).
function Mock:put_scenario(name, script)
  local doc = H.obj({ steps = steps_json(script.steps), after = script.after })
  local code, text = self:http("PUT", "/_mock/scenarios/" .. name, json.encode(doc))
  check(code == 204, "PUT scenario %s: HTTP %s %s", name, tostring(code), text)
end

function Mock:script(name, steps, after)
  self:put_scenario(name, { steps = steps, after = after })
end

function Mock:requests(name)
  local code, text = self:http("GET", "/_mock/requests/" .. name)
  check(code == 200, "GET requests %s: HTTP %s", name, tostring(code))
  local recs = json.decode(text)
  check(type(recs) == "table", "requests of %s are not JSON: %s", name, text)
  return recs
end

function Mock:connections_accepted()
  local _, text = self:http("GET", "/_mock/connections")
  return json.decode(text).accepted
end

-- A fresh scenario name (scripted empty: plain success) for one test.
function Mock:scen(hint)
  self.counter = self.counter + 1
  local name = (hint or "t"):lower():gsub("[^a-z0-9_]+", "_"):sub(1, 40)
    .. "_" .. self.counter
  local s = { mock = self, name = name, url = self:scenario_url(name) }
  function s.script(steps, after) self:script(name, steps, after); return s end
  function s.requests() return self:requests(name) end
  function s.wait_requests(n, timeout_ms)
    local recs
    H.wait_until(function()
      recs = self:requests(name)
      return #recs >= n
    end, timeout_ms)
    return recs
  end
  s.script({})
  return s
end

-- ---------------------------------------------------------------------------
-- Bodies, events, loggers

function H.secret_body(tag, model)
  return {
    model = model or "gpt-test",
    messages = {
      { role = "system", content = "SECRET-SYSTEM-" .. tag },
      { role = "user", content = "SECRET-PROMPT-" .. tag },
    },
  }
end

function H.body_secrets(body)
  local out = { H.SECRET_KEY }
  if type(body) == "table" and type(body.messages) == "table" then
    for _, m in ipairs(body.messages) do
      if type(m) == "table" and type(m.content) == "string" and m.content ~= "" then
        out[#out + 1] = m.content
      end
    end
  end
  return out
end

-- A logger recording each event.
function H.recorder()
  local r = { events = {} }
  r.fn = function(ev) r.events[#r.events + 1] = ev end
  function r.names()
    local out = {}
    for i, e in ipairs(r.events) do out[i] = e.event end
    return out
  end
  function r.of(name)
    local out = {}
    for _, e in ipairs(r.events) do if e.event == name then out[#out + 1] = e end end
    return out
  end
  function r.field(name, key)
    local out = {}
    for _, e in ipairs(r.of(name)) do out[#out + 1] = e[key] end
    return out
  end
  return r
end

local COMMON = { "event", "request_id", "attempt", "model", "policy" }
local function fields(extra)
  local set = {}
  for _, k in ipairs(COMMON) do set[k] = true end
  for _, k in ipairs(extra) do set[k] = true end
  return set
end
-- docs/reliability.md: each event's fields, exactly.
H.EVENT_FIELDS = {
  llm_request_started = fields({ "timeout_ms", "deadline_left_ms" }),
  llm_request_failed = fields({ "status", "duration_ms", "retry_after", "error_code",
    "body_preview" }),
  llm_request_error = fields({ "error_kind", "error_message", "duration_ms" }),
  llm_retry_scheduled = fields({ "delay_ms", "delay_source", "next_attempt" }),
  llm_request_succeeded = fields({ "status", "duration_ms", "usage", "response_model",
    "system_fingerprint" }),
  llm_request_gave_up = fields({ "reason", "attempts", "total_ms", "error_kind", "status" }),
  llm_shared_unavailable = fields({ "shared", "error_message" }),
  llm_shared_recovered = fields({ "shared", "down_ms" }),
}
H.KINDS = { http_status = true, timeout = true, network = true, invalid_response = true,
  deadline_exceeded = true, cancelled = true, response_too_large = true,
  stream_interrupted = true, circuit_open = true, refusal = true }
H.REASONS = { retries_exhausted = true, not_retryable = true, deadline = true,
  retry_after_too_long = true, unsafe_mode = true, cancelled = true, stream_interrupted = true,
  retry_budget_exhausted = true, circuit_open = true }
H.STREAM_REASONS = { network = true, idle_timeout = true, error_event = true, truncated = true,
  deadline = true, cancelled = true, invalid_chunk = true, too_large = true }
H.DELAY_SOURCES = { retry_after = true, ratelimit_reset = true, backoff = true, fallback = true }

local function is_str_or_null(v) return type(v) == "string" or v == llm.null end
local function is_int_or_null(v) return H.is_int(v) or v == llm.null end

-- One event: exactly its docs/reliability.md fields (null ones present as llm.null).
function H.check_event_shape(ev)
  check(type(ev) == "table", "event is a %s", type(ev))
  local name = ev.event
  local want = H.EVENT_FIELDS[name]
  check(want ~= nil, "unknown event %s", H.dump(ev))
  if ev.stream ~= nil and (name == "llm_request_succeeded" or name == "llm_request_gave_up") then
    -- A streamed call's end says what its stream did (never its text).
    local w = {}
    for k in pairs(want) do w[k] = true end
    w.stream, w.ttft_ms, w.chunks = true, true, true
    if name == "llm_request_gave_up" and ev.stream_reason ~= nil then w.stream_reason = true end
    want = w
    check(ev.stream == true, "stream %s", H.dump(ev.stream))
    check(H.is_int(ev.chunks) and ev.chunks >= 0, "chunks %s", H.dump(ev.chunks))
    check(ev.ttft_ms == llm.null or (H.is_int(ev.ttft_ms) and ev.ttft_ms >= 0), "ttft_ms %s",
      H.dump(ev.ttft_ms))
  end
  if ev.target ~= nil then
    -- A call with fallbacks: every event names its target.
    local w = {}
    for k in pairs(want) do w[k] = true end
    w.target = true
    want = w
    check(H.is_int(ev.target) and ev.target >= 0, "target %s", H.dump(ev.target))
  end
  if ev.validation_path ~= nil then
    -- An answer the schema refused: where, never what.
    local w = {}
    for k in pairs(want) do w[k] = true end
    w.validation_path = true
    want = w
    check(name == "llm_request_error" and ev.error_kind == "invalid_response"
      and type(ev.validation_path) == "string" and ev.validation_path:sub(1, 1) == "$",
      "validation_path %s", H.dump(ev))
  end
  for k in pairs(ev) do
    check(want[k], "%s has an extra field %s: %s", name, tostring(k), H.dump(ev))
  end
  for k in pairs(want) do
    check(ev[k] ~= nil, "%s lacks field %s: %s", name, k, H.dump(ev))
  end
  check(type(ev.request_id) == "string" and ev.request_id ~= "", "request_id %s",
    H.dump(ev.request_id))
  check(H.is_int(ev.attempt) and ev.attempt >= 0, "attempt %s", H.dump(ev.attempt))
  check(is_str_or_null(ev.model), "model %s", H.dump(ev.model))
  for _, k in ipairs({ "timeout_ms", "duration_ms", "delay_ms", "next_attempt", "attempts",
    "total_ms" }) do
    if want[k] then
      check(H.is_int(ev[k]) and ev[k] >= 0, "%s.%s = %s", name, k, H.dump(ev[k]))
    end
  end
  if name == "llm_request_started" then
    check(ev.timeout_ms > 0, "timeout_ms %s", H.dump(ev.timeout_ms))
    check(is_int_or_null(ev.deadline_left_ms), "deadline_left_ms %s", H.dump(ev.deadline_left_ms))
  elseif name == "llm_request_failed" then
    check(H.is_int(ev.status) and ev.status >= 300, "failed.status %s", H.dump(ev.status))
    for _, k in ipairs({ "retry_after", "error_code", "body_preview" }) do
      check(is_str_or_null(ev[k]), "failed.%s = %s", k, H.dump(ev[k]))
    end
    if type(ev.body_preview) == "string" then
      check(#ev.body_preview <= 500, "body_preview of %d bytes", #ev.body_preview)
    end
  elseif name == "llm_request_error" then
    check(H.KINDS[ev.error_kind], "error_kind %s", H.dump(ev.error_kind))
    check(type(ev.error_message) == "string" and ev.error_message ~= "", "error_message %s",
      H.dump(ev.error_message))
  elseif name == "llm_retry_scheduled" then
    check(H.DELAY_SOURCES[ev.delay_source], "delay_source %s", H.dump(ev.delay_source))
    if ev.delay_source == "fallback" then
      -- To the next target at once; an attempt the open breaker refused
      -- was never made, so its index comes again.
      check(ev.next_attempt == ev.attempt + 1 or ev.next_attempt == ev.attempt,
        "fallback next_attempt %s after attempt %s", H.dump(ev.next_attempt), H.dump(ev.attempt))
    else
      check(ev.next_attempt == ev.attempt + 1, "next_attempt %s after attempt %s",
        H.dump(ev.next_attempt), H.dump(ev.attempt))
    end
  elseif name == "llm_request_succeeded" then
    check(H.is_int(ev.status) and ev.status >= 200 and ev.status < 300, "succeeded.status %s",
      H.dump(ev.status))
    if ev.usage ~= llm.null then
      check(type(ev.usage) == "table", "usage %s", H.dump(ev.usage))
      local n = 0
      for k, v in pairs(ev.usage) do
        n = n + 1
        check(k == "prompt_tokens" or k == "completion_tokens" or k == "total_tokens",
          "usage key %s", tostring(k))
        check(H.is_int(v), "usage.%s = %s", k, H.dump(v))
      end
      check(n == 3, "usage has %d keys", n)
    end
    check(is_str_or_null(ev.response_model), "response_model %s", H.dump(ev.response_model))
    check(is_str_or_null(ev.system_fingerprint), "system_fingerprint %s",
      H.dump(ev.system_fingerprint))
  elseif name == "llm_request_gave_up" then
    check(H.REASONS[ev.reason], "reason %s", H.dump(ev.reason))
    check(H.KINDS[ev.error_kind], "gave_up.error_kind %s", H.dump(ev.error_kind))
    check(is_int_or_null(ev.status), "gave_up.status %s", H.dump(ev.status))
  end
end

-- Invariants of tests/vectors/README.md on one call's events.
function H.check_event_sequence(events, attempts, request_id, model)
  if model == nil then model = "gpt-test" end
  local cur, nxt, starts = -1, 0, 0
  for i, ev in ipairs(events) do
    H.check_event_shape(ev)
    check(ev.request_id == request_id, "event %d has request_id %s, expected %s", i,
      tostring(ev.request_id), tostring(request_id))
    if model then check(ev.model == model, "event %d model %s", i, H.dump(ev.model)) end
    local name = ev.event
    if name == "llm_request_started" then
      check(ev.attempt == nxt, "started #%d: attempt %s, expected %d", i, tostring(ev.attempt), nxt)
      cur = ev.attempt
      starts = starts + 1
    elseif name == "llm_retry_scheduled" then
      check(ev.attempt == cur, "retry_scheduled #%d: attempt %s, last start %d", i,
        tostring(ev.attempt), cur)
      nxt = ev.next_attempt
      check(nxt == cur + 1, "next_attempt %s", tostring(nxt))
    else
      check(ev.attempt == cur, "%s #%d: attempt %s, last start %d", name, i, tostring(ev.attempt),
        cur)
      if name == "llm_request_succeeded" or name == "llm_request_gave_up" then
        check(i == #events, "%s is not the last event", name)
        if name == "llm_request_gave_up" then
          check(ev.attempts == attempts, "gave_up.attempts %s, expected %d", tostring(ev.attempts),
            attempts)
        end
      end
    end
  end
  check(starts == attempts, "%d started events for %d attempts", starts, attempts)
end

function H.check_no_secrets(secrets, ...)
  local n = select("#", ...)
  for i = 1, n do
    local v = select(i, ...)
    if v ~= nil then
      local text = type(v) == "string" and v or H.dump(v)
      for _, s in ipairs(secrets) do
        check(not text:find(s, 1, true), "secret %q leaked into %s", s, text:sub(1, 300))
      end
    end
  end
end

-- An error table as call_llm returns it (lua_api.md conventions).
function H.check_error(err, kind, o)
  o = o or {}
  check(type(err) == "table", "expected an error table, got %s", H.dump(err))
  check(getmetatable(err) == llm.error_mt, "the error lacks llmretry's error metatable")
  check(llm.is_error(err), "llm.is_error(err) is false")
  check(err.kind == kind, "kind %s, expected %s (%s)", tostring(err.kind), kind, tostring(err))
  -- A broken stream's reason is how it broke (docs/streaming.md).
  local reasons = kind == "stream_interrupted" and H.STREAM_REASONS or H.REASONS
  check(reasons[err.reason], "reason %s", H.dump(err.reason))
  if o.reason then
    check(err.reason == o.reason, "reason %s, expected %s (%s)", tostring(err.reason), o.reason,
      tostring(err))
  end
  check(H.is_int(err.attempts) and err.attempts >= 1, "attempts %s", H.dump(err.attempts))
  if o.attempts then
    check(err.attempts == o.attempts, "attempts %s, expected %d", tostring(err.attempts), o.attempts)
  end
  check(err.attempt == err.attempts - 1, "attempt %s with attempts %s", tostring(err.attempt),
    tostring(err.attempts))
  if o.status ~= nil then
    if o.status == false then
      check(err.status == nil, "status %s, expected none", H.dump(err.status))
    else
      check(err.status == o.status, "status %s, expected %s", H.dump(err.status),
        tostring(o.status))
    end
  end
  check(err.status == nil or H.is_int(err.status), "status %s", H.dump(err.status))
  check(type(err.request_id) == "string" and err.request_id ~= "", "request_id %s",
    H.dump(err.request_id))
  check(type(err.message) == "string" and err.message ~= "", "message %s", H.dump(err.message))
  local model = o.model
  if model == nil then model = "gpt-test" end
  if model then check(err.model == model, "model %s", H.dump(err.model)) end
  check(H.is_int(err.duration_ms) and H.is_int(err.total_ms), "duration_ms %s total_ms %s",
    H.dump(err.duration_ms), H.dump(err.total_ms))
  check(err.total_ms >= err.duration_ms and err.duration_ms >= 0, "total_ms %d < duration_ms %d",
    err.total_ms, err.duration_ms)
  check(err.retry_after_ms == nil or (H.is_int(err.retry_after_ms) and err.retry_after_ms > 0),
    "retry_after_ms %s", H.dump(err.retry_after_ms))
  check(err.error_code == nil or type(err.error_code) == "string", "error_code %s",
    H.dump(err.error_code))
  check(err.body_preview == nil or type(err.body_preview) == "string", "body_preview %s",
    H.dump(err.body_preview))
  -- "llmretry: <kind> (<reason>): <message> [request_id=<id>]"
  local want = string.format("llmretry: %s (%s): %s [request_id=%s]", err.kind, err.reason,
    err.message, err.request_id)
  check(tostring(err) == want, "tostring(err) = %q, expected %q", tostring(err), want)
  for k, v in pairs(err) do
    check(v ~= llm.null, "err.%s is null: absent values must be nil", tostring(k))
  end
end

-- What the server saw: every request carries the key, the request id, the
-- JSON headers, the user agent and the body.
function H.check_requests(recs, request_id, body_text, want_body)
  for i, rec in ipairs(recs) do
    local h = rec.headers
    check(h.authorization == "Bearer " .. H.SECRET_KEY, "request %d authorization %s", i,
      tostring(h.authorization))
    check(h["x-client-request-id"] == request_id, "request %d x-client-request-id %s, expected %s",
      i, tostring(h["x-client-request-id"]), tostring(request_id))
    check((h["content-type"] or ""):find("^application/json"), "content-type %s",
      tostring(h["content-type"]))
    check(h.accept == "application/json", "accept %s", tostring(h.accept))
    check((h["user-agent"] or ""):find("^llmretry/"), "user-agent %s", tostring(h["user-agent"]))
    check(rec.method == "POST", "method %s", tostring(rec.method))
    if body_text then
      check(rec.body == body_text, "request %d body differs from what was encoded:\n%s\n%s", i,
        tostring(rec.body), body_text)
    end
    if want_body then
      local got = json.decode(rec.body)
      check(H.same(got, want_body), "request %d body decodes to %s, expected %s", i, H.dump(got),
        H.dump(want_body))
    end
  end
end

-- ---------------------------------------------------------------------------
-- One call through llm.call_llm against a scenario.

function H.merge(...)
  local out = {}
  for i = 1, select("#", ...) do
    local t = select(i, ...)
    if t then for k, v in pairs(t) do out[k] = v end end
  end
  return out
end

-- run_call(scen, steps_or_nil, opts): script scen (when steps is given), make
-- one call with FAST + opts, a recorder logger, the secret key.
-- opts._after: the scenario's `after` step; opts._fast = false: no FAST.
function H.run_call(scen, steps, opts)
  opts = opts or {}
  if steps then scen.script(steps, opts._after) end
  local body = opts.body or H.secret_body(scen.name)
  local options = H.merge(opts._fast == false and {} or H.FAST, opts)
  options._after, options._fast = nil, nil
  options.body = body
  if options.base_url == nil and options.url == nil then options.base_url = scen.url end
  if options.api_key == nil then options.api_key = H.SECRET_KEY end
  local rec = H.recorder()
  if options.logger == nil then options.logger = rec.fn end
  local t0 = H.now_ms()
  local res, err = llm.call_llm(options)
  local wall = H.now_ms() - t0
  return { res = res, err = err, events = rec, wall_ms = wall, body = body, options = options,
    ok = res ~= nil }
end

-- The checks every fault-matrix outcome gets.
function H.common(out, scen, attempts)
  local m = out.res and out.res.meta or out.err
  check(m ~= nil, "neither a result nor an error")
  check(m.attempts == attempts, "attempts %s, expected %d (%s)", tostring(m.attempts), attempts,
    tostring(out.err))
  H.check_event_sequence(out.events.events, attempts, m.request_id)
  H.check_outcome_secrets(out)
  local recs = scen.requests()
  check(#recs == attempts, "server saw %d requests for %d attempts", #recs, attempts)
  H.check_requests(recs, m.request_id, nil, out.body)
  if out.err then
    local gave_up = out.events.of("llm_request_gave_up")
    check(#gave_up == 1, "%d gave_up events", #gave_up)
    check(gave_up[1].reason == out.err.reason, "gave_up.reason %s vs err.reason %s",
      tostring(gave_up[1].reason), tostring(out.err.reason))
    check(gave_up[1].error_kind == out.err.kind, "gave_up.error_kind %s vs %s",
      tostring(gave_up[1].error_kind), tostring(out.err.kind))
    local st = gave_up[1].status
    if st == llm.null then st = nil end
    check(st == out.err.status, "gave_up.status %s vs err.status %s", H.dump(st),
      H.dump(out.err.status))
  end
end

function H.check_outcome_secrets(out)
  local secrets = H.body_secrets(out.body)
  for _, ev in ipairs(out.events.events) do H.check_no_secrets(secrets, ev) end
  if out.err then
    H.check_no_secrets(secrets, out.err, tostring(out.err), out.err.message)
  else
    H.check_no_secrets(secrets, out.res.meta)
  end
end

-- Stricter than check_outcome_secrets: besides the key and the body's
-- contents, no "SECRET" at all, no Authorization header text and no
-- fragment of the request body, in tostring(err), any err field or any event.
H.LEAK_BITS = { "SECRET", H.SECRET_KEY, "sk-test", "Bearer", '"messages"' }

function H.check_no_leak(out)
  local bits = H.body_secrets(out.body)
  for _, b in ipairs(H.LEAK_BITS) do bits[#bits + 1] = b end
  local where = {}
  if out.err then
    where[#where + 1] = tostring(out.err)
    for k, v in pairs(out.err) do where[#where + 1] = tostring(k) .. "=" .. H.dump(v) end
  end
  if out.res then where[#where + 1] = H.dump(out.res.meta) end
  for _, ev in ipairs(out.events.events) do where[#where + 1] = H.dump(ev) end
  for _, text in ipairs(where) do
    for _, s in ipairs(bits) do
      check(not text:find(s, 1, true), "%q leaked into %s", s, text:sub(1, 300))
    end
  end
end

-- A recording server (tests/lua/recording_server.py) as a subprocess:
-- o.tls: HTTPS with a throw-away self-signed certificate (rec.cert is its
-- path); o.status / o.body: the answer to every request (default: a
-- chat.completion). rec:records() is what reached it so far:
-- {connections=, handshake_failures=, requests={...}}. Returns nil, "no
-- openssl" when o.tls is asked for and the openssl tool is missing.
local Recorder = {}
Recorder.__index = Recorder

function H.start_recorder(o)
  o = o or {}
  local records = os.tmpname()
  os.remove(records)
  local extra = ""
  if o.tls then extra = extra .. " --tls" end
  if o.status then extra = extra .. " --status " .. tostring(o.status) end
  local body_file
  if o.body then
    body_file = os.tmpname()
    H.write_file(body_file, o.body)
    extra = extra .. " --body-file " .. q(body_file)
  end
  local log = os.tmpname()
  local cmd = string.format("echo $$ && exec " .. H.CLEAN_ENV
      .. "timeout -s TERM 600 python3 %s --records %s%s 2>>%s",
    q(H.REPO .. "/tests/lua/recording_server.py"), q(records), extra, q(log))
  local p = assert(io.popen(cmd, "r"))
  local pid = p:read("*l")
  local port = p:read("*l")
  if port == "NO-OPENSSL" then
    p:close()
    os.remove(log)
    if body_file then os.remove(body_file) end
    return nil, "no openssl"
  end
  if not (pid and port and tonumber(port)) then
    p:close()
    error("the recording server did not start: " .. tostring(H.read_file(log)))
  end
  local r = setmetatable({ pipe = p, pid = tonumber(pid), port = tonumber(port),
    records_file = records, log = log, body_file = body_file }, Recorder)
  if o.tls then r.cert = p:read("*l") end
  r.base_url = string.format("%s://127.0.0.1:%d/v1", o.tls and "https" or "http", r.port)
  return r
end

function Recorder:records()
  local f = io.open(self.records_file, "rb")
  if not f then return { connections = 0, handshake_failures = 0, requests = {} } end
  local text = f:read("*a")
  f:close()
  local doc = json.decode(text)
  check(type(doc) == "table", "the recorder's records are not JSON: %s", text)
  return doc
end

-- Poll records() until pred(records) holds or timeout_ms passes; the last records.
function Recorder:wait_for(pred, timeout_ms)
  local recs
  H.wait_until(function()
    recs = self:records()
    return pred(recs)
  end, timeout_ms or 3000)
  return recs
end

function Recorder:stop()
  if not self.pipe then return end
  os.execute("kill -TERM " .. self.pid .. " 2>/dev/null")
  self.pipe:close()
  self.pipe = nil
  for _, f in ipairs({ self.records_file, self.records_file .. ".tmp", self.log,
    self.body_file }) do
    os.remove(f)
  end
end

-- The Lua interpreter running this suite (for child processes).
function H.interpreter()
  local i = -1
  while arg and arg[i - 1] do i = i - 1 end
  local first = arg and arg[i]
  if first and first:find("lua", 1, true) then return first end
  return jit and "luajit" or "lua5.4"
end

-- A TCP port nothing listens on.
function H.closed_port()
  local p = assert(io.popen(H.CLEAN_ENV .. "python3 -c 'import socket; s=socket.socket(); "
    .. "s.bind((\"127.0.0.1\", 0)); print(s.getsockname()[1]); s.close()'"))
  local port = tonumber(p:read("*l"))
  p:close()
  return port
end

-- Run f with io.stderr replaced by a buffer; returns the text written and f's results.
function H.capture_stderr(f, ...)
  local buf = {}
  local fake = {
    write = function(self, ...)
      for i = 1, select("#", ...) do buf[#buf + 1] = tostring((select(i, ...))) end
      return self
    end,
    flush = function(self) return self end,
  }
  local real = io.stderr
  io.stderr = fake
  local ok, a, b, c = pcall(f, ...)
  io.stderr = real
  if not ok then error(a, 0) end
  return table.concat(buf), a, b, c
end

-- Same with io.stdout (log_usage prints there).
function H.capture_stdout(f, ...)
  local buf = {}
  local fake = {
    write = function(self, ...)
      for i = 1, select("#", ...) do buf[#buf + 1] = tostring((select(i, ...))) end
      return self
    end,
    flush = function(self) return self end,
  }
  local real = io.stdout
  io.stdout = fake
  local ok, a, b = pcall(f, ...)
  io.stdout = real
  if not ok then error(a, 0) end
  return table.concat(buf), a, b
end

-- The error message of f(...) (which must raise).
function H.raises(f, ...)
  local ok, e = pcall(f, ...)
  check(not ok, "expected an error, got success")
  return tostring(e)
end

return H
