/* http1.c — one HTTP/1.1 response, parsed as its bytes arrive (http1.h).
 *
 * Framing is RFC 9112's, strictly where a mistake would misread the next
 * response on a kept-alive connection: Transfer-Encoding chunked wins over
 * Content-Length; two different Content-Lengths, a length that is not
 * digits, or another transfer coding are errors; a body with neither is
 * read to the close, and that connection is never reused. 1xx heads are
 * handed on and skipped (101 is an error: nothing here upgrades). Lines
 * end in CRLF or a bare LF. Trailers are read and dropped. */
#include "http1.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_CHUNK_LINE 1024     /* a chunk size and its extensions */

void lr_http1_init(lr_http1 *p, lr_h1_cb on_header, lr_h1_cb on_body, void *ud)
{
    memset(p, 0, sizeof *p);
    p->on_header = on_header;
    p->on_body = on_body;
    p->ud = ud;
}

void lr_http1_reset(lr_http1 *p)
{
    char *line = p->line;
    size_t cap = p->line_cap;
    lr_h1_cb h = p->on_header, b = p->on_body;
    void *ud = p->ud;
    memset(p, 0, sizeof *p);
    p->line = line;
    p->line_cap = cap;
    p->on_header = h;
    p->on_body = b;
    p->ud = ud;
}

void lr_http1_free(lr_http1 *p)
{
    free(p->line);
    p->line = NULL;
    p->line_len = p->line_cap = 0;
}

static void fail(lr_http1 *p, const char *why)
{
    p->state = LR_H1_ERROR;
    p->error = why;
}

/* ---- the head ------------------------------------------------------------- */

static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }

/* "HTTP/1.1 200 OK" (the line without its end). */
static int status_line(lr_http1 *p, const char *s, size_t n)
{
    if (n < 12 || memcmp(s, "HTTP/1.", 7) != 0 || (s[7] != '0' && s[7] != '1') || s[8] != ' ' ||
        !is_digit(s[9]) || !is_digit(s[10]) || !is_digit(s[11]) || (n > 12 && s[12] != ' ')) {
        fail(p, "the response does not begin with an HTTP/1.x status line");
        return -1;
    }
    int status = (s[9] - '0') * 100 + (s[10] - '0') * 10 + (s[11] - '0');
    if (status < 100) {
        fail(p, "the response's status is not a valid HTTP status");
        return -1;
    }
    if (status == 101) {
        fail(p, "the server switched protocols (101), which nothing here asked for");
        return -1;
    }
    p->http10 = s[7] == '0';
    p->interim = status < 200;
    p->status = status;
    p->chunked = p->has_length = p->conn_close = 0;
    p->left = 0;
    return 0;
}

/* Does the comma-separated list v (n bytes) hold the token t? */
static int list_has(const char *v, size_t n, const char *t)
{
    size_t tn = strlen(t);
    const char *end = v + n;
    while (v < end) {
        while (v < end && (*v == ' ' || *v == '\t' || *v == ','))
            v++;
        const char *e = v;
        while (e < end && *e != ',')
            e++;
        const char *te = e;
        while (te > v && (te[-1] == ' ' || te[-1] == '\t'))
            te--;
        if ((size_t)(te - v) == tn && strncasecmp(v, t, tn) == 0)
            return 1;
        v = e;
    }
    return 0;
}

/* The framing headers of a final response's head. */
static int header_line(lr_http1 *p, const char *s, size_t n)
{
    const char *colon = memchr(s, ':', n);
    if (!colon) {
        fail(p, "a response header line has no colon");
        return -1;
    }
    if (p->interim)
        return 0;
    size_t name = (size_t)(colon - s);
    const char *v = colon + 1, *end = s + n;
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    size_t vn = (size_t)(end - v);
    if (name == 14 && strncasecmp(s, "content-length", 14) == 0) {
        if (vn == 0 || vn > 18) {
            fail(p, "the response's Content-Length is not a length");
            return -1;
        }
        int64_t len = 0;
        for (size_t i = 0; i < vn; i++) {
            if (!is_digit(v[i])) {
                fail(p, "the response's Content-Length is not a length");
                return -1;
            }
            len = len * 10 + (v[i] - '0');
        }
        if (p->has_length && len != p->left) {
            fail(p, "the response has two different Content-Lengths");
            return -1;
        }
        p->has_length = 1;
        p->left = len;
    } else if (name == 17 && strncasecmp(s, "transfer-encoding", 17) == 0) {
        /* chunked must be the last coding; nothing else is spoken here. */
        if (!list_has(v, vn, "chunked") || vn < 7 || strncasecmp(end - 7, "chunked", 7) != 0) {
            fail(p, "the response's Transfer-Encoding is not chunked");
            return -1;
        }
        p->chunked = 1;
    } else if (name == 10 && strncasecmp(s, "connection", 10) == 0) {
        if (list_has(v, vn, "close"))
            p->conn_close = 1;
    }
    return 0;
}

