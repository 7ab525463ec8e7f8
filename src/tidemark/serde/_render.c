/*
 * tidemark.serde._render: the Debezium JSON writer of one table schema's row events,
 * compiled.
 *
 * The same output as the code debezium_json.compile_event_renderer generates in Python,
 * which stays the reference (and the fallback where this module is not built); the
 * tests hold the two to identical text. Why C: writing the JSON is two thirds of the
 * engine's time per record in Python, mostly interpreter overhead around string pieces
 * that are already in their final form (integer text, text without characters to
 * escape). Here every piece is only referenced, and the key and the value are each
 * written in one allocation.
 *
 * Column kinds and what they write for a ``str`` value (other values: None -> the
 * column's null text, the "unavailable" marker -> its placeholder, anything else ->
 * ``binary(value)``):
 *   RAW      the text itself (integers: PostgreSQL's text is valid JSON)
 *   STRING   the text as a JSON string (``json.encoder.encode_basestring``)
 *   BOOL     true for "t", false otherwise
 *   FLOAT    the text where it is already what Java's Float/Double.toString writes
 *            (plain, with a fraction, 1e-3 <= |x| < 1e7), else ``functions[i](text)``
 *            (debezium_json.java_float_text)
 *   FUNCTION ``functions[i](text)``
 *   DECIMAL  numeric(p, s) in Debezium's precise mode: the base64 JSON string of the
 *            unscaled value's two's complement bytes, for text with exactly s = params[i]
 *            fraction digits and at most 38 digits; else ``functions[i](text)``
 *   ZONED    timestamptz as Debezium's ZonedTimestamp with params[i] fraction digits, for
 *            the two shapes a UTC session prints most (no fraction, or six digits when
 *            params[i] is 6); else ``functions[i](text)``
 *   DATE     a date's days since 1970-01-01 for 'YYYY-MM-DD'; else ``functions[i](text)``
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <string.h>
#include <structmember.h>

enum {
    K_RAW = 0, K_STRING = 1, K_BOOL = 2, K_FLOAT = 3, K_FUNCTION = 4, K_DECIMAL = 5,
    K_ZONED = 6, K_DATE = 7, K_LAST = 7
};

/* -- a list of string pieces, joined once ------------------------------------------ */

typedef struct {
    const void *data;
    Py_ssize_t len;
    Py_UCS4 maxchar;
    int kind;
} Piece;

#define SMALL_PIECES 192
#define SMALL_OWNED 48

typedef struct {
    Piece *items;
    Py_ssize_t n, cap;
    PyObject **owned; /* new references made while writing, released by buf_free */
    Py_ssize_t n_owned, owned_cap;
    Piece small[SMALL_PIECES];
    PyObject *owned_small[SMALL_OWNED];
} Buf;

static void
buf_init(Buf *b)
{
    b->items = b->small;
    b->n = 0;
    b->cap = SMALL_PIECES;
    b->owned = b->owned_small;
    b->n_owned = 0;
    b->owned_cap = SMALL_OWNED;
}

static void
buf_free(Buf *b)
{
    for (Py_ssize_t i = 0; i < b->n_owned; i++) {
        Py_DECREF(b->owned[i]);
    }
    if (b->items != b->small) {
        PyMem_Free(b->items);
    }
    if (b->owned != b->owned_small) {
        PyMem_Free(b->owned);
    }
}

/* Room for *extra* more pieces. */
static int
buf_reserve(Buf *b, Py_ssize_t extra)
{
    if (b->n + extra <= b->cap) {
        return 0;
    }
    Py_ssize_t cap = b->cap * 2;
    while (cap < b->n + extra) {
        cap *= 2;
    }
    Piece *items = PyMem_Malloc(sizeof(Piece) * (size_t)cap);
    if (items == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(items, b->items, sizeof(Piece) * (size_t)b->n);
    if (b->items != b->small) {
        PyMem_Free(b->items);
    }
    b->items = items;
    b->cap = cap;
    return 0;
}

/* Keeps a new reference until buf_free (steals it, also on failure). */
static int
buf_own(Buf *b, PyObject *obj)
{
    if (b->n_owned == b->owned_cap) {
        Py_ssize_t cap = b->owned_cap * 2;
        PyObject **owned = PyMem_Malloc(sizeof(PyObject *) * (size_t)cap);
        if (owned == NULL) {
            Py_DECREF(obj);
            PyErr_NoMemory();
            return -1;
        }
        memcpy(owned, b->owned, sizeof(PyObject *) * (size_t)b->n_owned);
        if (b->owned != b->owned_small) {
            PyMem_Free(b->owned);
        }
        b->owned = owned;
        b->owned_cap = cap;
    }
    b->owned[b->n_owned++] = obj;
    return 0;
}

/* A str piece; *s* must stay alive until the join (owned by the caller or the buffer).
 * The caller has reserved room. */
static inline void
push_str(Buf *b, PyObject *s)
{
    Piece *p = &b->items[b->n++];
    p->data = PyUnicode_DATA(s);
    p->len = PyUnicode_GET_LENGTH(s);
    p->kind = PyUnicode_KIND(s);
    p->maxchar = PyUnicode_MAX_CHAR_VALUE(s);
}

static inline void
push_ascii(Buf *b, const char *text, Py_ssize_t len)
{
    Piece *p = &b->items[b->n++];
    p->data = text;
    p->len = len;
    p->kind = PyUnicode_1BYTE_KIND;
    p->maxchar = 0x7f;
}

#define PUSH_LITERAL(b, text) push_ascii((b), (text), (Py_ssize_t)(sizeof(text) - 1))

static PyObject *
join(const Buf *b, Py_ssize_t start, Py_ssize_t end)
{
    Py_ssize_t total = 0;
    Py_UCS4 maxchar = 0;
    for (Py_ssize_t i = start; i < end; i++) {
        total += b->items[i].len;
        if (b->items[i].maxchar > maxchar) {
            maxchar = b->items[i].maxchar;
        }
    }
    PyObject *out = PyUnicode_New(total, maxchar);
    if (out == NULL) {
        return NULL;
    }
    int kind = PyUnicode_KIND(out);
    char *data = PyUnicode_DATA(out);
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = start; i < end; i++) {
        const Piece *p = &b->items[i];
        if (p->kind == kind) {
            memcpy(data + pos * kind, p->data, (size_t)(p->len * kind));
        }
        else { /* a narrower piece in a wider string */
            for (Py_ssize_t j = 0; j < p->len; j++) {
                PyUnicode_WRITE(kind, data, pos + j, PyUnicode_READ(p->kind, p->data, j));
            }
        }
        pos += p->len;
    }
    return out;
}

