-- llmretry.ffi (issue 36): under LuaJIT a call nobody listens to is drained
-- and read through plain C functions by the FFI; elsewhere the classic
-- methods. The path must be taken where it can be (no silent fallback),
-- and give what the classic one gives: the same tables, the same errors.

local H = require("helpers")
local llm = require("llmretry")
local core = require("llmretry.core")
local check = H.check

local lffi = require("llmretry.ffi")
local IS_JIT = type(rawget(_G, "jit")) == "table"

-- Deep equality, metatables included (decoded arrays carry array_mt).
local function same(a, b, path)
  path = path or "res"
  if type(a) ~= type(b) then return false, path .. ": " .. type(a) .. " vs " .. type(b) end
  if type(a) ~= "table" then
    if a == b then return true end
    return false, path .. ": " .. tostring(a) .. " vs " .. tostring(b)
  end
  if getmetatable(a) ~= getmetatable(b) then return false, path .. ": metatables differ" end
  for k, v in pairs(a) do
    local ok, why = same(v, b[k], path .. "." .. tostring(k))
    if not ok then return false, why end
  end
  for k in pairs(b) do
    if a[k] == nil then return false, path .. "." .. tostring(k) .. ": missing" end
  end
  return true
end

local function opts(scen, extra)
  return H.merge(H.FAST, { body = H.secret_body(scen.name), base_url = scen.url,
    api_key = H.SECRET_KEY, event_mask = 0 }, extra)
end

-- Submit, wait for the end, then read the result both ways.
local function both_ways(engine, o)
  local h = engine:submit(o)
  check(h:wait(10000), "the call did not end")
  while true do
    local kind = h:next()
    if kind == "done" or kind == nil then break end
  end
  local before = lffi.calls
  local res_f, err_f = lffi.result(h)
  local built = lffi.calls - before
  local res_c, err_c = h:result()
  return res_f, err_f, res_c, err_c, built
end

