-- Channels from Lua (bindings/lua/channel.c): engine:channel() keeps its
-- calls' news to itself; a socket channel (what llmretry.openresty's
-- dispatcher waits on through a cosocket) is connected to with a unix
-- socket (luasocket's socket.unix here), and the engine writes a byte to it
-- when its calls have news.

local H = require("helpers")
local llm = require("llmretry")
local unix = require("socket.unix")
local check = H.check

local function opts(scen, extra)
  return H.merge(H.FAST, { body = H.secret_body(scen.name), base_url = scen.url,
    api_key = H.SECRET_KEY, event_mask = 0 }, extra)
end

-- Take every item of h's mailbox: true once done.
local function drain(h)
  while true do
    local kind = h:next()
    if kind == nil then return false end
    if kind == "done" then return true end
  end
end

describe("channels", function()
  local mock

  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  it("report their own calls, not the engine's", function()
    local scen = mock:scen("plain_channel")
    scen.script({}, { delay_ms = 50 })
    local engine = llm.new_engine()
    local ch = engine:new_channel()
    check(H.is_int(ch:fd()), "an eventfd channel has an fd")
    check(ch:fd() ~= engine:channel():fd(), "a new channel is not the engine's")
    check(ch:path() == nil, "and no path")
    local mine = {}
    for i = 1, 3 do mine[engine:submit(opts(scen, { channel = ch }))] = i end
    local other = engine:submit(opts(scen))
    local done, deadline = 0, H.now_ms() + 10000
    while done < 3 and H.now_ms() < deadline do
      ch:wait(200)
      for _, h in ipairs(ch:poll()) do
        check(mine[h], "the channel reported a call that is not its own")
        if drain(h) then done = done + 1 end
      end
      local hs = engine:channel():poll()
      for _, h in ipairs(hs) do check(h == other, "the engine's channel reported another's call") end
    end
    check(done == 3, "%d of 3 calls done", done)
    ch:close()
    engine:close()
  end)

  it("wake a reader connected to a socket channel", function()
    local scen = mock:scen("socket_channel")
    scen.script({}, { delay_ms = 50 })
    local engine = llm.new_engine()
    local ch = engine:new_channel{ socket = true }
    check(tostring(ch):find("socket", 1, true), "tostring: %s", tostring(ch))
    check(ch:fd() == nil, "a socket channel has no fd to watch")
    local path = ch:path()
    check(type(path) == "string" and path:sub(1, 1) == "/", "path %s", tostring(path))
    check(H.raises(ch.wait, ch, 10):find("connection's end", 1, true), "wait() on a socket channel")

    local t0 = H.now_ms()
    local ok, why = ch:accept(50)
    check(ok == nil and why:find("in time", 1, true), "accept with nobody connected: %s",
      tostring(why))
    check(H.now_ms() - t0 < 2000, "accept waited %d ms", H.now_ms() - t0)

    local client = assert(unix())
    assert(client:connect(path))
    check(ch:accept() == true, "accept took the connection")
    check(ch:path() == nil, "no path once accepted")
    local again, why2 = ch:accept(0)
    check(again == nil and why2:find("already", 1, true), "a second accept: %s", tostring(why2))

    local mine = {}
    for i = 1, 4 do mine[engine:submit(opts(scen, { channel = ch }))] = i end
    check(#engine:channel():poll() == 0, "the engine's own channel sees none of them")
    client:settimeout(5)
    local done, wakes = 0, 0
    while done < 4 do
      local byte, err = client:receive(1)
      check(byte, "no byte from the channel: %s", tostring(err))
      wakes = wakes + 1
      -- Drain until empty: more news meanwhile either comes out here or
      -- writes another byte.
      while true do
        local hs = ch:poll()
        if #hs == 0 then break end
        for _, h in ipairs(hs) do
          check(mine[h], "the channel reported a call that is not its own")
          if drain(h) then done = done + 1 end
        end
      end
    end
    check(wakes >= 1 and wakes <= 8, "%d wakes for 4 calls", wakes)
    ch:close()
    -- The calls hold the C channel too: once they are collected, its end closes.
    mine = nil
    collectgarbage()
    collectgarbage()
    client:settimeout(2)
    -- A wake written after the last drain may still be unread: then EOF.
    local late, err = 0, nil
    repeat
      local byte
      byte, err = client:receive(1)
      if byte then late = late + 1 end
    until not byte or late > 8
    check(err == "closed" and late <= 8, "the channel's end after close: %s (%d bytes first)",
      tostring(err), late)
    client:close()
    engine:close()
  end)

  it("are checked as options", function()
    local engine = llm.new_engine()
    local scen = mock:scen("channel_opts")
    check(H.raises(engine.submit, engine, opts(scen, { channel = {} }))
      :find("channel must be a channel from engine:new_channel() (got table)", 1, true),
      "not a channel")
    local ch = engine:new_channel()
    ch:close()
    check(H.raises(engine.submit, engine, opts(scen, { channel = ch }))
      :find("channel is closed", 1, true), "a closed channel")
    check(H.raises(engine.new_channel, engine, { sockt = true })
      :find("unknown channel option 'sockt' (socket)", 1, true), "a misspelt option")
    check(H.raises(engine.new_channel, engine, { socket = 1 })
      :find("socket must be a boolean (got 1)", 1, true), "a wrong type")
    engine:close()
  end)

  it("of the engine and of a group live as long as their owner", function()
    local scen = mock:scen("own_channels")
    scen.script({}, { delay_ms = 50 })
    local engine = llm.new_engine()
    local g = engine:group{ limit = 2 }
    local gch = g:channel()
    check(H.is_int(gch:fd()) and gch:fd() ~= engine:channel():fd(), "a group's own channel")
    check(engine:group{ limit = 2, poll = false }:channel() == nil, "a pacing group's channel")
    check(H.raises(engine.submit, engine, opts(scen, { channel = gch }))
      :find("a group's channel takes only its group's calls", 1, true), "a group's channel")
    -- The engine's own channel as opts.channel is the default.
    local h = engine:submit(opts(scen, { channel = engine:channel() }))
    local news, seen = engine:channel(), false
    local deadline = H.now_ms() + 10000
    while not seen and H.now_ms() < deadline do
      news:wait(200)
      for _, x in ipairs(news:poll()) do seen = seen or x == h end
    end
    check(seen, "the engine's channel did not report the call")
    -- close() on an own channel lets go of it, not of the owner's.
    news:close()
    check(H.is_int(engine:channel():fd()), "the engine's channel went with a close()")
    g:close()
    check(tostring(gch):find("closed", 1, true), "a closed group's channel: %s", tostring(gch))
    check(#gch:poll() == 0 and gch:wait(0) == false, "a closed group's channel polls nothing")
    -- An own channel keeps its owner alive.
    local probe = setmetatable({}, { __mode = "v" })
    local kept
    do
      local e2 = llm.new_engine()
      probe.engine = e2
      kept = e2:channel()
    end
    collectgarbage()
    collectgarbage()
    check(probe.engine ~= nil and H.is_int(kept:fd()), "the engine went before its channel")
    kept = nil -- luacheck: ignore
    collectgarbage()
    collectgarbage()
    check(probe.engine == nil, "the engine was not collected after its channel")
    engine:close()
  end)
end)