/* What an f-string makes of *obj* (steals it): itself if a str, else format(obj, ""). */
static PyObject *
as_text(PyObject *obj)
{
    if (obj == NULL || PyUnicode_CheckExact(obj)) {
        return obj;
    }
    PyObject *text = PyObject_Format(obj, NULL);
    Py_DECREF(obj);
    if (text != NULL && !PyUnicode_CheckExact(text)) {
        /* a str subclass: an exact copy, so that its data can be read directly */
        PyObject *exact = PyUnicode_Substring(text, 0, PyUnicode_GET_LENGTH(text));
        Py_DECREF(text);
        return exact;
    }
    return text;
}

/* as_text, kept by the buffer and pushed; -1 on error. */
static int
push_result(Buf *b, PyObject *obj)
{
    obj = as_text(obj);
    if (obj == NULL || buf_own(b, obj) < 0) {
        return -1;
    }
    push_str(b, obj);
    return 0;
}

/* Whether json.encoder.encode_basestring would change any character of *s*. */
static int
needs_escape(PyObject *s)
{
    Py_ssize_t len = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    if (kind == PyUnicode_1BYTE_KIND) {
        const unsigned char *c = data;
        for (Py_ssize_t i = 0; i < len; i++) {
            if (c[i] < 0x20 || c[i] == '"' || c[i] == '\\') {
                return 1;
            }
        }
        return 0;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < 0x20 || c == '"' || c == '\\') {
            return 1;
        }
    }
    return 0;
}

/* Whether PostgreSQL's float text *s* is already what Java's Float/Double.toString
 * writes (debezium_json.java_float_text's fast case): plain digits with a point and at
 * least one fraction digit, 1 to 7 whole digits without a leading zero, or "0." and a
 * non-zero digit among the first three of the fraction (1e-3 <= |x| < 1e7). */
static int
java_plain_float(PyObject *s)
{
    Py_ssize_t len = PyUnicode_GET_LENGTH(s), i = 0, point = -1;
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    if (len > 0 && PyUnicode_READ(kind, data, 0) == '-') {
        i = 1;
    }
    Py_ssize_t start = i;
    for (; i < len; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c == '.' && point < 0) {
            point = i;
        }
        else if (c < '0' || c > '9') {
            return 0;
        }
    }
    Py_ssize_t whole = point - start;
    if (point < 0 || point == len - 1 || whole < 1 || whole > 7) {
        return 0;
    }
    if (PyUnicode_READ(kind, data, start) != '0') {
        return 1;
    }
    if (whole != 1) {
        return 0;
    }
    for (i = point + 1; i < len && i <= point + 3; i++) {
        if (PyUnicode_READ(kind, data, i) != '0') {
            return 1;
        }
    }
    return 0;
}

/* -- the renderer ------------------------------------------------------------------- */

/* The event's fields the writer reads. */
enum { F_LSN, F_CONTEXT, F_SNAPSHOT, F_TS_US, F_OP, F_RAW_AFTER, F_RAW_BEFORE, N_FIELDS };
static PyObject *field_names[N_FIELDS];

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Py_ssize_t n_columns;
    char *kinds;
    unsigned char *params;  /* per column: DECIMAL's scale, ZONED's fraction digits */
    PyObject *functions;    /* tuple: callable per column whose kind falls back to one */
    PyObject *names;        /* tuple of str: '{"id":' for the first column, ',"x":' after */
    PyObject *nulls;        /* tuple of str: JSON text for SQL NULL */
    PyObject *placeholders; /* tuple of str: JSON text for an unchanged TOASTed value */
    Py_ssize_t n_keys;
    Py_ssize_t *key_indexes;
    PyObject *key_names;    /* tuple of str, like names, for the key's columns */
    PyObject *unavailable;
    PyObject *binary;       /* non-str value -> JSON text */
    PyObject *escape;       /* str -> JSON string text */
    PyObject *general;      /* event -> (key, value), for events without an LSN */
    PyObject *source_parts; /* (context, snapshot) -> (head, middle, end) of "source",
                             * or (block,) for a block without the event's position */
    PyObject *ts_fields;    /* ts_us -> the value's ts_* fields and closing brace */
    PyObject *transaction;  /* event -> the "transaction" block, or None: null */
    /* The cache between events: the source block of the last context and snapshot
     * marker, the ts fields of the last timestamp, the value of the last op. */
    PyObject *context, *snapshot, *head, *middle, *end, *ts, *ts_text, *op_enum, *op;
    int position_in_source; /* head + position + middle + position + end, else head */
    /* Whether the fields of events of event_type (at its version event_type_version)
     * are in slots (event_direct: msgspec.Struct fields are member descriptors), and
     * their offsets, read directly as the descriptors would read them: attribute
     * lookups cost more than the rest of writing an event. */
    PyTypeObject *event_type;
    unsigned int event_type_version;
    int event_direct;
    Py_ssize_t offsets[N_FIELDS];
} Renderer;

static PyObject *s_value_, *s_null, *s_empty;

/* Every object the renderer holds, for traverse and clear. */
/* The objects a writer is given, then those it caches; traverse and clear take both. */
#define RENDERER_ARGUMENTS(X)                                                              \
    X(functions) X(names) X(nulls) X(placeholders) X(key_names) X(unavailable) X(binary)   \
    X(escape) X(general) X(source_parts) X(ts_fields) X(transaction)
#define RENDERER_OBJECTS(X)                                                                \
    RENDERER_ARGUMENTS(X) X(context) X(snapshot) X(head) X(middle) X(end) X(ts)           \
    X(ts_text) X(op_enum) X(op) X(event_type)

static int
Renderer_traverse(Renderer *self, visitproc visit, void *arg)
{
#define VISIT(field) Py_VISIT(self->field);
    RENDERER_OBJECTS(VISIT)
#undef VISIT
    return 0;
}

static int
Renderer_clear(Renderer *self)
{
#define CLEAR(field) Py_CLEAR(self->field);
    RENDERER_OBJECTS(CLEAR)
#undef CLEAR
    return 0;
}