/* The blank line: the head is over; where the body is. */
static void head_end(lr_http1 *p)
{
    if (p->interim) {
        p->state = LR_H1_STATUS;        /* the final response comes next */
        return;
    }
    if (p->status == 204 || p->status == 304) {
        p->state = LR_H1_DONE;
    } else if (p->chunked) {
        p->has_length = 0;
        p->state = LR_H1_CHUNK_SIZE;
    } else if (p->has_length) {
        p->state = p->left > 0 ? LR_H1_BODY_LENGTH : LR_H1_DONE;
    } else {
        p->state = LR_H1_BODY_CLOSE;
        p->conn_close = 1;
    }
}

/* One whole line of the head (with its end), handed on as libcurl would. */
static int head_line(lr_http1 *p, char *s, size_t n)
{
    size_t bare = n;
    if (bare > 0 && s[bare - 1] == '\n')
        bare--;
    if (bare > 0 && s[bare - 1] == '\r')
        bare--;
    if (p->state == LR_H1_STATUS) {
        if (status_line(p, s, bare) != 0)
            return -1;
        p->state = LR_H1_HEADERS;
    } else if (bare == 0) {
        if (p->on_header && p->on_header(s, 1, n, p->ud) != n) {
            p->aborted = 1;
            return -1;
        }
        head_end(p);
        return 0;
    } else if (s[0] == ' ' || s[0] == '\t') {
        fail(p, "the response folds a header line (obsolete, RFC 9112)");
        return -1;
    } else if (header_line(p, s, bare) != 0) {
        return -1;
    }
    if (p->on_header && p->on_header(s, 1, n, p->ud) != n) {
        p->aborted = 1;
        return -1;
    }
    return 0;
}

/* ---- lines that come in pieces ------------------------------------------- */

static int line_append(lr_http1 *p, const char *s, size_t n)
{
    if (p->line_len + n + 1 > p->line_cap) {
        size_t cap = p->line_cap ? p->line_cap : 256;
        while (cap < p->line_len + n + 1)
            cap *= 2;
        char *q = realloc(p->line, cap);
        if (!q) {
            fail(p, "out of memory reading the response");
            return -1;
        }
        p->line = q;
        p->line_cap = cap;
    }
    memcpy(p->line + p->line_len, s, n);
    p->line_len += n;
    p->line[p->line_len] = '\0';
    return 0;
}

/* Take the next line from data: *line and *n are it (with its LF) once it
 * is whole, else NULL (what there was is kept). Returns the bytes used. */
static size_t take_line(lr_http1 *p, const char *data, size_t len, size_t max, char **line,
                        size_t *n)
{
    *line = NULL;
    const char *lf = memchr(data, '\n', len);
    size_t used = lf ? (size_t)(lf - data) + 1 : len;
    if (p->line_len + used > max) {
        fail(p, p->state == LR_H1_CHUNK_SIZE || p->state == LR_H1_CHUNK_END
                    ? "a chunk size line of the response is too long"
                    : "the response's head is too large");
        return 0;
    }
    if (lf && p->line_len == 0) {
        *line = (char *)data;      /* whole in one piece: no copy */
        *n = used;
        return used;
    }
    if (line_append(p, data, used) != 0)
        return 0;
    if (lf) {
        *line = p->line;
        *n = p->line_len;
    }
    return used;
}

