-- Per-request timings for bench/run_openresty.sh TIMING=1: where a call's
-- latency goes between wrk's view and the endpoint's 50 ms. Each location
-- records its handler's wall time (from before its call to after it, the
-- event loop's clock refreshed at both ends) and, for llmretry's calls,
-- meta.total_ms (the core's submit to finish) and meta.duration_ms (the
-- attempt). /timing answers each location's percentiles since the last
-- /timing, as JSON, and starts again. Off (the default): start() returns
-- nil and stop() does nothing. One worker's figures (the gateway has one).
local ngx = ngx
local floor, sort, concat, format = math.floor, table.sort, table.concat, string.format

local M = { on = false }
local by_location = {}

function M.start()
  if not M.on then return nil end
  ngx.update_time()
  return ngx.now()
end

function M.stop(location, t1, meta)
  if t1 == nil then return end
  ngx.update_time()
  local s = by_location[location]
  if s == nil then
    s = { wall = {}, total = {}, attempt = {} }
    by_location[location] = s
  end
  s.wall[#s.wall + 1] = (ngx.now() - t1) * 1000
  if meta then
    s.total[#s.total + 1] = meta.total_ms
    s.attempt[#s.attempt + 1] = meta.duration_ms
  end
end

-- t sorted.
local function pct(t, q)
  if #t == 0 then return "null" end
  return format("%.1f", t[math.max(1, floor(#t * q + 0.5))])
end

local function mean(t)
  if #t == 0 then return "null" end
  local sum = 0
  for i = 1, #t do sum = sum + t[i] end
  return format("%.2f", sum / #t)
end

-- {"location": {"n": ..., "wall": [mean, p50, p99], "total": [...],
-- "attempt": [...]}, ...}, and the figures start again.
function M.dump()
  local out = {}
  for location, s in pairs(by_location) do
    local parts = {}
    for _, k in ipairs({ "wall", "total", "attempt" }) do
      local t = s[k]
      sort(t)
      parts[#parts + 1] = format('"%s": [%s, %s, %s]', k, mean(t), pct(t, 0.5), pct(t, 0.99))
    end
    out[#out + 1] = format('"%s": {"n": %d, %s}', location, #s.wall, concat(parts, ", "))
  end
  by_location = {}
  return "{" .. concat(out, ", ") .. "}"
end

return M