static void
Renderer_dealloc(Renderer *self)
{
    PyObject_GC_UnTrack(self);
    Renderer_clear(self);
    PyMem_Free(self->kinds);
    PyMem_Free(self->params);
    PyMem_Free(self->key_indexes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Renderer_vectorcall(PyObject *, PyObject *const *, size_t, PyObject *);

static int
check_str_tuple(PyObject *tuple, Py_ssize_t size, const char *what)
{
    if (!PyTuple_CheckExact(tuple) || PyTuple_GET_SIZE(tuple) != size) {
        PyErr_Format(PyExc_ValueError, "%s must be a tuple of %zd str, got %R", what, size,
                     tuple);
        return -1;
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(tuple, i))) {
            PyErr_Format(PyExc_TypeError, "%s[%zd] must be a str, got %R", what, i,
                         PyTuple_GET_ITEM(tuple, i));
            return -1;
        }
    }
    return 0;
}

static PyObject *
Renderer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"kinds", "functions", "names", "nulls", "placeholders",
                               "key_indexes", "key_names", "unavailable", "binary",
                               "escape", "general", "source_parts", "ts_fields",
                               "transaction", "params", NULL};
    PyObject *kinds, *functions, *names, *nulls, *placeholders, *key_indexes, *key_names,
        *unavailable, *binary, *escape, *general, *source_parts, *ts_fields, *transaction,
        *params = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "SOOOOOOOOOOOOO|S:EventRenderer", keywords,
                                     &kinds, &functions, &names, &nulls, &placeholders,
                                     &key_indexes, &key_names, &unavailable, &binary,
                                     &escape, &general, &source_parts, &ts_fields,
                                     &transaction, &params)) {
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(kinds);
    if (params != NULL && PyBytes_GET_SIZE(params) != n) {
        PyErr_Format(PyExc_ValueError, "params must be bytes of %zd, one per column", n);
        return NULL;
    }
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "a schema without columns has no compiled renderer");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((unsigned char)PyBytes_AS_STRING(kinds)[i] > K_LAST) {
            PyErr_Format(PyExc_ValueError, "kinds[%zd] is %d, not a column kind (0-%d)", i,
                         (int)(unsigned char)PyBytes_AS_STRING(kinds)[i], K_LAST);
            return NULL;
        }
    }
    if (!PyTuple_CheckExact(functions) || PyTuple_GET_SIZE(functions) != n) {
        PyErr_Format(PyExc_ValueError, "functions must be a tuple of %zd", n);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        char kind = PyBytes_AS_STRING(kinds)[i];
        if (kind >= K_FLOAT && !PyCallable_Check(PyTuple_GET_ITEM(functions, i))) {
            PyErr_Format(PyExc_TypeError, "functions[%zd] must be callable", i);
            return NULL;
        }
    }
    if (check_str_tuple(names, n, "names") < 0 || check_str_tuple(nulls, n, "nulls") < 0 ||
        check_str_tuple(placeholders, n, "placeholders") < 0) {
        return NULL;
    }
    if (!PyTuple_CheckExact(key_indexes)) {
        PyErr_SetString(PyExc_TypeError, "key_indexes must be a tuple of int");
        return NULL;
    }
    Py_ssize_t n_keys = PyTuple_GET_SIZE(key_indexes);
    if (check_str_tuple(key_names, n_keys, "key_names") < 0) {
        return NULL;
    }
    PyObject *callables[] = {binary, escape, general, source_parts, ts_fields};
    for (size_t i = 0; i < sizeof(callables) / sizeof(callables[0]); i++) {
        if (!PyCallable_Check(callables[i])) {
            PyErr_Format(PyExc_TypeError, "%s must be callable", keywords[8 + i]);
            return NULL;
        }
    }
    if (transaction != Py_None && !PyCallable_Check(transaction)) {
        PyErr_SetString(PyExc_TypeError, "transaction must be callable or None");
        return NULL;
    }
    Renderer *self = (Renderer *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->n_columns = n;
    self->n_keys = n_keys;
    self->kinds = PyMem_Malloc((size_t)n);
    self->params = PyMem_Calloc((size_t)n, 1);
    self->key_indexes = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n_keys ? n_keys : 1));
    if (self->kinds == NULL || self->params == NULL || self->key_indexes == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    memcpy(self->kinds, PyBytes_AS_STRING(kinds), (size_t)n);
    if (params != NULL) {
        memcpy(self->params, PyBytes_AS_STRING(params), (size_t)n);
    }
    for (Py_ssize_t i = 0; i < n_keys; i++) {
        Py_ssize_t index = PyNumber_AsSsize_t(PyTuple_GET_ITEM(key_indexes, i),
                                              PyExc_OverflowError);
        if (index == -1 && PyErr_Occurred()) {
            Py_DECREF(self);
            return NULL;
        }
        if (index < 0 || index >= n) {
            PyErr_Format(PyExc_ValueError, "key_indexes[%zd] is %zd, not a column (0-%zd)",
                         i, index, n - 1);
            Py_DECREF(self);
            return NULL;
        }
        self->key_indexes[i] = index;
    }
#define KEEP(field) self->field = Py_NewRef(field);
    RENDERER_ARGUMENTS(KEEP)
#undef KEEP
    self->vectorcall = Renderer_vectorcall;
    return (PyObject *)self;
}

/* -- the values written in C where the text has its common shape ---------------------
 * Each returns a new str, or NULL without an error for any other shape (the column's
 * Python function takes those), or NULL with an error set. */

static PyObject *
ascii_str(const char *data, Py_ssize_t len)
{
    PyObject *s = PyUnicode_New(len, 127);
    if (s != NULL) {
        memcpy(PyUnicode_1BYTE_DATA(s), data, (size_t)len);
    }
    return s;
}

static int
bit_length(unsigned __int128 x)
{
    int bits = 0;
    while (x) {
        bits++;
        x >>= 1;
    }
    return bits;
}

/* Like json_values._decimal_fragment's fast path: the digits without the point are the
 * unscaled value; its bytes are the shortest big-endian two's complement (as Python's
 * int.to_bytes with one spare bit), base64-encoded with padding, in quotes. */
