/* Origins (scheme://host:port): what the engine knows of each HTTPS server
 * it talks to, for the admission stage's connection gate.
 *
 * Over HTTP/2 many calls share one connection, up to the server's stream
 * limit (nginx: 128). libcurl opens a new connection for a call that finds
 * every connection full, and once it knows the host multiplexes it no
 * longer waits for a connection being set up (CURLOPT_PIPEWAIT): a burst of
 * calls past the first connection's streams would each open a TLS
 * connection of their own (256 calls: 157 connections, 153 used once).
 * So while an origin may multiplex (HTTP/2, or not known yet) at most one
 * attempt to it is "connecting" (added, its connection not ready): the next
 * starts when that one's connection is ready and can share it. The first
 * handshake's ALPN answer tells HTTP/1.1 origins apart, which are never
 * gated (each of their requests needs a connection of its own). Plain
 * http:// is HTTP/1.1 here: never gated. A connection that takes longer
 * than CONNECT_GRACE_MS to come up (a far or a dead server) stops holding
 * the others back: calls to a server that never answers must not connect
 * one after the other. I/O thread only. */
#include "engine.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* More origins than this are not tracked (their calls are not gated). */
#define MAX_ORIGINS 256
/* How long one connection being set up holds the origin's other calls. */
#define CONNECT_GRACE_MS 1000

struct lr_origin {
    char *key;                     /* scheme://authority of the URL */
    int multiplexed;               /* -1 not known yet, 0 HTTP/1.x, 1 HTTP/2 */
    int connecting;                /* attempts added whose connection is not ready */
    int64_t connecting_since;      /* when connecting last went from 0 to 1 */
    lr_queue held;                 /* attempts waiting for that connection */
};

static int open_at(const lr_origin *o, int64_t now)
{
    return o->multiplexed == 0 || o->connecting == 0 ||
           now - o->connecting_since >= CONNECT_GRACE_MS;
}

/* The origin part of an https URL, or 0 when it has none to gate. */
static size_t origin_len(const char *url)
{
    if (!url || strncasecmp(url, "https://", 8) != 0)
        return 0;
    return 8 + strcspn(url + 8, "/?#");
}

lr_origin *lr_origin_of(llmretry_engine *e, llmretry_call *c)
{
    if (c->origin_known)
        return c->origin;
    c->origin_known = 1;
    if (e->host_io)
        return NULL;                /* its host's connections: HTTP/1.1, nothing to wait for */
    size_t n = origin_len(c->url);
    if (n == 0)
        return NULL;
    for (size_t i = 0; i < e->n_origins; i++) {
        lr_origin *o = e->origins[i];
        if (strlen(o->key) == n && strncasecmp(o->key, c->url, n) == 0)
            return c->origin = o;
    }
    if (e->n_origins == MAX_ORIGINS)
        return NULL;
    lr_origin **more = realloc(e->origins, (e->n_origins + 1) * sizeof *more);
    lr_origin *o = more ? calloc(1, sizeof *o) : NULL;
    if (more)
        e->origins = more;
    if (!o || !(o->key = lr_strndup(c->url, n))) {
        free(o);
        return NULL;                /* out of memory: this call is not gated */
    }
    o->multiplexed = -1;
    e->origins[e->n_origins++] = o;
    return c->origin = o;
}

int lr_origin_admits(llmretry_engine *e, llmretry_call *c)
{
    lr_origin *o = lr_origin_of(e, c);
    return !o || open_at(o, lr_mono_ms());
}

lr_queue *lr_origin_queue(llmretry_call *c)
{
    return &c->origin->held;
}

void lr_origin_connecting(llmretry_engine *e, llmretry_call *c)
{
    lr_origin *o = lr_origin_of(e, c);
    if (o && !c->connecting) {
        c->connecting = 1;
        if (o->connecting++ == 0)
            o->connecting_since = lr_mono_ms();
    }
}

void lr_origin_connected(llmretry_call *c)
{
    if (!c->connecting)
        return;
    c->connecting = 0;
    c->origin->connecting--;
}

int lr_origin_multiplexes(const lr_origin *o)
{
    return o->multiplexed;
}

void lr_origin_learned(llmretry_call *c, int multiplexed)
{
    if (c->origin)
        c->origin->multiplexed = multiplexed;
}

void lr_origins_pump(llmretry_engine *e)
{
    int64_t now = lr_mono_ms();
    for (size_t i = 0; i < e->n_origins; i++) {
        lr_origin *o = e->origins[i];
        while (o->held.head && open_at(o, now) && e->in_flight < e->max_in_flight) {
            llmretry_call *c = o->held.head;
            lr_queue_unlink(&o->held, c);
            lr_timer_remove(e, c);
            lr_attempt_start(e, c);
        }
    }
}

