/* A 2xx body's JSON straight from its bytes to the values json.loads makes.
 *
 * Why: a batch turns every body into Result.data on the thread that also
 * waits for the engine, and json's scanner cost that thread ~26k
 * instructions of the ~47k an item took there (callgrind): the body
 * decoded to a str first, every key hashed and looked up in a memo that is
 * cleared after each call, a str sliced out per string. Here the core's
 * pull reader (core/src/json_pull.c, which also checked the body) walks
 * the bytes once; keys come from a small cache kept across bodies, so
 * "choices", "message" or "total_tokens" are one str each (hashed once)
 * for the whole life of the module.
 *
 * The same values as json.loads, by construction: dict (a repeated key:
 * the last value, at the first one's place, as PyDict_SetItem does), list,
 * str, int through PyLong_FromString when it has more than 18 digits (so
 * json's digit limit applies), float through PyOS_string_to_double of the
 * exact token (what PyFloat_FromString does for json), True, False, None.
 * Whatever the reader refuses (a lone surrogate escape, NaN, anything not
 * strict JSON) and whatever fails here (nesting past DEPTH or past the
 * recursion limit json's scanner would hit, a number json refuses, memory)
 * returns NULL with no error: the caller then takes the path it took
 * before, so values and error messages stay json's own.
 *
 * No C recursion: open containers are a fixed stack of frames. Each also
 * counts against the recursion limit (Py_EnterRecursiveCall), as each of
 * json's does, so a body too deep for json here is too deep here too. */
#include "json_decode.h"

#include "json_pull.h"

#include <stdint.h>
#include <string.h>

/* ---- the key cache ----------------------------------------------------------
 * Keys without escapes, up to KEY_MAX bytes, by their bytes as they stand
 * in the body: an open-addressed table (linear probing) holding one
 * reference to each str. Nothing is evicted, so a batch's keys stay one
 * str each however their hashes fall; when KEY_FILL keys are held, the
 * table is emptied and fills again (bodies with ever new keys cost one
 * emptying per KEY_FILL of them). Strs are immutable and the GIL is held,
 * so one table serves every engine and thread of the module: a slot only
 * ever holds a key equal to the bytes it is stored under. */
#define KEY_SLOTS 512               /* a power of two */
#define KEY_FILL 384                /* at most this many held: probes stay short */
#define KEY_MAX 32                  /* "rejected_prediction_tokens" is 26 */

typedef struct {
    PyObject *key;                  /* NULL: empty */
    uint32_t hash;
    unsigned char len;
    short next;                     /* the slot of the key read after it last time; -1: none */
    char bytes[KEY_MAX];
} key_slot;

/* Short string values (a response's "object", "model", "role",
 * "finish_reason", fingerprint...) repeat from body to body as keys do:
 * one str per value while it keeps coming, in a direct-mapped table (a
 * value takes its slot from whatever held it). Why: a batch keeps every
 * result's strings alive, and each full pass of the cyclic GC reads each
 * str a result's dicts hold (to see that it is not a container): shared
 * ones are read once. Values are never compared by identity, and a str
 * is not changed in place while the table, or anyone else, holds it. */
#define VALUE_SLOTS 256             /* a power of two */
#define VALUE_MAX 24                /* longer strings (prompts, answers, ids) are made each time */

typedef struct {
    PyObject *value;                /* NULL: empty */
    unsigned char len;
    char bytes[VALUE_MAX];
} value_slot;

struct lr_key_cache {
    size_t held;
    key_slot slot[KEY_SLOTS];
    value_slot value[VALUE_SLOTS];
};

static void key_cache_empty(lr_key_cache *c)
{
    for (size_t i = 0; i < KEY_SLOTS; i++) {
        Py_CLEAR(c->slot[i].key);
        c->slot[i].next = -1;
    }
    c->held = 0;
}

