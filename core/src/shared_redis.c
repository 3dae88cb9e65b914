/* The Redis store of shared budgets (shared.h): `shared =
 * "redis://[[user]:password@]host[:port][/db]"`, for processes on several
 * machines.
 *
 * The engine's I/O thread never waits on Redis. It works on local state
 * that a thread of the store keeps in step:
 *
 * - each endpoint has a mirror (an lr_shared_ep in this process's memory)
 *   that the I/O thread reads and changes with the rules of shared.c, as it
 *   would a slot of the shm store; what it changes is also queued
 *   (`pending`: counts as deltas, breaker events, a pause) and the store
 *   thread sends it to Redis, where one script applies it to the shared
 *   numbers and answers with them; the answer becomes the mirror again,
 *   with what the I/O thread did meanwhile applied on top;
 * - the rate buckets are GCRA timestamps in Redis. A process takes slices
 *   of them in advance: the script moves the bucket's timestamp on by k
 *   units and answers when, relative to its clock, the first of them may
 *   go; the I/O thread spends them one call at a time, each no sooner than
 *   its place in the slice. Slices are short (LEASE_US of the bucket's
 *   time), a slice's unused future is given back, and a unit is never spent
 *   later than GRACE after its place: so N processes send what one GCRA
 *   would admit, give or take a unit each. A slice for calls yet to come is
 *   booked no further than HORIZON_US ahead, and asked for while the
 *   current one runs (a call waits for Redis only when it comes with
 *   nothing leased); a call that waits books its place in line however far
 *   the others have booked (WAITING_HORIZON_US at most), so that processes
 *   contending for a busy bucket queue in Redis instead of polling it;
 * - the breaker's half-open probe is a lease in Redis too: a process
 *   probes only once Redis named it the holder.
 *
 * Redis down, slow (no answer within its timeout: 50 ms unless the URL
 * says ?timeout_ms=N) or refusing the
 * password: the mirror alone is the budget (this process's own, as without
 * `shared`), the engine reports the change once (llm_shared_unavailable)
 * and the store thread reconnects in the background, reporting the
 * recovery. A call waits for Redis that timeout at most, ever.
 *
 * Times in Redis are Redis's clock (TIME): the script answers in durations
 * relative to it, which this process maps onto its own monotonic clock at
 * the moment the answer arrives (late by the answer's trip, so a slice
 * starts a little later here than there, never earlier). The password is
 * kept for AUTH alone: messages and events name the store with "***" in
 * its place. */
#include "shared.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "condvar.h"

#define FAIL_OPEN_MS 50                 /* the longest a call waits for Redis (default) */
#define SYNC_MS 50                      /* an active endpoint's numbers are read this often */
#define ACTIVE_MS 2000                  /* ... while it was used this recently */
#define LEASE_US 20000                  /* a slice: this much of a bucket's time */
#define HORIZON_US 50000                /* booked ahead of now for no call yet, at most */
#define WAITING_HORIZON_US 1000000      /* ... and for a call that waits (its place in line) */
#define GRACE_MAX_US 10000              /* a unit may go this late after its place */
#define PREFETCH_MS 100                 /* a bucket used this recently gets its next slice early */
#define RETRY_MIN_MS 50                 /* reconnecting: first after this, */
#define RETRY_MAX_MS 500                /* doubling up to this */
#define KEY_TTL_MS "3600000"            /* an endpoint nobody touched for an hour is forgotten */
#define START_ASK 4                     /* slow start: requests of the first wave asked at once */
/* shared.h's LR_SHARED_*_S, as the script reads them (ms; i from 0) */
#define SAID_AGES "(i == 2 or i == 3) and 60000 or 10000"
#define WAVE_MS "10000"
_Static_assert(LR_SHARED_CLAIM_S == 10 && LR_SHARED_LEARNED_S == 60 && LR_SHARED_WAVE_S == 10,
               "the script's SAID_AGES and WAVE_MS follow shared.h");

enum { ST_CONNECTING, ST_UP, ST_DOWN };
enum { PROBE_NONE, PROBE_MINE, PROBE_USED };

/* ---- the script ------------------------------------------------------------ */

/* One call per endpoint and round: applies what this process did since the
 * last (ARGV 2-12), leases slices of the buckets (13-17, 18-22: units, a
 * unit's cost, the tolerance, time given back, how far ahead), and answers with
 * the endpoint's shared numbers. ARGV[1] names this process (the probe's
 * holder). Fields of the hash: rt/tt the buckets' timestamps (us), pz the
 * pause (ms), bf/bo/bp/bw the breaker's failures, open-until, probe lease
 * and its holder, s/q/r<i> the retry budget's slot i (its second, first
 * attempts, retries), as in shared.c. Numbers are written with %.0f:
 * Redis's Lua would print 16 digits in %.14g, losing the microseconds. */
