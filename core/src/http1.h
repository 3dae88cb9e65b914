/* http1.h — an incremental parser of one HTTP/1.1 response (http1.c), for
 * the attempts a host performs on its own sockets (io_loop "host",
 * host_io.c). Pure: bytes in as they arrive, in pieces of any size; the
 * head's lines and the body's bytes out through two callbacks shaped like
 * libcurl's header and write callbacks, so that transfer.c reads a host's
 * response as it reads libcurl's. No I/O; it allocates only its line
 * buffer. */
#ifndef LR_HTTP1_H
#define LR_HTTP1_H

#include <stddef.h>
#include <stdint.h>
#pragma GCC visibility push(hidden)

typedef enum lr_h1_state {
    LR_H1_STATUS,          /* reading a status line */
    LR_H1_HEADERS,         /* reading header lines */
    LR_H1_BODY_LENGTH,     /* a Content-Length body: `left` bytes to come */
    LR_H1_BODY_CLOSE,      /* a body that ends when the connection does */
    LR_H1_CHUNK_SIZE,      /* a chunk's size line */
    LR_H1_CHUNK_DATA,      /* `left` bytes of a chunk */
    LR_H1_CHUNK_END,       /* the CRLF after a chunk */
    LR_H1_TRAILERS,        /* after the last chunk, to the blank line */
    LR_H1_DONE,            /* the response is complete */
    LR_H1_ERROR            /* not HTTP/1.x as it must be: `error` says why */
} lr_h1_state;

/* What the parser hands on: a head line (with its CRLF, the status line
 * and the blank line too, as libcurl does) and body bytes (de-chunked).
 * Each returns the bytes it took; fewer stops the parser (`aborted`). */
typedef size_t (*lr_h1_cb)(char *data, size_t size, size_t nmemb, void *ud);

typedef struct lr_http1 {
    lr_h1_state state;
    int status;            /* the final response's, 0 until its line */
    int interim;           /* the head being read is a 1xx */
    int http10;            /* an HTTP/1.0 response */
    int chunked, has_length, conn_close;
    int keep_alive;        /* when DONE: the connection may carry another request */
    int aborted;           /* a callback took fewer bytes than it was given */
    int64_t left;          /* bytes left of the body or of the chunk */
    size_t head_bytes;     /* of the head so far: bounded (LR_H1_MAX_HEAD) */
    uint64_t body_bytes;   /* de-chunked body bytes handed on */
    const char *error;     /* LR_H1_ERROR: a static message */
    char *line;            /* the line being read, when it came in pieces */
    size_t line_len, line_cap;
    lr_h1_cb on_header, on_body;
    void *ud;
} lr_http1;

/* A response head over 256 KiB (libcurl's own bound is 300 KiB) is an error. */
#define LR_H1_MAX_HEAD (256 * 1024)

void lr_http1_init(lr_http1 *p, lr_h1_cb on_header, lr_h1_cb on_body, void *ud);
/* Back to the start of a response, keeping the line buffer. */
void lr_http1_reset(lr_http1 *p);
void lr_http1_free(lr_http1 *p);
/* Feed bytes; returns how many it took: all of them, unless the response
 * ended (DONE: the rest is not this response's), failed (ERROR) or a
 * callback stopped it (aborted). */
size_t lr_http1_feed(lr_http1 *p, const char *data, size_t len);
/* The connection ended: a body read to the close is complete (DONE);
 * anything else unfinished stays as it is (the caller knows it is cut). */
void lr_http1_eof(lr_http1 *p);

#pragma GCC visibility pop
#endif