lr_key_cache *lr_key_cache_new(void)
{
#ifdef Py_GIL_DISABLED
    /* No GIL serialises the table's users there: each body's keys are its own. */
    return NULL;
#else
    lr_key_cache *c = PyMem_Calloc(1, sizeof(lr_key_cache));
    if (c)
        key_cache_empty(c);         /* no key follows another yet */
    return c;
#endif
}

void lr_key_cache_free(lr_key_cache *c)
{
    if (!c)
        return;
    key_cache_empty(c);
    for (size_t i = 0; i < VALUE_SLOTS; i++)
        Py_CLEAR(c->value[i].value);
    PyMem_Free(c);
}

/* ---- strings ------------------------------------------------------------- */

/* A string read by lr_jp_string as a str (its bytes are valid UTF-8). */
static PyObject *new_str(const lr_jp_str *s)
{
    if (!s->escaped && s->cps == s->len) {          /* ASCII: one copy */
        PyObject *o = PyUnicode_New((Py_ssize_t)s->len, 127);
        if (o)
            memcpy(PyUnicode_1BYTE_DATA(o), s->raw, s->len);
        return o;
    }
    if (!s->escaped)
        return PyUnicode_DecodeUTF8(s->raw, (Py_ssize_t)s->len, NULL);
    char local[256] = { 0 }, *buf = s->len <= sizeof local ? local : PyMem_Malloc(s->len);
    if (!buf)
        return PyErr_NoMemory();
    size_t n = lr_jp_unescape(s, buf);
    PyObject *o = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)n, NULL);
    if (buf != local)
        PyMem_Free(buf);
    return o;
}

/* A key's slot hash: its length and its first and last four bytes (or
 * every byte of a shorter one), mixed. Cheap rather than thorough: keys
 * that share it only probe one slot further (the bytes are compared). */
static uint32_t key_hash(const char *p, size_t n)
{
    uint64_t x = n;
    if (n >= 4) {
        uint32_t a, b;
        memcpy(&a, p, 4);
        memcpy(&b, p + n - 4, 4);
        x |= (uint64_t)a << 8 ^ (uint64_t)b << 32;
    } else {
        for (size_t i = 0; i < n; i++)
            x |= (uint64_t)(unsigned char)p[i] << (8 * i + 8);
    }
    x *= 0x9E3779B97F4A7C15u;
    return (uint32_t)(x >> 32);
}

/* An object's key: the cache's str for these bytes, or a new one (kept);
 * *at: its slot, -1 when not cached. */
static PyObject *key_str(lr_key_cache *c, const lr_jp_str *s, int *at)
{
    *at = -1;
    if (!c || s->escaped || s->len > KEY_MAX)
        return new_str(s);
    uint32_t h = key_hash(s->raw, s->len);
    size_t i = h & (KEY_SLOTS - 1);
    for (; c->slot[i].key; i = (i + 1) & (KEY_SLOTS - 1)) {
        key_slot *k = &c->slot[i];
        if (k->hash == h && k->len == s->len && memcmp(k->bytes, s->raw, s->len) == 0) {
            Py_INCREF(k->key);
            *at = (int)i;
            return k->key;
        }
    }
    PyObject *o = new_str(s);
    if (!o)
        return NULL;
    if (c->held == KEY_FILL) {
        key_cache_empty(c);
        i = h & (KEY_SLOTS - 1);
    }
    key_slot *k = &c->slot[i];
    Py_INCREF(o);
    k->key = o;
    k->hash = h;
    k->len = (unsigned char)s->len;
    k->next = -1;
    memcpy(k->bytes, s->raw, s->len);
    c->held++;
    *at = (int)i;
    return o;
}

/* A string value: the table's str for these bytes, or a new one (kept in
 * its slot when short and without escapes). */
