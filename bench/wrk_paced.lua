-- wrk script: every connection waits PACE_MS milliseconds before each of its
-- requests, so that the offered load is about connections / (PACE_MS +
-- latency) a second whatever the gateway's speed: two gateways compared at
-- the same load, below both's capacity, show their latency rather than
-- their queues (bench/run_openresty.sh, PACE_MS=). wrk times a request from
-- its send, so the wait is not in the latency.
local pace = tonumber(os.getenv("PACE_MS") or "0") or 0

function delay()
  return pace
end