static const char SCRIPT[] =
    "if redis.replicate_commands then redis.replicate_commands() end\n"
    "local t = redis.call('TIME')\n"
    "local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])\n"
    "local now = math.floor(now_us / 1000)\n"
    "local key, a = KEYS[1], ARGV\n"
    "local function n(i) return tonumber(a[i]) or 0 end\n"
    "local f = {'rt', 'tt', 'pz', 'bf', 'bo', 'bp', 'bw'}\n"
    "for i = 0, 9 do f[#f + 1] = 's' .. i; f[#f + 1] = 'q' .. i; f[#f + 1] = 'r' .. i end\n"
    "for i = 0, 4 do f[#f + 1] = 'a' .. i; f[#f + 1] = 'b' .. i end\n"
    "f[#f + 1] = 'so'; f[#f + 1] = 'sw'; f[#f + 1] = 'ws'\n"
    "local v = redis.call('HMGET', key, unpack(f))\n"
    "local h = {}\n"
    "for i, name in ipairs(f) do h[name] = v[i] end\n"
    "local function num(name) return tonumber(h[name]) or 0 end\n"
    "local set = {}\n"
    "local function put(name, x) set[#set + 1] = name; set[#set + 1] = string.format('%.0f', x) end\n"
    /* the retry budget: this second's slot counts what was pushed */
    "local sec = math.floor(now / 1000)\n"
    "local slot = sec % 10\n"
    "if n(2) > 0 or n(3) > 0 then\n"
    "  local q, r = 0, 0\n"
    "  if num('s' .. slot) == sec then q, r = num('q' .. slot), num('r' .. slot) end\n"
    "  h['s' .. slot] = sec; h['q' .. slot] = q + n(2); h['r' .. slot] = r + n(3)\n"
    "  put('s' .. slot, sec); put('q' .. slot, q + n(2)); put('r' .. slot, r + n(3))\n"
    "end\n"
    "local wq, wr = 0, 0\n"
    "for i = 0, 9 do\n"
    "  local s = num('s' .. i)\n"
    "  if s <= sec and sec - s < 10 then wq = wq + num('q' .. i); wr = wr + num('r' .. i) end\n"
    "end\n"
    /* the breaker: a success resets it, failures after it count, a failed
     * probe opens it again, a probe given back frees the lease */
    "local bf, bo, bp, bw = num('bf'), num('bo'), num('bp'), h['bw'] or ''\n"
    "local bf0, bo0, bp0, bw0 = bf, bo, bp, bw\n"
    "local owner, threshold, cooldown = a[1], n(7), n(8)\n"
    "if n(4) == 1 then bf, bo, bp = 0, 0, 0 end\n"
    "if n(5) > 0 then\n"
    "  bf = bf + n(5)\n"
    "  if threshold > 0 and bf >= threshold and bo == 0 then bo = now + cooldown end\n"
    "end\n"
    "if n(6) == 1 then bo = now + cooldown; bp = 0 end\n"
    "if n(9) == 1 and bw == owner then bp = 0 end\n"
    "if n(10) == 1 and bo ~= 0 and now >= bo and bp <= now then bp = now + n(11); bw = owner end\n"
    "if bf ~= bf0 then put('bf', bf) end\n"
    "if bo ~= bo0 then put('bo', bo) end\n"
    "if bp ~= bp0 then put('bp', bp) end\n"
    "if bw ~= bw0 then set[#set + 1] = 'bw'; set[#set + 1] = bw end\n"
    "local probe = 0\n"
    "if bp > now then if bw == owner then probe = 2 else probe = 1 end end\n"
    /* a pause: the latest end wins */
    "local pz = num('pz')\n"
    "if n(12) > 0 and now + n(12) > pz then pz = now + n(12); put('pz', pz) end\n"
    /* the buckets: give back, then lease up to `units` of `cost` booked no
     * further than the horizon ahead: (units granted, when the first may
     * go), or (0, how long until the bucket has room again) */
    "local function lease(name, units, cost, tol, give, horizon)\n"
    "  local tat = num(name)\n"
    "  local tat0 = tat\n"
    "  tat = tat - give\n"
    "  local g, rel = 0, 0\n"
    "  if units > 0 and cost > 0 then\n"
    "    local start = math.max(tat, now_us)\n"
    "    local room = now_us + horizon + tol - start\n"
    "    if room < 0 then\n"
    "      rel = -room\n"
    "    else\n"
    "      g = math.min(units, math.floor(room / cost) + 1)\n"
    "      tat = start + g * cost\n"
    "      rel = start - now_us\n"
    "    end\n"
    "  end\n"
    "  if tat ~= tat0 then put(name, tat) end\n"
    "  return g, rel\n"
    "end\n"
    "local rg, rv = lease('rt', n(13), n(14), n(15), n(16), n(17))\n"
    "local tg, tv = lease('tt', n(18), n(19), n(20), n(21), n(22))\n"
    /* what processes say of the limits (ARGV 23-27, 0: nothing): the
     * configured rpm and tpm, the stricter wins while it is said again; the
     * learned limits and the slow-down, the latest wins. a<i> the value,
     * b<i> when it was said (ms) */
    "local said = {}\n"
    "for i = 0, 4 do\n"
    "  local v, cur, at = n(23 + i), num('a' .. i), num('b' .. i)\n"
    "  local age = " SAID_AGES "\n"
    "  local fresh = cur > 0 and now - at < age\n"
    "  if v > 0 and (i >= 2 or not fresh or v <= cur) then\n"
    "    cur, at, fresh = v, now, true; put('a' .. i, v); put('b' .. i, now)\n"
    "  end\n"
    "  if fresh then said[#said + 1] = cur; said[#said + 1] = now - at\n"
    "  else said[#said + 1] = 0; said[#said + 1] = 0 end\n"
    "end\n"
    /* the slow start: so once an answer came back; sw requests of the wave
     * that began at ws, granted (ARGV 28 asked, 29 over, 30 the cap) */
    "local so, sw, ws = num('so'), num('sw'), num('ws')\n"
    "if n(29) == 1 and so == 0 then so = 1; put('so', 1) end\n"
    "if now - ws >= " WAVE_MS " then sw = 0 end\n"
    "local sg = 0\n"
    "if so == 0 and n(28) > 0 then\n"
    "  sg = math.max(0, math.min(n(28), n(30) - sw))\n"
    "  if sg > 0 then\n"
    "    if sw == 0 then ws = now; put('ws', ws) end\n"
    "    sw = sw + sg; put('sw', sw)\n"
    "  end\n"
    "end\n"
    /* every round writes (when it was last used): a Redis that refuses
     * writes (out of memory) fails every round, not only those with news */
    "put('lt', now)\n"
    "redis.call('HSET', key, unpack(set))\n"
    "redis.call('PEXPIRE', key, " KEY_TTL_MS ")\n"
    "local bs = 0\n"
    "if bo ~= 0 then bs = 1 end\n"
    "return {wq, wr, bf, bs, bo - now, probe, bp - now, pz - now, rg, rv, tg, tv,\n"
    "        said[1], said[2], said[3], said[4], said[5], said[6], said[7], said[8], said[9],\n"
    "        said[10], sg, sw, so}\n";

enum { R_WQ, R_WR, R_BF, R_BSET, R_BOPEN, R_PROBE, R_PROBE_REL, R_PAUSE, R_REQ_N, R_REQ_REL,
       R_TOK_N, R_TOK_REL, R_SAID, R_START_GRANTED = R_SAID + 2 * LR_SAID_COUNT, R_START_WAVE,
       R_START_OVER, R_COUNT };

/* ---- the state ---------------------------------------------------------------- */

/* A slice of a bucket this process holds: [pos, end) on this process's
 * monotonic clock in microseconds; empty when pos >= end. */
typedef struct slice {
    int64_t pos, end;
} slice;

typedef struct lease {
    slice s[2];                         /* the current one, and the next */
    int64_t cost, tol;                  /* the latest call's unit and tolerance */
    int64_t want_since;                 /* a call waits for a slice, unanswered since (0: none) */
    int64_t ask_at;                     /* Redis said the bucket has no room before then */
    int ask_waiting;                    /* ... for a waiting call's booking */
    int64_t used_at;                    /* the last take (0: never) */
    int local;                          /* the last take was from the mirror's own bucket */
    int64_t give_back;                  /* bucket time (us) to give back at the next round */
    int64_t known_end;                  /* where the shared bucket stood at the last answer */
    int asking;                         /* a request is on its way */
} lease;

/* What the I/O thread did since the last round, for Redis. */
typedef struct pending {
    int64_t requests, retries;
    int success, reopen, release, want_probe;
    int64_t failures;
    int64_t pause_until;                /* ms, this process's clock; 0: none */
    int64_t said[LR_SAID_COUNT];        /* values said (0: none) */
    int said_news;                      /* a said value changed: send it now */
    int start_want, start_over;         /* the slow start: requests asked, an answer came */
} pending;

struct lr_redis_ep {
    lr_redis *st;
    uint64_t id;
    char key[40];
    lr_shared_ep mirror;                /* what the I/O thread reads */
    pending p;                          /* the store's mutex guards the rest */
    int threshold;                      /* the breaker's options in force */
    int64_t cooldown_ms, lease_ms;
    lease b[2];                         /* LR_REDIS_REQ, LR_REDIS_TOK */
    int synced;                         /* read from Redis once (or Redis is down) */
    int64_t made_ms, active_ms, synced_ms;
    int probe;                          /* PROBE_*: the half-open probe's lease */
    int64_t mine_until;                 /* PROBE_MINE: when it lapses */
    int64_t other_until;                /* another process holds it until then */
    int64_t probe_asked;                /* asked Redis for it, no answer yet (0: not) */
    int start_granted;                  /* slow start: requests Redis granted, not yet sent */
    int64_t start_asked;                /* ... asked for more, no answer yet (0: not) */
};