static PyObject *value_str(lr_key_cache *c, const lr_jp_str *s)
{
    if (!c || s->escaped || s->len > VALUE_MAX)
        return new_str(s);
    value_slot *v = &c->value[key_hash(s->raw, s->len) & (VALUE_SLOTS - 1)];
    if (v->value && v->len == s->len && memcmp(v->bytes, s->raw, s->len) == 0)
        return Py_NewRef(v->value);
    PyObject *o = new_str(s);
    if (!o)
        return NULL;
    Py_XSETREF(v->value, Py_NewRef(o));
    v->len = (unsigned char)s->len;
    memcpy(v->bytes, s->raw, s->len);
    return o;
}

/* The key the cache expects at j->p after the key in slot `prev` (the
 * one that followed it last time: a batch's bodies have their keys in the
 * same order), taken with its colon when the body holds exactly its bytes
 * between quotes: those bytes were checked as a string when the key was
 * cached (no quote, backslash or control byte; valid UTF-8), so they read
 * the same again. New reference and its slot, or NULL (nothing read). */
static PyObject *expected_key(lr_jp *j, lr_key_cache *c, int prev, int *at)
{
    if (!c || prev < 0 || c->slot[prev].next < 0)
        return NULL;
    const key_slot *k = &c->slot[c->slot[prev].next];
    size_t n = k->len;
    if (!k->key || (size_t)(j->end - j->p) < n + 2 || j->p[0] != '"' || j->p[n + 1] != '"' ||
        memcmp(j->p + 1, k->bytes, n) != 0)
        return NULL;
    const char *back = j->p;
    j->p += n + 2;
    lr_jp_ws(j);
    if (lr_jp_peek(j) != ':') {
        j->p = back;                /* the reader's own path says what is wrong */
        return NULL;
    }
    j->p++;
    lr_jp_ws(j);
    *at = c->slot[prev].next;
    Py_INCREF(k->key);
    return k->key;
}

/* ---- numbers ------------------------------------------------------------- */

static PyObject *number(lr_jp *j)
{
    const char *start = j->p;
    if (lr_jp_number(j, NULL) != 0)     /* checked only: converted below, json's way */
        return NULL;
    size_t n = (size_t)(j->p - start);
    int is_float = 0;
    for (const char *p = start; p < j->p; p++)
        is_float |= *p == '.' || *p == 'e' || *p == 'E';
    if (!is_float && n <= 18) {                     /* fits an int64: no string */
        const char *p = start + (*start == '-');
        long long v = 0;
        for (; p < j->p; p++)
            v = v * 10 + (*p - '0');
        return PyLong_FromLongLong(*start == '-' ? -v : v);
    }
    /* json's own conversions, on the token NUL-terminated. */
    char local[64], *buf = n < sizeof local ? local : PyMem_Malloc(n + 1);
    if (!buf)
        return PyErr_NoMemory();
    memcpy(buf, start, n);
    buf[n] = '\0';
    PyObject *o;
    if (is_float) {
        double d = PyOS_string_to_double(buf, NULL, NULL);
        o = d == -1.0 && PyErr_Occurred() ? NULL : PyFloat_FromDouble(d);
    } else {
        o = PyLong_FromString(buf, NULL, 10);
    }
    if (buf != local)
        PyMem_Free(buf);
    return o;
}

/* ---- values -------------------------------------------------------------- */

#define DEPTH 128                   /* open containers; deeper: the caller's path */

typedef struct {
    PyObject *c;                    /* the dict or list */
    PyObject *key;                  /* a dict's member whose value is being read */
    int atomic;                     /* a dict holding no container the GC must see */
} frame;

/* A member's key and colon at j->p, the key into *key. *prev: the slot of
 * the key read before it in the body (-1: none or not cached), updated. */
static int member_key(lr_jp *j, lr_key_cache *c, PyObject **key, int *prev)
{
    int at;
    if ((*key = expected_key(j, c, *prev, &at))) {
        *prev = at;
        return 0;
    }
    lr_jp_str s;
    if (lr_jp_member_key(j, &s) != 0)
        return -1;
    if (!(*key = key_str(c, &s, &at)))
        return -1;
    if (*prev >= 0 && at >= 0)
        c->slot[*prev].next = (short)at;
    *prev = at;
    return 0;
}