static PyObject *
decimal_text(PyObject *v, int scale)
{
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if (PyUnicode_KIND(v) != PyUnicode_1BYTE_KIND || scale <= 0) {
        return NULL;
    }
    Py_ssize_t len = PyUnicode_GET_LENGTH(v);
    const unsigned char *c = PyUnicode_1BYTE_DATA(v);
    if (len <= scale || c[len - scale - 1] != '.' || c[len - 1] < '0' || c[len - 1] > '9') {
        return NULL;
    }
    Py_ssize_t i = c[0] == '-' ? 1 : 0;
    int negative = (int)i, digits = 0;
    unsigned __int128 u = 0;
    for (; i < len; i++) {
        if (i == len - scale - 1) {
            continue; /* the point */
        }
        if (c[i] < '0' || c[i] > '9' || ++digits > 38) {
            return NULL;
        }
        u = u * 10 + (unsigned)(c[i] - '0');
    }
    unsigned char raw[17];
    int n;
    if (!negative || u == 0) {
        n = (bit_length(u) >> 3) + 1;
        for (int k = 0; k < n; k++) {
            raw[n - 1 - k] = (unsigned char)(u >> (8 * k));
        }
    }
    else {
        unsigned __int128 m = u - 1; /* ~(-u) */
        n = (bit_length(m) >> 3) + 1;
        unsigned __int128 t = ~m;
        for (int k = 0; k < n; k++) {
            raw[n - 1 - k] = (unsigned char)(t >> (8 * k));
        }
    }
    char out[2 + 4 * ((17 + 2) / 3)];
    Py_ssize_t o = 0;
    out[o++] = '"';
    for (int k = 0; k < n; k += 3) {
        unsigned int chunk = (unsigned int)raw[k] << 16;
        if (k + 1 < n) {
            chunk |= (unsigned int)raw[k + 1] << 8;
        }
        if (k + 2 < n) {
            chunk |= raw[k + 2];
        }
        out[o++] = alphabet[(chunk >> 18) & 63];
        out[o++] = alphabet[(chunk >> 12) & 63];
        out[o++] = k + 1 < n ? alphabet[(chunk >> 6) & 63] : '=';
        out[o++] = k + 2 < n ? alphabet[chunk & 63] : '=';
    }
    out[o++] = '"';
    return ascii_str(out, o);
}

/* json_values._zoned_timestamp_fragment's two fast shapes. */
static PyObject *
zoned_text(PyObject *v, int width)
{
    if (PyUnicode_KIND(v) != PyUnicode_1BYTE_KIND || width > 9) {
        return NULL;
    }
    Py_ssize_t len = PyUnicode_GET_LENGTH(v);
    const char *c = (const char *)PyUnicode_1BYTE_DATA(v);
    char out[48];
    Py_ssize_t o = 0;
    if (len == 22 && memcmp(c + 19, "+00", 3) == 0 && c[10] == ' ') {
        out[o++] = '"';
        memcpy(out + o, c, 10);
        o += 10;
        out[o++] = 'T';
        memcpy(out + o, c + 11, 8);
        o += 8;
        if (width > 0) {
            out[o++] = '.';
            memset(out + o, '0', (size_t)width);
            o += width;
        }
        out[o++] = 'Z';
        out[o++] = '"';
        return ascii_str(out, o);
    }
    if (len == 29 && width == 6 && memcmp(c + 26, "+00", 3) == 0 && c[10] == ' ') {
        out[o++] = '"';
        memcpy(out + o, c, 10);
        o += 10;
        out[o++] = 'T';
        memcpy(out + o, c + 11, 15);
        o += 15;
        out[o++] = 'Z';
        out[o++] = '"';
        return ascii_str(out, o);
    }
    return NULL;
}

/* 'YYYY-MM-DD' -> days since 1970-01-01 (Howard Hinnant's days_from_civil, as
 * types._days_from_civil), as JSON text. */
static PyObject *
date_text(PyObject *v)
{
    if (PyUnicode_KIND(v) != PyUnicode_1BYTE_KIND || PyUnicode_GET_LENGTH(v) != 10) {
        return NULL;
    }
    const unsigned char *c = PyUnicode_1BYTE_DATA(v);
    static const int digit_at[] = {0, 1, 2, 3, 5, 6, 8, 9};
    for (size_t k = 0; k < sizeof(digit_at) / sizeof(digit_at[0]); k++) {
        if (c[digit_at[k]] < '0' || c[digit_at[k]] > '9') {
            return NULL;
        }
    }
    if (c[4] != '-' || c[7] != '-') {
        return NULL;
    }
    long year = (c[0] - '0') * 1000 + (c[1] - '0') * 100 + (c[2] - '0') * 10 + (c[3] - '0');
    int month = (c[5] - '0') * 10 + (c[6] - '0');
    int day = (c[8] - '0') * 10 + (c[9] - '0');
    if (month < 1 || month > 12 || day < 1 || day > 31) {
        return NULL;
    }
    if (month <= 2) {
        year -= 1;
    }
    long era = (year >= 0 ? year : year - 399) / 400;
    long year_of_era = year - era * 400;
    long day_of_year = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1;
    long day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    return PyUnicode_FromFormat("%ld", era * 146097 + day_of_era - 719468);
}

/* The pieces of one row as a JSON object. starts[i] is the index of column i's first
 * piece (its name), starts[n] that of the closing brace. */
static int
write_row(Renderer *self, Buf *b, PyObject *row, Py_ssize_t *starts)
{
    Py_ssize_t n = self->n_columns;
    if (buf_reserve(b, 4 * n + 1) < 0) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyTuple_GET_ITEM(row, i);
        starts[i] = b->n;
        push_str(b, PyTuple_GET_ITEM(self->names, i));
        if (PyUnicode_CheckExact(v)) {
            if (PyUnicode_READY(v) < 0) { /* a string of the legacy C API */
                return -1;
            }
            switch (self->kinds[i]) {
            case K_RAW:
                push_str(b, v);
                break;
            case K_STRING:
                if (needs_escape(v)) {
                    if (push_result(b, PyObject_CallOneArg(self->escape, v)) < 0) {
                        return -1;
                    }
                }
                else {
                    PUSH_LITERAL(b, "\"");
                    push_str(b, v);
                    PUSH_LITERAL(b, "\"");
                }
                break;
            case K_BOOL:
                if (PyUnicode_GET_LENGTH(v) == 1 && PyUnicode_READ_CHAR(v, 0) == 't') {
                    PUSH_LITERAL(b, "true");
                }
                else {
                    PUSH_LITERAL(b, "false");
                }
                break;
            case K_FLOAT:
                if (java_plain_float(v)) {
                    push_str(b, v);
                }
                else if (push_result(b, PyObject_CallOneArg(
                             PyTuple_GET_ITEM(self->functions, i), v)) < 0) {
                    return -1;
                }
                break;
            case K_DECIMAL:
            case K_ZONED:
            case K_DATE: {
                PyObject *text = self->kinds[i] == K_DECIMAL ? decimal_text(v, self->params[i])
                               : self->kinds[i] == K_ZONED ? zoned_text(v, self->params[i])
                                                           : date_text(v);
                if (text == NULL && PyErr_Occurred()) {
                    return -1;
                }
                if (text != NULL) {
                    if (push_result(b, text) < 0) {
                        return -1;
                    }
                    break;
                }
            }
                /* another shape: the Python function */
                /* fall through */
            default: /* K_FUNCTION */
                if (push_result(b, PyObject_CallOneArg(PyTuple_GET_ITEM(self->functions, i),
                                                       v)) < 0) {
                    return -1;
                }
            }
        }
        else if (v == Py_None) {
            push_str(b, PyTuple_GET_ITEM(self->nulls, i));
        }
        else if (v == self->unavailable) {
            push_str(b, PyTuple_GET_ITEM(self->placeholders, i));
        }
        else if (push_result(b, PyObject_CallOneArg(self->binary, v)) < 0) {
            return -1;
        }
    }
    starts[n] = b->n;
    PUSH_LITERAL(b, "}");
    return 0;
}