describe("llmretry.ffi", function()
  it("is the FFI path exactly where LuaJIT is the interpreter", function()
    if IS_JIT then
      check(type(lffi) == "table", "under LuaJIT llmretry.ffi is %s, not the FFI path",
        tostring(lffi))
      check(type(core._ffi()) == "userdata", "core._ffi() gives no entry points")
    else
      check(lffi == false, "under %s llmretry.ffi is %s", _VERSION, tostring(lffi))
    end
  end)

  it("keeps the function that reads a handle by its address out of every table", function()
    -- It takes any number for a handle's address: reachable from Lua, a
    -- wrong number would crash the process. Only llmretry.ffi gets it, and
    -- only under LuaJIT.
    for name, value in pairs(core) do
      check(name ~= "_ffi_result", "core.%s is %s", name, tostring(value))
    end
    local n = select("#", core._ffi())
    check(n == (IS_JIT and 2 or 1), "core._ffi() gives %d values under %s", n, _VERSION)
  end)

  it("declares the entry points as bindings/lua/lffi.h does", function()
    if not IS_JIT then return end
    local header = H.read_file(H.REPO .. "/bindings/lua/lffi.h")
    local struct = header:match("/%* cdef begin %*/(.-)/%* cdef end %*/")
    check(struct, "lffi.h has no cdef markers")
    local function norm(s) return (s:gsub("%s+", " "):gsub("^ ", ""):gsub(" $", "")) end
    local cdef = lffi.CDEF:match("(struct lr_ffi_handle;.-} lr_ffi_api;)")
    check(cdef and norm(cdef) == norm(struct), "the cdef and lffi.h differ:\n%s\n%s",
      tostring(cdef), struct)
    -- The core's field record, which the FFI reads in place: as shapes.h has it.
    local shapes = H.read_file(H.REPO .. "/core/include/llmretry/shapes.h"):gsub("/%*.-%*/", "")
    for _, decl in ipairs({ "typedef enum llmretry_field_type {.-} llmretry_field_type;",
                            "typedef struct llmretry_field {.-} list;%s*} llmretry_field;" }) do
      local c, l = shapes:match(decl), lffi.CDEF:match(decl)
      check(c and l and norm(c) == norm(l), "the cdef and shapes.h differ:\n%s\n%s",
        tostring(l), tostring(c))
    end
    -- The exchange of an io_loop "host" engine, read in place: as host_io.h has it.
    local host_io = H.read_file(H.REPO .. "/core/include/llmretry/host_io.h"):gsub("/%*.-%*/", "")
    local decl = "typedef struct llmretry_exchange {.-} llmretry_exchange;"
    local c, l = host_io:match(decl), lffi.CDEF:match(decl)
    check(c and l and norm(c) == norm(l), "the cdef and host_io.h differ:\n%s\n%s",
      tostring(l), tostring(c))
    local abi = header:match("#define LR_FFI_ABI (%d+)")
    check(tonumber(abi) == require("ffi").cast("const lr_ffi_api *", core._ffi()).abi,
      "LR_FFI_ABI %s", tostring(abi))
  end)

  -- The point of this path is that LuaJIT compiles it: a function of
  -- llmretry.ffi whose trace LuaJIT abandons runs in the interpreter, and
  -- its FFI calls convert every argument one by one. A function that
  -- returns by a tail call to a fast function with side effects (ffi.gc,
  -- a C function through the FFI) is such a place: "leaving loop in root
  -- trace at ffi.gc" (issue 36). A host engine's whole call (submit, the
  -- exchange fed a canned answer, the result, the free), 3,000 times in a
  -- LuaJIT of its own under jit.v, which lists every abandoned trace.
  it("runs a call's path with no trace of llmretry.ffi abandoned at a return", function()
    if not IS_JIT then return end
    -- The path bench/instr_openresty.sh counts: one loop for both.
    local script, log = H.REPO .. "/bench/openresty_path.lua", os.tmpname()
    local p = assert(io.popen("luajit -jv=" .. log .. " " .. script .. " 3000 200; echo rc=$?"))
    local out = p:read("*a")
    p:close()
    check(out:find("rc=0", 1, true), "the loop failed: %s", out)
    local lf = assert(io.open(log))
    local text = lf:read("*a")
    lf:close()
    os.remove(log)
    check(text:find("TRACE", 1, true), "jit.v wrote no trace: %s", text)
    -- "[TRACE --- ffi.lua:387 -- leaving loop in root trace at ffi.gc]": a
    -- trace from llmretry.ffi abandoned at a fast function (not at a line:
    -- a loop that ends before looping back is tried again).
    local abandoned = {}
    for line in text:gmatch("[^\n]+") do
      local start, why = line:match("^%[TRACE %-%-%- ([^ ]*ffi%.lua:%d+) %-%- (.-)%]$")
      if start and why:find("root trace at [%a_][%w_.]*$") then
        abandoned[#abandoned + 1] = start .. ": " .. why
      end
    end
    check(#abandoned == 0, "traces abandoned in llmretry.ffi:\n%s", table.concat(abandoned, "\n"))
  end)

  describe("against the mock", function()
    local mock
    setup(function() mock = H.start_mock() end)
    teardown(function() if mock then mock:stop() end end)

    it("reads a success, a retried success and a failure as the classic path does",
      function()
      if not IS_JIT then return end
      local engine = llm.new_engine()
      -- A plain success, with usage and the answering model.
      local scen = mock:scen("ffi_ok")
      local rf, ef, rc, ec, built = both_ways(engine, opts(scen))
      check(rf and rc, "failed: %s / %s", tostring(ef), tostring(ec))
      check(built == 1, "the FFI path did not build the result (fell back)")
      check(rf ~= rc, "the FFI path gave the classic table itself")
      local ok, why = same(rf, rc)
      check(ok, "FFI and classic results differ: %s", tostring(why))
      check(type(rf.meta.usage) == "table" and rf.meta.usage.total_tokens == 15,
        "usage %s", H.dump(rf.meta.usage))
      -- A success after a 503 (attempts 2), with a raw usage-less answer.
      scen = mock:scen("ffi_retry")
      scen.script({ { status = 503 } })
      rf, ef, rc, ec, built = both_ways(engine, opts(scen))
      check(rf and rc, "failed: %s / %s", tostring(ef), tostring(ec))
      check(built == 1, "the FFI path did not build the retried result (fell back)")
      check(rf.meta.attempts == 2, "attempts %s", tostring(rf.meta.attempts))
      ok, why = same(rf, rc)
      check(ok, "FFI and classic results differ after a retry: %s", tostring(why))
      -- A failure: the classic error table itself, request id and all.
      scen = mock:scen("ffi_fail")
      scen.script({ { status = 400 } })
      rf, ef, rc, ec, built = both_ways(engine, opts(scen, { request_id = "ffi-fail-1" }))
      check(rf == nil and rc == nil, "a 400 succeeded")
      check(built == 0, "a failure was counted as built by the FFI path")
      check(ef == ec, "the failure is not the classic error table")
      check(getmetatable(ef) == core.error_mt and ef.request_id == "ffi-fail-1",
        "error %s", H.dump(ef))
      check(tostring(ef):find("ffi-fail-1", 1, true), "tostring %s", tostring(ef))
      engine:close()
    end)

    it("submits a plain call as engine:submit does, and leaves the rest to it", function()
      if not IS_JIT then return end
      local engine = llm.new_engine()
      local scen = mock:scen("ffi_submit")
      scen.script({ { status = 503 } })
      local before = lffi.submitted
      local o = opts(scen, { request_id = "ffi-sub-1", deadline_ms = 20000 })
      local h = lffi.submit(engine, o)
      check(type(h) == "cdata", "a plain call was not submitted through the FFI: %s",
        tostring(h))
      check(lffi.submitted == before + 1, "not counted")
      check(h:request_id() == "ffi-sub-1", "request_id %s", tostring(h:request_id()))
      check(tostring(h) == "llmretry.handle: ffi-sub-1", "tostring %s", tostring(h))
      check(H.wait_until(function() return lffi.drain(h) end), "the call did not end")
      local built = lffi.calls
      local res = lffi.result(h)
      check(lffi.calls == built + 1, "the FFI path did not build the result")
      check(res.meta.attempts == 2 and res.meta.request_id == "ffi-sub-1"
        and res.meta.model == "gpt-test", "meta %s", H.dump(res.meta))
      -- The request went out as engine:submit sends it.
      local h2 = engine:submit(H.merge(o, { request_id = "ffi-sub-2" }))
      check(h2:wait(10000), "the classic call did not end")
      local recs = scen.wait_requests(3)
      check(#recs == 3, "%d requests", #recs)
      check(recs[2].body == recs[3].body, "the bodies differ:\n%s\n%s", recs[2].body,
        recs[3].body)
      local hd, hc = recs[2].headers, recs[3].headers
      check(hd.authorization == hc.authorization and hd["content-type"] == hc["content-type"],
        "headers differ")
      lffi.free(h)
      -- Not plain: headers, a group, an unknown key, a bad value, a closed
      -- engine: nil, and engine:submit says what it says.
      local function refused(extra, e)
        local o2 = H.merge(opts(scen), extra)
        check(lffi.submit(e or engine, o2) == nil, "taken: %s", H.dump(extra))
      end
      refused({ headers = { ["X-A"] = "1" } })
      refused({ group = engine:group{ limit = 1 } })
      refused({ timeout = 5 })
      refused({ timeout_ms = -5 })
      refused({ timeout_ms = 1.5 })
      refused({ jitter = "sometimes" })
      refused({ body = "" })
      local closed = llm.new_engine()
      closed:close()
      refused({}, closed)
      refused({}, {})
      check(lffi.submitted == before + 1, "a refused call was counted")
      local ok, err = pcall(engine.submit, engine, H.merge(opts(scen), { timeout_ms = -5 }))
      check(not ok and tostring(err):find("timeout_ms", 1, true), "classic: %s", tostring(err))
      -- A failure through an FFI handle: the classic error table.
      scen = mock:scen("ffi_submit_fail")
      scen.script({ { status = 401 } })
      h = lffi.submit(engine, opts(scen, { request_id = "ffi-sub-fail" }))
      check(H.wait_until(function() return lffi.drain(h) end), "the call did not end")
      local r, e = lffi.result(h)
      check(r == nil and getmetatable(e) == core.error_mt and e.kind == "http_status"
        and e.status == 401 and e.request_id == "ffi-sub-fail", "err %s", H.dump(e))
      lffi.free(h)
      engine:close()
    end)

    -- llmretry.ffi keeps a call's options set for the next call that has
    -- the same (issue 36): a call must still get exactly its own, never
    -- one left over from the call before (an option it leaves out, another
    -- value, the model of a table body, a channel, a refused option).
    it("gives each call its own options, whatever the call before had", function()
      if not IS_JIT then return end
      local engine = llm.new_engine()
      local scen = mock:scen("ffi_reuse")
      local function run(o)
        local before = lffi.submitted
        local h = lffi.submit(engine, o)
        check(h ~= nil and lffi.submitted == before + 1, "not submitted through the FFI: %s",
          H.dump(o))
        check(H.wait_until(function() return lffi.drain(h) end), "the call did not end")
        local res, err = lffi.result(h)
        lffi.free(h)
        return res, err
      end
      local base = opts(scen, { request_id = "ffi-reuse-1" })
      local res = run(base)
      check(res and res.meta.request_id == "ffi-reuse-1", "first %s", H.dump(res))
      -- The same options but request_id: a fresh id, not the last one.
      local o2 = H.merge(base)
      o2.request_id = nil
      res = run(o2)
      check(res and res.meta.request_id ~= "ffi-reuse-1" and #res.meta.request_id == 36,
        "an option left out was kept: request_id %s", res and res.meta.request_id)
      -- The same again: the same options, a new id each time.
      local again = run(o2)
      check(again and again.meta.request_id ~= res.meta.request_id, "the id was reused")
      -- Another value: max_retries 0 against a 503 fails; then 1 retries.
      scen.script({ { status = 503 } })
      local r, e = run(H.merge(o2, { max_retries = 0 }))
      check(r == nil and e.status == 503 and e.attempts == 1, "max_retries 0: %s", H.dump(e))
      scen.script({ { status = 503 } })
      r = run(H.merge(o2, { max_retries = 1 }))
      check(r and r.meta.attempts == 2, "max_retries 1: %s", H.dump(r and r.meta))
      -- A table body's model is its call's: a string body after it names
      -- its own (read from the text).
      r = run(H.merge(o2, { body = H.secret_body(scen.name, "model-table") }))
      check(r and r.meta.model == "model-table", "table body model %s", r and r.meta.model)
      r = run(H.merge(o2, { body = core.encode(H.secret_body(scen.name, "model-text")) }))
      check(r and r.meta.model == "model-text", "a table body's model was kept: %s",
        r and r.meta.model)
      -- A channel is its call's: the next call, without one, reports to none.
      local ch = engine:new_channel()
      local heard = {}
      local function listen()
        lffi.poll(ch, function(_, key) heard[#heard + 1] = key end, nil)
        return #heard > 0
      end
      local h1 = lffi.submit(engine, H.merge(o2, { channel = ch }))
      check(H.wait_until(listen), "h1's channel heard nothing")
      check(heard[1] == lffi.key(h1), "the channel heard another call")
      check(H.wait_until(function() return lffi.drain(h1) end), "h1 did not end")
      heard = {}
      local h2 = lffi.submit(engine, o2)
      check(H.wait_until(function() return lffi.drain(h2) end), "h2 did not end")
      listen()
      check(#heard == 0, "a call without a channel reported to the last call's")
      lffi.free(h1)
      lffi.free(h2)
      -- Options the core checked at the call before are not checked again
      -- (LR_SUBMIT_CHECKED); any change is: values the setters take and
      -- only the check refuses (a header's line break in the key, a
      -- request id with a tab), right after a checked call.
      run(o2)
      check(lffi.submit(engine, H.merge(o2, { api_key = "sk-x\r\nX-Injected: 1" })) == nil,
        "an api_key with a line break was taken after a checked call")
      run(o2)
      check(lffi.submit(engine, H.merge(o2, { request_id = "tab\tin it" })) == nil,
        "a request_id with a tab was taken after a checked call")
      -- A refused option in between (the classic path): the next call is
      -- set from nothing again.
      check(lffi.submit(engine, H.merge(o2, { timeout_ms = -5 })) == nil, "-5 was taken")
      r = run(H.merge(o2, { request_id = "ffi-reuse-2" }))
      check(r and r.meta.request_id == "ffi-reuse-2", "after a refusal %s", H.dump(r))
      engine:close()
    end)

    it("carries call_llm without a logger, and not a call with one", function()
      local scen = mock:scen("ffi_call")
      scen.script({ { status = 500 } })
      local before = lffi and lffi.calls or 0
      local res, err = llm.call_llm(H.merge(H.FAST, { body = H.secret_body(scen.name),
        base_url = scen.url, api_key = H.SECRET_KEY }))
      check(res, "call_llm failed: %s", tostring(err))
      check(res.meta.attempts == 2 and res.data.choices[1].message.content == "ok",
        "res %s", H.dump(res.meta))
      if IS_JIT then
        check(lffi.calls == before + 1, "call_llm did not take the FFI path (%d -> %d)",
          before, lffi.calls)
      end
      local seen = 0
      local res2 = llm.call_llm(H.merge(H.FAST, { body = H.secret_body(scen.name),
        base_url = scen.url, api_key = H.SECRET_KEY, logger = function() seen = seen + 1 end }))
      check(res2 and seen > 0, "the logged call: %s, %d events", tostring(res2), seen)
      if IS_JIT then
        check(lffi.calls == before + 1, "a logged call took the FFI path")
      end
    end)
  end)
end)
