/* llmretry/host_io.h — engines whose host moves the bytes (io_loop host).
 * Part of the public API: include <llmretry.h>, which includes every part.
 *
 * An engine made with io_loop LLMRETRY_IO_LOOP_HOST has no thread. Its
 * host runs it (llmretry_engine_run) and performs each attempt's HTTP/1.1
 * exchange on its own sockets, the way an nginx worker must (its cosockets
 * are the only I/O that does not block it). Everything else is the
 * engine's, as with any other engine: the request (URL, headers, body,
 * request id), the attempt's timeout, the response's framing (an
 * incremental HTTP/1.1 parser: the host hands over bytes as they come),
 * reading and validating the answer, retries, backoff, Retry-After, the
 * deadline, rate budgets, breakers, fallbacks, events and the result.
 *
 * The loop of a host, for each call it submitted:
 *
 *   llmretry_engine_run(e, &next_ms);
 *   while (llmretry_call_exchange(c, &x)) {       an attempt to perform
 *       connect to x.host:x.port (TLS when x.tls), send x.request, then
 *       read: llmretry_call_exchange_feed(c, x.token, bytes, n) until it
 *       says DONE (keep the connection when DONE, close it otherwise), or
 *       llmretry_call_exchange_failed(c, x.token, why, reused, msg);
 *       llmretry_engine_run(e, &next_ms);
 *   }
 *   read the mailbox (llmretry_call_next); not DONE: wait for the call's
 *   news (its channel) or next_ms, whichever comes first, and run again.
 *
 * One thread at a time: such an engine and its calls are used from one
 * thread (or from several that never overlap). Not for such engines:
 * streaming calls (submit says EINVAL), HTTP/2, proxies, ca_file (the
 * host's TLS verifies, with its own trust store), llmretry_call_wait
 * (it would wait for a thread that does not exist: use a channel). */
#ifndef LLMRETRY_HOST_IO_H
#define LLMRETRY_HOST_IO_H

#include <stddef.h>
#include <stdint.h>
#include "llmretry/status.h"
#include "llmretry/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One turn of the engine on the caller's thread: submitted calls and the
 * host's verdicts taken, due timers fired (backoffs, deadlines), attempts
 * admitted and handed to the host as exchanges, news published to the
 * channels. *next_ms (may be NULL) gets how soon it must run again at the
 * latest: 0 to 1000 ms. ESTATE unless io_loop is LLMRETRY_IO_LOOP_HOST. */
llmretry_status llmretry_engine_run(llmretry_engine *e, int64_t *next_ms);

/* An attempt for the host to perform. The strings are the call's, valid
 * until the exchange ends (its feed said it is over, or it failed). */
typedef struct llmretry_exchange {
    unsigned token;            /* names this exchange to feed and failed */
    const char *host;          /* to connect to: a name, or an IP address
                                * (IPv6 without its brackets) */
    int port;
    int tls;                   /* 1: https: a TLS handshake first, with
                                * `host` as the server name, verified */
    const char *pool_key;      /* "host:port" or "tls:host:port": which
                                * kept-alive connections may carry it */
    const char *request;       /* the whole request, head and body */
    size_t request_len;
    /* Where in `request` the bytes that differ from call to call are (its
     * request id's header line), for a host that interns strings: LuaJIT
     * hashes a long string by a few of its bytes, and requests that differ
     * only there would all collide. 0, 0 when there are none. */
    size_t vary_at, vary_len;
    int64_t timeout_ms;        /* for the whole exchange, from connect to the
                                * last byte; 0 = none */
} llmretry_exchange;

/* 1 when an attempt of the call waits for the host (*x filled), else 0.
 * Asking again gives the same exchange until it ends. */
int llmretry_call_exchange(llmretry_call *c, llmretry_exchange *x);

typedef enum llmretry_feed {
    LLMRETRY_FEED_MORE = 0,    /* not complete yet: read on */
    LLMRETRY_FEED_DONE,        /* complete: the connection may be kept alive */
    LLMRETRY_FEED_DONE_CLOSE,  /* complete: close the connection */
    LLMRETRY_FEED_FAILED,      /* not a response the engine takes (framing,
                                * max_response_bytes): the attempt failed;
                                * close the connection */
    LLMRETRY_FEED_GONE         /* the attempt is not waited for any more
                                * (cancelled, or another token): close */
} llmretry_feed;

/* The response's bytes as they came, in pieces of any size. Every answer
 * but MORE ends the exchange; run the engine after it. */
llmretry_feed llmretry_call_exchange_feed(llmretry_call *c, unsigned token, const char *data,
                                          size_t len);

/* The whole response of an exchange, got some other way: a Batch API
 * result line's status and body, judged as the engine judges an attempt's
 * (an error's message screened, a 200 that is no answer refused, usage
 * read). As feeding "HTTP/1.1 <status>" with a Content-Length and then the
 * body. A status outside 200-599 fails the attempt as a response the
 * engine does not take (FAILED). Run the engine after it. */
llmretry_feed llmretry_call_exchange_answer(llmretry_call *c, unsigned token, int status,
                                            const char *body, size_t len);

/* Why an exchange ended before its feed said it was over. */
typedef enum llmretry_xfer_error {
    LLMRETRY_XFER_RESOLVE = 1, /* the host name did not resolve */
    LLMRETRY_XFER_CONNECT,     /* no connection: refused, unreachable */
    LLMRETRY_XFER_TLS,         /* the TLS handshake failed */
    LLMRETRY_XFER_TLS_VERIFY,  /* the server's certificate did not verify
                                * (never retried) */
    LLMRETRY_XFER_TIMEOUT,     /* timeout_ms passed */
    LLMRETRY_XFER_SEND,        /* the connection failed while sending */
    LLMRETRY_XFER_CLOSED       /* it failed or closed while receiving (a
                                * body that runs to the close ends so: the
                                * engine knows and takes it) */
} llmretry_xfer_error;

/* The exchange ended without its feed saying so. reused: it ran on a
 * connection an earlier exchange had used; a request that got not a byte
 * back on one may still have been read by the server, so that attempt
 * fails and safe mode retries it at once (docs/reliability.md, Re-sends).
 * message: the host's own words for the log and the result (may be NULL;
 * never a secret). Run the engine after it. Another token: ignored. */
void llmretry_call_exchange_failed(llmretry_call *c, unsigned token, llmretry_xfer_error why,
                                   int reused, const char *message);

#ifdef __cplusplus
}
#endif
#endif /* LLMRETRY_HOST_IO_H */
