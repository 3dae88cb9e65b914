/* Writing JSON strings: the escape of an ASCII byte that cannot stand for
 * itself in one (a control byte, a quote, a backslash), shared by the
 * bindings' encoders (bindings/lua/encode.c, bindings/python/json_encode.c),
 * which write straight into their own buffers. */
#ifndef LLMRETRY_JSON_ESCAPE_H
#define LLMRETRY_JSON_ESCAPE_H

/* Does byte c (< 0x80) need an escape? */
static inline int lr_json_needs_escape(unsigned c)
{
    return c < 0x20 || c == '"' || c == '\\';
}

/* c's escape written at o (six bytes at the most); returns the end. */
static inline char *lr_json_escape(char *o, unsigned c)
{
    static const char hex[] = "0123456789abcdef";
    *o++ = '\\';
    switch (c) {
    case '"': *o++ = '"'; break;
    case '\\': *o++ = '\\'; break;
    case '\b': *o++ = 'b'; break;
    case '\f': *o++ = 'f'; break;
    case '\n': *o++ = 'n'; break;
    case '\r': *o++ = 'r'; break;
    case '\t': *o++ = 't'; break;
    default:
        *o++ = 'u';
        *o++ = '0';
        *o++ = '0';
        *o++ = hex[(c >> 4) & 0xF];
        *o++ = hex[c & 0xF];
    }
    return o;
}

#endif