/* The innermost container, closed: untracked when it is a dict holding
 * only atomic values (what the cyclic GC would do on its first visit,
 * done before it has to; a dict tracks itself again when given a
 * container), as results.c's untrack_atomic did after json's scanner. */
static PyObject *close_frame(frame *stack, int *top)
{
    frame *f = &stack[--*top];
    Py_LeaveRecursiveCall();
    if (f->atomic && PyDict_CheckExact(f->c) && PyObject_GC_IsTracked(f->c))
        PyObject_GC_UnTrack(f->c);
    return f->c;
}

PyObject *lr_json_decode(lr_key_cache *cache, const char *text, size_t len)
{
    frame stack[DEPTH];
    int top = 0, prev = -1;         /* prev: the last key's slot in the cache */
    PyObject *v = NULL;
    lr_jp j;
    lr_jp_init(&j, text, len);
    lr_jp_ws(&j);
    for (;;) {
        /* A value at j.p, into v (or, a non-empty container: its first
         * member's, next time round). */
        char c = lr_jp_peek(&j);
        if (c == '{' || c == '[') {
            if (top == DEPTH || lr_jp_enter(&j) != 0 ||
                Py_EnterRecursiveCall(" while decoding a JSON document"))
                goto fail;
            frame *f = &stack[top];
            f->c = c == '{' ? PyDict_New() : PyList_New(0);
            if (!f->c) {
                Py_LeaveRecursiveCall();
                goto fail;
            }
            f->key = NULL;
            f->atomic = 1;
            top++;
            lr_jp_ws(&j);
            if (lr_jp_peek(&j) == (c == '{' ? '}' : ']')) {
                lr_jp_leave(&j);
                v = close_frame(stack, &top);
            } else {
                if (c == '{' && member_key(&j, cache, &f->key, &prev) != 0)
                    goto fail;
                continue;
            }
        } else if (c == '"') {
            lr_jp_str s;
            if (lr_jp_string(&j, &s) != 0 || !(v = value_str(cache, &s)))
                goto fail;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            if (!(v = number(&j)))
                goto fail;
        } else {
            int what;
            if (lr_jp_literal(&j, &what) != 0)
                goto fail;
            v = what == 1 ? Py_True : what == 0 ? Py_False : Py_None;
            Py_INCREF(v);
        }
        /* After a value: into its container, then the next member or the
         * container's end (which is itself a value just read). */
        for (;;) {
            if (top == 0) {
                lr_jp_ws(&j);
                if (j.p != j.end)
                    goto fail;
                return v;
            }
            frame *f = &stack[top - 1];
            int object = PyDict_CheckExact(f->c);
            int rc;
            if (object) {
                if (PyList_CheckExact(v) || (PyDict_CheckExact(v) && PyObject_GC_IsTracked(v)))
                    f->atomic = 0;
                rc = PyDict_SetItem(f->c, f->key, v);
                Py_CLEAR(f->key);
            } else {
                rc = PyList_Append(f->c, v);
            }
            Py_CLEAR(v);
            if (rc != 0)
                goto fail;
            lr_jp_ws(&j);
            c = lr_jp_peek(&j);
            if (c == ',') {
                j.p++;
                lr_jp_ws(&j);
                if (object && member_key(&j, cache, &f->key, &prev) != 0)
                    goto fail;
                break;
            }
            if (c != (object ? '}' : ']'))
                goto fail;
            lr_jp_leave(&j);
            v = close_frame(stack, &top);
        }
    }
fail:
    Py_XDECREF(v);
    while (top > 0) {
        top--;
        Py_DECREF(stack[top].c);
        Py_XDECREF(stack[top].key);
        Py_LeaveRecursiveCall();
    }
    PyErr_Clear();
    return NULL;
}
