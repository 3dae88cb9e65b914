-- map_with_concurrency (coroutines over one engine) and call_many.

local H = require("helpers")
local llm = require("llmretry")
local check = H.check

local function body(tag)
  return H.secret_body(tag)
end

describe("map_with_concurrency", function()
  local mock

  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  it("runs 20 calls of 300 ms at once with limit 20", function()
    local scen = mock:scen("concurrent20")
    scen.script({}, { delay_ms = 300 })
    local items = {}
    for i = 1, 20 do items[i] = i end
    local t0 = H.now_ms()
    local results, errors = llm.map_with_concurrency(items, 20, function(item, i)
      check(item == i, "item %s at index %d", tostring(item), i)
      local res, err = llm.call_llm({ body = body("c" .. i), base_url = scen.url,
        api_key = H.SECRET_KEY, timeout_ms = 5000 })
      check(res, "call %d failed: %s", i, tostring(err))
      return res.meta.duration_ms
    end)
    local wall = H.now_ms() - t0
    check(results.n == 20, "results.n %s", tostring(results.n))
    check(next(errors) == nil, "errors %s", H.dump(errors))
    for i = 1, 20 do
      check(H.is_int(results[i]) and results[i] >= 280, "result %d: %s", i, H.dump(results[i]))
    end
    -- Sequential would be 6 s; at once it is ~300 ms plus overheads.
    check(wall < 2500, "20 x 300 ms calls took %.0f ms with limit 20", wall)
    local recs = scen.requests()
    check(#recs == 20, "%d requests", #recs)
    local first, last = math.huge, -math.huge
    for _, r in ipairs(recs) do
      first = math.min(first, r.time)
      last = math.max(last, r.time)
    end
    check(last - first < 0.29, "the requests arrived %.3f s apart: not concurrent", last - first)
  end)

  it("respects the limit and returns results in input order", function()
    local scen = mock:scen("limit3")
    scen.script({}, { delay_ms = 150 })
    local items = { "a", "b", "c", "d", "e", "f", "g" }
    local active, max_active = 0, 0
    local t0 = H.now_ms()
    local results = llm.map_with_concurrency(items, 3, function(item, i)
      active = active + 1
      if active > max_active then max_active = active end
      -- Later items finish first: the order of results must not follow.
      local res, err = llm.call_llm({ body = body(item), base_url = scen.url,
        api_key = H.SECRET_KEY })
      active = active - 1
      check(res, "call failed: %s", tostring(err))
      return item .. i
    end)
    local wall = H.now_ms() - t0
    check(max_active == 3, "at most %d workers ran at once, expected 3", max_active)
    check(results.n == 7, "results.n")
    for i, item in ipairs(items) do
      check(results[i] == item .. i, "results[%d] = %s", i, H.dump(results[i]))
    end
    -- 7 items, 3 at a time: three waves of >= 150 ms.
    check(wall >= 430, "wall %.0f ms: the limit was not respected", wall)
    check(wall < 3000, "wall %.0f ms", wall)
  end)

  it("keeps input order when completion order differs", function()
    local scen = {}
    -- Answers 250 ms apart, the last item's first: under CI's load (this
    -- suite runs beside the C and Python ones) 60 ms apart once let the
    -- mock's late starts of the first calls keep input order.
    for i = 1, 5 do
      scen[i] = mock:scen("order" .. i)
      scen[i].script({ { delay_ms = (6 - i) * 250, content = "answer-" .. i } })
    end
    local finished = {}
    local results = llm.map_with_concurrency({ 1, 2, 3, 4, 5 }, 5, function(i)
      local res = assert(llm.call_llm({ body = body("o" .. i), base_url = scen[i].url,
        api_key = H.SECRET_KEY }))
      finished[#finished + 1] = i
      return res.data.choices[1].message.content
    end)
    check(H.list_eq(finished, { 5, 4, 3, 2, 1 }), "completion order %s", H.list_str(finished))
    for i = 1, 5 do
      check(results[i] == "answer-" .. i, "results[%d] = %s", i, H.dump(results[i]))
    end
  end)

  it("returns every failure in place with return_errors", function()
    local scen = mock:scen("return_errors")
    local items = {}
    for i = 1, 9 do items[i] = i end
    local results, errors = llm.map_with_concurrency(items, 4, function(i)
      local res, err = llm.call_llm({ body = body("r" .. i), base_url = scen.url,
        api_key = H.SECRET_KEY })
      check(res, "call failed: %s", tostring(err))
      if i % 3 == 0 then error({ code = "boom", item = i }) end
      return i * 10
    end, { return_errors = true })
    check(results.n == 9, "results.n")
    for i = 1, 9 do
      if i % 3 == 0 then
        check(results[i] == nil, "results[%d] = %s", i, H.dump(results[i]))
        check(type(errors[i]) == "table" and errors[i].code == "boom" and errors[i].item == i,
          "errors[%d] = %s", i, H.dump(errors[i]))
      else
        check(results[i] == i * 10, "results[%d] = %s", i, H.dump(results[i]))
        check(errors[i] == nil, "errors[%d] = %s", i, H.dump(errors[i]))
      end
    end
    check(#scen.requests() == 9, "every item ran")
  end)

  it("stops new starts after the first raise and reports its index", function()
    local scen = mock:scen("first_raise")
    scen.script({}, { delay_ms = 300 })
    local started = {}
    local items = {}
    for i = 1, 10 do items[i] = i end
    local ok, e = pcall(llm.map_with_concurrency, items, 2, function(i)
      started[#started + 1] = i
      if i == 1 then
        llm.call_llm({ body = body("f1"), base_url = mock:scenario_url("fast_" .. scen.name),
          api_key = H.SECRET_KEY })
        error("item one exploded")
      end
      local res, err = llm.call_llm({ body = body("f" .. i), base_url = scen.url,
        api_key = H.SECRET_KEY })
      check(res, "call failed: %s", tostring(err))
      return "done-" .. i
    end)
    check(not ok, "map_with_concurrency did not raise")
    check(type(e) == "table", "raised a %s: %s", type(e), tostring(e))
    check(e.index == 1, "index %s", tostring(e.index))
    check(tostring(e.error):find("item one exploded", 1, true), "error %s", tostring(e.error))
    local s = tostring(e)
    check(s:find("^llmretry: item 1 failed: ") and s:find("item one exploded", 1, true),
      "tostring %s", s)
    -- Item 2 was running: it finished, and its result is kept.
    check(H.list_eq(started, { 1, 2 }), "started %s", H.list_str(started))
    check(e.results[2] == "done-2", "results[2] = %s", H.dump(e.results[2]))
    check(e.errors[1] == e.error, "errors[1] is not the error")
    check(#scen.requests() == 1, "%d slow requests", #scen.requests())
  end)

  it("does not count a worker's nil, err as a failure", function()
    local results, errors = llm.map_with_concurrency({ 1, 2 }, 2, function(i)
      if i == 1 then return nil, "soft" end
      return i
    end)
    check(results[1] == nil and results[2] == 2, "results %s", H.dump(results))
    check(next(errors) == nil, "errors %s", H.dump(errors))
  end)

  it("handles empty input and workers that never call", function()
    local results, errors = llm.map_with_concurrency({}, 3, function() error("never") end)
    check(results.n == 0 and next(errors) == nil, "results %s", H.dump(results))
    local r = llm.map_with_concurrency({ 3, 4, 5 }, 1, function(x) return x * x end)
    check(H.list_eq(r, { 9, 16, 25 }), "results %s", H.list_str(r))
  end)

  it("lets workers yield on their own and make several calls each", function()
    local scen = mock:scen("multi")
    local results = llm.map_with_concurrency({ 1, 2, 3 }, 3, function(i)
      coroutine.yield()
      local total = 0
      for _ = 1, 3 do
        local res = assert(llm.call_llm({ body = body("m" .. i), base_url = scen.url,
          api_key = H.SECRET_KEY }))
        total = total + res.meta.status
        coroutine.yield("anything")
      end
      return total
    end)
    check(H.list_eq(results, { 600, 600, 600 }), "results %s", H.list_str(results))
    check(#scen.requests() == 9, "%d requests", #scen.requests())
  end)

  it("yields through pcall inside a worker", function()
    local scen = mock:scen("through_pcall")
    scen.script({}, { delay_ms = 300 })
    local t0 = H.now_ms()
    local results = llm.map_with_concurrency({ 1, 2, 3, 4 }, 4, function(i)
      local ok, res = pcall(llm.call_llm, { body = body("p" .. i), base_url = scen.url,
        api_key = H.SECRET_KEY })
      check(ok and res, "call %d: %s", i, tostring(res))
      return res.meta.status
    end)
    local wall = H.now_ms() - t0
    check(H.list_eq(results, { 200, 200, 200, 200 }), "results %s", H.list_str(results))
    check(wall < 1000, "4 x 300 ms calls under pcall took %.0f ms: they did not overlap", wall)
  end)

  it("returns nil, err for a failed call inside a worker", function()
    local scen = mock:scen("worker_err")
    scen.script({ { status = 400 } })
    local results = llm.map_with_concurrency({ 1 }, 1, function()
      local res, err = llm.call_llm(H.merge(H.FAST, { body = body("we"), base_url = scen.url,
        api_key = H.SECRET_KEY }))
      check(res == nil, "expected a failure")
      H.check_error(err, "http_status", { reason = "not_retryable", attempts = 1, status = 400 })
      return err.kind
    end)
    check(results[1] == "http_status", "results %s", H.dump(results))
  end)

  it("delivers events in the worker's coroutine, with the pool's default logger", function()
    local scen = mock:scen("pool_logger")
    scen.script({ { status = 503 } })
    local seen = {}
    local cos = {}
    local results = llm.map_with_concurrency({ 1, 2 }, 2, function(i)
      cos[i] = coroutine.running()
      local res = assert(llm.call_llm(H.merge(H.FAST, { body = body("pl" .. i),
        base_url = scen.url, api_key = H.SECRET_KEY })))
      return res.meta.request_id
    end, { logger = function(ev)
      seen[#seen + 1] = { ev = ev, co = coroutine.running() }
    end })
    check(#seen == 2 + 5, "%d events", #seen)
    for _, s in ipairs(seen) do
      local rid = s.ev.request_id
      local i = rid == results[1] and 1 or (rid == results[2] and 2 or nil)
      check(i, "an event of an unknown call")
      check(s.co == cos[i], "event of item %d delivered outside its worker", i)
    end
  end)

  it("runs validate inside the pool and retries a rejection", function()
    local scen = mock:scen("pool_validate")
    scen.script({ { content = "bad" }, { content = "good" } })
    local calls = 0
    local results = llm.map_with_concurrency({ 1 }, 1, function()
      local res, err = llm.call_llm(H.merge(H.FAST, { body = body("pv"), base_url = scen.url,
        api_key = H.SECRET_KEY, validate = function(data)
          calls = calls + 1
          return data.choices[1].message.content == "good"
        end }))
      check(res, "failed: %s", tostring(err))
      return res.data.choices[1].message.content
    end)
    check(results[1] == "good" and calls == 2, "results %s, %d validations", H.dump(results),
      calls)
  end)

  it("falls back to a blocking call where the worker cannot yield", function()
    local scen = mock:scen("no_yield")
    local results = llm.map_with_concurrency({ 1 }, 1, function()
      local got
      -- A comparator runs under a C function (table.sort): no yield there.
      table.sort({ 2, 1 }, function(a, b)
        if not got then
          local res, err = llm.call_llm({ body = body("ny"), base_url = scen.url,
            api_key = H.SECRET_KEY })
          got = res and res.meta.status or tostring(err)
        end
        return a < b
      end)
      return got
    end)
    check(results[1] == 200, "results %s", H.dump(results))
  end)

  it("uses a caller's engine and leaves it open", function()
    local scen = mock:scen("own_engine")
    local engine = llm.new_engine()
    local results = llm.map_with_concurrency({ 1, 2 }, 2, function()
      return assert(llm.call_llm({ body = body("oe"), base_url = scen.url,
        api_key = H.SECRET_KEY })).meta.status
    end, { engine = engine })
    check(H.list_eq(results, { 200, 200 }), "results %s", H.list_str(results))
    -- Still open: another call on it works.
    local res = llm.call_llm({ body = body("oe2"), base_url = scen.url, api_key = H.SECRET_KEY,
      engine = engine })
    check(res and res.meta.status == 200, "engine closed by the pool")
    engine:close()
  end)

  it("runs nested pools", function()
    local scen = mock:scen("nested")
    local results = llm.map_with_concurrency({ 1, 2 }, 2, function(i)
      local inner = llm.map_with_concurrency({ 1, 2, 3 }, 3, function(j)
        return assert(llm.call_llm({ body = body("n" .. i .. j), base_url = scen.url,
          api_key = H.SECRET_KEY })).meta.status + j
      end)
      return inner[1] + inner[2] + inner[3]
    end)
    check(H.list_eq(results, { 606, 606 }), "results %s", H.list_str(results))
  end)
end)

describe("call_many", function()
  local mock

  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  it("runs bodies with a limit, in order, failures in place", function()
    local ok_scen = mock:scen("many_ok")
    ok_scen.script({}, { delay_ms = 150 })
    local bodies = {}
    for i = 1, 6 do bodies[i] = body("many" .. i) end
    local rec = H.recorder()
    local t0 = H.now_ms()
    local outs = llm.call_many(bodies, H.merge(H.FAST, { limit = 2, base_url = ok_scen.url,
      api_key = H.SECRET_KEY, logger = rec.fn }))
    local wall = H.now_ms() - t0
    check(outs.n == 6, "outs.n %s", tostring(outs.n))
    for i = 1, 6 do
      check(type(outs[i]) == "table" and outs[i].meta and outs[i].meta.status == 200,
        "outs[%d] = %s", i, H.dump(outs[i]))
    end
    -- 6 bodies, 2 at a time, 150 ms each: three waves.
    check(wall >= 430 and wall < 3000, "wall %.0f ms", wall)
    local recs = ok_scen.requests()
    check(#recs == 6, "%d requests", #recs)
    local by_id = {}
    for _, ev in ipairs(rec.events) do
      H.check_event_shape(ev)
      by_id[ev.request_id] = (by_id[ev.request_id] or 0) + 1
    end
    for i = 1, 6 do
      check(by_id[outs[i].meta.request_id] == 2, "events of call %d", i)
    end
    -- Each body went out once.
    local sent = {}
    for _, r in ipairs(recs) do
      local b = H.json.decode(r.body)
      sent[b.messages[2].content] = (sent[b.messages[2].content] or 0) + 1
    end
    for i = 1, 6 do
      check(sent["SECRET-PROMPT-many" .. i] == 1, "body %d sent %s times", i,
        tostring(sent["SECRET-PROMPT-many" .. i]))
    end
  end)

  it("puts error tables in place of failures", function()
    local bad = mock:scen("many_bad")
    bad.script({ {}, { status = 400 }, {} })
    local outs = llm.call_many({ body("x1"), body("x2"), body("x3") },
      H.merge(H.FAST, { limit = 1, base_url = bad.url, api_key = H.SECRET_KEY }))
    check(outs.n == 3, "outs.n")
    check(outs[1].meta and outs[1].meta.status == 200, "outs[1] %s", H.dump(outs[1]))
    H.check_error(outs[2], "http_status", { reason = "not_retryable", attempts = 1, status = 400 })
    check(outs[3].meta and outs[3].meta.status == 200, "outs[3] %s", H.dump(outs[3]))
  end)

  it("takes JSON strings and returns an empty result for no bodies", function()
    local scen = mock:scen("many_str")
    local outs = llm.call_many({ '{"model":"m-str","messages":[]}' },
      { base_url = scen.url, api_key = H.SECRET_KEY })
    check(outs[1].meta.model == "m-str", "model %s", H.dump(outs[1].meta))
    check(scen.requests()[1].body == '{"model":"m-str","messages":[]}', "body")
    local none = llm.call_many({}, { base_url = scen.url })
    check(none.n == 0 and none[1] == nil, "outs %s", H.dump(none))
  end)
end)

-- call_many is one engine group: the batch policy of docs/reliability.md / issue 6.
describe("call_many batch policy", function()
  local mock

  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  it("pauses every new start on a 429's Retry-After", function()
    local scen = mock:scen("many_pause")
    scen.script({ { status = 429, retry_after = "0.6" } }, { delay_ms = 100 })
    local bodies = {}
    for i = 1, 12 do bodies[i] = body("pause" .. i) end
    local outs = llm.call_many(bodies, H.merge(H.FAST, { limit = 4, adaptive = false,
      base_url = scen.url, api_key = H.SECRET_KEY }))
    for i = 1, 12 do
      check(outs[i].meta and outs[i].meta.status == 200, "outs[%d] = %s", i, H.dump(outs[i]))
    end
    local recs = scen.requests()
    check(#recs == 13, "%d requests", #recs)
    -- The first 4 left together; the 429 came back at once while the others
    -- took 100 ms, so every later request waited out the 0.6 s.
    for k = 5, #recs do
      check(recs[k].time - recs[1].time >= 0.55, "request %d went out %.3f s after the 429",
        k, recs[k].time - recs[1].time)
    end
    check(outs.stats.pauses >= 1, "stats %s", H.dump(outs.stats))
    check(outs.stats.halvings == 0, "halvings %s without adaptive", tostring(outs.stats.halvings))
  end)

  it("halves the window on a burst of 429s when adaptive", function()
    local scen = mock:scen("many_burst")
    scen.script({ { status = 429 }, { status = 429 }, { status = 429 }, { status = 429 } },
      { delay_ms = 20 })
    local bodies = {}
    for i = 1, 16 do bodies[i] = body("burst" .. i) end
    local outs = llm.call_many(bodies, H.merge(H.FAST, { limit = 8, base_url = scen.url,
      api_key = H.SECRET_KEY }))
    for i = 1, 16 do
      check(outs[i].meta, "outs[%d] = %s", i, H.dump(outs[i]))
    end
    check(outs.stats.halvings == 1, "stats %s", H.dump(outs.stats))
  end)

  it("bounds the whole batch with deadline_ms", function()
    local scen = mock:scen("many_deadline")
    scen.script({}, { delay_ms = 300 })
    local bodies = {}
    for i = 1, 5 do bodies[i] = body("dl" .. i) end
    local t0 = H.now_ms()
    local outs = llm.call_many(bodies, H.merge(H.FAST, { limit = 1, deadline_ms = 500,
      base_url = scen.url, api_key = H.SECRET_KEY }))
    local wall = H.now_ms() - t0
    check(outs[1].meta and outs[1].meta.status == 200, "outs[1] = %s", H.dump(outs[1]))
    for i = 2, 5 do
      check(outs[i].kind == "deadline_exceeded" and outs[i].reason == "deadline",
        "outs[%d] = %s", i, H.dump(outs[i]))
    end
    check(outs[2].attempts == 1 and outs[5].attempts == 0, "attempts %s / %s",
      tostring(outs[2].attempts), tostring(outs[5].attempts))
    check(wall >= 450 and wall < 1500, "batch ended after %.0f ms", wall)
    check(#scen.requests() == 2, "%d requests", #scen.requests())
  end)

  it("rejects bad batch options before any I/O", function()
    local scen = mock:scen("many_bad")
    for _, o in ipairs({ { deadline_ms = -1 }, { deadline_ms = "5" }, { adaptive = "yes" },
                         { limit = 0 } }) do
      local ok, err = pcall(llm.call_many, { body("bad") }, H.merge(o, { base_url = scen.url }))
      check(not ok, "accepted %s", H.dump(o))
      local name = next(o)
      check(tostring(err):find(name, 1, true), "error %s does not name %s", tostring(err), name)
    end
    check(#scen.requests() == 0, "%d requests", #scen.requests())
  end)
end)
