-- A small test runner for scripts that run inside a real headless Neovim:
--
--   nvim --headless -u NONE -i NONE --cmd "lua package.path=..." -c "luafile tests/nvim/x.lua"
--
-- Tests run one after another, each in a coroutine resumed from Neovim's own
-- main loop: T.sleep / T.wait_until return to the editor's loop (a uv timer
-- resumes the test, through vim.schedule), so nothing here pumps the loop by
-- hand (no vim.wait) and what a test sees is what a plugin would see.
-- Each test prints "PASS nvim: name" or "FAIL nvim: name: why"; at the end
-- "nvim: N passed, M failed" and Neovim exits 0 (qall!) or 1 (cquit!).
-- A watchdog ends a run that hangs.
--
-- Environment: LLMRETRY_MOCK = the mock server's root URL (http://127.0.0.1:PORT).

local uv = vim.uv or vim.loop

local T = {}

T.MOCK = os.getenv("LLMRETRY_MOCK") or error("LLMRETRY_MOCK is not set")
T.SECRET_KEY = "sk-test-SECRET-KEY-123"

local tests = {}
local passed, failed = 0, 0

local function out(fmt, ...)
  io.stdout:write(string.format(fmt, ...), "\n")
  io.stdout:flush()
end
T.out = out

function T.now_ms() return uv.hrtime() / 1e6 end

function T.check(cond, fmt, ...)
  if not cond then error(string.format(fmt or "check failed", ...), 2) end
  return cond
end

function T.test(name, fn) tests[#tests + 1] = { name = name, fn = fn } end

-- Inside a test: give the loop back for `ms`.
function T.sleep(ms)
  local co = coroutine.running()
  vim.defer_fn(function() coroutine.resume(co) end, ms)
  coroutine.yield()
end

-- Inside a test: wait (on the loop) until cond() is true; false on timeout.
function T.wait_until(cond, timeout_ms, interval_ms)
  local deadline = T.now_ms() + (timeout_ms or 5000)
  while not cond() do
    if T.now_ms() > deadline then return false end
    T.sleep(interval_ms or 5)
  end
  return true
end

-- A repeating uv timer that records when it fired (in its fast callback).
function T.ticker(interval_ms)
  local k = { times = {} }
  local timer = uv.new_timer()
  timer:start(interval_ms, interval_ms, function() k.times[#k.times + 1] = T.now_ms() end)
  function k.stop()
    if not timer:is_closing() then timer:stop(); timer:close() end
  end
  -- Ticks within [t0, t1] and the longest stretch without one there.
  function k.between(t0, t1)
    local n, last, gap = 0, t0, 0
    for _, t in ipairs(k.times) do
      if t >= t0 and t <= t1 then
        n = n + 1
        gap = math.max(gap, t - last)
        last = t
      end
    end
    gap = math.max(gap, t1 - last)
    return n, gap
  end
  return k
end

-- ---------------------------------------------------------------------------
-- The mock server's control API, through curl (blocking: test set-up only).

local function curl(args)
  local cmd = { "curl", "-sS", "-m", "10", "-w", "\n%{http_code}" }
  vim.list_extend(cmd, args)
  local text = vim.fn.system(cmd)
  local body, code = text:match("^(.*)\n(%d+)$")
  return tonumber(code), body
end

-- script(name, steps [, after]): steps is a list of step tables ({} = plain success).
function T.script(name, steps, after)
  local s = {}
  for i, st in ipairs(steps) do
    s[i] = next(st) == nil and vim.empty_dict() or st
  end
  local doc = { steps = s }
  if #s == 0 then doc.steps = {} end
  if after then doc.after = after end
  local json = vim.fn.json_encode(doc)
  local code, body = curl({ "-X", "PUT", "-H", "Content-Type: application/json", "--data-binary",
    json, T.MOCK .. "/_mock/scenarios/" .. name })
  T.check(code == 204, "PUT scenario %s: %s %s", name, tostring(code), tostring(body))
end

function T.requests(name)
  local code, body = curl({ T.MOCK .. "/_mock/requests/" .. name })
  T.check(code == 200, "GET requests %s: %s", name, tostring(code))
  return vim.fn.json_decode(body)
end

function T.url(name) return T.MOCK .. "/s/" .. name .. "/v1" end

function T.body(tag)
  return { model = "gpt-test", messages = { { role = "user", content = "SECRET-PROMPT-" .. tag } } }
end

-- Options for one call against scenario `name`.
function T.opts(name, extra)
  local o = { body = T.body(name), base_url = T.url(name), api_key = T.SECRET_KEY,
    timeout_ms = 5000, max_retries = 3, base_delay_ms = 20, jitter = "none" }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

-- ---------------------------------------------------------------------------
-- Running

local finishers = {}

-- fn() runs when the tests are over, before the summary line.
function T.on_finish(fn) finishers[#finishers + 1] = fn end

local function finish()
  for _, fn in ipairs(finishers) do pcall(fn) end
  out("nvim: %d passed, %d failed", passed, failed)
  if failed > 0 then vim.cmd("cquit!") else vim.cmd("qall!") end
end

-- Run every test registered with T.test, then exit Neovim. `watchdog_ms`
-- bounds the whole run.
function T.run(watchdog_ms)
  local dog = uv.new_timer()
  dog:start(watchdog_ms or 120000, 0, vim.schedule_wrap(function()
    out("FAIL nvim: watchdog: the run did not finish in %d ms", watchdog_ms or 120000)
    failed = failed + 1
    finish()
  end))
  local main = coroutine.create(function()
    for _, t in ipairs(tests) do
      local ok, err = xpcall(t.fn, debug.traceback)
      if ok then
        passed = passed + 1
        out("PASS nvim: %s", t.name)
      else
        failed = failed + 1
        out("FAIL nvim: %s: %s", t.name, tostring(err))
      end
    end
    dog:stop()
    finish()
  end)
  -- Start from the loop, once the script that registered the tests is done.
  vim.schedule(function()
    local ok, err = coroutine.resume(main)
    if not ok then
      out("FAIL nvim: the runner raised: %s", tostring(err))
      failed = failed + 1
      finish()
    end
  end)
end

return T
