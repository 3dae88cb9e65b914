/* compat.h — the few Lua C API differences llmretry_core.c meets between
 * Lua 5.1 (and LuaJIT, which speaks 5.1's ABI) and Lua 5.2-5.4.
 *
 * Everything here has an lr_ name of its own, so it never collides with
 * the 5.2-style functions LuaJIT's lauxlib.h may or may not declare: the
 * same source builds against Debian's plain 5.1 headers (as luarocks does
 * for --lua-version 5.1) and against LuaJIT's. No lua-compat53 needed. */
#ifndef LLMRETRY_LUA_COMPAT_H
#define LLMRETRY_LUA_COMPAT_H

#include <lauxlib.h>
#include <lua.h>

#include <stdint.h>

#if LUA_VERSION_NUM >= 502
#define lr_rawlen(L, i) lua_rawlen((L), (i))
#define lr_absindex(L, i) lua_absindex((L), (i))
#define lr_setfuncs(L, l, n) luaL_setfuncs((L), (l), (n))
#define lr_testudata(L, i, t) luaL_testudata((L), (i), (t))
#else
#define lr_rawlen(L, i) lua_objlen((L), (i))

static inline int lr_absindex(lua_State *L, int i)
{
    return i > 0 || i <= LUA_REGISTRYINDEX ? i : lua_gettop(L) + i + 1;
}

/* luaL_setfuncs of 5.2: every function shares the nup values on top. */
static inline void lr_setfuncs(lua_State *L, const luaL_Reg *l, int nup)
{
    luaL_checkstack(L, nup + 1, "too many upvalues");
    for (; l->name; l++) {
        for (int i = 0; i < nup; i++)
            lua_pushvalue(L, -nup);
        lua_pushcclosure(L, l->func, nup);
        lua_setfield(L, -(nup + 2), l->name);
    }
    lua_pop(L, nup);
}

static inline void *lr_testudata(lua_State *L, int i, const char *tname)
{
    void *p = lua_touserdata(L, i);
    if (!p || !lua_getmetatable(L, i))
        return NULL;
    luaL_getmetatable(L, tname);
    int same = lua_rawequal(L, -1, -2);
    lua_pop(L, 2);
    return same ? p : NULL;
}
#endif

/* One user value per userdata: 5.4 has numbered ones, 5.2/5.3 one, and
 * 5.1 the userdata's environment table (which must be a table: that is
 * all we ever store). */
#if LUA_VERSION_NUM >= 504
#define lr_newuserdata(L, sz) lua_newuserdatauv((L), (sz), 1)
#define lr_setuservalue(L, i) ((void)lua_setiuservalue((L), (i), 1))
#define lr_getuservalue(L, i) ((void)lua_getiuservalue((L), (i), 1))
#elif LUA_VERSION_NUM >= 502
#define lr_newuserdata(L, sz) lua_newuserdata((L), (sz))
#define lr_setuservalue(L, i) lua_setuservalue((L), (i))
#define lr_getuservalue(L, i) ((void)lua_getuservalue((L), (i)))
#else
#define lr_newuserdata(L, sz) lua_newuserdata((L), (sz))
#define lr_setuservalue(L, i) ((void)lua_setfenv((L), (i)))
#define lr_getuservalue(L, i) lua_getfenv((L), (i))
#endif

/* Integers: 5.3+ has a subtype; before that every number is a double,
 * exact for the counts and milliseconds the core deals in (< 2^53). */
#if LUA_VERSION_NUM >= 503
#define LR_HAVE_INTEGERS 1
#define lr_pushint(L, v) lua_pushinteger((L), (lua_Integer)(v))
#else
#define LR_HAVE_INTEGERS 0
#define lr_pushint(L, v) lua_pushnumber((L), (lua_Number)(v))
#endif

#endif /* LLMRETRY_LUA_COMPAT_H */
