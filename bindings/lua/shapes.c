/* Every table the core hands to Lua, built by walking the core's own
 * description of it (llmretry/shapes.h, and events' fields): events, meta,
 * error tables, targets, usage, endpoint and group stats. No field is
 * named here. A null value is absent from a shape's table (nil) and
 * core.null in an event (whose fields are all always there). */
#include "lcore.h"

#include <string.h>

/* Push the value of one field; 0 (nothing pushed) for a null one. */
int lr_push_field(lua_State *L, const llmretry_field *f)
{
    luaL_checkstack(L, 4, "llmretry: out of stack space");
    switch (f->type) {
    case LLMRETRY_FIELD_INT: lr_pushint(L, f->i); return 1;
    case LLMRETRY_FIELD_BOOL: lua_pushboolean(L, f->i != 0); return 1;
    case LLMRETRY_FIELD_STRING: push_text0(L, f->s); return 1;
    case LLMRETRY_FIELD_USAGE: lr_push_shape(L, LLMRETRY_SHAPE_USAGE, f->usage); return 1;
    case LLMRETRY_FIELD_JSON: {
        /* Core-made JSON (validation errors): as a Lua list. */
        char err[64];
        return push_decoded(L, f->s, strlen(f->s), err, sizeof err);
    }
    case LLMRETRY_FIELD_LIST:
        lua_createtable(L, (int)f->list.n, 0);
        for (size_t i = 0; i < f->list.n; i++) {
            lr_push_shape(L, (llmretry_shape)f->list.shape,
                          (const char *)f->list.items + i * f->list.size);
            lua_rawseti(L, -2, (int)i + 1);
        }
        return 1;
    default: return 0;
    }
}

/* Set the fields of `obj` that are not null into the table on top. */
void lr_shape_into(lua_State *L, llmretry_shape s, const void *obj)
{
    llmretry_field f;
    for (size_t i = 0; llmretry_shape_field(s, obj, i, &f) == 0; i++)
        if (lr_push_field(L, &f))
            lua_setfield(L, -2, f.name);
}

void lr_push_shape(lua_State *L, llmretry_shape s, const void *obj)
{
    lua_createtable(L, 0, (int)llmretry_shape_field_count(s));
    lr_shape_into(L, s, obj);
}

/* The event as a table: every field of docs/reliability.md, null ones as
 * core.null. */
void lr_push_event(lua_State *L, const llmretry_event *ev)
{
    lua_createtable(L, 0, (int)llmretry_event_field_count(ev));
    llmretry_field f;
    for (size_t i = 0; llmretry_event_field(ev, i, &f) == 0; i++) {
        if (!lr_push_field(L, &f))
            push_null(L);
        lua_setfield(L, -2, f.name);
    }
}

/* A list of the names name(1), name(2), ... up to the first NULL: the
 * core's error kinds, give-up reasons, stream reasons. */
void lr_push_names(lua_State *L, const char *(*name)(int))
{
    lua_newtable(L);
    const char *s;
    for (int i = 1; (s = name(i)); i++) {
        lua_pushstring(L, s);
        lua_rawseti(L, -2, i);
    }
}