int64_t lr_origins_due_in(const llmretry_engine *e, int64_t now, int64_t cap)
{
    if (e->in_flight >= e->max_in_flight)
        return cap;                 /* a finishing attempt wakes the loop */
    int64_t due = cap;
    for (size_t i = 0; i < e->n_origins; i++) {
        const lr_origin *o = e->origins[i];
        if (!o->held.head)
            continue;
        if (open_at(o, now))
            return 0;
        int64_t t = o->connecting_since + CONNECT_GRACE_MS - now;
        if (t < due)
            due = t;
    }
    return due;
}

void lr_origins_free(llmretry_engine *e)
{
    for (size_t i = 0; i < e->n_origins; i++) {
        free(e->origins[i]->key);
        free(e->origins[i]);
    }
    free(e->origins);
    e->origins = NULL;
    e->n_origins = 0;
    free(e->reached);
    e->reached = NULL;
    e->n_reached = e->cap_reached = 0;
}

/* ---- origins reached --------------------------------------------------------
 * Every origin (http or https) a connection of this engine has reached. A
 * call that cannot resolve or connect to an origin nothing ever reached is
 * most likely pointed at the wrong place (a typo in base_url, a port of
 * nothing, a server not started yet), and its error says so (attempt.c);
 * one that worked before and is down now is an ordinary outage. Kept as
 * hashes, looked up once per call and target, at most MAX_REACHED: past
 * that nothing is claimed. */
#define MAX_REACHED 4096

/* url's origin: its scheme and "://" (*scheme_len bytes from url) and its
 * host[:port] (*host_len bytes from *host), user:password@ left out. 0
 * when url has no "://". */
static int origin_parts(const char *url, size_t *scheme_len, const char **host,
                        size_t *host_len)
{
    const char *sep = url ? strstr(url, "://") : NULL;
    if (!sep)
        return 0;
    *scheme_len = (size_t)(sep - url) + 3;
    const char *auth = sep + 3;
    size_t n = strcspn(auth, "/?#");
    const char *at = memchr(auth, '@', n);
    while (at) {                    /* the last '@' ends the user info */
        n -= (size_t)(at + 1 - auth);
        auth = at + 1;
        at = memchr(auth, '@', n);
    }
    *host = auth;
    *host_len = n;
    return 1;
}

static uint64_t fnv1a_lower(uint64_t h, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)tolower((unsigned char)s[i]);
        h *= 0x100000001b3ULL;
    }
    return h;
}

static int origin_hash(const char *url, uint64_t *out)
{
    size_t sl, hl;
    const char *host;
    if (!origin_parts(url, &sl, &host, &hl))
        return 0;
    *out = fnv1a_lower(fnv1a_lower(0xcbf29ce484222325ULL, url, sl), host, hl);
    return 1;
}

static int reached(const llmretry_engine *e, uint64_t h)
{
    for (size_t i = 0; i < e->n_reached; i++)
        if (e->reached[i] == h)
            return 1;
    return 0;
}

void lr_origin_reached(llmretry_engine *e, llmretry_call *c)
{
    if (c->reached_url == c->url)
        return;                     /* marked already (a target changes c->url) */
    c->reached_url = c->url;
    uint64_t h;
    if (!origin_hash(c->url, &h) || reached(e, h))
        return;
    if (e->n_reached == e->cap_reached) {
        size_t cap = e->cap_reached ? e->cap_reached * 2 : 8;
        uint64_t *more = cap <= MAX_REACHED ? realloc(e->reached, cap * sizeof *more) : NULL;
        if (!more) {
            e->reached_full = 1;    /* no longer sure of "never" */
            return;
        }
        e->reached = more;
        e->cap_reached = cap;
    }
    e->reached[e->n_reached++] = h;
}

int lr_origin_never_reached(const llmretry_engine *e, const char *url)
{
    uint64_t h;
    return !e->reached_full && origin_hash(url, &h) && !reached(e, h);
}

void lr_origin_text(const char *url, char *buf, size_t size)
{
    size_t sl = 0, hl = 0;
    const char *host = NULL;
    if (!origin_parts(url, &sl, &host, &hl)) {
        sl = hl = 0;
        host = NULL;
    }
    snprintf(buf, size, "%.*s%.*s", (int)sl, url ? url : "", (int)hl, host ? host : "");
}
