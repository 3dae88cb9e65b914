-- core.uuid4: the core's UUID v4 (the system's CSPRNG), which the module
-- uses for idempotency_key = "auto" instead of reading /dev/urandom itself.

local H = require("helpers")
local core = require("llmretry.core")
local check = H.check

describe("uuid4", function()
  it("gives distinct version-4 UUIDs", function()
    local seen = {}
    for _ = 1, 200 do
      local id = core.uuid4()
      local pattern = "^" .. ("%x"):rep(8) .. "%-" .. ("%x"):rep(4) .. "%-4" .. ("%x"):rep(3)
        .. "%-[89ab]" .. ("%x"):rep(3) .. "%-" .. ("%x"):rep(12) .. "$"
      check(id:match(pattern), "not a UUID v4: %s", id)
      check(not seen[id], "repeated: %s", id)
      seen[id] = true
    end
  end)
end)
