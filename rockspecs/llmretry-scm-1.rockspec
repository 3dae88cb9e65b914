-- llmretry for Lua 5.4 and LuaJIT / Lua 5.1, built from this checkout:
--   luarocks --lua-version 5.4 make rockspecs/llmretry-scm-1.rockspec
--   luarocks --lua-version 5.1 make rockspecs/llmretry-scm-1.rockspec   (LuaJIT)
-- The C core needs the headers of libcurl, cJSON and hiredis: on Debian/Ubuntu
--   apt-get install libcurl4-openssl-dev libcjson-dev libhiredis-dev
rockspec_format = "3.0"
package = "llmretry"
version = "scm-1"

source = {
   url = "git+file:///dev/null/llmretry.git",  -- built with `luarocks make` from a checkout
}

description = {
   summary = "Retries, deadlines, events and a coroutine pool around OpenAI-compatible chat calls",
   detailed = [[
llmretry puts a production policy around every call to an OpenAI-compatible chat
API: a timeout per attempt, one total deadline, retries of transient failures only
(exponential backoff with jitter, Retry-After), a request id, structured log events,
response validation and token accounting, plus a coroutine pool (map_with_concurrency)
whose calls all run at once on one C engine. One C core (libcurl + cJSON) does the
I/O on its own thread; nothing blocks your event loop (engine:fd/poll/wait).

Build requirements: the headers of libcurl, cJSON and hiredis (shared budgets
through Redis). On Debian/Ubuntu:
  apt-get install libcurl4-openssl-dev libcjson-dev libhiredis-dev
("Could not find header file for CURL", "... for CJSON" or "... for HIREDIS" from
luarocks means one of those packages is missing; elsewhere pass CURL_DIR=... /
CJSON_DIR=... / HIREDIS_DIR=...)
]],
   labels = { "llm", "openai", "http", "retry", "curl" },
}

dependencies = {
   "lua >= 5.1, < 5.5",
}

-- CURL is checked by its library, not by curl/curl.h: Debian and Ubuntu keep
-- curl's headers in a multiarch directory (/usr/include/<triplet>/curl) that
-- the C compiler searches by itself but luarocks does not. The unversioned
-- libcurl.so comes with the -dev package only, so the check still means
-- "the development files are installed". A missing one reads
-- "Could not find library file for CURL" / "... header file for CJSON" /
-- "... header file for HIREDIS": apt-get install libcurl4-openssl-dev libcjson-dev
-- libhiredis-dev
external_dependencies = {
   CURL = { library = "curl" },
   CJSON = { header = "cjson/cJSON.h", library = "cjson" },
   HIREDIS = { header = "hiredis/hiredis.h", library = "hiredis" },
}

build = {
   type = "builtin",
   modules = {
      ["llmretry.core"] = {
         sources = {
            "bindings/lua/calls.c",
            "bindings/lua/channel.c",
            "bindings/lua/encode.c",
            "bindings/lua/engine.c",
            "bindings/lua/ffi.c",
            "bindings/lua/json.c",
            "bindings/lua/llmretry_core.c",
            "bindings/lua/options.c",
            "bindings/lua/policies.c",
            "bindings/lua/shapes.c",
            "bindings/lua/url.c",
            "core/src/admission.c",
            "core/src/answer.c",
            "core/src/answer_error.c",
            "core/src/assembly.c",
            "core/src/attempt.c",
            "core/src/ca_bundle.c",
            "core/src/call.c",
            "core/src/channel.c",
            "core/src/conn_shards.c",
            "core/src/engine.c",
            "core/src/events.c",
            "core/src/fork.c",
            "core/src/group.c",
            "core/src/host_io.c",
            "core/src/http1.c",
            "core/src/ids.c",
            "core/src/io_events.c",
            "core/src/json.c",
            "core/src/json_pull.c",
            "core/src/mailbox.c",
            "core/src/notifier.c",
            "core/src/notifier_socket.c",
            "core/src/option_suggest.c",
            "core/src/option_table.c",
            "core/src/options.c",
            "core/src/origins.c",
            "core/src/outcome.c",
            "core/src/pacer.c",
            "core/src/policies.c",
            "core/src/policy.c",
            "core/src/ratelimit.c",
            "core/src/call_end.c",
            "core/src/ratelimit_learn.c",
            "core/src/estimate.c",
            "core/src/endpoint.c",
            "core/src/health.c",
            "core/src/targets.c",
            "core/src/repair.c",
            "core/src/response.c",
            "core/src/response_body.c",
            "core/src/schema.c",
            "core/src/schema_check.c",
            "core/src/schema_pattern.c",
            "core/src/schema_text.c",
            "core/src/schema_walk.c",
            "core/src/schema_validate.c",
            "core/src/sockets.c",
            "core/src/spares.c",
            "core/src/sse.c",
            "core/src/stream.c",
            "core/src/stream_body.c",
            "core/src/stream_whole.c",
            "core/src/sse_payload.c",
            "core/src/shapes.c",
            "core/src/shared.c",
            "core/src/shared_shm.c",
            "core/src/shared_redis.c",
            "core/src/shared_redis_conn.c",
            "core/src/shared_redis_lease.c",
            "core/src/shared_redis_script.c",
            "core/src/shared_redis_store.c",
            "core/src/timers.c",
            "core/src/transfer.c",
            "core/src/url.c",
            "core/src/version.c",
         },
         incdirs = { "core/include", "core/src", "$(CURL_INCDIR)", "$(CJSON_INCDIR)",
                     "$(HIREDIS_INCDIR)" },
         libdirs = { "$(CURL_LIBDIR)", "$(CJSON_LIBDIR)", "$(HIREDIS_LIBDIR)" },
         libraries = { "curl", "cjson", "hiredis", "pthread", "m" },
         defines = { "_GNU_SOURCE" },
      },
      llmretry = "lua/llmretry/init.lua",
      ["llmretry.api"] = "lua/llmretry/api.lua",
      ["llmretry.ffi"] = "lua/llmretry/ffi.lua",
      ["llmretry.args"] = "lua/llmretry/args.lua",
      ["llmretry.mailbox"] = "lua/llmretry/mailbox.lua",
      ["llmretry.verdict"] = "lua/llmretry/verdict.lua",
      ["llmretry.nvim"] = "lua/llmretry/nvim.lua",
      ["llmretry.openresty"] = "lua/llmretry/openresty.lua",
      ["llmretry.openresty_abort"] = "lua/llmretry/openresty_abort.lua",
      ["llmretry.openresty_host"] = "lua/llmretry/openresty_host.lua",
      ["llmretry.openresty_dispatch"] = "lua/llmretry/openresty_dispatch.lua",
      ["llmretry.openresty_waiters"] = "lua/llmretry/openresty_waiters.lua",
      ["llmretry.policies"] = "lua/llmretry/policies.lua",
      ["llmretry.scheduler"] = "lua/llmretry/scheduler.lua",
      ["llmretry.client"] = "lua/llmretry/client.lua",
      ["llmretry.cosocket"] = "lua/llmretry/cosocket.lua",
   },
}
