/* The Redis store's connection (shared_redis.h): the URL, connecting and
 * logging in, and a round sent and read back. The password is kept for AUTH
 * alone: messages name the store with "***" in its place. */
#include "shared_redis.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <stdarg.h>
#include <sys/time.h>

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

int lr_redis_parse(const char *spec, lr_redis *st, char *err, size_t len)
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

/* ---- talking to Redis ------------------------------------------------------------ */

/* Why a reply did not come: `late` (no whole reply by the deadline), or
 * hiredis's words. A reply that is not RESP is named as such: hiredis's
 * words for it ("Protocol error, got ...") do not say who is at fault. */
static void say(lr_redis *st, char *why, size_t len, const char *what, const redisContext *c,
                int late)
{
    /* A timeout of hiredis's own (a connect's, or a write's: the socket's
     * timeout), whose "Resource temporarily unavailable" says nothing useful. */
    late |= c && c->err == REDIS_ERR_IO &&
            (errno == EAGAIN || errno == EWOULDBLOCK || strstr(c->errstr, "temporarily"));
#ifdef REDIS_ERR_TIMEOUT
    late |= c && c->err == REDIS_ERR_TIMEOUT;           /* hiredis 1.x */
#endif
    if (late)
        snprintf(why, len, "%s: %s: no answer within %d ms", st->name, what, st->timeout_ms);
    else if (c && c->err == REDIS_ERR_PROTOCOL)
        snprintf(why, len, "%s: %s: not a Redis reply (%s)", st->name, what, c->errstr);
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

/* The next reply, whole by `deadline` (mono_us) or not at all: hiredis's
 * own blocking read waits timeout_ms for each read(2), so a server that
 * drips a reply a byte at a time, each in time, would hold this thread (and
 * the engine's close, which joins it) for as long as it likes. Writes are a
 * round's few hundred bytes an endpoint, bounded by the socket's timeout.
 * A round under way when the store closes is waited for (it may carry the
 * failures that open the breaker for the other processes): the deadline
 * bounds it. 0 with *out set; else -1 and *late says whether it was the
 * deadline. */
static int reply_by(lr_redis *st, int64_t deadline, void **out, int *late)
{
    redisContext *c = st->ctx;
    *out = NULL;
    *late = 0;
    int done = 0;
    while (!done)
        if (redisBufferWrite(c, &done) != REDIS_OK)
            return -1;
    for (;;) {
        if (redisGetReplyFromReader(c, out) != REDIS_OK)
            return -1;
        if (*out)
            return 0;
        int64_t left = deadline - mono_us();
        if (left <= 0) {
            *late = 1;
            return -1;
        }
        struct pollfd p = { .fd = c->fd, .events = POLLIN };
        int ms = (int)((left + 999) / 1000);
        int rc = poll(&p, 1, ms);
        if (rc < 0 && errno != EINTR) {
            snprintf(c->errstr, sizeof c->errstr, "%s", strerror(errno));
            c->err = REDIS_ERR_IO;
            return -1;
        }
        if (rc > 0 && redisBufferRead(c) != REDIS_OK)
            return -1;
    }
}

/* One command sent and its reply read within the store's timeout: the
 * reply, or NULL with why (`what` failed). */
static redisReply *command(lr_redis *st, char *why, size_t len, const char *what,
                           const char *format, ...)
{
    int64_t deadline = mono_us() + st->timeout_ms * 1000LL;
    va_list ap;
    va_start(ap, format);
    int rc = redisvAppendCommand(st->ctx, format, ap);
    va_end(ap);
    void *r = NULL;
    int late = 0;
    if (rc != REDIS_OK || reply_by(st, deadline, &r, &late) != 0) {
        say(st, why, len, what, st->ctx, late);
        return NULL;
    }
    return r;
}

/* A reply of `type` (freed), or -1 with why: the reply's code after
 * `refused`. A NULL reply's why is command()'s. */
static int expect(lr_redis *st, redisReply *r, int type, char *why, size_t len, const char *refused)
{
    int ok = r && r->type == type;
    if (r && !ok)
        say_reply(st, why, len, refused, r);
    freeReplyObject(r);
    return ok ? 0 : -1;
}

static int load_script(lr_redis *st, char *why, size_t len)
{
    redisReply *r = command(st, why, len, "loading the script", "SCRIPT LOAD %s", lr_redis_script);
    int ok = r && r->type == REDIS_REPLY_STRING && r->len < sizeof st->sha;
    if (ok)
        snprintf(st->sha, sizeof st->sha, "%s", r->str);
    else if (r)
        say_reply(st, why, len, r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOAUTH", 6) == 0
                                    ? "Redis wants a password, and the URL has none"
                                    : "Redis refused the script (Redis 6 or later is needed)", r);
    freeReplyObject(r);
    return ok ? 0 : -1;
}

/* Connect, log in, pick the database, load the script, each within the
 * store's timeout: 0, or -1 with why. */
int lr_redis_dial(lr_redis *st, char *why, size_t len)
{
    struct timeval tv = { st->timeout_ms / 1000, (st->timeout_ms % 1000) * 1000 };
    st->ctx = redisConnectWithTimeout(st->host, st->port, tv);
    if (!st->ctx || st->ctx->err) {
        say(st, why, len, "cannot connect", st->ctx, 0);
        goto fail;
    }
    if (redisSetTimeout(st->ctx, tv) != REDIS_OK) {
        say(st, why, len, "cannot set a timeout", st->ctx, 0);
        goto fail;
    }
    if (st->password &&
        expect(st, st->user ? command(st, why, len, "logging in", "AUTH %s %s", st->user,
                                      st->password)
                            : command(st, why, len, "logging in", "AUTH %s", st->password),
               REDIS_REPLY_STATUS, why, len, "Redis refused the password") != 0)
        goto fail;
    if (st->db != 0 &&
        expect(st, command(st, why, len, "selecting the database", "SELECT %d", st->db),
               REDIS_REPLY_STATUS, why, len, "Redis refused the database number") != 0)
        goto fail;
    if (load_script(st, why, len) == 0)
        return 0;
fail:
    if (st->ctx)
        redisFree(st->ctx);
    st->ctx = NULL;
    return -1;
}

/* The script's answer: an array of R_COUNT integers (anything else is a
 * server that is not running it: the mirror is never made of it). */
static int the_answer(const redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != R_COUNT)
        return 0;
    for (size_t i = 0; i < r->elements; i++)
        if (r->element[i]->type != REDIS_REPLY_INTEGER)
            return 0;
    return 1;
}

