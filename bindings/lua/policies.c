/* Named policies and ids: the core checks policies (core/src/policies.c)
 * and makes UUIDs; this only converts. */
#include "lcore.h"

#include <cjson/cJSON.h>

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- named policies: the core checks them (core/src/policies.c) ---------- */

/* core.parse_policies(json_text[, source]) -> names, settings (name -> the
 * JSON text of the keys it sets), or nil, message: the core's words, so Lua
 * and Python refuse a policy file alike (llmretry/policies.lua raises). */
int l_parse_policies(lua_State *L)
{
    size_t len;
    const char *text = luaL_checklstring(L, 1, &len);
    const char *source = luaL_optstring(L, 2, NULL);
    char err[1024] = "";           /* a file's path, the policy, the known keys */
    llmretry_policies *p = NULL;
    llmretry_status st = llmretry_policies_parse(text, len, source, &p, err, sizeof err);
    if (st != LLMRETRY_OK) {
        lua_pushnil(L);
        lua_pushstring(L, err[0] ? err : llmretry_status_name(st));
        return 2;
    }
    size_t n = llmretry_policies_count(p);
    lua_createtable(L, (int)n, 0);
    lua_createtable(L, 0, (int)n);
    for (size_t i = 0; i < n; i++) {
        const char *name = llmretry_policies_name(p, i);
        char *json = llmretry_policies_get_json(p, name);
        if (!json) {
            llmretry_policies_free(p);
            return lr_fail(L, "out of memory reading policies");
        }
        lua_pushstring(L, name);
        lua_rawseti(L, -3, (int)i + 1);
        lua_pushstring(L, json);
        lua_setfield(L, -2, name);
        llmretry_free(json);
    }
    llmretry_policies_free(p);
    return 2;
}

/* core.resolve_policy(settings_json|nil, explicit_json|nil, defaults_json|nil)
 * -> the JSON text of every policy key (explicit > policy > defaults >
 * built-in), or nil, message. */
int l_resolve_policy(lua_State *L)
{
    size_t plen = 0, elen = 0, dlen = 0;
    const char *pol = luaL_optlstring(L, 1, NULL, &plen);
    const char *ex = luaL_optlstring(L, 2, NULL, &elen);
    const char *def = luaL_optlstring(L, 3, NULL, &dlen);
    char err[1024] = "", *out = NULL;
    llmretry_policies *p = NULL;
    llmretry_status st = LLMRETRY_OK;
    if (pol) {
        luaL_Buffer b;
        luaL_buffinit(L, &b);
        luaL_addstring(&b, "{\"p\":");
        luaL_addlstring(&b, pol, plen);
        luaL_addstring(&b, "}");
        luaL_pushresult(&b);
        size_t len;
        const char *doc = lua_tolstring(L, -1, &len);
        st = llmretry_policies_parse(doc, len, NULL, &p, err, sizeof err);
        lua_pop(L, 1);
    }
    if (st == LLMRETRY_OK)
        st = llmretry_policies_resolve(p, pol ? "p" : NULL, ex, elen, def, dlen, &out, err,
                                       sizeof err);
    llmretry_policies_free(p);
    if (st != LLMRETRY_OK) {
        lua_pushnil(L);
        lua_pushstring(L, err[0] ? err : llmretry_status_name(st));
        return 2;
    }
    lua_pushstring(L, out);
    llmretry_free(out);
    return 1;
}

/* core.uuid4() -> a fresh UUID v4 from the system's CSPRNG (the core's). */
int l_uuid4(lua_State *L)
{
    char id[37];
    if (llmretry_uuid4(id) != LLMRETRY_OK)
        return lr_fail(L, "could not read the system's random source");
    lua_pushstring(L, id);
    return 1;
}
