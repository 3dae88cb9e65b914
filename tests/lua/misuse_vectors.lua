-- The Lua misuse vectors (tests/vectors/lua_misuse/cases.json) in any host:
-- busted (misuse_vectors_spec.lua, lua5.4 and luajit), headless Neovim
-- (tests/nvim/test_nvim.lua) and nginx (tests/openresty/nginx.conf.in's
-- /misuse_vectors). The same file is loaded everywhere, so "points at the
-- caller" means the same thing everywhere: this file, where it calls.
--
-- Values in a case's args: "$function" is a function, "$nil" a hole (nil),
-- {"$opts": {...}} the options of a valid call (the host's base_opts())
-- with those keys changed ("$nil" removes one); anything else is as decoded.

local unpack = table.unpack or unpack
local HERE = debug.getinfo(1, "S").short_src

local M = {}

local PUBLIC = { "call_llm", "stream_llm", "call_many", "map_with_concurrency" }

local function value(v, base_opts)
  if v == "$function" then return function() end end
  if type(v) ~= "table" then return v end
  local out
  if v["$opts"] ~= nil then
    out = base_opts()
    for k, x in pairs(v["$opts"]) do
      if x == "$nil" then out[k] = nil else out[k] = value(x, base_opts) end
    end
    return out
  end
  out = {}
  for k, x in pairs(v) do out[k] = value(x, base_opts) end
  return out
end

-- What f(args) raises, called from this file (not a tail call: the error's
-- position is this line).
local function raised(f, args)
  local ok, e = pcall(function()
    local a, b = f(unpack(args, 1, args.n))
    return a, b
  end)
  if ok then return nil end
  return e
end

-- Run every case of `doc` (the decoded vector) whose function `host` has, on
-- module `llm`. base_opts() gives a valid call's options (against a mock
-- scenario that must see no request); adapt(name, args), if given, fits
-- args to the host's signature (Neovim's map_with_concurrency takes on_done
-- before opts). Returns the number of cases run and a list of failures.
function M.run(doc, host, llm, base_opts, adapt)
  local failures, ran = {}, 0
  local has = {}
  for _, name in ipairs(doc.functions[host]) do has[name] = true end
  for _, name in ipairs(PUBLIC) do
    if (type(llm[name]) == "function") ~= (has[name] == true) then
      failures[#failures + 1] = string.format("%s: %s %s", host, name,
        has[name] and "is missing" or "exists, but the vector does not list it for this host")
    end
  end
  for i, case in ipairs(doc.cases) do
    local name = case["function"]
    if has[name] then
      ran = ran + 1
      local args = { n = #case.args }
      for j = 1, args.n do
        if case.args[j] ~= "$nil" then args[j] = value(case.args[j], base_opts) end
      end
      if adapt then adapt(name, args) end
      local want = case.host_message and case.host_message[host] or case.message
      local e = raised(llm[name], args)
      local why
      if e == nil then
        why = "no error"
      elseif type(e) ~= "string" then
        why = "raised a " .. type(e) .. ", not a message"
      elseif e:sub(1, #HERE + 1) ~= HERE .. ":" then
        why = "does not point at the caller (" .. HERE .. "): " .. e
      else
        local msg = e:sub(#HERE + 2):gsub("^%d+: ", "", 1)
        if msg ~= want then why = string.format("%q, want %q", msg, want) end
      end
      if why then
        failures[#failures + 1] = string.format("%s: case %d, %s: %s", host, i, name, why)
      end
    end
  end
  return ran, failures
end

return M