static void free_replies(redisReply **out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        freeReplyObject(out[i]);
}

/* Send every ask of the round at once, then read the answers, all within
 * the store's timeout (and again after loading the script again). */
int lr_redis_exchange(lr_redis *st, ask *asks, size_t n, redisReply **out, char *why, size_t len)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        int64_t deadline = mono_us() + st->timeout_ms * 1000LL;
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
            if (redisAppendCommandArgv(st->ctx, 4 + N_ARGS, argv, lens) != REDIS_OK) {
                say(st, why, len, "running the script", st->ctx, 0);
                return -1;
            }
        }
        int noscript = 0;
        int64_t sent = mono_us();                       /* the first read writes the batch */
        for (size_t i = 0; i < n; i++) {
            void *r = NULL;
            int late = 0;
            int rc = reply_by(st, deadline, &r, &late);
            /* Redis ran the script between sending and this answer: the
             * middle is the best guess of when, its error at most half the
             * round trip (an answer read late, taken as when it came, would
             * place the slices late by as much). */
            asks[i].at_us = sent + (mono_us() - sent) / 2;
            if (rc != 0) {
                free_replies(out, i);
                say(st, why, len, "running the script", st->ctx, late);
                return -1;
            }
            out[i] = r;
            if (out[i]->type == REDIS_REPLY_ERROR && strncmp(out[i]->str, "NOSCRIPT", 8) == 0)
                noscript = 1;
        }
        size_t bad = 0;
        while (bad < n && the_answer(out[bad]))
            bad++;
        if (bad == n)
            return 0;
        if (!noscript || attempt == 1) {
            say_reply(st, why, len, "the script failed", out[bad]);
            free_replies(out, n);
            return -1;
        }
        /* Redis restarted or its scripts were flushed: load it again. */
        free_replies(out, n);
        if (load_script(st, why, len) != 0)
            return -1;
    }
    return -1;
}