/* The key of a row written by write_row, from its pieces, joined. */
static PyObject *
join_key(Renderer *self, Buf *b, const Py_ssize_t *starts)
{
    Py_ssize_t first = b->n;
    for (Py_ssize_t j = 0; j < self->n_keys; j++) {
        Py_ssize_t column = self->key_indexes[j];
        /* the column's pieces after its name */
        Py_ssize_t from = starts[column] + 1, to = starts[column + 1];
        if (buf_reserve(b, to - from + 2) < 0) {
            return NULL;
        }
        push_str(b, PyTuple_GET_ITEM(self->key_names, j));
        memcpy(&b->items[b->n], &b->items[from], sizeof(Piece) * (size_t)(to - from));
        b->n += to - from;
    }
    if (buf_reserve(b, 1) < 0) {
        return NULL;
    }
    PUSH_LITERAL(b, "}");
    return join(b, first, b->n);
}

/* Replaces *slot* with a new reference to *value* (stolen). */
static inline void
store(PyObject **slot, PyObject *value)
{
    PyObject *old = *slot;
    *slot = value;
    Py_XDECREF(old);
}

static int
refresh_source(Renderer *self, PyObject *context, PyObject *snapshot)
{
    PyObject *parts = PyObject_CallFunctionObjArgs(self->source_parts, context, snapshot,
                                                   NULL);
    if (parts == NULL) {
        return -1;
    }
    Py_ssize_t count = PyTuple_Check(parts) ? PyTuple_GET_SIZE(parts) : 0;
    if (count != 3 && count != 1) {
        PyErr_Format(PyExc_TypeError,
                     "source_parts returned %R, not (head, middle, end) or (block,)", parts);
        Py_DECREF(parts);
        return -1;
    }
    PyObject *text[3];
    for (int i = 0; i < 3; i++) {
        /* A whole block: the middle and end are empty and never written. */
        text[i] = as_text(Py_NewRef(i < count ? PyTuple_GET_ITEM(parts, i) : s_empty));
        if (text[i] == NULL) {
            for (int j = 0; j < i; j++) {
                Py_DECREF(text[j]);
            }
            Py_DECREF(parts);
            return -1;
        }
    }
    Py_DECREF(parts);
    store(&self->head, text[0]);
    store(&self->middle, text[1]);
    store(&self->end, text[2]);
    store(&self->context, Py_NewRef(context));
    store(&self->snapshot, Py_NewRef(snapshot));
    self->position_in_source = count == 3;
    return 0;
}

static int
is_char(PyObject *s, Py_UCS4 c)
{
    return PyUnicode_Check(s) && PyUnicode_GET_LENGTH(s) == 1 && PyUnicode_READ_CHAR(s, 0) == c;
}

/* Whether the fields of events of *type* can be read from their slots, and where
 * (*offsets*): when they are all plain object member descriptors, as msgspec.Struct
 * fields are. Data descriptors take precedence over an instance's dict, so the slot
 * holds what getattr would return. */
static int
field_offsets(PyTypeObject *type, Py_ssize_t *offsets)
{
    for (int i = 0; i < N_FIELDS; i++) {
        PyObject *descr = _PyType_Lookup(type, field_names[i]);
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            return 0;
        }
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type != T_OBJECT_EX && member->type != T_OBJECT) {
            return 0;
        }
        offsets[i] = member->offset;
    }
    return 1;
}

/* field_offsets of the event's type, cached per type and version: the lookups give
 * a type a version tag, which any change to the type resets. Copied out, because a
 * renderer shared between threads may be re-pointed at another type by an event
 * written while this one calls into Python. */
static int
event_offsets(Renderer *self, PyTypeObject *type, Py_ssize_t *offsets)
{
    if (type == self->event_type && (type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) &&
        type->tp_version_tag == self->event_type_version) {
        memcpy(offsets, self->offsets, sizeof(self->offsets));
        return self->event_direct;
    }
    int direct = field_offsets(type, offsets);
    if ((type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) && type->tp_version_tag != 0) {
        store((PyObject **)&self->event_type, Py_NewRef(type));
        self->event_type_version = type->tp_version_tag;
        self->event_direct = direct;
        memcpy(self->offsets, offsets, sizeof(self->offsets));
    }
    return direct;
}

/* A new reference to field *i* of *event*; *direct*: from its slot at offsets[i]. */
static inline PyObject *
get_field(PyObject *event, const Py_ssize_t *offsets, int i, int direct)
{
    if (direct) {
        PyObject *value = *(PyObject **)((char *)event + offsets[i]);
        if (value != NULL) {
            return Py_NewRef(value);
        }
    }
    return PyObject_GetAttr(event, field_names[i]);
}

/* Decimal digits of *value* into *out* (room for 20); their count. */
static Py_ssize_t
decimal_digits(unsigned long long value, char *out)
{
    char reversed[20];
    Py_ssize_t n = 0;
    do {
        reversed[n++] = (char)('0' + value % 10);
        value /= 10;
    } while (value != 0);
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = reversed[n - 1 - i];
    }
    return n;
}

#define SMALL_COLUMNS 64