struct lr_redis {
    char host[256];
    int port, db;
    int timeout_ms;                     /* slower than this is unavailable */
    char *user, *password;              /* NULL: none; the password goes to AUTH only */
    char name[320];                     /* the URL, "***" for the password */
    char owner[40];                     /* this store in Redis (the probe's holder) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int stop, kick;
    void (*wake)(void *);
    void *wake_arg;
    lr_redis_ep **eps;
    size_t n_eps, cap_eps;
    int state;                          /* ST_* */
    char why[512];                      /* why it is down */
    int64_t down_at, down_ms;           /* since when; how long the last outage was */
    int reported_down;                  /* I/O thread: the engine said it is down */
    /* The store thread's own. */
    redisContext *ctx;
    char sha[48];
    int64_t retry_at;
    int64_t backoff_ms;
    int redial_now;                     /* the last round went well: redial a failed one at once */
};

static int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int64_t max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* ---- the URL --------------------------------------------------------------------- */

#define USAGE "redis://[:password@]host[:port][/db]"
#define STR_(x) #x
#define STR(x) STR_(x)

static int bad(char *err, size_t len, const char *what)
{
    snprintf(err, len, "shared: %s (expected " USAGE ")", what);
    return -1;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* [p, end) with %XX decoded, malloc'd; NULL on a bad escape. */
static char *decode(const char *p, const char *end)
{
    char *out = malloc((size_t)(end - p) + 1), *o = out;
    if (!out)
        return NULL;
    while (p < end) {
        if (*p == '%') {
            if (end - p < 3 || hexval(p[1]) < 0 || hexval(p[2]) < 0) {
                free(out);
                return NULL;
            }
            *o++ = (char)(hexval(p[1]) * 16 + hexval(p[2]));
            p += 3;
        } else {
            *o++ = *p++;
        }
    }
    *o = '\0';
    return out;
}

/* Digits only, within [lo, hi]; -1 otherwise. */
static long number(const char *p, const char *end, long lo, long hi)
{
    if (p == end || end - p > 9)
        return -1;
    long v = 0;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        v = v * 10 + (*p - '0');
    }
    return v >= lo && v <= hi ? v : -1;
}

static int parse(const char *spec, lr_redis *st, char *err, size_t len)
{
    /* TLS needs hiredis_ssl (hiredis 1.0 and later); Debian's libhiredis
     * (0.14), which llmretry builds with, has none. */
    if (strncmp(spec, "rediss://", 9) == 0)
        return bad(err, len, "rediss:// (Redis over TLS) is not supported: llmretry is built "
                   "with hiredis " STR(HIREDIS_MAJOR) "." STR(HIREDIS_MINOR)
#if HIREDIS_MAJOR < 1
                   ", which has no TLS"
#else
                   " without its TLS library (hiredis_ssl)"
#endif
                   "; use redis:// on a trusted network, or a TLS tunnel (stunnel, "
                   "spiped) to a local port");
    const char *p = spec + 8;                           /* after "redis://" */
    const char *auth_end = p + strcspn(p, "/?#");
    if (*auth_end == '#')
        return bad(err, len, "a Redis URL with a fragment is not supported");
    const char *at = NULL;
    for (const char *q = p; q < auth_end; q++)
        if (*q == '@')
            at = q;                                     /* the last: passwords may hold '@' */
    const char *hp = p;
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (!colon)
            return bad(err, len, "the Redis URL's credentials must be :password or user:password");
        if (colon + 1 == at)
            return bad(err, len, "the Redis URL's password is empty");
        if (colon > p && !(st->user = decode(p, colon)))
            return bad(err, len, "the Redis URL's user has a bad %-escape");
        if (!(st->password = decode(colon + 1, at)))
            return bad(err, len, "the Redis URL's password has a bad %-escape");
        hp = at + 1;
    }
    const char *host = hp, *host_end, *after;
    if (*hp == '[') {                                   /* [IPv6] */
        host = hp + 1;
        host_end = memchr(host, ']', (size_t)(auth_end - host));
        if (!host_end)
            return bad(err, len, "the Redis URL's [IPv6 address] is not closed");
        after = host_end + 1;
    } else {
        host_end = memchr(hp, ':', (size_t)(auth_end - hp));
        if (!host_end)
            host_end = auth_end;
        after = host_end;
    }
    if (host_end == host)
        return bad(err, len, "the Redis URL names no host");
    if ((size_t)(host_end - host) >= sizeof st->host)
        return bad(err, len, "the Redis URL's host is too long");
    for (const char *q = host; q < host_end; q++)
        if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') ||
              *q == '.' || *q == '-' || *q == '_' || (*hp == '[' && *q == ':')))
            return bad(err, len, "the Redis URL's host may hold letters, digits, '.', '-' and '_' "
                       "(an IPv6 address goes in [brackets])");
    memcpy(st->host, host, (size_t)(host_end - host));
    st->host[host_end - host] = '\0';
    st->port = 6379;
    if (after < auth_end) {
        if (*after != ':' ||
            (st->port = (int)number(after + 1, auth_end, 1, 65535)) < 0)
            return bad(err, len, "the Redis URL's port must be a number from 1 to 65535");
    }
    st->db = 0;
    const char *query = strchr(auth_end, '?');
    const char *path_end = query ? query : auth_end + strlen(auth_end);
    if (strchr(auth_end, '#'))
        return bad(err, len, "a Redis URL with a fragment is not supported");
    if (*auth_end == '/' && auth_end + 1 < path_end &&
        (st->db = (int)number(auth_end + 1, path_end, 0, 1000000)) < 0)
        return bad(err, len, "the Redis URL's database (after the host's '/') must be a number");
    /* One parameter: how slow is unavailable (a Redis far away answers in
     * more than the default 50 ms). */
    st->timeout_ms = FAIL_OPEN_MS;
    if (query && (strncmp(query, "?timeout_ms=", 12) != 0 ||
                  (st->timeout_ms = (int)number(query + 12, query + strlen(query), 1, 60000)) < 0))
        return bad(err, len, "the Redis URL's only parameter is ?timeout_ms=N (1 to 60000)");
    char extra[32] = "";
    if (st->timeout_ms != FAIL_OPEN_MS)
        snprintf(extra, sizeof extra, "?timeout_ms=%d", st->timeout_ms);
    snprintf(st->name, sizeof st->name, "redis://%s%s%s%s:%d/%d%s", st->password ? "***@" : "",
             *hp == '[' ? "[" : "", st->host, *hp == '[' ? "]" : "", st->port, st->db, extra);
    return 0;
}

/* ---- the I/O thread's side --------------------------------------------------------- */

static void kick(lr_redis *st)
{
    st->kick = 1;
    pthread_cond_signal(&st->cv);
}

static int down(const lr_redis *st)
{
    return st->state == ST_DOWN;
}

/* The mirror's probe lease, from what this process knows of the Redis
 * one: free for a local call only when Redis named this process the
 * holder; held by another until when it said; else blocked until asked. */
#define PROBE_BLOCKED (INT64_MAX / 4)
static void fix_probe(lr_redis_ep *x, int64_t now_ms)
{
    lr_shared_ep *m = &x->mirror;
    if (x->probe == PROBE_MINE && now_ms >= x->mine_until)
        x->probe = PROBE_NONE;                          /* it lapsed unused */
    if (x->probe == PROBE_USED)
        return;                                         /* a local call probes: its lease */
    if (down(x->st) || atomic_load(&m->breaker_open_until) == 0 || x->probe == PROBE_MINE)
        atomic_store(&m->breaker_probe_until, 0);
    else
        atomic_store(&m->breaker_probe_until, x->other_until > now_ms ? x->other_until
                                                                         : PROBE_BLOCKED);
}

