/* The store's one script, and a round of it for one endpoint
 * (shared_redis.h): what the I/O thread did since the last round goes to
 * Redis as ARGV, and Redis's answer becomes the endpoint's mirror again. */
#include "shared_redis.h"

#include <stdio.h>
#include <string.h>

#define KEY_TTL_MS "3600000"            /* an endpoint nobody touched for an hour is forgotten */
/* shared.h's LR_SHARED_*_S, as the script reads them (ms; i from 0) */
#define SAID_AGES "(i == 2 or i == 3) and 60000 or 10000"
#define WAVE_MS "10000"
_Static_assert(LR_SHARED_CLAIM_S == 10 && LR_SHARED_LEARNED_S == 60 && LR_SHARED_WAVE_S == 10,
               "the script's SAID_AGES and WAVE_MS follow shared.h");

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
const char lr_redis_script[] =
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


/* Whether x has anything to tell Redis. */
int lr_redis_has_news(const lr_redis_ep *x)
{
    const pending *p = &x->p;
    int said = 0;
    for (int i = 0; i < LR_SAID_COUNT; i++)
        said |= p->said[i] != 0;
    return p->requests || p->retries || p->success || p->failures || p->reopen || p->release ||
           p->pause_until || x->b[0].give_back || x->b[1].give_back || said || p->start_over;
}

/* When endpoint x needs a round (microseconds; <= now: now). */
int64_t lr_redis_due_at(const lr_redis_ep *x, int64_t now)
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
                       lr_redis_held_us(L, now) < LEASE_US / 2;
        if (L->want_since || prefetch)
            due = min64(due, lr_redis_ask_after(L));
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
void lr_redis_prepare(lr_redis *st, lr_redis_ep *x, ask *a, int64_t now)
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
                       lr_redis_held_us(L, now) < LEASE_US / 2;
        a->units[b] = 0;
        a->cost[b] = L->cost;
        /* A call that waits books its place however far ahead the others
         * have (it will use it); a slice for calls yet to come only what
         * is near. */
        a->horizon[b] = L->want_since ? WAITING_HORIZON_US : HORIZON_US;
        if (!L->asking && L->cost > 0 && (L->want_since || prefetch) && now >= lr_redis_ask_after(L)) {
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
void lr_redis_install(lr_redis_ep *x, const ask *a, const redisReply *r)
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
    lr_redis_fix_probe(x, now);
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