static PyObject *
render(Renderer *self, PyObject *event)
{
    PyObject *lsn = NULL, *context = NULL, *snapshot = NULL, *ts = NULL, *op_enum = NULL,
             *op = NULL, *after = NULL, *before = NULL, *key = NULL, *value = NULL,
             *result = NULL;
    Py_ssize_t small_starts[2 * (SMALL_COLUMNS + 1)];
    Py_ssize_t *starts = small_starts;
    Buf b;
    buf_init(&b);

    Py_ssize_t offsets[N_FIELDS];
    int direct = event_offsets(self, Py_TYPE(event), offsets);
    lsn = get_field(event, offsets, F_LSN, direct);
    if (lsn == NULL) {
        goto done;
    }
    if (lsn == Py_None) {
        result = PyObject_CallOneArg(self->general, event);
        goto done;
    }
    if ((context = get_field(event, offsets, F_CONTEXT, direct)) == NULL ||
        (snapshot = get_field(event, offsets, F_SNAPSHOT, direct)) == NULL) {
        goto done;
    }
    if ((context != self->context || snapshot != self->snapshot) &&
        refresh_source(self, context, snapshot) < 0) {
        goto done;
    }
    /* The cached pieces this event uses, held: writing it calls into Python, where
     * another thread writing with this renderer (or a converter function re-entering
     * it) may change the cache. */
    PyObject *head = Py_NewRef(self->head), *middle = Py_NewRef(self->middle),
             *end = Py_NewRef(self->end);
    int position_in_source = self->position_in_source;
    if (buf_own(&b, head) < 0 || buf_own(&b, middle) < 0 || buf_own(&b, end) < 0) {
        goto done;
    }
    if ((ts = get_field(event, offsets, F_TS_US, direct)) == NULL) {
        goto done;
    }
    if (ts != self->ts) {
        int same = self->ts == NULL ? 0 : PyObject_RichCompareBool(ts, self->ts, Py_EQ);
        if (same < 0) {
            goto done;
        }
        if (!same) {
            PyObject *text = as_text(PyObject_CallOneArg(self->ts_fields, ts));
            if (text == NULL) {
                goto done;
            }
            store(&self->ts_text, text);
            store(&self->ts, Py_NewRef(ts));
        }
    }
    PyObject *ts_text = Py_NewRef(self->ts_text);
    if (buf_own(&b, ts_text) < 0) {
        goto done;
    }
    if ((op_enum = get_field(event, offsets, F_OP, direct)) == NULL) {
        goto done;
    }
    if (op_enum == self->op_enum) {
        op = Py_NewRef(self->op);
    }
    else {
        if ((op = PyObject_GetAttr(op_enum, s_value_)) == NULL) {
            goto done;
        }
        store(&self->op_enum, Py_NewRef(op_enum));
        store(&self->op, Py_NewRef(op));
    }
    if ((after = get_field(event, offsets, F_RAW_AFTER, direct)) == NULL ||
        (before = get_field(event, offsets, F_RAW_BEFORE, direct)) == NULL) {
        goto done;
    }
    Py_ssize_t n = self->n_columns;
    /* Rows that are not tuples of the schema's width: the general code, which unpacks
     * them as the generated Python code would (or fails the same way). */
    if ((after != Py_None && (!PyTuple_CheckExact(after) || PyTuple_GET_SIZE(after) != n)) ||
        (before != Py_None &&
         (!PyTuple_CheckExact(before) || PyTuple_GET_SIZE(before) != n))) {
        result = PyObject_CallOneArg(self->general, event);
        goto done;
    }
    if (n > SMALL_COLUMNS) {
        starts = PyMem_Malloc(sizeof(Py_ssize_t) * 2 * (size_t)(n + 1));
        if (starts == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    Py_ssize_t *before_starts = starts, *after_starts = starts + n + 1;

    if (buf_reserve(&b, 2) < 0) {
        goto done;
    }
    if (before == Py_None) {
        PUSH_LITERAL(&b, "{\"before\":null,\"after\":");
    }
    else {
        PUSH_LITERAL(&b, "{\"before\":");
        if (write_row(self, &b, before, before_starts) < 0 || buf_reserve(&b, 1) < 0) {
            goto done;
        }
        PUSH_LITERAL(&b, ",\"after\":");
    }
    if (after == Py_None) {
        if (buf_reserve(&b, 1) < 0) {
            goto done;
        }
        PUSH_LITERAL(&b, "null");
    }
    else if (write_row(self, &b, after, after_starts) < 0) {
        goto done;
    }

    char lsn_digits[20];
    PyObject *lsn_text = NULL;
    unsigned long long lsn_value = 0;
    if (PyLong_CheckExact(lsn)) {
        lsn_value = PyLong_AsUnsignedLongLong(lsn);
        if (lsn_value == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear(); /* negative or beyond 64 bits: Python's own text */
            lsn_text = PyObject_Str(lsn);
            if (lsn_text == NULL) {
                goto done;
            }
        }
    }
    else if ((lsn_text = as_text(Py_NewRef(lsn))) == NULL) {
        goto done;
    }
    if (lsn_text != NULL && buf_own(&b, lsn_text) < 0) {
        goto done;
    }
    Py_ssize_t lsn_len = lsn_text == NULL ? decimal_digits(lsn_value, lsn_digits) : 0;

    PyObject *op_text = as_text(Py_NewRef(op));
    if (op_text == NULL || buf_own(&b, op_text) < 0) {
        goto done;
    }
    PyObject *transaction_text = NULL;
    if (self->transaction != Py_None) {
        transaction_text = as_text(PyObject_CallOneArg(self->transaction, event));
        if (transaction_text == NULL || buf_own(&b, transaction_text) < 0) {
            goto done;
        }
    }
    if (buf_reserve(&b, 12) < 0) {
        goto done;
    }
    PUSH_LITERAL(&b, ",\"source\":");
    push_str(&b, head);
    if (position_in_source) {
        if (lsn_text == NULL) {
            push_ascii(&b, lsn_digits, lsn_len);
        }
        else {
            push_str(&b, lsn_text);
        }
        push_str(&b, middle);
        if (lsn_text == NULL) {
            push_ascii(&b, lsn_digits, lsn_len);
        }
        else {
            push_str(&b, lsn_text);
        }
        push_str(&b, end);
    }
    if (transaction_text == NULL) {
        PUSH_LITERAL(&b, ",\"transaction\":null,\"op\":\"");
    }
    else {
        PUSH_LITERAL(&b, ",\"transaction\":");
        push_str(&b, transaction_text);
        PUSH_LITERAL(&b, ",\"op\":\"");
    }
    push_str(&b, op_text);
    PUSH_LITERAL(&b, "\",");
    push_str(&b, ts_text);
    Py_ssize_t value_end = b.n;

    if (self->n_keys == 0) {
        key = Py_NewRef(s_null);
    }
    else if (is_char(op, 'd')) {
        key = before == Py_None ? Py_NewRef(s_null) : join_key(self, &b, before_starts);
    }
    else if (is_char(op, 't') || after == Py_None) {
        key = Py_NewRef(s_null);
    }
    else {
        key = join_key(self, &b, after_starts);
    }
    if (key == NULL || (value = join(&b, 0, value_end)) == NULL) {
        goto done;
    }
    result = PyTuple_Pack(2, key, value);

done:
    buf_free(&b);
    if (starts != small_starts) {
        PyMem_Free(starts);
    }
    Py_XDECREF(lsn);
    Py_XDECREF(context);
    Py_XDECREF(snapshot);
    Py_XDECREF(ts);
    Py_XDECREF(op_enum);
    Py_XDECREF(op);
    Py_XDECREF(after);
    Py_XDECREF(before);
    Py_XDECREF(key);
    Py_XDECREF(value);
    return result;
}

static PyObject *
Renderer_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                    PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_SetString(PyExc_TypeError, "EventRenderer takes one event");
        return NULL;
    }
    return render((Renderer *)callable, args[0]);
}