lr_redis_ep *lr_redis_endpoint(lr_redis *st, uint64_t id)
{
    pthread_mutex_lock(&st->mu);
    lr_redis_ep *x = NULL;
    for (size_t i = 0; i < st->n_eps && !x; i++)
        if (st->eps[i]->id == id)
            x = st->eps[i];
    if (!x && st->n_eps == st->cap_eps) {
        size_t cap = st->cap_eps ? 2 * st->cap_eps : 8;
        lr_redis_ep **more = realloc(st->eps, cap * sizeof *more);
        if (more) {
            st->eps = more;
            st->cap_eps = cap;
        }
    }
    if (!x && st->n_eps < st->cap_eps && (x = calloc(1, sizeof *x))) {
        x->st = st;
        x->id = id;
        snprintf(x->key, sizeof x->key, "llmretry:1:%016llx", (unsigned long long)id);
        lr_shared_ep_init(&x->mirror, id);
        x->made_ms = x->active_ms = mono_us() / 1000;
        x->synced = down(st);
        st->eps[st->n_eps++] = x;
        kick(st);                                       /* read its numbers now */
    }
    pthread_mutex_unlock(&st->mu);
    return x;
}

lr_shared_ep *lr_redis_mirror(lr_redis_ep *x)
{
    return &x->mirror;
}

const char *lr_redis_name(const lr_redis *st)
{
    return st->name;
}

const char *lr_redis_ep_name(const lr_redis_ep *x)
{
    return x->st->name;
}

/* When the store may ask for a slice again: after what Redis said, unless
 * it said it of a slice for calls yet to come and a call now waits (a
 * waiting call books further ahead). */
static int64_t ask_after(const lease *L)
{
    return L->want_since && !L->ask_waiting ? 0 : L->ask_at;
}

/* Bucket time this process holds from `now` on. */
static int64_t held_us(const lease *L, int64_t now)
{
    int64_t t = 0;
    for (int i = 0; i < 2; i++)
        if (L->s[i].end > max64(L->s[i].pos, now))
            t += L->s[i].end - max64(L->s[i].pos, now);
    return t;
}

/* One unit of `cost` from the slices held: 0 (taken if `take`), or the
 * microseconds to wait. */
static int64_t from_slices(lr_redis_ep *x, int bucket, int64_t now, int64_t cost, int64_t tol,
                           int take)
{
    lr_redis *st = x->st;
    lease *L = &x->b[bucket];
    _Atomic int64_t *tat = bucket == LR_REDIS_REQ ? &x->mirror.req_tat_us : &x->mirror.tok_tat_us;
    L->cost = cost;
    L->tol = tol;
    if (take)
        L->used_at = now;
    x->active_ms = now / 1000;
    /* Redis is down, or has not answered for as long as a call may wait:
     * this process's own bucket, from where the shared one stood when Redis
     * last said (it never holds a call long: Redis books no further ahead
     * than the horizon and a slice). */
    if (down(st) || (L->want_since && now - max64(L->want_since, ask_after(L)) >= st->timeout_ms * 1000)) {
        lr_shared_raise(tat, L->known_end);
        L->local = take;
        return take ? lr_shared_gcra_take(tat, now, cost, 1, tol) : lr_shared_gcra_wait(tat, now, tol);
    }
    if (take)
        L->local = 0;
    int64_t grace = min64(cost, GRACE_MAX_US);
    for (;;) {
        slice *s = &L->s[0];
        if (s->end <= s->pos)
            break;
        int64_t start = max64(s->pos, now - grace);
        if (s->end - start >= cost) {
            if (start - tol > now)
                return start - tol - now;
            if (take) {
                s->pos = start + cost;
                if (held_us(L, now) < LEASE_US / 2 && !L->asking && !L->s[1].end)
                    kick(st);                           /* the next slice, before this runs out */
            }
            return 0;
        }
        /* Too little left for this unit: its future goes back to the others. */
        int64_t left = s->end - max64(s->pos, now);
        if (left > 0)
            L->give_back += left;
        L->s[0] = L->s[1];
        L->s[1] = (slice){ 0, 0 };
    }
    if (!L->want_since) {
        L->want_since = now;
        kick(st);
    }
    /* The store's answer wakes the I/O thread; until then, at most until
     * Redis said it has room, or until the wait is up. */
    int64_t after = ask_after(L);
    int64_t w = after > now ? after - now : max64(L->want_since, after) + st->timeout_ms * 1000 - now;
    return w > 1000 ? w : 1000;
}

int64_t lr_redis_take(lr_redis_ep *x, int bucket, int64_t now_us, int64_t cost_us,
                      int64_t tolerance_us)
{
    pthread_mutex_lock(&x->st->mu);
    int64_t w = from_slices(x, bucket, now_us, cost_us, tolerance_us, 1);
    pthread_mutex_unlock(&x->st->mu);
    return w;
}

int64_t lr_redis_wait(lr_redis_ep *x, int bucket, int64_t now_us, int64_t cost_us,
                      int64_t tolerance_us)
{
    pthread_mutex_lock(&x->st->mu);
    int local = x->b[bucket].local;
    int64_t w = from_slices(x, bucket, now_us, cost_us, tolerance_us, 0);
    x->b[bucket].local = local;
    pthread_mutex_unlock(&x->st->mu);
    return w;
}

void lr_redis_untake(lr_redis_ep *x, int bucket, int64_t cost_us)
{
    pthread_mutex_lock(&x->st->mu);
    lease *L = &x->b[bucket];
    if (L->local)
        lr_shared_gcra_adjust(bucket == LR_REDIS_REQ ? &x->mirror.req_tat_us : &x->mirror.tok_tat_us,
                              -cost_us);
    else
        L->s[0].pos -= cost_us;
    pthread_mutex_unlock(&x->st->mu);
}

void lr_redis_adjust(lr_redis_ep *x, int bucket, int64_t delta_us)
{
    pthread_mutex_lock(&x->st->mu);
    if (down(x->st))
        lr_shared_gcra_adjust(bucket == LR_REDIS_REQ ? &x->mirror.req_tat_us : &x->mirror.tok_tat_us,
                              delta_us);
    else
        x->b[bucket].give_back -= delta_us;
    pthread_mutex_unlock(&x->st->mu);
}

void lr_redis_raise_pause(lr_redis_ep *x, int64_t until_ms)
{
    pthread_mutex_lock(&x->st->mu);
    lr_shared_raise(&x->mirror.paused_until, until_ms);
    if (!down(x->st) && until_ms > x->p.pause_until) {
        x->p.pause_until = until_ms;
        kick(x->st);                                    /* every process waits: tell them now */
    }
    pthread_mutex_unlock(&x->st->mu);
}

void lr_redis_budget_request(lr_redis_ep *x, int64_t now_ms)
{
    pthread_mutex_lock(&x->st->mu);
    lr_shared_budget_request(&x->mirror, now_ms);
    if (!down(x->st))
        x->p.requests++;
    x->active_ms = now_ms;
    pthread_mutex_unlock(&x->st->mu);
}

int lr_redis_budget_take(lr_redis_ep *x, int64_t now_ms, double ratio, int64_t min)
{
    pthread_mutex_lock(&x->st->mu);
    int ok = lr_shared_budget_take(&x->mirror, now_ms, ratio, min);
    if (ok && !down(x->st))
        x->p.retries++;
    pthread_mutex_unlock(&x->st->mu);
    return ok;
}

