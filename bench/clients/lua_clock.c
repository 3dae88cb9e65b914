/* benchclock: what the Lua benchmark client needs and plain Lua lacks.
 *   now()          monotonic wall clock, seconds (os.time() has 1 s steps)
 *   cpu()          user + system CPU seconds of the whole process, every
 *                  thread (getrusage RUSAGE_SELF, as the other clients)
 *   raise_nofile() lift the soft open-files limit to the hard one (1,024
 *                  connections do not fit under the usual soft 1,024)
 * Built for Lua 5.4 and for LuaJIT (5.1 headers) by bench/clients/setup.sh. */
#include <lauxlib.h>
#include <lua.h>

#include <sys/resource.h>
#include <time.h>

static int l_now(lua_State *L)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec / 1e9);
    return 1;
}

static int l_cpu(lua_State *L)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    lua_pushnumber(L, (lua_Number)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
                          (lua_Number)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
    return 1;
}

static int l_raise_nofile(lua_State *L)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    getrlimit(RLIMIT_NOFILE, &rl);
    lua_pushnumber(L, rl.rlim_cur == RLIM_INFINITY ? -1 : (lua_Number)rl.rlim_cur);
    return 1;
}

int luaopen_benchclock(lua_State *L)
{
    /* No luaL_newlib/luaL_register: the same code for 5.1 and 5.4. */
    lua_createtable(L, 0, 3);
    lua_pushcfunction(L, l_now);
    lua_setfield(L, -2, "now");
    lua_pushcfunction(L, l_cpu);
    lua_setfield(L, -2, "cpu");
    lua_pushcfunction(L, l_raise_nofile);
    lua_setfield(L, -2, "raise_nofile");
    return 1;
}
