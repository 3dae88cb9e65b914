-- The Lua examples of README.md and docs/*.md, each run as a program of its
-- own by this interpreter against the mock server: the docs cannot go stale.
--
-- The examples and their markers come from tests/python/doc_examples.py (one
-- extractor for both suites; tests/python/test_docs.py runs the Python and
-- shell ones). Each example gets LLMRETRY_MOCK (the mock's root URL),
-- OPENAI_BASE_URL (its /v1) and a fake OPENAI_API_KEY, and the file's mock
-- scenarios freshly loaded.

local H = require("helpers")
local json = H.json
local q = H.shell_quote

local FAKE_KEY = "sk-doc-test-not-a-real-key"

local function list_examples()
  local script = q(H.REPO .. "/tests/python/doc_examples.py")
  local p = assert(io.popen(H.CLEAN_ENV .. "python3 " .. script .. " lua"))
  local text = p:read("*a")
  local ok = p:close()
  assert(ok, "tests/python/doc_examples.py failed")
  return assert(json.decode(text), "doc_examples.py printed no JSON")
end

local EXAMPLES = list_examples()

-- An example's output block (doc_examples.py's "output"): each expected
-- line, as its pieces between "..."s, found in order in a line of the output,
-- the lines in order. As doc_examples.unmatched_output.
local function has_in_order(line, pieces)
  local pos = 1
  for _, piece in ipairs(pieces) do
    local s, e = line:find(piece, pos, true)
    if not s then return false end
    pos = e + 1
  end
  return true
end

local function unmatched_output(expected, text)
  local lines = {}
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = line end
  local at = 1
  for _, pieces in ipairs(expected) do
    while at <= #lines and not has_in_order(lines[at], pieces) do at = at + 1 end
    if at > #lines then return table.concat(pieces, "...") end
    at = at + 1
  end
  return nil
end

describe("doc examples (Lua)", function()
  local mock

  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  it("finds the Lua examples", function()
    local runnable = 0
    for _, ex in ipairs(EXAMPLES) do
      if ex.skip == nil or ex.skip == json.null then runnable = runnable + 1 end
    end
    H.check(runnable > 0, "no runnable Lua example in README.md or docs/")
  end)

  for _, ex in ipairs(EXAMPLES) do
    local skip = ex.skip ~= json.null and ex.skip or nil
    if skip then
      pending(ex.name .. ": " .. skip)
    else
      it(ex.name, function()
        if ex.scenarios ~= json.null and ex.scenarios then
          for name, script in pairs(ex.scenarios) do
            mock:put_scenario(name, script)
          end
        end
        local file = os.tmpname()
        H.write_file(file, ex.code)
        local out = os.tmpname()
        local cmd = string.format("cd %s && LLMRETRY_MOCK=%s OPENAI_BASE_URL=%s "
          .. "OPENAI_API_KEY=%s timeout 20 %s %s >%s 2>&1", q(H.REPO), q(mock.root),
          q(mock.base_url), q(FAKE_KEY), q(H.interpreter()), q(file), q(out))
        local ok, _, code = os.execute(cmd)
        local text = H.read_file(out)
        os.remove(file)
        os.remove(out)
        -- Lua 5.1 returns the status alone; 5.2+ returns true/nil, "exit", code.
        local passed = ok == true or ok == 0
        H.check(passed, "%s exited with %s\n--- code\n%s--- output\n%s", ex.name,
          tostring(code or ok), ex.code, text:sub(-3000))
        H.check(not text:find(FAKE_KEY, 1, true), "%s printed the API key", ex.name)
        if ex.output ~= json.null and ex.output then
          local missing = unmatched_output(ex.output, text)
          H.check(missing == nil, "%s did not print %q (its output block, in order)\n"
            .. "--- output\n%s", ex.name, tostring(missing), text:sub(-3000))
        end
      end)
    end
  end
end)