int lr_redis_breaker_admits(lr_redis_ep *x, int64_t now_ms, int64_t lease_ms, int *probe)
{
    lr_redis *st = x->st;
    pthread_mutex_lock(&st->mu);
    x->active_ms = now_ms;
    x->lease_ms = lease_ms;
    *probe = 0;
    fix_probe(x, now_ms);
    if (!down(st) && lr_shared_breaker_state(&x->mirror, now_ms) == LR_SHARED_HALF_OPEN &&
        x->probe == PROBE_NONE && x->other_until <= now_ms) {
        /* Half open, and nobody is known to probe: ask Redis for the lease
         * (the call waits for the answer), unless it has not answered in
         * time: then this process decides alone. */
        if (!x->probe_asked) {
            x->probe_asked = now_ms;
            x->p.want_probe = 1;
            kick(st);
        }
        if (now_ms - x->probe_asked < st->timeout_ms) {
            pthread_mutex_unlock(&st->mu);
            return -1;
        }
        atomic_store(&x->mirror.breaker_probe_until, 0);
    }
    int ok = lr_shared_breaker_admits(&x->mirror, now_ms, lease_ms, probe);
    if (*probe)
        x->probe = PROBE_USED;
    pthread_mutex_unlock(&st->mu);
    return ok;
}

int lr_redis_breaker_failed(lr_redis_ep *x, int64_t now_ms, int threshold, int64_t cooldown_ms,
                            int probe)
{
    pthread_mutex_lock(&x->st->mu);
    int opened = lr_shared_breaker_failed(&x->mirror, now_ms, threshold, cooldown_ms, probe);
    x->threshold = threshold;
    x->cooldown_ms = cooldown_ms;
    if (probe)
        x->probe = PROBE_NONE;
    if (!down(x->st)) {
        if (probe)
            x->p.reopen = 1;
        else
            x->p.failures++;
        kick(x->st);
    }
    fix_probe(x, now_ms);
    pthread_mutex_unlock(&x->st->mu);
    return opened;
}

void lr_redis_breaker_succeeded(lr_redis_ep *x)
{
    pthread_mutex_lock(&x->st->mu);
    lr_shared_ep *m = &x->mirror;
    /* Only news when the shared breaker counts failures or is open: a
     * success on a closed breaker changes nothing anywhere. */
    int64_t open = atomic_load(&m->breaker_open_until);
    if (!down(x->st) && (open != 0 || atomic_load(&m->breaker_failures) != 0 || x->p.failures)) {
        x->p.success = 1;
        x->p.failures = 0;
        x->p.reopen = 0;
        if (open != 0)
            kick(x->st);
    }
    lr_shared_breaker_succeeded(m);
    x->probe = PROBE_NONE;
    pthread_mutex_unlock(&x->st->mu);
}

void lr_redis_probe_release(lr_redis_ep *x)
{
    pthread_mutex_lock(&x->st->mu);
    if (x->probe == PROBE_USED) {
        x->probe = PROBE_NONE;
        if (!down(x->st)) {
            x->p.release = 1;
            kick(x->st);
        }
    }
    atomic_store(&x->mirror.breaker_probe_until, 0);
    fix_probe(x, mono_us() / 1000);
    pthread_mutex_unlock(&x->st->mu);
}

void lr_redis_say(lr_redis_ep *x, int index, int64_t now_ms, int64_t value, int claim)
{
    pthread_mutex_lock(&x->st->mu);
    _Atomic int64_t *w = &x->mirror.said[index];
    int64_t age = lr_shared_said_age_s(index), before = lr_shared_fresh(w, now_ms, age);
    if (claim)
        lr_shared_claim(w, now_ms, value);
    else
        lr_shared_say(w, now_ms, value);
    if (!down(x->st)) {
        int64_t *p = &x->p.said[index];
        *p = claim && *p > 0 && *p < value ? *p : value;
        /* A value that changes what the others pace by is news for them at
         * once; one said again goes with the next round. */
        if (lr_shared_fresh(w, now_ms, age) != before) {
            x->p.said_news = 1;
            kick(x->st);
        }
    }
    pthread_mutex_unlock(&x->st->mu);
}

int lr_redis_start_take(lr_redis_ep *x, int64_t now_ms)
{
    lr_redis *st = x->st;
    pthread_mutex_lock(&st->mu);
    x->active_ms = now_ms;              /* read back while calls wait on it */
    int ok = 0;
    if (atomic_load(&x->mirror.start_over)) {
        ok = 1;
    } else if (x->start_granted > 0) {
        x->start_granted--;
        ok = 1;
    } else if (down(st) || (x->start_asked && now_ms - x->start_asked >= st->timeout_ms)) {
        /* Redis does not answer: the mirror's wave, this process's own. */
        ok = lr_shared_start_take(&x->mirror, now_ms, LR_SHARED_START_CAP);
    } else if (!x->start_asked) {
        x->start_asked = now_ms;
        x->p.start_want = START_ASK;
        kick(st);
    }
    pthread_mutex_unlock(&st->mu);
    return ok;
}

int lr_redis_start_room(lr_redis_ep *x, int64_t now_ms)
{
    lr_redis *st = x->st;
    pthread_mutex_lock(&st->mu);
    x->active_ms = now_ms;
    /* Room: granted requests in hand, or none asked for and the wave as
     * Redis last told it not full (the call then asks); an answer on its
     * way wakes the I/O thread. */
    int room = atomic_load(&x->mirror.start_over) || x->start_granted > 0 || down(st) ||
               (x->start_asked ? now_ms - x->start_asked >= st->timeout_ms
                               : lr_shared_start_room(&x->mirror, now_ms, LR_SHARED_START_CAP));
    pthread_mutex_unlock(&st->mu);
    return room;
}

void lr_redis_start_over(lr_redis_ep *x)
{
    pthread_mutex_lock(&x->st->mu);
    atomic_store(&x->mirror.start_over, 1);
    if (!down(x->st)) {
        x->p.start_over = 1;
        kick(x->st);
    }
    pthread_mutex_unlock(&x->st->mu);
}

int64_t lr_redis_hold_ms(lr_redis_ep *x, int64_t now_ms)
{
    pthread_mutex_lock(&x->st->mu);
    int64_t w = 0;
    if (!down(x->st)) {
        if (!x->synced)
            w = x->made_ms + x->st->timeout_ms - now_ms;
        if (x->probe_asked)
            w = max64(w, x->probe_asked + x->st->timeout_ms - now_ms);
    }
    pthread_mutex_unlock(&x->st->mu);
    return w > 0 ? w : 0;
}

int lr_redis_transition(lr_redis_ep *x, char *why, size_t len, int64_t *down_ms)
{
    lr_redis *st = x->st;
    int t = 0;
    pthread_mutex_lock(&st->mu);
    if (st->state == ST_DOWN && !st->reported_down) {
        st->reported_down = 1;
        snprintf(why, len, "%s", st->why);
        t = 1;
    } else if (st->state == ST_UP && st->reported_down) {
        st->reported_down = 0;
        *down_ms = st->down_ms;
        t = 2;
    }
    pthread_mutex_unlock(&st->mu);
    return t;
}

/* ---- the store thread ------------------------------------------------------------ */

/* One endpoint's request in a round: the script's ARGV, and what was asked. */
#define N_ARGS 30
typedef struct ask {
    lr_redis_ep *x;
    char args[N_ARGS][48];
    pending p;                          /* what this round tells Redis */
    int64_t units[2], cost[2], horizon[2]; /* slices asked for */
    int64_t at_us;                      /* when Redis answered, on this process's clock */
} ask;

