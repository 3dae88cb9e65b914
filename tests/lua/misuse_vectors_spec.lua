-- The Lua misuse vectors (tests/vectors/lua_misuse/cases.json) on the
-- blocking module: the same cases run in headless Neovim on llmretry.nvim
-- (tests/nvim/test_nvim.lua) and in nginx on llmretry.openresty
-- (tests/openresty/host_check.py), so a bad argument reads alike in every host.

local H = require("helpers")
local llm = require("llmretry")
local run = require("misuse_vectors").run
local check = H.check

describe("misuse vectors", function()
  it("raise the vector's message at the caller, before any I/O", function()
    local mock = H.start_mock()
    local ok, err = pcall(function()
      local scen = mock:scen("misuse_vectors")
      local doc = H.json.decode(H.read_file(H.VECTOR_DIR .. "/lua_misuse/cases.json"))
      local ran, failures = run(doc, "lua", llm, function()
        return { body = H.secret_body("misuse"), base_url = scen.url, api_key = H.SECRET_KEY }
      end)
      check(#failures == 0, "%d of %d cases failed:\n%s", #failures, ran,
        table.concat(failures, "\n"))
      check(ran >= 30, "only %d cases ran", ran)
      check(#scen.requests() == 0, "a misused call reached the server")
    end)
    mock:stop()
    if not ok then error(err, 0) end
  end)
end)
