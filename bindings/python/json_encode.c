/* A request body (a dict) to the bytes the package's encoder sends:
 * json.JSONEncoder(ensure_ascii=False, separators=(",", ":"),
 * allow_nan=False).encode(body).encode("utf-8"), byte for byte.
 *
 * Why: every call encodes its body on the caller's thread, and json's C
 * encoder spent ~11k instructions on a two-message chat body (callgrind,
 * call_many): a list of items per dict, a chunk list joined into a str,
 * then the str encoded again to UTF-8. Here one pass writes the UTF-8.
 *
 * Only what the answer is plain for: exact dict (str keys), list, tuple,
 * str, int, float, True, False, None. Anything else (a subclass, another
 * key type, NaN or infinity, a lone surrogate, an int past Python's digit
 * limit, nesting past DEPTH, a cycle) returns NULL with no error and the
 * caller takes json's encoder, whose output or error stands. */
#include "json_encode.h"
#include "json_escape.h"

#include <math.h>
#include <string.h>

#define DEPTH 64                    /* containers open; deeper: json's encoder */
#define STR_CHUNK 1024              /* a str's characters per check for room */

typedef struct {
    char *p;
    size_t n, cap;
    char local[512];
} out_buf;

static int grow(out_buf *b, size_t more)
{
    size_t cap = b->cap * 2;
    while (cap < b->n + more)
        cap *= 2;
    char *p = b->p == b->local ? PyMem_Malloc(cap) : PyMem_Realloc(b->p, cap);
    if (!p)
        return -1;
    if (b->p == b->local)
        memcpy(p, b->local, b->n);
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int put(out_buf *b, const char *s, size_t n)
{
    if (b->n + n > b->cap && grow(b, n) != 0)
        return -1;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

static inline int put_c(out_buf *b, char c)
{
    return put(b, &c, 1);
}

/* A str as json's encode_basestring writes it, in UTF-8: '"', '\\' and
 * the control characters escaped (\b \f \n \r \t, else \u00XX), the rest
 * as it is. */
static int put_str(out_buf *b, PyObject *s)
{
    Py_ssize_t len = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    if (PyUnicode_IS_ASCII(s)) {    /* most keys and values: copied when nothing to escape */
        const unsigned char *p = data;
        Py_ssize_t i = 0;
        while (i < len && p[i] >= 0x20 && p[i] != '"' && p[i] != '\\')
            i++;
        if (i == len) {
            if (b->n + (size_t)len + 2 > b->cap && grow(b, (size_t)len + 2) != 0)
                return -1;
            b->p[b->n++] = '"';
            memcpy(b->p + b->n, p, (size_t)len);
            b->n += (size_t)len;
            b->p[b->n++] = '"';
            return 0;
        }
    }
    if (put_c(b, '"') != 0)
        return -1;
    char *o = b->p + b->n;
    Py_ssize_t room = 0;            /* characters there is room for */
    for (Py_ssize_t i = 0; i < len; i++) {
        /* Room for the next STR_CHUNK characters at the most a character
         * takes (6 bytes: \u00XX; UTF-8 takes 4), and the closing quote. */
        if (room-- == 0) {
            b->n = (size_t)(o - b->p);
            if (b->n + STR_CHUNK * 6 + 1 > b->cap && grow(b, STR_CHUNK * 6 + 1) != 0)
                return -1;
            o = b->p + b->n;
            room = STR_CHUNK - 1;
        }
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < 0x80 && !lr_json_needs_escape(c)) {
            *o++ = (char)c;
        } else if (c < 0x80) {
            o = lr_json_escape(o, c);
        } else if (c < 0x800) {
            *o++ = (char)(0xC0 | c >> 6);
            *o++ = (char)(0x80 | (c & 0x3F));
        } else if (c < 0x10000) {
            if (c >= 0xD800 && c <= 0xDFFF)
                return -1;          /* a lone surrogate: no UTF-8 (json's path raises) */
            *o++ = (char)(0xE0 | c >> 12);
            *o++ = (char)(0x80 | (c >> 6 & 0x3F));
            *o++ = (char)(0x80 | (c & 0x3F));
        } else {
            *o++ = (char)(0xF0 | c >> 18);
            *o++ = (char)(0x80 | (c >> 12 & 0x3F));
            *o++ = (char)(0x80 | (c >> 6 & 0x3F));
            *o++ = (char)(0x80 | (c & 0x3F));
        }
    }
    b->n = (size_t)(o - b->p);
    return put_c(b, '"');
}

/* A str's repr of an int or float (both ASCII): what json writes for them. */
static int put_repr(out_buf *b, PyObject *o, reprfunc repr)
{
    PyObject *r = repr(o);
    if (!r)
        return -1;
    int rc = put(b, (const char *)PyUnicode_DATA(r), (size_t)PyUnicode_GET_LENGTH(r));
    Py_DECREF(r);
    return rc;
}

static int put_value(out_buf *b, PyObject *o, int depth)
{
    if (o == Py_None)
        return put(b, "null", 4);
    if (o == Py_True)
        return put(b, "true", 4);
    if (o == Py_False)
        return put(b, "false", 5);
    PyTypeObject *t = Py_TYPE(o);
    if (t == &PyUnicode_Type)
        return put_str(b, o);
    if (t == &PyLong_Type) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow)
            return put_repr(b, o, PyLong_Type.tp_repr);  /* the digit limit holds */
        char digits[24], *d = digits + sizeof digits;
        unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
        do {
            *--d = (char)('0' + u % 10);
        } while (u /= 10);
        if (v < 0)
            *--d = '-';
        return put(b, d, (size_t)(digits + sizeof digits - d));
    }
    if (t == &PyFloat_Type)
        return isfinite(PyFloat_AS_DOUBLE(o)) ? put_repr(b, o, PyFloat_Type.tp_repr) : -1;
    if (depth >= DEPTH)
        return -1;
    if (t == &PyList_Type || t == &PyTuple_Type) {
        /* No Python code runs while this is written: the sequence holds. */
        Py_ssize_t n = t == &PyList_Type ? PyList_GET_SIZE(o) : PyTuple_GET_SIZE(o);
        PyObject **items = t == &PyList_Type ? ((PyListObject *)o)->ob_item
                                             : ((PyTupleObject *)o)->ob_item;
        if (put_c(b, '[') != 0)
            return -1;
        for (Py_ssize_t i = 0; i < n; i++)
            if ((i && put_c(b, ',') != 0) || put_value(b, items[i], depth + 1) != 0)
                return -1;
        return put_c(b, ']');
    }
    if (t == &PyDict_Type) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        int first = 1;
        if (put_c(b, '{') != 0)
            return -1;
        while (PyDict_Next(o, &pos, &k, &v)) {
            if (Py_TYPE(k) != &PyUnicode_Type)
                return -1;          /* json turns 1, True, None... into keys its way */
            if ((!first && put_c(b, ',') != 0) || put_str(b, k) != 0 || put_c(b, ':') != 0 ||
                put_value(b, v, depth + 1) != 0)
                return -1;
            first = 0;
        }
        return put_c(b, '}');
    }
    return -1;
}

PyObject *lr_json_encode(PyObject *obj)
{
#ifdef Py_GIL_DISABLED
    /* Another thread may change a list or dict while it is read: json's
     * encoder, which guards against that, does it there. */
    (void)obj;
    return NULL;
#endif
    out_buf b;
    b.p = b.local;
    b.n = 0;
    b.cap = sizeof b.local;
    PyObject *bytes = NULL;
    if (put_value(&b, obj, 0) == 0)
        bytes = PyBytes_FromStringAndSize(b.p, (Py_ssize_t)b.n);
    if (b.p != b.local)
        PyMem_Free(b.p);
    PyErr_Clear();
    return bytes;
}

/* encode_json(obj) -> bytes, or None when json's encoder is to say. */
PyObject *lr_py_json_encode(PyObject *module, PyObject *obj)
{
    (void)module;
    PyObject *bytes = lr_json_encode(obj);
    if (bytes)
        return bytes;
    Py_RETURN_NONE;
}
