-- wrk script for bench/clients/wrk.sh: POST the suite's request and, at the
-- end, print one machine-readable line of wrk's own counters.
wrk.method = "POST"
wrk.body = '{"model":"bench-model","messages":[{"role":"user","content":"Say hi"}]}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer bench-key"

function done(summary, latency, requests)
  local e = summary.errors
  -- requests: responses completed (any status); e.status: those with a
  -- status >= 400; the others are connections that failed or timed out.
  io.write(string.format("WRK_RESULT requests=%d duration_us=%d status=%d connect=%d "
    .. "read=%d write=%d timeout=%d\n", summary.requests, summary.duration, e.status,
    e.connect, e.read, e.write, e.timeout))
end