static void say(lr_redis *st, char *why, size_t len, const char *what, const redisContext *c)
{
    /* hiredis's own words for an I/O error, except for a timeout, whose
     * "Resource temporarily unavailable" says nothing useful. */
    int timeout = c && c->err == REDIS_ERR_IO &&
                  (errno == EAGAIN || errno == EWOULDBLOCK || strstr(c->errstr, "temporarily"));
#ifdef REDIS_ERR_TIMEOUT
    timeout |= c && c->err == REDIS_ERR_TIMEOUT;        /* hiredis 1.x */
#endif
    if (timeout)
        snprintf(why, len, "%s: %s: no answer within %d ms", st->name, what, st->timeout_ms);
    else if (c && c->err)
        snprintf(why, len, "%s: %s: %s", st->name, what, c->errstr);
    else
        snprintf(why, len, "%s: %s", st->name, what);
}

/* An error reply, by its code alone (the first word): the rest could
 * repeat what was sent. */
static void say_reply(lr_redis *st, char *why, size_t len, const char *what, const redisReply *r)
{
    char code[32] = "no reply";
    if (r && r->type == REDIS_REPLY_ERROR && r->str)
        snprintf(code, sizeof code, "%.*s", (int)strcspn(r->str, " "), r->str);
    else if (r)
        snprintf(code, sizeof code, "an unexpected reply");
    snprintf(why, len, "%s: %s (%s)", st->name, what, code);
}

static int ok_reply(redisReply *r, int type)
{
    return r && r->type == type;
}

static int load_script(lr_redis *st, char *why, size_t len)
{
    redisReply *r = redisCommand(st->ctx, "SCRIPT LOAD %s", SCRIPT);
    int ok = ok_reply(r, REDIS_REPLY_STRING) && r->len < sizeof st->sha;
    if (ok)
        snprintf(st->sha, sizeof st->sha, "%s", r->str);
    else if (!r)
        say(st, why, len, "loading the script", st->ctx);
    else if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOAUTH", 6) == 0)
        say_reply(st, why, len, "Redis wants a password, and the URL has none", r);
    else
        say_reply(st, why, len, "Redis refused the script (Redis 6 or later is needed)", r);
    freeReplyObject(r);
    return ok ? 0 : -1;
}

/* Connect, log in, pick the database, load the script: 0, or -1 with why. */
static int dial(lr_redis *st, char *why, size_t len)
{
    struct timeval tv = { st->timeout_ms / 1000, (st->timeout_ms % 1000) * 1000 };
    st->ctx = redisConnectWithTimeout(st->host, st->port, tv);
    if (!st->ctx || st->ctx->err) {
        say(st, why, len, "cannot connect", st->ctx);
        goto fail;
    }
    if (redisSetTimeout(st->ctx, tv) != REDIS_OK) {
        say(st, why, len, "cannot set a timeout", st->ctx);
        goto fail;
    }
    if (st->password) {
        redisReply *r = st->user
            ? redisCommand(st->ctx, "AUTH %s %s", st->user, st->password)
            : redisCommand(st->ctx, "AUTH %s", st->password);
        int ok = ok_reply(r, REDIS_REPLY_STATUS);
        if (!r)
            say(st, why, len, "logging in", st->ctx);
        else if (!ok)
            say_reply(st, why, len, "Redis refused the password", r);
        freeReplyObject(r);
        if (!ok)
            goto fail;
    }
    if (st->db != 0) {
        redisReply *r = redisCommand(st->ctx, "SELECT %d", st->db);
        int ok = ok_reply(r, REDIS_REPLY_STATUS);
        if (!r)
            say(st, why, len, "selecting the database", st->ctx);
        else if (!ok)
            say_reply(st, why, len, "Redis refused the database number", r);
        freeReplyObject(r);
        if (!ok)
            goto fail;
    }
    if (load_script(st, why, len) == 0)
        return 0;
fail:
    if (st->ctx)
        redisFree(st->ctx);
    st->ctx = NULL;
    return -1;
}

/* Send every ask of the round at once, then read the answers. */
static int exchange(lr_redis *st, ask *asks, size_t n, redisReply **out, char *why, size_t len)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        for (size_t i = 0; i < n; i++) {
            const char *argv[4 + N_ARGS];
            size_t lens[4 + N_ARGS];
            argv[0] = "EVALSHA";
            argv[1] = st->sha;
            argv[2] = "1";
            argv[3] = asks[i].x->key;
            for (int k = 0; k < N_ARGS; k++)
                argv[4 + k] = asks[i].args[k];
            for (int k = 0; k < 4 + N_ARGS; k++)
                lens[k] = strlen(argv[k]);
            redisAppendCommandArgv(st->ctx, 4 + N_ARGS, argv, lens);
        }
        int noscript = 0;
        int64_t sent = mono_us();                       /* the first read writes the batch */
        for (size_t i = 0; i < n; i++) {
            void *r = NULL;
            int rc = redisGetReply(st->ctx, &r);
            /* Redis ran the script between sending and this answer: the
             * middle is the best guess of when, its error at most half the
             * round trip (an answer read late, taken as when it came, would
             * place the slices late by as much). */
            asks[i].at_us = sent + (mono_us() - sent) / 2;
            if (rc != REDIS_OK) {
                for (size_t k = 0; k < i; k++)
                    freeReplyObject(out[k]);
                say(st, why, len, "the connection failed", st->ctx);
                return -1;
            }
            out[i] = r;
            if (out[i]->type == REDIS_REPLY_ERROR && strncmp(out[i]->str, "NOSCRIPT", 8) == 0)
                noscript = 1;
        }
        int good = 1;
        for (size_t i = 0; i < n; i++)
            good &= out[i]->type == REDIS_REPLY_ARRAY && out[i]->elements == R_COUNT;
        if (good)
            return 0;
        if (!noscript || attempt == 1) {
            for (size_t i = 0; i < n; i++) {
                if (good || out[i]->type != REDIS_REPLY_ARRAY) {
                    say_reply(st, why, len, "the script failed", out[i]);
                    break;
                }
            }
            for (size_t i = 0; i < n; i++)
                freeReplyObject(out[i]);
            return -1;
        }
        /* Redis restarted or its scripts were flushed: load it again. */
        for (size_t i = 0; i < n; i++)
            freeReplyObject(out[i]);
        if (load_script(st, why, len) != 0)
            return -1;
    }
    return -1;
}

/* Whether x has anything to tell Redis. */
static int has_news(const lr_redis_ep *x)
{
    const pending *p = &x->p;
    int said = 0;
    for (int i = 0; i < LR_SAID_COUNT; i++)
        said |= p->said[i] != 0;
    return p->requests || p->retries || p->success || p->failures || p->reopen || p->release ||
           p->pause_until || x->b[0].give_back || x->b[1].give_back || said || p->start_over;
}

/* When endpoint x needs a round (microseconds; <= now: now). */
static int64_t due_at(const lr_redis_ep *x, int64_t now)
{
    const pending *p = &x->p;
    if (!x->synced || p->success || p->failures || p->reopen || p->release || p->want_probe ||
        p->pause_until || p->said_news || p->start_want || p->start_over)
        return 0;
    int64_t due = INT64_MAX;
    for (int b = 0; b < 2; b++) {
        const lease *L = &x->b[b];
        if (L->asking || L->cost <= 0)
            continue;
        int prefetch = L->used_at && now - L->used_at < PREFETCH_MS * 1000 && !L->s[1].end &&
                       held_us(L, now) < LEASE_US / 2;
        if (L->want_since || prefetch)
            due = min64(due, ask_after(L));
    }
    int64_t next = (x->synced_ms + SYNC_MS) * 1000;
    if (now / 1000 - x->active_ms < ACTIVE_MS || p->requests || p->retries || x->b[0].give_back ||
        x->b[1].give_back)
        due = min64(due, next);
    return due;
}

