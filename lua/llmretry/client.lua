-- llmretry.client: named policies (issue 9) and clients, the half of the
-- llmretry module (init.lua) that resolves a call's options before it runs.
-- init.lua installs it into the module: install(M, split_options, sched),
-- with its Lua-side option split and this Lua state's pools, so the
-- Client's methods run as the module's call_llm, stream_llm, call_many and
-- map_with_concurrency do.

local core = require("llmretry.core")
local args = require("llmretry.args")

local type, pairs, ipairs, error, pcall, tostring = type, pairs, ipairs, error, pcall, tostring
local setmetatable, getmetatable = setmetatable, getmetatable
local string, table = string, table
local argerror = args.argerror

return function(M, split_options, sched)
  -- llm.load_policies(source): a table (name -> settings) or the path of a
  -- policies .json file, checked now (unknown keys, wrong types, out-of-range
  -- values raise, naming the file, the policy and the key).
  -- llm.client{ policies = ..., <default call options> }: call_llm, call_many
  -- and map_with_concurrency with opts.policy = NAME. For one call: explicit
  -- options > the named policy > the client's defaults > built-in defaults.

  local policies_mod = require("llmretry.policies")

  function M.load_policies(source)
    local ok, p = pcall(policies_mod.load, source)
    if not ok then error(p, 2) end
    return p
  end

  -- A fresh idempotency key: a UUID v4 from the core (the system's CSPRNG).
  local new_idempotency_key = core.uuid4
  M._new_idempotency_key = new_idempotency_key

  local Client = {}
  Client.__index = Client
  Client.__name = "llmretry.client"

  -- tostring(client): its endpoint (user info and query as ***: core.url_shown),
  -- the retry settings it was given and whether it has a key, never the key
  -- (as Python's Client repr).
  function Client.__tostring(self)
    local d = self.defaults
    local name = d.url ~= nil and "url" or "base_url"
    local url = d[name]
    local parts = { name .. "=" .. (type(url) == "string" and string.format("%q",
      core.url_shown(url)) or "nil") }
    for _, k in ipairs{ "timeout_ms", "max_retries", "deadline_ms" } do
      if d[k] ~= nil then parts[#parts + 1] = k .. "=" .. tostring(d[k]) end
    end
    if self.default_policy ~= nil then
      parts[#parts + 1] = string.format("policy=%q", self.default_policy)
    end
    local key = d.api_key
    parts[#parts + 1] = (type(key) == "string" and key ~= "") and "api_key=<set>"
      or "api_key=<unset>"
    return "llmretry.client(" .. table.concat(parts, ", ") .. ")"
  end

  function M.client(opts)
    if opts == nil then opts = {} end
    if type(opts) ~= "table" then argerror(2, "opts", "a table or nil", opts) end
    local pols = opts.policies
    if pols == nil then
      pols = policies_mod.load({})
    else
      local ok, p = pcall(policies_mod.load, pols)
      if not ok then error(p, 2) end
      pols = p
    end
    local defaults = {}
    for k, v in pairs(opts) do
      if k ~= "policies" and k ~= "policy" and k ~= "shared" then defaults[k] = v end
    end
    -- shared (docs/shared.md): the client's calls on an engine of their own
    -- whose endpoints' budgets live in that store. An engine passed in has its
    -- store already.
    if opts.shared ~= nil then
      if type(opts.shared) ~= "string" then
        argerror(2, "opts.shared", '"shm:NAME" or "redis://..." (a string) or nil', opts.shared)
      end
      if opts.engine ~= nil then
        error("llmretry: opts.shared and opts.engine: give one (an engine has its store: "
          .. "llmretry.new_engine(n, conns, shared))", 2)
      end
      local ok, engine = pcall(core.new_engine, nil, nil, opts.shared)
      if not ok then error(engine, 2) end
      defaults.engine = engine
    end
    -- Bad defaults raise now, naming the option, as Python's Client does.
    local sub = split_options(defaults, 2)
    local ok_opts, why = pcall(core.check_options, sub)
    if not ok_opts then error(why, 2) end
    local self = setmetatable({ policies = pols, defaults = defaults }, Client)
    if opts.policy ~= nil then
      if type(opts.policy) ~= "string" or not pols:get(opts.policy) then
        error(pols:unknown(opts.policy), 2)
      end
      self.default_policy = opts.policy
    end
    return self
  end

  -- The endpoints of the client's engine (M.endpoint_stats).
  function Client:endpoint_stats()
    return M.endpoint_stats(self.defaults.engine)
  end

  -- The settings of the policy `name` (nil: none), or raise naming it.
  local function policy_of(self, name, level)
    if name == nil then return nil end
    if type(name) ~= "string" then
      argerror(level + 1, "policy", "a policy name (a string) or nil", name)
    end
    local p = self.policies:get(name)
    if not p then error(self.policies:unknown(name), level + 1) end
    return p
  end

  -- The options of one call (or of a call_many batch: `many`): explicit >
  -- policy > client defaults. Returns the merged options and whether each call
  -- needs a fresh idempotency key.
  local function resolve(self, opts, level, many, pool_policy)
    if opts == nil then opts = {} end
    if type(opts) ~= "table" then argerror(level + 1, "opts", "a table", opts) end
    local name = opts.policy
    if name == nil then name = pool_policy end
    if name == nil then name = self.default_policy end
    local p = policy_of(self, name, level + 1)
    local out = {}
    for k, v in pairs(self.defaults) do out[k] = v end
    if many and out.deadline_ms ~= nil then
      -- A client's deadline_ms is per call; call_many's is the whole batch's.
      out.call_deadline_ms, out.deadline_ms = out.deadline_ms, nil
    end
    local explicit_url = opts.url ~= nil or opts.base_url ~= nil
    local model, auto
    if p then
      -- The policy over the client's defaults, as the core resolves it.
      local layer = self.policies:layer(name, self.defaults)
      for k, v in pairs(layer) do
        if v == core.null then v = nil end
        if k == "model" then
          model = v
        elseif k == "idempotency_key" then
          auto = v == "auto"       -- a fresh key per call, by the caller
        else
          out[k] = v
        end
      end
      out.url = layer.url
      if many then
        -- A client's or a policy's deadline_ms is per call; call_many's own
        -- is the whole batch's.
        out.call_deadline_ms, out.deadline_ms = out.deadline_ms, nil
      end
      out.policy = name
    end
    for k, v in pairs(opts) do
      if k ~= "policy" then out[k] = v end
    end
    if explicit_url then
      -- The endpoint is one setting: the caller's url or base_url replaces both.
      if opts.url == nil then out.url = nil end
      if opts.base_url == nil then out.base_url = nil end
    end
    return out, auto and opts.idempotency_key == nil, model
  end

  -- A body with `model` filled in when it is a table without one.
  local function with_model(body, model)
    if model == nil or type(body) ~= "table" or body.model ~= nil then return body end
    local b = {}
    for k, v in pairs(body) do b[k] = v end
    local mt = getmetatable(body)
    if mt then setmetatable(b, mt) end
    b.model = model
    return b
  end

  function Client:call_llm(opts)
    if getmetatable(self) ~= Client then
      error("llmretry: call client:call_llm(opts) with a colon", 2)
    end
    local pool = sched.current()
    local o, auto, model = resolve(self, opts, 2, false, pool and pool.policy or nil)
    if auto then o.idempotency_key = new_idempotency_key() end
    o.body = with_model(o.body, model)
    return M.call_llm(o)
  end

  function Client:stream_llm(opts, on_chunk)
    if getmetatable(self) ~= Client then
      error("llmretry: call client:stream_llm(opts, on_chunk) with a colon", 2)
    end
    local pool = sched.current()
    local o, auto, model = resolve(self, opts, 2, false, pool and pool.policy or nil)
    if auto then o.idempotency_key = new_idempotency_key() end
    o.body = with_model(o.body, model)
    return M.stream_llm(o, on_chunk)
  end

  function Client:call_many(bodies, opts)
    if getmetatable(self) ~= Client then
      error("llmretry: call client:call_many(bodies, opts) with a colon", 2)
    end
    local o, auto, model = resolve(self, opts, 2, true)
    if type(bodies) == "table" and model ~= nil then
      local bs = {}
      for i = 1, #bodies do bs[i] = with_model(bodies[i], model) end
      bodies = bs
    end
    return M._call_many(bodies, o, auto and new_idempotency_key or nil)
  end

  function Client:map_with_concurrency(items, limit, worker, opts)
    if getmetatable(self) ~= Client then
      error("llmretry: call client:map_with_concurrency(...) with a colon", 2)
    end
    local name
    if opts ~= nil and type(opts) == "table" and opts.policy ~= nil then
      policy_of(self, opts.policy, 2)
      name = opts.policy
      local o = {}
      for k, v in pairs(opts) do if k ~= "policy" then o[k] = v end end
      opts = o
    end
    if opts == nil or type(opts) == "table" then
      local o = {}
      for k, v in pairs(opts or {}) do o[k] = v end
      if o.logger == nil then o.logger = self.defaults.logger end
      if o.engine == nil then o.engine = self.defaults.engine end
      opts = o
    end
    return M._map_with_concurrency(items, limit, worker, opts, name)
  end

  -- name -> the 14 resolved settings of each policy of this client (over its
  -- defaults).
  function Client:resolved()
    return self.policies:resolved(self.defaults)
  end

  function Client:names()
    return self.policies:names()
  end

  return Client
end
