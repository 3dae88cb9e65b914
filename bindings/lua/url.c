/* URL text for Lua (llmretry/url.h): core.url_join and core.url_shown. */
#include "lcore.h"

/* Pushes the core's malloc'd text (freed here); raises when out of memory. */
static int push_core_text(lua_State *L, char *text)
{
    if (!text)
        return luaL_error(L, "llmretry: out of memory");
    lua_pushstring(L, text);
    llmretry_free(text);
    return 1;
}

/* core.url_join(base, path) -> the engine's join of a base URL and a path
 * ("/files"): before the base's query, its fragment dropped. */
int l_url_join(lua_State *L)
{
    const char *base = luaL_checkstring(L, 1), *path = luaL_checkstring(L, 2);
    return push_core_text(L, llmretry_url_join(base, path));
}

/* core.url_shown(url) -> url with its user info and its query each "***",
 * no fragment, as the endpoint stats show it. */
int l_url_shown(lua_State *L)
{
    return push_core_text(L, llmretry_url_shown(luaL_checkstring(L, 1)));
}