static PyObject *
Renderer_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    return PyVectorcall_Call(self, args, kwargs);
}

/* -- whole JSON lines of one rows event ---------------------------------------------
 * For a source that knows a batch of rows of one table share everything but their row
 * index (MariaDB's rows events): the lines are written here, with no event object per
 * row. The Python twin is tidemark.source.mariadb.json_lines.PythonRowLines. */

/* Copies pieces [from, to) of *b* to its end; the caller has reserved room. */
static inline void
copy_pieces(Buf *b, Py_ssize_t from, Py_ssize_t to)
{
    memcpy(&b->items[b->n], &b->items[from], sizeof(Piece) * (size_t)(to - from));
    b->n += to - from;
}

/* The key's pieces of a row written by write_row (without braces' join). */
static void
push_key(Renderer *self, Buf *b, const Py_ssize_t *starts)
{
    for (Py_ssize_t j = 0; j < self->n_keys; j++) {
        Py_ssize_t column = self->key_indexes[j];
        push_str(b, PyTuple_GET_ITEM(self->key_names, j));
        copy_pieces(b, starts[column] + 1, starts[column + 1]);
    }
    PUSH_LITERAL(b, "}");
}

static Py_ssize_t
key_pieces(Renderer *self, const Py_ssize_t *starts)
{
    Py_ssize_t count = 1;
    for (Py_ssize_t j = 0; j < self->n_keys; j++) {
        Py_ssize_t column = self->key_indexes[j];
        count += 1 + starts[column + 1] - (starts[column] + 1);
    }
    return count;
}

/* One change event's line (and its tombstone's, after a delete with a key), appended
 * to *out*. *before_starts* and *after_starts*: the rows as written, or NULL for none. */
static int
append_line(Renderer *self, Buf *b, PyObject *out, char op, const Py_ssize_t *before_starts,
            const Py_ssize_t *after_starts, PyObject *head, const char *row, Py_ssize_t row_len,
            PyObject *tail, PyObject *ts_text, int tombstones)
{
    Py_ssize_t n = self->n_columns;
    const Py_ssize_t *key_starts = op == 'd' ? before_starts : after_starts;
    int keyed = self->n_keys > 0 && key_starts != NULL;
    Py_ssize_t keys = keyed ? key_pieces(self, key_starts) : 1;
    Py_ssize_t need = 2 * keys + 24 +
                      (before_starts ? before_starts[n] + 1 - before_starts[0] : 1) +
                      (after_starts ? after_starts[n] + 1 - after_starts[0] : 1);
    if (buf_reserve(b, need) < 0) {
        return -1;
    }
    Py_ssize_t start = b->n;
    PUSH_LITERAL(b, "{\"key\":");
    if (keyed) {
        push_key(self, b, key_starts);
    }
    else {
        PUSH_LITERAL(b, "null");
    }
    PUSH_LITERAL(b, ",\"value\":{\"before\":");
    if (before_starts != NULL) {
        copy_pieces(b, before_starts[0], before_starts[n] + 1);
    }
    else {
        PUSH_LITERAL(b, "null");
    }
    PUSH_LITERAL(b, ",\"after\":");
    if (after_starts != NULL) {
        copy_pieces(b, after_starts[0], after_starts[n] + 1);
    }
    else {
        PUSH_LITERAL(b, "null");
    }
    PUSH_LITERAL(b, ",\"source\":");
    push_str(b, head);
    push_ascii(b, row, row_len);
    push_str(b, tail);
    PUSH_LITERAL(b, ",\"transaction\":null,\"op\":\"");
    push_ascii(b, op == 'c' ? "c" : op == 'u' ? "u" : "d", 1);
    PUSH_LITERAL(b, "\",");
    push_str(b, ts_text);
    PUSH_LITERAL(b, "}\n");
    if (tombstones && op == 'd' && keyed) {
        PUSH_LITERAL(b, "{\"key\":");
        push_key(self, b, key_starts);
        PUSH_LITERAL(b, ",\"value\":null}\n");
    }
    PyObject *line = join(b, start, b->n);
    b->n = start;
    if (line == NULL) {
        return -1;
    }
    int failed = PyList_Append(out, line);
    Py_DECREF(line);
    return failed;
}

/* Whether an update changed its row's key (tidemark.key_change.key_changed). */
static int
key_changed(Renderer *self, PyObject *before, PyObject *after)
{
    for (Py_ssize_t j = 0; j < self->n_keys; j++) {
        Py_ssize_t i = self->key_indexes[j];
        PyObject *old = PyTuple_GET_ITEM(before, i), *new = PyTuple_GET_ITEM(after, i);
        if (new == self->unavailable) {
            continue;
        }
        int differ = PyObject_RichCompareBool(old, new, Py_NE);
        if (differ != 0) {
            return differ; /* 1, or -1 on error */
        }
    }
    return 0;
}

static int
check_row(Renderer *self, PyObject *row)
{
    if (row != Py_None &&
        (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != self->n_columns)) {
        PyErr_Format(PyExc_ValueError, "a row must be None or a tuple of %zd values, not %R",
                     self->n_columns, row);
        return -1;
    }
    return 0;
}

