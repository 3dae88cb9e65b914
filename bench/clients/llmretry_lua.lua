-- Benchmark client: llmretry from Lua, under lua5.4 or luajit (see README.md).
--
--   lua5.4|luajit bench/clients/llmretry_lua.lua map|call_many \
--       --url BASE --concurrency C --requests N --warmup W
--
-- map:       llm.map_with_concurrency(items, C, worker), each worker calling
--            llm.call_llm (coroutines over one engine);
-- call_many: llm.call_many(bodies, {limit = C}) (one engine group).
-- llmretry's default policy; no logger (the Lua default). The module comes
-- from the luarocks tree that bench/clients/setup.sh builds under
-- build-bench/lua/<5.4|5.1>; the benchclock helper (wall clock, CPU,
-- open-files limit) sits next to it. Last line of stdout: the contract's
-- {"ok", "failed", "seconds", "cpu_seconds"}.

local MAX_REPORTED = 5
local API_KEY = "bench-key"

local function usage(msg)
  io.stderr:write("llmretry_lua: ", msg, "\nusage: lua llmretry_lua.lua map|call_many ",
    "--url BASE --concurrency C --requests N [--warmup W]\n")
  os.exit(2)
end

local mode = arg[1]
if mode ~= "map" and mode ~= "call_many" then usage("unknown mode " .. tostring(mode)) end
local opt = { warmup = "0" }
for i = 2, #arg, 2 do
  local k = arg[i]:match("^%-%-(%a+)$")
  if not k or arg[i + 1] == nil then usage("bad argument " .. arg[i]) end
  opt[k] = arg[i + 1]
end
local url = opt.url and opt.url:gsub("/+$", "")
local C, N, W = tonumber(opt.concurrency), tonumber(opt.requests), tonumber(opt.warmup)
if not url or not C or C < 1 or not N or N < 1 or not W or W < 0 then
  usage("missing or bad --url/--concurrency/--requests/--warmup")
end

-- The repo root from this script's path (run from the root: bench/clients/...).
local here = arg[0]:match("^(.*)/[^/]*$") or "."
local abi = _VERSION:match("%d+%.%d+")       -- "5.4", or "5.1" for LuaJIT
local tree = here .. "/../../build-bench/lua/" .. abi
package.path = tree .. "/share/lua/" .. abi .. "/?.lua;" .. tree .. "/share/lua/" .. abi
  .. "/?/init.lua;" .. package.path
package.cpath = tree .. "/lib/lua/" .. abi .. "/?.so;" .. tree .. "/?.so;" .. package.cpath

local ok_llm, llm = pcall(require, "llmretry")
local ok_clock, clock = pcall(require, "benchclock")
if not ok_llm or not ok_clock then
  io.stderr:write("llmretry_lua: ", tostring(ok_llm and clock or llm),
    "\n(run bench/clients/setup.sh first: it builds ", tree, ")\n")
  os.exit(1)
end
clock.raise_nofile()

-- The engine runs at most max_in_flight calls (default 256): size it to C.
local engine = llm.new_engine(math.max(256, C))

local function body()
  return { model = "bench-model", messages = { { role = "user", content = "Say hi" } } }
end

local function tally_new(name) return { name = name, ok = 0, failed = 0 } end

local function fail(t, err)
  t.failed = t.failed + 1
  if t.failed <= MAX_REPORTED then
    -- An llmretry error's text names its kind and status, never the key.
    io.stderr:write(t.name, ": request failed: ", tostring(err):sub(1, 200), "\n")
  end
end

local function count(t, content, err)
  if type(content) == "string" then t.ok = t.ok + 1 else fail(t, err or "no content") end
end

local function content_of(res)
  return res.data.choices[1].message.content
end

local batch
if mode == "map" then
  local function worker()
    local res, err = llm.call_llm({ body = body(), base_url = url, api_key = API_KEY })
    if not res then error(err, 0) end
    return content_of(res)
  end
  batch = function(n, t)
    local items = {}
    for i = 1, n do items[i] = i end
    local results, errors = llm.map_with_concurrency(items, C, worker,
      { engine = engine, return_errors = true })
    for i = 1, n do count(t, results[i], errors[i]) end
  end
else
  batch = function(n, t)
    local bodies = {}
    for i = 1, n do bodies[i] = body() end
    local outs = llm.call_many(bodies, { limit = C, engine = engine, base_url = url,
      api_key = API_KEY })
    for i = 1, n do
      local o = outs[i]
      if llm.is_error(o) then fail(t, o) else count(t, content_of(o)) end
    end
  end
end

local name = "llmretry_lua " .. mode .. " (" .. (jit and jit.version or _VERSION) .. ")"
if W > 0 then
  local warm = tally_new(name .. " warm-up")
  batch(W, warm)
  if warm.failed > 0 then
    io.stderr:write(name, ": ", warm.failed, " of ", W, " warm-up requests failed\n")
  end
end
local t = tally_new(name)
local c0, t0 = clock.cpu(), clock.now()
batch(N, t)
local seconds, cpu = clock.now() - t0, clock.cpu() - c0
engine:close()
io.stdout:write(string.format('{"ok": %d, "failed": %d, "seconds": %.6f, "cpu_seconds": %.6f}\n',
  t.ok, t.failed, seconds, cpu))