/* "1a3;ext=1" -> 0x1a3; -1 when not a size. */
static int64_t chunk_size(const char *s, size_t n)
{
    int64_t v = 0;
    size_t i = 0;
    for (; i < n; i++) {
        char ch = s[i];
        int d = is_digit(ch) ? ch - '0' : (ch | 0x20) >= 'a' && (ch | 0x20) <= 'f'
                                              ? (ch | 0x20) - 'a' + 10 : -1;
        if (d < 0)
            break;
        if (i >= 15)
            return -1;              /* over 2^60: not a size anyone sends */
        v = v * 16 + d;
    }
    if (i == 0)
        return -1;
    while (i < n && (s[i] == ' ' || s[i] == '\t'))
        i++;
    if (i < n && s[i] != ';' && s[i] != '\r' && s[i] != '\n')
        return -1;
    return v;
}

static int body(lr_http1 *p, const char *data, size_t n)
{
    if (n == 0)
        return 0;
    p->body_bytes += n;
    if (p->on_body && p->on_body((char *)data, 1, n, p->ud) != n) {
        p->aborted = 1;
        return -1;
    }
    return 0;
}

static void done(lr_http1 *p)
{
    p->state = LR_H1_DONE;
}

size_t lr_http1_feed(lr_http1 *p, const char *data, size_t len)
{
    size_t pos = 0;
    while (pos < len && !p->aborted) {
        const char *d = data + pos;
        size_t rest = len - pos;
        char *line;
        size_t n, used;
        switch (p->state) {
        case LR_H1_STATUS:
        case LR_H1_HEADERS:
        case LR_H1_TRAILERS: {
            size_t room = p->head_bytes < LR_H1_MAX_HEAD ? LR_H1_MAX_HEAD - p->head_bytes : 0;
            used = take_line(p, d, rest, room + p->line_len, &line, &n);
            if (p->state == LR_H1_ERROR)
                return pos;
            pos += used;
            p->head_bytes += used;
            if (!line)
                break;
            p->line_len = 0;
            if (p->state == LR_H1_TRAILERS) {
                if (n <= 2 && (line[0] == '\n' || (line[0] == '\r' && n == 2)))
                    done(p);
            } else if (head_line(p, line, n) != 0) {
                return pos;
            }
            break;
        }
        case LR_H1_CHUNK_SIZE:
        case LR_H1_CHUNK_END:
            used = take_line(p, d, rest, MAX_CHUNK_LINE, &line, &n);
            if (p->state == LR_H1_ERROR)
                return pos;
            pos += used;
            if (!line)
                break;
            p->line_len = 0;
            if (p->state == LR_H1_CHUNK_END) {
                if (!(n == 1 || (n == 2 && line[0] == '\r'))) {
                    fail(p, "a chunk of the response is longer than its size");
                    return pos;
                }
                p->state = LR_H1_CHUNK_SIZE;
                break;
            }
            p->left = chunk_size(line, n);
            if (p->left < 0) {
                fail(p, "a chunk size of the response is not a size");
                return pos;
            }
            p->state = p->left > 0 ? LR_H1_CHUNK_DATA : LR_H1_TRAILERS;
            break;
        case LR_H1_CHUNK_DATA:
        case LR_H1_BODY_LENGTH:
            n = rest < (uint64_t)p->left ? rest : (size_t)p->left;
            if (body(p, d, n) != 0)
                return pos;
            pos += n;
            p->left -= (int64_t)n;
            if (p->left == 0) {
                if (p->state == LR_H1_CHUNK_DATA)
                    p->state = LR_H1_CHUNK_END;
                else
                    done(p);
            }
            break;
        case LR_H1_BODY_CLOSE:
            if (body(p, d, rest) != 0)
                return pos;
            pos += rest;
            break;
        case LR_H1_DONE:
        case LR_H1_ERROR:
            goto out;
        }
    }
out:
    if (p->state == LR_H1_DONE)
        /* Bytes after the response on an HTTP/1.1 connection are an answer
         * to nothing: the next request would read them as its own. */
        p->keep_alive = !p->http10 && !p->conn_close && pos == len;
    return pos;
}

void lr_http1_eof(lr_http1 *p)
{
    if (p->state == LR_H1_BODY_CLOSE && !p->aborted) {
        p->state = LR_H1_DONE;
        p->keep_alive = 0;
    }
}