static void fmt(char *buf, int64_t v)
{
    snprintf(buf, 48, "%lld", (long long)v);
}

/* Take what endpoint x has for Redis into a round. */
static void prepare(lr_redis *st, lr_redis_ep *x, ask *a, int64_t now)
{
    a->x = x;
    a->p = x->p;
    memset(&x->p, 0, sizeof x->p);
    snprintf(a->args[0], sizeof a->args[0], "%s", st->owner);
    fmt(a->args[1], a->p.requests);
    fmt(a->args[2], a->p.retries);
    fmt(a->args[3], a->p.success);
    fmt(a->args[4], a->p.failures);
    fmt(a->args[5], a->p.reopen);
    fmt(a->args[6], x->threshold);
    fmt(a->args[7], x->cooldown_ms);
    fmt(a->args[8], a->p.release);
    fmt(a->args[9], a->p.want_probe);
    fmt(a->args[10], x->lease_ms > 0 ? x->lease_ms : 1000);
    fmt(a->args[11], a->p.pause_until ? max64(1, a->p.pause_until - now / 1000) : 0);
    for (int b = 0; b < 2; b++) {
        lease *L = &x->b[b];
        int prefetch = L->used_at && now - L->used_at < PREFETCH_MS * 1000 && !L->s[1].end &&
                       held_us(L, now) < LEASE_US / 2;
        a->units[b] = 0;
        a->cost[b] = L->cost;
        /* A call that waits books its place however far ahead the others
         * have (it will use it); a slice for calls yet to come only what
         * is near. */
        a->horizon[b] = L->want_since ? WAITING_HORIZON_US : HORIZON_US;
        if (!L->asking && L->cost > 0 && (L->want_since || prefetch) && now >= ask_after(L)) {
            a->units[b] = LEASE_US / L->cost > 1 ? LEASE_US / L->cost : 1;
            L->asking = 1;
        }
        fmt(a->args[12 + 5 * b], a->units[b]);
        fmt(a->args[13 + 5 * b], L->cost);
        fmt(a->args[14 + 5 * b], L->tol);
        fmt(a->args[15 + 5 * b], L->give_back);
        fmt(a->args[16 + 5 * b], a->horizon[b]);
        L->give_back = 0;
    }
    for (int i = 0; i < LR_SAID_COUNT; i++)
        fmt(a->args[22 + i], a->p.said[i]);
    fmt(a->args[27], a->p.start_want);
    fmt(a->args[28], a->p.start_over);
    fmt(a->args[29], LR_SHARED_START_CAP);
}

/* Redis's answer becomes the mirror, with what the I/O thread did since the
 * round was prepared (x->p) applied on top. */
static void install(lr_redis_ep *x, const ask *a, const redisReply *r)
{
    int64_t t_us = a->at_us;
    int64_t v[R_COUNT];
    for (int i = 0; i < R_COUNT; i++)
        v[i] = r->element[i]->type == REDIS_REPLY_INTEGER ? r->element[i]->integer : 0;
    int64_t now = t_us / 1000;
    lr_shared_ep *m = &x->mirror;
    /* The retry budget's window, as one count in this second's slot. */
    int64_t sec = now / 1000;
    for (int i = 0; i < LR_SHARED_BUDGET_SLOTS; i++) {
        atomic_store(&m->budget_requests[i], 0);
        atomic_store(&m->budget_retries[i], 0);
    }
    int slot = (int)(sec % LR_SHARED_BUDGET_SLOTS);
    atomic_store(&m->budget_requests[slot], (sec << 32) | (v[R_WQ] + x->p.requests));
    atomic_store(&m->budget_retries[slot], (sec << 32) | (v[R_WR] + x->p.retries));
    /* The breaker, then this process's news since. */
    int64_t failures = (x->p.success ? 0 : v[R_BF]) + x->p.failures;
    int64_t open = v[R_BSET] ? max64(1, now + v[R_BOPEN]) : 0;
    if (x->p.success)
        open = 0;
    if (x->p.reopen || (x->threshold > 0 && failures >= x->threshold && open == 0 && x->p.failures))
        open = now + x->cooldown_ms;
    atomic_store(&m->breaker_failures, failures);
    atomic_store(&m->breaker_open_until, open);
    if (v[R_PROBE] == 2) {
        if (x->probe == PROBE_NONE)
            x->probe = PROBE_MINE;
        x->mine_until = now + v[R_PROBE_REL];
        x->other_until = 0;
    } else {
        if (x->probe == PROBE_MINE)
            x->probe = PROBE_NONE;
        x->other_until = v[R_PROBE] == 1 ? now + v[R_PROBE_REL] : 0;
    }
    if (a->p.want_probe)
        x->probe_asked = 0;
    fix_probe(x, now);
    if (v[R_PAUSE] > 0)
        lr_shared_raise(&m->paused_until, now + v[R_PAUSE]);
    /* The slices. */
    for (int b = 0; b < 2; b++) {
        lease *L = &x->b[b];
        if (!a->units[b])
            continue;
        L->asking = 0;
        L->want_since = 0;
        int64_t n = v[R_REQ_N + 2 * b], rel = v[R_REQ_REL + 2 * b];
        L->known_end = max64(L->known_end, n > 0 ? t_us + rel + n * a->cost[b]
                                                 : t_us + rel + a->horizon[b] + L->tol);
        if (v[R_REQ_N + 2 * b] > 0) {
            slice s = { t_us + v[R_REQ_REL + 2 * b],
                        t_us + v[R_REQ_REL + 2 * b] + v[R_REQ_N + 2 * b] * a->cost[b] };
            L->s[L->s[0].end > L->s[0].pos ? 1 : 0] = s;
            L->ask_at = 0;
        } else {
            L->ask_at = t_us + v[R_REQ_REL + 2 * b];
            L->ask_waiting = a->horizon[b] == WAITING_HORIZON_US;
        }
    }
    /* What processes said of the limits, then what this one said since. */
    for (int i = 0; i < LR_SAID_COUNT; i++) {
        int64_t value = v[R_SAID + 2 * i], age = v[R_SAID + 2 * i + 1];
        atomic_store(&m->said[i], value > 0 ? (max64(0, now - age) / 1000) << 32 | value : 0);
        if (x->p.said[i] && (i == LR_SAID_CFG_RPM || i == LR_SAID_CFG_TPM))
            lr_shared_claim(&m->said[i], now, x->p.said[i]);
        else if (x->p.said[i])
            lr_shared_say(&m->said[i], now, x->p.said[i]);
    }
    /* The slow start. */
    if (a->p.start_want)
        x->start_asked = 0;
    x->start_granted += (int)v[R_START_GRANTED];
    atomic_store(&m->start_over, v[R_START_OVER] || x->p.start_over);
    atomic_store(&m->start_wave, v[R_START_WAVE] > 0 ? (now / 1000) << 32 | v[R_START_WAVE] : 0);
    x->synced = 1;
    x->synced_ms = now;
}

/* Redis is out of reach: each mirror is this process's own budget from now
 * on, starting where its slices end (what it was granted, it has). */