static PyObject *
Renderer_lines(Renderer *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "lines(rows, op, head, tail, ts_text, tombstones) takes 6 arguments");
        return NULL;
    }
    PyObject *rows = args[0], *op_text = args[1], *head = args[2], *tail = args[3],
             *ts_text = args[4];
    if (!PyList_CheckExact(rows)) {
        PyErr_SetString(PyExc_TypeError, "rows must be a list of (before, after)");
        return NULL;
    }
    if (!PyUnicode_CheckExact(op_text) || PyUnicode_GET_LENGTH(op_text) != 1 ||
        (PyUnicode_READ_CHAR(op_text, 0) != 'c' && PyUnicode_READ_CHAR(op_text, 0) != 'u' &&
         PyUnicode_READ_CHAR(op_text, 0) != 'd')) {
        PyErr_Format(PyExc_ValueError, "op must be 'c', 'u' or 'd', not %R", op_text);
        return NULL;
    }
    if (!PyUnicode_CheckExact(head) || !PyUnicode_CheckExact(tail) ||
        !PyUnicode_CheckExact(ts_text)) {
        PyErr_SetString(PyExc_TypeError, "head, tail and ts_text must be str");
        return NULL;
    }
    int tombstones = PyObject_IsTrue(args[5]);
    if (tombstones < 0) {
        return NULL;
    }
    char op = (char)PyUnicode_READ_CHAR(op_text, 0);
    Py_ssize_t n = self->n_columns;
    Py_ssize_t small_starts[2 * (SMALL_COLUMNS + 1)];
    Py_ssize_t *starts = small_starts;
    if (n > SMALL_COLUMNS &&
        (starts = PyMem_Malloc(sizeof(Py_ssize_t) * 2 * (size_t)(n + 1))) == NULL) {
        return PyErr_NoMemory();
    }
    Py_ssize_t *before_starts = starts, *after_starts = starts + n + 1;
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        goto fail;
    }
    for (Py_ssize_t r = 0; r < PyList_GET_SIZE(rows); r++) {
        PyObject *item = PyList_GET_ITEM(rows, r);
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_Format(PyExc_ValueError, "rows[%zd] is not a (before, after) pair", r);
            goto fail;
        }
        /* Held: writing a value may call into Python, which may change the list. */
        Py_INCREF(item);
        PyObject *before = PyTuple_GET_ITEM(item, 0), *after = PyTuple_GET_ITEM(item, 1);
        Buf b;
        buf_init(&b);
        char row[20];
        Py_ssize_t row_len = decimal_digits((unsigned long long)r, row);
        int failed = check_row(self, before) < 0 || check_row(self, after) < 0 ||
                     (op != 'c' && before == Py_None) || (op != 'd' && after == Py_None);
        if (failed && !PyErr_Occurred()) {
            PyErr_Format(PyExc_ValueError, "rows[%zd] lacks the image a '%c' needs", r, op);
        }
        if (!failed && before != Py_None) {
            failed = write_row(self, &b, before, before_starts) < 0;
        }
        if (!failed && after != Py_None) {
            failed = write_row(self, &b, after, after_starts) < 0;
        }
        const Py_ssize_t *bs = before == Py_None ? NULL : before_starts;
        const Py_ssize_t *as = after == Py_None ? NULL : after_starts;
        int changed = 0;
        if (!failed && op == 'u' && self->n_keys > 0) {
            changed = key_changed(self, before, after);
            failed = changed < 0;
        }
        if (!failed) {
            if (changed) { /* a delete of the old key, then a create of the new row */
                failed = append_line(self, &b, out, 'd', bs, NULL, head, row, row_len, tail,
                                     ts_text, tombstones) < 0 ||
                         append_line(self, &b, out, 'c', NULL, as, head, row, row_len, tail,
                                     ts_text, tombstones) < 0;
            }
            else {
                failed = append_line(self, &b, out, op, op == 'c' ? NULL : bs,
                                     op == 'd' ? NULL : as, head, row, row_len, tail,
                                     ts_text, tombstones) < 0;
            }
        }
        buf_free(&b);
        Py_DECREF(item);
        if (failed) {
            goto fail;
        }
    }
    if (starts != small_starts) {
        PyMem_Free(starts);
    }
    return out;

fail:
    if (starts != small_starts) {
        PyMem_Free(starts);
    }
    Py_XDECREF(out);
    return NULL;
}

static PyMethodDef Renderer_methods[] = {
    {"lines", (PyCFunction)(void (*)(void))Renderer_lines, METH_FASTCALL,
     "lines(rows, op, head, tail, ts_text, tombstones) -> list of str\n\n"
     "The JSON lines of one batch of rows of this schema, each ``(before, after)``, all\n"
     "of operation *op* ('c', 'u', 'd'), without transaction metadata: the source block\n"
     "of row *i* is ``head + str(i) + tail``; the value ends with *ts_text*. An update\n"
     "that changes the key becomes a delete and a create (tidemark.key_change); a\n"
     "delete with a key is followed by its tombstone's line when *tombstones*."},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(Renderer_doc,
"EventRenderer(kinds, functions, names, nulls, placeholders, key_indexes, key_names,\n"
"              unavailable, binary, escape, general, source_parts, ts_fields,\n"
"              transaction)\n"
"--\n\n"
"Writes the Debezium JSON key and value of one table schema's row events:\n"
"``renderer(event) -> (key, value)``. Built by\n"
"``tidemark.serde.debezium_json.compile_event_renderer``.");

static PyTypeObject RendererType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tidemark.serde._render.EventRenderer",
    .tp_basicsize = sizeof(Renderer),
    .tp_dealloc = (destructor)Renderer_dealloc,
    .tp_vectorcall_offset = offsetof(Renderer, vectorcall),
    .tp_call = Renderer_call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = Renderer_doc,
    .tp_traverse = (traverseproc)Renderer_traverse,
    .tp_clear = (inquiry)Renderer_clear,
    .tp_new = Renderer_new,
    .tp_methods = Renderer_methods,
};

static struct PyModuleDef render_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tidemark.serde._render",
    .m_doc = "The compiled Debezium JSON event writer (see debezium_json).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__render(void)
{
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&field_names[F_LSN], "lsn"},
        {&field_names[F_CONTEXT], "context"},
        {&field_names[F_SNAPSHOT], "snapshot"},
        {&field_names[F_TS_US], "ts_us"},
        {&field_names[F_OP], "op"},
        {&field_names[F_RAW_AFTER], "raw_after"},
        {&field_names[F_RAW_BEFORE], "raw_before"},
        {&s_value_, "_value_"},
        {&s_null, "null"},
        {&s_empty, ""},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (*names[i].slot == NULL &&
            (*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL) {
            return NULL;
        }
    }
    if (PyType_Ready(&RendererType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&render_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "EventRenderer", (PyObject *)&RendererType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
