-- llm.stream_llm under lua5.4 and luajit against the mock's SSE scenarios
-- (docs/streaming.md): chunks to on_chunk as they arrive, the assembled result, the
-- commit point, interrupted streams, streams inside map_with_concurrency.
-- The Python twin is tests/python/test_stream.py.

local H = require("helpers")
local llm = require("llmretry")
local check = H.check

local function content_of(chunks)
  local out = {}
  for _, ch in ipairs(chunks) do
    for _, choice in ipairs(ch.choices or {}) do
      local d = choice.delta
      if type(d) == "table" and type(d.content) == "string" then out[#out + 1] = d.content end
    end
  end
  return table.concat(out)
end

describe("stream_llm", function()
  local mock

  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  local function opts(scen, extra)
    return H.merge({ body = H.secret_body(scen.name), base_url = scen.url,
      api_key = H.SECRET_KEY, base_delay_ms = 10, jitter = "none", timeout_ms = 5000 }, extra)
  end

  it("gives each chunk to on_chunk, then the assembled result", function()
    local scen = mock:scen("lua_stream_ok")
    scen.script({ { stream = { chunks = { "Hel", "lo" } } } })
    local chunks = {}
    local rec = H.recorder()
    local res, err = llm.stream_llm(opts(scen, { logger = rec.fn }), function(ch)
      chunks[#chunks + 1] = ch
    end)
    check(res, "failed: %s", tostring(err))
    check(content_of(chunks) == "Hello", "chunks say %q", content_of(chunks))
    check(#chunks == 4, "%d chunks (2 deltas, finish, usage)", #chunks)
    check(res.data.choices[1].message.content == "Hello", "assembled %s",
      H.dump(res.data.choices[1].message))
    check(res.meta.stream == true and res.meta.chunks == 4, "meta %s", H.dump(res.meta))
    check(res.meta.usage and res.meta.usage.total_tokens == 15, "usage %s", H.dump(res.meta.usage))
    local sent = H.json.decode(scen.requests()[1].body)
    check(sent.stream == true and sent.stream_options.include_usage == true, "sent %s",
      scen.requests()[1].body)
    local last = rec.events[#rec.events]
    H.check_event_shape(last)
    check(last.event == "llm_request_succeeded" and last.stream == true, "last event %s",
      H.dump(last))
  end)

  it("says in meta that a plain call did not stream, as Python's Meta does", function()
    -- Meta is the core's meta shape in both languages: every field there.
    local scen = mock:scen("lua_plain_meta")
    scen.script({ {} })
    local res, err = llm.call_llm(opts(scen))
    check(res, "failed: %s", tostring(err))
    local m = res.meta
    check(m.stream == false and m.chunks == 0 and m.ttft_ms == nil and m.target == 0 and
      m.resends == 0 and m.attempts == 1 and m.status == 200, "meta %s", H.dump(m))
  end)

  it("retries a failure before the first chunk reached on_chunk", function()
    local scen = mock:scen("lua_stream_retry")
    scen.script({ { status = 503 }, { stream = { chunks = { "x", "y" } } } })
    local chunks = {}
    local res, err = llm.stream_llm(opts(scen), function(ch) chunks[#chunks + 1] = ch end)
    check(res, "failed: %s", tostring(err))
    check(content_of(chunks) == "xy" and res.meta.attempts == 2, "got %q in %s attempts",
      content_of(chunks), tostring(res.meta.attempts))
  end)

  it("does not retry once a chunk was delivered: stream_interrupted", function()
    local scen = mock:scen("lua_stream_broken")
    scen.script({ { stream = { chunks = { "a", "b", "c" }, ["end"] = "error_event", after = 2,
      delay_ms = 100, error_code = "server_error" } } })
    local chunks = {}
    local res, err = llm.stream_llm(opts(scen), function(ch) chunks[#chunks + 1] = ch end)
    check(res == nil and err, "no error")
    H.check_error(err, "stream_interrupted")
    check(err.reason == "error_event" and err.stream_reason == "error_event", "reason %s",
      tostring(err.reason))
    check(err.chunks_delivered == #chunks and #chunks >= 1, "chunks_delivered %s of %d",
      tostring(err.chunks_delivered), #chunks)
    check(err.error_code == "server_error", "error_code %s", tostring(err.error_code))
    check(err.partial and err.partial.data.choices[1].message.content == content_of(chunks),
      "partial %s", H.dump(err.partial))
    check(#scen.requests() == 1, "a delivered stream was retried")
  end)

  it("an on_chunk that raises stops the stream and the error is raised", function()
    local scen = mock:scen("lua_stream_raise")
    scen.script({ { stream = { chunks = 20, delay_ms = 20 } } })
    local ok, e = pcall(llm.stream_llm, opts(scen), function() error("boom", 0) end)
    check(not ok and e == "boom", "raised %s", tostring(e))
  end)

  it("refuses a missing on_chunk at once, before any I/O", function()
    local scen = mock:scen("lua_stream_args")
    local ok, e = pcall(llm.stream_llm, opts(scen))
    check(not ok and tostring(e):find("on_chunk", 1, true), "error %s", tostring(e))
    check(#scen.requests() == 0, "a request was sent")
  end)

  it("streams inside map_with_concurrency workers, several at once", function()
    local scen = mock:scen("lua_stream_pool")
    scen.script({}, { stream = { chunks = { "p", "q" }, delay_ms = 100 } })
    local t0 = H.now_ms()
    local results = llm.map_with_concurrency({ 1, 2, 3, 4 }, 4, function(i)
      local seen = {}
      local res, err = llm.stream_llm(opts(scen), function(ch) seen[#seen + 1] = ch end)
      assert(res, tostring(err))
      return content_of(seen)
    end)
    local wall = H.now_ms() - t0
    for i = 1, 4 do check(results[i] == "pq", "results[%d] = %s", i, tostring(results[i])) end
    -- 4 streams of ~300 ms side by side, not one after another.
    check(wall < 1000, "4 streams took %.0f ms", wall)
  end)

  it("a client's stream_llm applies its policy", function()
    local scen = mock:scen("lua_stream_client")
    scen.script({ { stream = { chunks = { "c" } } } })
    local c = llm.client{ policies = { s = { model = "policy-model", max_retries = 1 } },
      base_url = scen.url, api_key = H.SECRET_KEY }
    local body = H.secret_body(scen.name)
    body.model = nil
    local n = 0
    local res, err = c:stream_llm({ body = body, policy = "s" }, function() n = n + 1 end)
    check(res, "failed: %s", tostring(err))
    check(n >= 1 and H.json.decode(scen.requests()[1].body).model == "policy-model",
      "model not filled")
  end)
end)

-- How a stream ends (DESIGN rule 9), issue 27: its terminal event ends the
-- call whatever the server does next, an end with no finish_reason is no
-- answer, typed (Responses API) streams without event: lines, their usage,
-- text holding U+0000. The Python twin is tests/python/test_stream_ends.py.
describe("the end of a stream", function()
  local mock

  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  local FAST = { api_key = H.SECRET_KEY, base_delay_ms = 10, jitter = "none", timeout_ms = 5000 }
  -- timeout_ms far above the test, a deadline of a few seconds: reading on
  -- after [DONE] fails at the deadline (3 s) instead of hanging.
  local HELD = H.merge(FAST, { timeout_ms = 20000, deadline_ms = 3000, max_retries = 2 })

  local function body_of(scen, extra)
    return H.merge(H.secret_body(scen.name), extra or {})
  end

  -- The answer's text: a chat.completion's content, a response's output_text.
  local function text_of(data)
    if data.object == "response" then return data.output[1].content[1].text end
    return data.choices[1].message.content
  end

  -- One request, and the connection the server held open closed by us.
  local function check_one_request_closed(scen)
    local recs
    H.wait_until(function()
      recs = scen.requests()
      return recs[#recs].client_gone == true
    end, 3000)
    check(#recs == 1, "the request was sent %d times", #recs)
    check(recs[#recs].client_gone == true, "the held connection was never closed")
  end

  local HOLDS = {
    { "silence", { after_done = "silence" } },
    { "junk", { after_done = "junk" } },
    { "content_length", { framing = "length" } },
    { "typed_silence", { api = "responses", event_lines = false, after_done = "silence" } },
  }
  for _, hold in ipairs(HOLDS) do
    local label, how = hold[1], hold[2]
    local function held(hint)
      local scen = mock:scen(hint .. "_" .. label)
      scen.script({ { stream = H.merge(how, { chunks = { "o", "k" } }) } },
        { stream = { chunks = { "retried" } } })
      return scen
    end

    it("stream_llm ends at the terminal event (" .. label .. ")", function()
      local scen = held("end_stream")
      local n = 0
      local res, err = llm.stream_llm(H.merge(HELD, { body = body_of(scen), base_url = scen.url }),
        function() n = n + 1 end)
      check(res, "failed: %s", tostring(err))
      check(text_of(res.data) == "ok" and n == 4, "%d chunks, %s", n, H.dump(res.data))
      check(res.meta.attempts == 1, "attempts %s", tostring(res.meta.attempts))
      check_one_request_closed(scen)
    end)

    it("call_llm with a streaming body ends at the terminal event (" .. label .. ")", function()
      local scen = held("end_call")
      local res, err = llm.call_llm(H.merge(HELD, { body = body_of(scen, { stream = true }),
        base_url = scen.url }))
      check(res, "failed: %s", tostring(err))
      check(text_of(res.data) == "ok", "data %s", H.dump(res.data))
      check_one_request_closed(scen)
    end)

    it("call_many of streaming bodies ends at the terminal event (" .. label .. ")", function()
      local scen = held("end_many")
      local opts = H.merge(HELD, { base_url = scen.url, call_deadline_ms = 3000 })
      opts.deadline_ms = nil
      local outs = llm.call_many({ body_of(scen, { stream = true }) }, opts)
      check(not llm.is_error(outs[1]), "failed: %s", tostring(outs[1]))
      check(text_of(outs[1].data) == "ok", "data %s", H.dump(outs[1].data))
      check_one_request_closed(scen)
    end)
  end

  it("a role-only chunk then [DONE] is truncated, not an empty answer", function()
    local scen = mock:scen("role_only")
    -- The usage chunk and [DONE] 300 ms after the role-only chunk: time
    -- for on_chunk to take it (the commit point).
    scen.script({ { stream = { role_only = true, delay_ms = 300 } } },
      { stream = { chunks = { "retried" } } })
    local res, err = llm.stream_llm(H.merge(FAST, { body = body_of(scen), base_url = scen.url }),
      function() end)
    check(res == nil and err, "succeeded: %s", H.dump(res and res.data))
    H.check_error(err, "stream_interrupted")
    check(err.reason == "truncated", "reason %s", tostring(err.reason))
    check(#scen.requests() == 1, "retried after the commit point")

    -- Before the commit point (call_llm): retried until a real answer.
    scen.script({ { stream = { role_only = true } }, { stream = { chunks = { "o", "k" } } } })
    res, err = llm.call_llm(H.merge(FAST, { body = body_of(scen, { stream = true }),
      base_url = scen.url }))
    check(res and text_of(res.data) == "ok" and res.meta.attempts == 2, "got %s / %s",
      H.dump(res and res.data), tostring(err))
  end)

  it("a typed stream without event: lines, to a /responses URL", function()
    local scen = mock:scen("typed")
    scen.script({ { usage = { prompt_tokens = 5, completion_tokens = 2, total_tokens = 7 },
      stream = { api = "responses", event_lines = false, chunks = { "Hi", "!" } } } })
    local types = {}
    local res, err = llm.stream_llm(H.merge(FAST, { body = { model = "m", input = "SECRET" },
      url = scen.url .. "/responses" }), function(ch) types[#types + 1] = ch.type end)
    check(res, "failed: %s", tostring(err))
    check(table.concat(types, ",") == "response.created,response.output_text.delta,"
      .. "response.output_text.delta,response.completed", "chunks %s", table.concat(types, ","))
    check(res.data.object == "response" and text_of(res.data) == "Hi!", "data %s", H.dump(res.data))
    local u = res.meta.usage
    check(u.prompt_tokens == 5 and u.completion_tokens == 2 and u.total_tokens == 7,
      "usage %s", H.dump(u))
    local sent = H.json.decode(scen.requests()[1].body)
    check(sent.stream == true and sent.stream_options == nil, "sent %s", scen.requests()[1].body)
  end)

  it("a whole answer to a stream (a server that does not stream) reaches on_chunk", function()
    -- stream_whole.c: an on_chunk filling a buffer got nothing, an empty answer.
    local scen = mock:scen("lua_whole")
    scen.script({ { stream = false, content = "whole answer" },
      { stream = false, content = "whole response" } })
    local chunks = {}
    local res, err = llm.stream_llm(H.merge(FAST, { body = body_of(scen), base_url = scen.url }),
      function(ch) chunks[#chunks + 1] = ch end)
    check(res, "failed: %s", tostring(err))
    check(#chunks == 1 and chunks[1].object == "chat.completion.chunk" and
      content_of(chunks) == "whole answer", "chunks %s", H.dump(chunks))
    check(res.data.object == "chat.completion" and res.meta.stream == true and
      res.meta.chunks == 0, "result %s %s", H.dump(res.data), H.dump(res.meta))
    local types, deltas = {}, {}
    res, err = llm.stream_llm(H.merge(FAST, { body = { model = "m", input = "SECRET" },
      url = scen.url .. "/responses" }), function(ch)
        types[#types + 1] = ch.type
        if ch.type == "response.output_text.delta" then deltas[#deltas + 1] = ch.delta end
      end)
    check(res, "failed: %s", tostring(err))
    check(types[1] == "response.created" and types[#types] == "response.completed" and
      table.concat(deltas) == "whole response", "events %s", table.concat(types, ","))
  end)

  it("keeps U+0000 in the assembled text", function()
    local scen = mock:scen("nul")
    local pieces = { "xa\0by", "\31" .. "0", "\\u0000" }
    scen.script({ { stream = { chunks = pieces } } })
    local got = {}
    local res, err = llm.stream_llm(H.merge(FAST, { body = body_of(scen), base_url = scen.url }),
      function(ch)
        local d = ch.choices[1] and ch.choices[1].delta
        if d and type(d.content) == "string" then got[#got + 1] = d.content end
      end)
    check(res, "failed: %s", tostring(err))
    check(table.concat(got) == table.concat(pieces), "chunks %q", table.concat(got))
    check(res.data.choices[1].message.content == table.concat(pieces), "assembled %q",
      tostring(res.data.choices[1].message.content))
  end)
end)