static void went_down(lr_redis *st, const char *why, int64_t now)
{
    if (st->state != ST_DOWN) {
        st->state = ST_DOWN;
        st->down_at = now;
        snprintf(st->why, sizeof st->why, "%s", why);
    }
    for (size_t i = 0; i < st->n_eps; i++) {
        lr_redis_ep *x = st->eps[i];
        for (int b = 0; b < 2; b++) {
            lease *L = &x->b[b];
            _Atomic int64_t *tat = b == LR_REDIS_REQ ? &x->mirror.req_tat_us : &x->mirror.tok_tat_us;
            lr_shared_raise(tat, L->known_end);
            memset(L, 0, sizeof *L);
        }
        memset(&x->p, 0, sizeof x->p);
        x->synced = 1;
        x->probe_asked = 0;
        x->start_asked = 0;
        x->other_until = 0;
        if (x->probe == PROBE_MINE)
            x->probe = PROBE_NONE;
        fix_probe(x, now / 1000);
    }
}

static void went_up(lr_redis *st, int64_t now)
{
    if (st->state == ST_DOWN)
        st->down_ms = (now - st->down_at) / 1000;
    st->state = ST_UP;
}

static void news(lr_redis *st)
{
    if (st->wake)
        st->wake(st->wake_arg);
}

static void *store_main(void *arg)
{
    lr_redis *st = arg;
    ask *asks = NULL;
    redisReply **replies = NULL;
    size_t cap = 0;
    char why[sizeof st->why];
    pthread_mutex_lock(&st->mu);
    while (!st->stop) {
        int64_t now = mono_us();
        if (!st->ctx) {
            if (now < st->retry_at) {
                st->kick = 0;
                lr_cond_wait_until(&st->cv, &st->mu, (st->retry_at + 999) / 1000);
                continue;
            }
            pthread_mutex_unlock(&st->mu);
            int rc = dial(st, why, sizeof why);
            pthread_mutex_lock(&st->mu);
            now = mono_us();
            if (rc != 0) {
                went_down(st, why, now);
                st->retry_at = now + st->backoff_ms * 1000;
                st->backoff_ms = min64(2 * st->backoff_ms, RETRY_MAX_MS);
                news(st);
                continue;
            }
            /* Up once a round goes through (a Redis that takes the
             * connection and refuses the script's writes, out of memory, is
             * not up); with no endpoint yet there is nothing more to try. */
            if (st->n_eps == 0) {
                went_up(st, now);
                news(st);
            }
        }
        /* The endpoints due now, and when the next one is. */
        if (cap < st->n_eps) {
            size_t c = st->n_eps + 8;
            ask *a = realloc(asks, c * sizeof *a);
            redisReply **r = a ? realloc(replies, c * sizeof *r) : NULL;
            if (a)
                asks = a;
            if (r)
                replies = r;
            if (a && r)
                cap = c;
        }
        size_t n = 0;
        int64_t next = now + 1000000;
        for (size_t i = 0; i < st->n_eps; i++) {
            int64_t d = due_at(st->eps[i], now);
            if (d <= now && n < cap)
                prepare(st, st->eps[i], &asks[n++], now);
            else
                next = min64(next, d);
        }
        if (n == 0) {
            if (!st->kick)
                lr_cond_wait_until(&st->cv, &st->mu, (next + 999) / 1000);
            st->kick = 0;
            continue;
        }
        st->kick = 0;
        pthread_mutex_unlock(&st->mu);
        int rc = exchange(st, asks, n, replies, why, sizeof why);
        pthread_mutex_lock(&st->mu);
        now = mono_us();
        if (rc == 0) {
            for (size_t i = 0; i < n; i++) {
                install(asks[i].x, &asks[i], replies[i]);
                freeReplyObject(replies[i]);
            }
            if (st->state != ST_UP)
                went_up(st, now);
            st->redial_now = 1;
            st->backoff_ms = RETRY_MIN_MS;
        } else {
            /* What this round carried is lost: Redis may or may not have
             * applied it, and this process goes on alone. */
            redisFree(st->ctx);
            st->ctx = NULL;
            went_down(st, why, now);
            /* Redialled at once after a round that went well (a Redis slow
             * for a moment is back within a round trip), else backing off
             * (one that keeps failing rounds is not hammered). */
            st->retry_at = st->redial_now ? now : now + st->backoff_ms * 1000;
            if (!st->redial_now)
                st->backoff_ms = min64(2 * st->backoff_ms, RETRY_MAX_MS);
            st->redial_now = 0;
        }
        news(st);
    }
    /* Closing: what this process did last still reaches the others (its
     * last failures may be the ones that open the breaker for them). */
    size_t n = 0;
    for (size_t i = 0; st->ctx && i < st->n_eps && i < cap; i++)
        if (has_news(st->eps[i]))
            prepare(st, st->eps[i], &asks[n++], mono_us());
    pthread_mutex_unlock(&st->mu);
    if (n > 0 && exchange(st, asks, n, replies, why, sizeof why) == 0)
        for (size_t i = 0; i < n; i++)
            freeReplyObject(replies[i]);
    if (st->ctx)
        redisFree(st->ctx);
    st->ctx = NULL;
    free(asks);
    free(replies);
    return NULL;
}

/* ---- the store ---------------------------------------------------------------------- */

static void discard(lr_redis *st)
{
    if (st->password) {
        /* Gone from this process's memory, not only freed. */
        volatile char *p = st->password;
        while (*p)
            *p++ = '\0';
    }
    free(st->password);
    free(st->user);
    for (size_t i = 0; i < st->n_eps; i++)
        free(st->eps[i]);
    free(st->eps);
    free(st);
}

int lr_redis_open(const char *spec, lr_redis **out, char *err, size_t len)
{
    *out = NULL;
    lr_redis *st = calloc(1, sizeof *st);
    if (!st) {
        snprintf(err, len, "shared: out of memory");
        return -1;
    }
    if (parse(spec, st, err, len) != 0) {
        discard(st);
        return -1;
    }
    /* This store's name in Redis: unique enough among every process that
     * may hold the probe's lease. */
    uint64_t z = (uint64_t)mono_us() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)st;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    snprintf(st->owner, sizeof st->owner, "%d-%016llx", (int)getpid(),
             (unsigned long long)(z ^ (z >> 31)));
    st->state = ST_CONNECTING;
    st->backoff_ms = RETRY_MIN_MS;
    pthread_mutex_init(&st->mu, NULL);
    if (lr_cond_init(&st->cv) != 0) {
        pthread_mutex_destroy(&st->mu);
        discard(st);
        snprintf(err, len, "shared: cannot make a condition variable");
        return -1;
    }
    /* The store's thread takes no signals: they are the host's. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&st->thread, NULL, store_main, st);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        pthread_cond_destroy(&st->cv);
        pthread_mutex_destroy(&st->mu);
        discard(st);
        snprintf(err, len, "shared: cannot start the Redis store's thread: %s", strerror(rc));
        return -1;
    }
    *out = st;
    return 0;
}

void lr_redis_on_news(lr_redis *st, void (*wake)(void *), void *arg)
{
    pthread_mutex_lock(&st->mu);
    st->wake = wake;
    st->wake_arg = arg;
    pthread_mutex_unlock(&st->mu);
}

void lr_redis_close(lr_redis *st)
{
    if (!st)
        return;
    pthread_mutex_lock(&st->mu);
    st->stop = 1;
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
    pthread_join(st->thread, NULL);
    pthread_cond_destroy(&st->cv);
    pthread_mutex_destroy(&st->mu);
    discard(st);
}
