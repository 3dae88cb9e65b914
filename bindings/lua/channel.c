/* Channels: the one readiness object (core/include/llmretry/channel.h).
 *
 *   engine:channel() -> channel            the engine's own: calls submitted
 *                                          without opts.group / opts.channel
 *   group:channel() -> channel | nil       a polling group's own
 *   engine:new_channel() -> channel        an eventfd (or pipe) channel
 *   engine:new_channel{ socket = true }    a unix-socket channel (OpenResty)
 *   engine:submit{ ..., channel = ch }     the call reports to ch only
 *   ch:poll([max]) -> { handle, ... }      the handles with news (no blocking)
 *   ch:fd(), ch:wait(ms)                   eventfd/pipe channels
 *   ch:path(), ch:accept([timeout_ms])     socket channels: connect to
 *       "unix:" .. ch:path(), then ch:accept() -> true | nil, message
 *   ch:close()
 *
 * A socket channel is for a host that can connect to an address but cannot
 * watch a descriptor it did not open: an nginx cosocket. The engine writes
 * one byte to the connection whenever the channel's list goes from empty to
 * non-empty; the host reads what bytes there are, then polls until poll()
 * returns nothing (llmretry.openresty's dispatcher). */
#include "lcore.h"

#include <limits.h>
#include <string.h>

static lr_chan *check_chan(lua_State *L)
{
    return lr_check_self(L, CHANNEL_MT, "a channel");
}

llmretry_channel *lr_chan_open(const lr_chan *c)
{
    if (!c->ch || (c->owner && !c->owner_open(c->owner)))
        return NULL;
    return c->ch;
}

void lr_push_own_channel(lua_State *L, int owner, llmretry_channel *ch,
                         int (*owner_open)(const void *owner))
{
    owner = lr_absindex(L, owner);
    lr_chan *c = lr_newuserdata(L, sizeof *c);
    c->ch = NULL;
    c->socket = 0;
    c->owner = lua_touserdata(L, owner);
    c->owner_open = owner_open;
    c->owner_ref = LUA_NOREF;
    int idx = lua_gettop(L);
    luaL_getmetatable(L, CHANNEL_MT);
    lua_setmetatable(L, idx);
    lr_getuservalue(L, owner);          /* the owner's call -> handle table */
    lr_setuservalue(L, idx);
    lua_pushvalue(L, owner);
    c->owner_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    c->ch = ch;
}

/* Calls on the channel keep the C channel alive; dropping ours is safe. An
 * own channel lets its owner go (the owner frees the C channel). */
int channel_close(lua_State *L)
{
    lr_chan *c = lua_touserdata(L, 1);
    if (c) {
        if (c->owner) {
            luaL_unref(L, LUA_REGISTRYINDEX, c->owner_ref);
            c->owner_ref = LUA_NOREF;
        } else {
            llmretry_channel_free(c->ch);
        }
        c->ch = NULL;
    }
    return 0;
}

static size_t poll_channel(void *src, llmretry_call **calls, size_t max)
{
    return llmretry_channel_poll(src, calls, max);
}

int channel_poll(lua_State *L)
{
    return push_polled(L, lr_chan_open(check_chan(L)), poll_channel);
}

/* The eventfd or pipe to watch; nil for a socket channel (its host reads
 * its own end of the connection). */
int channel_fd(lua_State *L)
{
    lr_chan *c = check_chan(L);
    if (!lr_chan_open(c))
        lr_fail(L, "channel is closed");
    int fd = llmretry_channel_fd(c->ch);
    if (fd < 0)
        lua_pushnil(L);
    else
        lua_pushinteger(L, fd);
    return 1;
}

int channel_wait(lua_State *L)
{
    lr_chan *c = check_chan(L);
    int64_t t = check_timeout(L, 2);
    if (c->ch && c->socket)
        lr_fail(L, "a socket channel is waited on at its connection's end, not with wait()");
    llmretry_channel *ch = lr_chan_open(c);
    lua_pushboolean(L, ch && llmretry_channel_wait(ch, t) == LLMRETRY_OK);
    return 1;
}

/* The path to connect to ("unix:" .. path for a cosocket), or nil once
 * accepted (and for other channels). */
int channel_path(lua_State *L)
{
    lr_chan *c = check_chan(L);
    const char *p = lr_chan_open(c) ? llmretry_channel_socket_path(c->ch) : NULL;
    if (p)
        lua_pushstring(L, p);
    else
        lua_pushnil(L);
    return 1;
}

/* accept([timeout_ms = 1000]) -> true, or nil and why (not raised: the
 * dispatcher logs it and carries on without the channel). */
int channel_accept(lua_State *L)
{
    lr_chan *c = check_chan(L);
    int64_t t = lua_isnoneornil(L, 2) ? 1000 : check_timeout(L, 2);
    char err[LLMRETRY_ERRBUF] = "the channel is closed";
    llmretry_status st = lr_chan_open(c) ? llmretry_channel_accept(c->ch, t, err, sizeof err)
                               : LLMRETRY_ESTATE;
    if (st == LLMRETRY_OK) {
        lua_pushboolean(L, 1);
        return 1;
    }
    lua_pushnil(L);
    lua_pushfstring(L, "llmretry: %s", err[0] ? err : llmretry_status_name(st));
    return 2;
}

int channel_tostring(lua_State *L)
{
    lr_chan *c = lr_testudata(L, 1, CHANNEL_MT);
    lua_pushfstring(L, "llmretry.channel: %p%s%s", (void *)c, c && c->socket ? " (socket)" : "",
                    c && lr_chan_open(c) ? "" : " (closed)");
    return 1;
}

/* engine:new_channel([{ socket = bool }]) -> channel */
int engine_new_channel(lua_State *L)
{
    char buf[64];
    llmretry_engine *e = check_open_engine(L);
    int socket = 0;
    if (!lua_isnoneornil(L, 2)) {
        if (lua_type(L, 2) != LUA_TTABLE)
            lr_fail(L, "opts must be a table (got %s)", got(L, 2, buf, sizeof buf));
        lua_pushnil(L);
        while (lua_next(L, 2)) {
            lua_pop(L, 1);
            const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "?";
            if (strcmp(k, "socket") != 0)
                lr_fail(L, "unknown channel option '%.40s' (socket)", k);
        }
        lua_getfield(L, 2, "socket");
        if (!lua_isnil(L, -1)) {
            if (lua_type(L, -1) != LUA_TBOOLEAN)
                lr_fail(L, "socket must be a boolean (got %s)", got(L, -1, buf, sizeof buf));
            socket = lua_toboolean(L, -1);
        }
        lua_pop(L, 1);
    }
    lr_chan *c = lr_newuserdata(L, sizeof *c);
    c->ch = NULL;
    c->socket = socket;
    c->owner = NULL;
    c->owner_open = NULL;
    c->owner_ref = LUA_NOREF;
    int idx = lua_gettop(L);
    luaL_getmetatable(L, CHANNEL_MT);
    lua_setmetatable(L, idx);
    lua_newtable(L);                    /* call pointer -> handle, weak */
    luaL_getmetatable(L, WEAKV_MT);
    lua_setmetatable(L, -2);
    lr_setuservalue(L, idx);
    char err[LLMRETRY_ERRBUF] = "";
    llmretry_status st = socket ? llmretry_channel_new_socket(e, &c->ch, err, sizeof err)
                                : llmretry_channel_new(e, &c->ch, err, sizeof err);
    if (st != LLMRETRY_OK) {
        c->ch = NULL;
        return lr_fail(L, "%s", err[0] ? err : llmretry_status_name(st));
    }
    lua_settop(L, idx);
    return 1;
}
