/*
 * tidemark.source.postgres._pgoutput_line: a pgoutput Insert, Update (without an old
 * tuple) or Delete message straight to its Debezium JSON line, compiled.
 *
 * The same text as the code pgoutput_json generates per table schema in Python, which
 * stays the reference (and the fallback where this module is not built, or for shapes
 * of messages this code does not take); the tests hold the two to identical text. Why
 * C: in ``tidemark capture`` the generated Python code is more than half of the
 * client's CPU, mostly slicing and joining small strings per column; here every
 * column's text is copied once from the message into one buffer, and the line is made
 * from it with one UTF-8 decode.
 *
 * A writer is called as the generated code is: ``writer(data, text, lsn, parts)``
 * (*text* is ignored: this code reads the bytes). Anything it does not take — another
 * column count, a binary value, truncated bytes, invalid UTF-8, a converter that
 * fails — raises, and the caller takes the general path, as for the generated code.
 *
 * Column kinds (those of serde/_render.c, with the same meaning, on the value's bytes;
 * for any other shape than the one written here, ``functions[i](text)``):
 *   RAW the text; STRING the text as a JSON string (json.encoder.encode_basestring);
 *   BOOL true for "t", else false; FLOAT the text when already Java's (and ".0" after
 *   a whole number below 1e7); FUNCTION the
 *   function (memoized per column where ``memos[i]`` is a dict); DECIMAL, ZONED, DATE
 *   their common shapes (numeric(p, s) base64, timestamptz in UTC, 'YYYY-MM-DD').
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <string.h>

enum {
    K_RAW = 0, K_STRING = 1, K_BOOL = 2, K_FLOAT = 3, K_FUNCTION = 4, K_DECIMAL = 5,
    K_ZONED = 6, K_DATE = 7, K_LAST = 7
};

#define MEMO_SIZE 1024 /* entries per column memo; cleared when full (as pgoutput_json) */

/* -- a growing byte buffer ------------------------------------------------------------ */

#define SMALL_BUF 4096

typedef struct {
    char *data;
    Py_ssize_t len, cap;
    char small[SMALL_BUF];
} Buf;

static void
buf_init(Buf *b)
{
    b->data = b->small;
    b->len = 0;
    b->cap = SMALL_BUF;
}

static void
buf_free(Buf *b)
{
    if (b->data != b->small) {
        PyMem_Free(b->data);
    }
}

static int
buf_grow(Buf *b, Py_ssize_t extra)
{
    Py_ssize_t cap = b->cap;
    while (cap < b->len + extra) {
        cap *= 2;
    }
    char *data = PyMem_Malloc((size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(data, b->data, (size_t)b->len);
    buf_free(b);
    b->data = data;
    b->cap = cap;
    return 0;
}

static inline int
buf_add(Buf *b, const char *data, Py_ssize_t len)
{
    if (b->len + len > b->cap && buf_grow(b, len) < 0) {
        return -1;
    }
    memcpy(b->data + b->len, data, (size_t)len);
    b->len += len;
    return 0;
}

#define ADD_LITERAL(b, text) buf_add((b), (text), (Py_ssize_t)(sizeof(text) - 1))

/* A str's UTF-8 bytes appended (cached by the str for non-ASCII text). */
static int
buf_add_str(Buf *b, PyObject *s)
{
    Py_ssize_t len;
    const char *utf8 = PyUnicode_AsUTF8AndSize(s, &len);
    return utf8 == NULL ? -1 : buf_add(b, utf8, len);
}

static inline int
buf_add_bytes(Buf *b, PyObject *bytes)
{
    return buf_add(b, PyBytes_AS_STRING(bytes), PyBytes_GET_SIZE(bytes));
}

/* -- the values ------------------------------------------------------------------------ */

/* json.encoder.encode_basestring of the text: quotes, backslashes and control
 * characters escaped, everything else (non-ASCII included) as it is. */
static int
write_string(Buf *b, const unsigned char *c, Py_ssize_t n)
{
    static const char hex[] = "0123456789abcdef";
    /* at most 6 bytes per byte, and the quotes */
    if (b->len + 6 * n + 2 > b->cap && buf_grow(b, 6 * n + 2) < 0) {
        return -1;
    }
    char *out = b->data + b->len;
    *out++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char ch = c[i];
        if (ch >= 0x20 && ch != '"' && ch != '\\') {
            *out++ = (char)ch;
            continue;
        }
        *out++ = '\\';
        switch (ch) {
        case '"': *out++ = '"'; break;
        case '\\': *out++ = '\\'; break;
        case '\b': *out++ = 'b'; break;
        case '\f': *out++ = 'f'; break;
        case '\n': *out++ = 'n'; break;
        case '\r': *out++ = 'r'; break;
        case '\t': *out++ = 't'; break;
        default:
            *out++ = 'u';
            *out++ = '0';
            *out++ = '0';
            *out++ = hex[ch >> 4];
            *out++ = hex[ch & 15];
        }
    }
    *out++ = '"';
    b->len = out - b->data;
    return 0;
}

/* Whether PostgreSQL's float text is already what Java's Float/Double.toString writes
 * (serde/_render.c's java_plain_float, on bytes). */
static int
java_plain_float(const unsigned char *c, Py_ssize_t len)
{
    Py_ssize_t i = 0, point = -1;
    if (len > 0 && c[0] == '-') {
        i = 1;
    }
    Py_ssize_t start = i;
    for (; i < len; i++) {
        if (c[i] == '.' && point < 0) {
            point = i;
        }
        else if (c[i] < '0' || c[i] > '9') {
            return 0;
        }
    }
    Py_ssize_t whole = point - start;
    if (point < 0 || point == len - 1 || whole < 1 || whole > 7) {
        return 0;
    }
    if (c[start] != '0') {
        return 1;
    }
    if (whole != 1) {
        return 0;
    }
    for (i = point + 1; i < len && i <= point + 3; i++) {
        if (c[i] != '0') {
            return 1;
        }
    }
    return 0;
}

/* Whether PostgreSQL's float text is a whole number that Java writes as the text and
 * ".0" (json_values._java_notation): "0", or 1 to 7 digits without a leading zero,
 * after an optional minus sign (|x| < 1e7). */
static int
java_whole_float(const unsigned char *c, Py_ssize_t len)
{
    Py_ssize_t start = len > 0 && c[0] == '-' ? 1 : 0, digits = len - start;
    if (digits < 1 || digits > 7 || (c[start] == '0' && digits != 1)) {
        return 0;
    }
    for (Py_ssize_t i = start; i < len; i++) {
        if (c[i] < '0' || c[i] > '9') {
            return 0;
        }
    }
    return 1;
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

/* numeric(p, s) in precise mode (serde/_render.c's decimal_text, on bytes): 1 written,
 * 0 for another shape. */
static int
write_decimal(Buf *b, const unsigned char *c, Py_ssize_t len, int scale)
{
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if (scale <= 0 || len <= scale || c[len - scale - 1] != '.' || c[len - 1] < '0' ||
        c[len - 1] > '9') {
        return 0;
    }
    Py_ssize_t i = c[0] == '-' ? 1 : 0;
    int negative = (int)i, digits = 0;
    unsigned __int128 u = 0;
    for (; i < len; i++) {
        if (i == len - scale - 1) {
            continue; /* the point */
        }
        if (c[i] < '0' || c[i] > '9' || ++digits > 38) {
            return 0;
        }
        u = u * 10 + (unsigned)(c[i] - '0');
    }
    unsigned char raw[17];
    int n;
    unsigned __int128 t = u;
    if (negative && u != 0) {
        unsigned __int128 m = u - 1; /* ~(-u) */
        n = (bit_length(m) >> 3) + 1;
        t = ~m;
    }
    else {
        n = (bit_length(u) >> 3) + 1;
    }
    for (int k = 0; k < n; k++) {
        raw[n - 1 - k] = (unsigned char)(t >> (8 * k));
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
    return buf_add(b, out, o) < 0 ? -1 : 1;
}

static int
all_ascii(const unsigned char *c, Py_ssize_t len)
{
    for (Py_ssize_t i = 0; i < len; i++) {
        if (c[i] >= 0x80) {
            return 0;
        }
    }
    return 1;
}

/* timestamptz as ZonedTimestamp with *width* fraction digits, for the two shapes a UTC
 * session prints most (serde/_render.c's zoned_text, on ASCII bytes only: the Python
 * code slices characters). */
static int
write_zoned(Buf *b, const unsigned char *c, Py_ssize_t len, int width)
{
    char out[48];
    Py_ssize_t o = 0;
    if (width > 9 || !all_ascii(c, len)) {
        return 0;
    }
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
    }
    else if (len == 29 && width == 6 && memcmp(c + 26, "+00", 3) == 0 && c[10] == ' ') {
        out[o++] = '"';
        memcpy(out + o, c, 10);
        o += 10;
        out[o++] = 'T';
        memcpy(out + o, c + 11, 15);
        o += 15;
    }
    else {
        return 0;
    }
    out[o++] = 'Z';
    out[o++] = '"';
    return buf_add(b, out, o) < 0 ? -1 : 1;
}

/* 'YYYY-MM-DD' -> days since 1970-01-01 (serde/_render.c's date_text). */
static int
write_date(Buf *b, const unsigned char *c, Py_ssize_t len)
{
    static const int digit_at[] = {0, 1, 2, 3, 5, 6, 8, 9};
    if (len != 10 || c[4] != '-' || c[7] != '-') {
        return 0;
    }
    for (size_t k = 0; k < sizeof(digit_at) / sizeof(digit_at[0]); k++) {
        if (c[digit_at[k]] < '0' || c[digit_at[k]] > '9') {
            return 0;
        }
    }
    long year = (c[0] - '0') * 1000 + (c[1] - '0') * 100 + (c[2] - '0') * 10 + (c[3] - '0');
    int month = (c[5] - '0') * 10 + (c[6] - '0');
    int day = (c[8] - '0') * 10 + (c[9] - '0');
    if (month < 1 || month > 12 || day < 1 || day > 31) {
        return 0;
    }
    if (month <= 2) {
        year -= 1;
    }
    long era = (year >= 0 ? year : year - 399) / 400;
    long year_of_era = year - era * 400;
    long day_of_year = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1;
    long day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    char out[24];
    int o = snprintf(out, sizeof(out), "%ld", era * 146097 + day_of_era - 719468);
    return buf_add(b, out, o) < 0 ? -1 : 1;
}

/* -- the writer ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Py_ssize_t n_columns;
    unsigned char *kinds;
    unsigned char *params;
    PyObject *functions;    /* tuple: callable (or None for RAW, STRING, BOOL) */
    PyObject *names;        /* tuple of bytes: '{"id":' for the first column, ',"x":' */
    PyObject *nulls;        /* tuple of bytes: JSON text for SQL NULL */
    PyObject *placeholders; /* tuple of bytes: JSON text for an unchanged TOASTed value */
    PyObject *memos;        /* tuple: dict (text -> JSON text) or None, per column */
    Py_ssize_t n_keys;
    Py_ssize_t *key_indexes;
    PyObject *key_names;    /* tuple of bytes, like names, for the key's columns */
    int delete;             /* the row is the "before" (else the "after") */
    int tombstone;          /* a delete's line is followed by its tombstone's */
} Writer;

#define WRITER_OBJECTS(X) X(functions) X(names) X(nulls) X(placeholders) X(memos) X(key_names)

static int
Writer_traverse(Writer *self, visitproc visit, void *arg)
{
#define VISIT(field) Py_VISIT(self->field);
    WRITER_OBJECTS(VISIT)
#undef VISIT
    return 0;
}

static int
Writer_clear(Writer *self)
{
#define CLEAR(field) Py_CLEAR(self->field);
    WRITER_OBJECTS(CLEAR)
#undef CLEAR
    return 0;
}

static void
Writer_dealloc(Writer *self)
{
    PyObject_GC_UnTrack(self);
    Writer_clear(self);
    PyMem_Free(self->kinds);
    PyMem_Free(self->params);
    PyMem_Free(self->key_indexes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The JSON text of functions[i] applied to the value, appended (memoized per column). */
static int
write_function(Writer *self, Buf *b, Py_ssize_t i, const char *c, Py_ssize_t len)
{
    PyObject *memo = PyTuple_GET_ITEM(self->memos, i), *key = NULL, *result;
    if (memo != Py_None) {
        if ((key = PyBytes_FromStringAndSize(c, len)) == NULL) {
            return -1;
        }
        result = PyDict_GetItemWithError(memo, key);
        if (result != NULL) {
            Py_DECREF(key);
            return buf_add_str(b, result);
        }
        if (PyErr_Occurred()) {
            Py_DECREF(key);
            return -1;
        }
    }
    PyObject *text = PyUnicode_DecodeUTF8(c, len, NULL);
    if (text == NULL) {
        Py_XDECREF(key);
        return -1;
    }
    result = PyObject_CallOneArg(PyTuple_GET_ITEM(self->functions, i), text);
    Py_DECREF(text);
    if (result != NULL && !PyUnicode_CheckExact(result)) { /* as an f-string would */
        Py_SETREF(result, PyObject_Format(result, NULL));
    }
    int status = -1;
    if (result != NULL && (status = buf_add_str(b, result)) == 0 && key != NULL) {
        if (PyDict_GET_SIZE(memo) >= MEMO_SIZE) {
            PyDict_Clear(memo);
        }
        status = PyDict_SetItem(memo, key, result);
    }
    Py_XDECREF(result);
    Py_XDECREF(key);
    return status;
}

/* Column i's JSON text for the text value *c*, appended. */
static int
write_value(Writer *self, Buf *b, Py_ssize_t i, const unsigned char *c, Py_ssize_t len)
{
    int done = 0;
    switch (self->kinds[i]) {
    case K_RAW:
        return buf_add(b, (const char *)c, len);
    case K_STRING:
        return write_string(b, c, len);
    case K_BOOL:
        if (len == 1 && c[0] == 't') {
            return ADD_LITERAL(b, "true");
        }
        return ADD_LITERAL(b, "false");
    case K_FLOAT:
        if (java_plain_float(c, len)) {
            return buf_add(b, (const char *)c, len);
        }
        if (java_whole_float(c, len)) {
            return buf_add(b, (const char *)c, len) < 0 ? -1 : ADD_LITERAL(b, ".0");
        }
        break;
    case K_DECIMAL:
        done = write_decimal(b, c, len, self->params[i]);
        break;
    case K_ZONED:
        done = write_zoned(b, c, len, self->params[i]);
        break;
    case K_DATE:
        done = write_date(b, c, len);
        break;
    }
    if (done != 0) {
        return done < 0 ? -1 : 0;
    }
    return write_function(self, b, i, (const char *)c, len);
}

static PyObject *
fallback(const char *why)
{
    PyErr_SetString(PyExc_ValueError, why);
    return NULL;
}

#define SMALL_COLUMNS 64

/* The key's JSON text from the row's value ranges. */
static int
write_key(Writer *self, Buf *out, const Buf *row, const Py_ssize_t *ends)
{
    if (self->n_keys == 0) {
        return ADD_LITERAL(out, "null");
    }
    for (Py_ssize_t j = 0; j < self->n_keys; j++) {
        Py_ssize_t i = self->key_indexes[j];
        Py_ssize_t start = i == 0 ? 0 : ends[i - 1];
        if (buf_add_bytes(out, PyTuple_GET_ITEM(self->key_names, j)) < 0 ||
            buf_add(out, row->data + start, ends[i] - start) < 0) {
            return -1;
        }
    }
    return ADD_LITERAL(out, "}");
}

static PyObject *
write_line(Writer *self, PyObject *data, PyObject *lsn, PyObject *parts)
{
    if (!PyBytes_Check(data)) {
        return fallback("not bytes");
    }
    if (!PyTuple_CheckExact(parts) || PyTuple_GET_SIZE(parts) != 3) {
        return fallback("parts must be (head, middle, tail)");
    }
    const unsigned char *c = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t size = PyBytes_GET_SIZE(data), n = self->n_columns;
    if (size < 8 || ((Py_ssize_t)c[6] << 8 | c[7]) != n) {
        return fallback("another column count");
    }
    unsigned long long lsn_value = PyLong_AsUnsignedLongLong(lsn);
    if (lsn_value == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t small_ends[SMALL_COLUMNS];
    Py_ssize_t *ends = n <= SMALL_COLUMNS ? small_ends
                                          : PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)n);
    if (ends == NULL) {
        return PyErr_NoMemory();
    }
    PyObject *result = NULL;
    Buf row, out;
    buf_init(&row);
    buf_init(&out);
    /* The columns' JSON texts one after the other; column i's ends at ends[i]. */
    Py_ssize_t pos = 8;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (pos >= size) {
            fallback("truncated");
            goto done;
        }
        unsigned char k = c[pos];
        if (k == 't') {
            if (pos + 5 > size) {
                fallback("truncated");
                goto done;
            }
            Py_ssize_t len = (Py_ssize_t)((unsigned long)c[pos + 1] << 24 |
                                          (unsigned long)c[pos + 2] << 16 |
                                          (unsigned long)c[pos + 3] << 8 | c[pos + 4]);
            if (len > size - pos - 5) {
                fallback("truncated");
                goto done;
            }
            if (write_value(self, &row, i, c + pos + 5, len) < 0) {
                goto done;
            }
            pos += 5 + len;
        }
        else if (k == 'n') {
            if (buf_add_bytes(&row, PyTuple_GET_ITEM(self->nulls, i)) < 0) {
                goto done;
            }
            pos += 1;
        }
        else if (k == 'u') {
            if (buf_add_bytes(&row, PyTuple_GET_ITEM(self->placeholders, i)) < 0) {
                goto done;
            }
            pos += 1;
        }
        else {
            fallback("not a text value");
            goto done;
        }
        ends[i] = row.len;
    }
    if (pos != size) {
        fallback("bytes after the columns");
        goto done;
    }
    char digits[24];
    int digits_len = snprintf(digits, sizeof(digits), "%llu", lsn_value);
    if (ADD_LITERAL(&out, "{\"key\":") < 0 || write_key(self, &out, &row, ends) < 0 ||
        ADD_LITERAL(&out, ",\"value\":{\"before\":") < 0 ||
        (!self->delete && ADD_LITERAL(&out, "null,\"after\":") < 0)) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t start = i == 0 ? 0 : ends[i - 1];
        if (buf_add_bytes(&out, PyTuple_GET_ITEM(self->names, i)) < 0 ||
            buf_add(&out, row.data + start, ends[i] - start) < 0) {
            goto done;
        }
    }
    if (ADD_LITERAL(&out, "}") < 0 ||
        (self->delete && ADD_LITERAL(&out, ",\"after\":null") < 0) ||
        ADD_LITERAL(&out, ",\"source\":") < 0 ||
        buf_add_str(&out, PyTuple_GET_ITEM(parts, 0)) < 0 ||
        buf_add(&out, digits, digits_len) < 0 ||
        buf_add_str(&out, PyTuple_GET_ITEM(parts, 1)) < 0 ||
        buf_add(&out, digits, digits_len) < 0 ||
        buf_add_str(&out, PyTuple_GET_ITEM(parts, 2)) < 0) {
        goto done;
    }
    if (self->delete && self->tombstone && self->n_keys > 0 &&
        (ADD_LITERAL(&out, "{\"key\":") < 0 || write_key(self, &out, &row, ends) < 0 ||
         ADD_LITERAL(&out, ",\"value\":null}\n") < 0)) {
        goto done;
    }
    /* Strict: a value that is not UTF-8 fails here, as its decode fails in Python. */
    result = PyUnicode_DecodeUTF8(out.data, out.len, NULL);
done:
    buf_free(&row);
    buf_free(&out);
    if (ends != small_ends) {
        PyMem_Free(ends);
    }
    return result;
}

static PyObject *
Writer_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                  PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 4 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "LineWriter takes (data, text, lsn, parts)");
        return NULL;
    }
    return write_line((Writer *)callable, args[0], args[2], args[3]);
}

static int
check_tuple(PyObject *tuple, Py_ssize_t size, PyTypeObject *type, const char *what)
{
    if (!PyTuple_CheckExact(tuple) || PyTuple_GET_SIZE(tuple) != size) {
        PyErr_Format(PyExc_ValueError, "%s must be a tuple of %zd, got %R", what, size, tuple);
        return -1;
    }
    for (Py_ssize_t i = 0; type != NULL && i < size; i++) {
        if (!Py_IS_TYPE(PyTuple_GET_ITEM(tuple, i), type)) {
            PyErr_Format(PyExc_TypeError, "%s[%zd] must be %s, got %R", what, i,
                         type->tp_name, PyTuple_GET_ITEM(tuple, i));
            return -1;
        }
    }
    return 0;
}

static PyObject *
Writer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"kinds", "params", "functions", "names", "nulls",
                               "placeholders", "memos", "key_indexes", "key_names",
                               "delete", "tombstone", NULL};
    PyObject *kinds, *params, *functions, *names, *nulls, *placeholders, *memos,
        *key_indexes, *key_names;
    int delete, tombstone;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "SSOOOOOOOpp:LineWriter", keywords,
                                     &kinds, &params, &functions, &names, &nulls,
                                     &placeholders, &memos, &key_indexes, &key_names,
                                     &delete, &tombstone)) {
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(kinds);
    if (n == 0 || n > 0xffff || PyBytes_GET_SIZE(params) != n) {
        PyErr_Format(PyExc_ValueError, "kinds and params must be bytes of the same length "
                     "1-65535 (one per column), got %zd and %zd", n, PyBytes_GET_SIZE(params));
        return NULL;
    }
    if (check_tuple(functions, n, NULL, "functions") < 0 ||
        check_tuple(names, n, &PyBytes_Type, "names") < 0 ||
        check_tuple(nulls, n, &PyBytes_Type, "nulls") < 0 ||
        check_tuple(placeholders, n, &PyBytes_Type, "placeholders") < 0 ||
        check_tuple(memos, n, NULL, "memos") < 0 || !PyTuple_CheckExact(key_indexes) ||
        check_tuple(key_names, PyTuple_GET_SIZE(key_indexes), &PyBytes_Type,
                    "key_names") < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "key_indexes must be a tuple of int");
        }
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char kind = (unsigned char)PyBytes_AS_STRING(kinds)[i];
        PyObject *memo = PyTuple_GET_ITEM(memos, i);
        if (kind > K_LAST) {
            PyErr_Format(PyExc_ValueError, "kinds[%zd] is %d, not a column kind (0-%d)", i,
                         (int)kind, K_LAST);
            return NULL;
        }
        if (kind >= K_FLOAT && !PyCallable_Check(PyTuple_GET_ITEM(functions, i))) {
            PyErr_Format(PyExc_TypeError, "functions[%zd] must be callable", i);
            return NULL;
        }
        if (memo != Py_None && !PyDict_CheckExact(memo)) {
            PyErr_Format(PyExc_TypeError, "memos[%zd] must be a dict or None", i);
            return NULL;
        }
    }
    Py_ssize_t n_keys = PyTuple_GET_SIZE(key_indexes);
    Writer *self = (Writer *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->n_columns = n;
    self->n_keys = n_keys;
    self->delete = delete;
    self->tombstone = tombstone;
    self->kinds = PyMem_Malloc((size_t)n);
    self->params = PyMem_Malloc((size_t)n);
    self->key_indexes = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n_keys ? n_keys : 1));
    if (self->kinds == NULL || self->params == NULL || self->key_indexes == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    memcpy(self->kinds, PyBytes_AS_STRING(kinds), (size_t)n);
    memcpy(self->params, PyBytes_AS_STRING(params), (size_t)n);
    for (Py_ssize_t j = 0; j < n_keys; j++) {
        Py_ssize_t index = PyNumber_AsSsize_t(PyTuple_GET_ITEM(key_indexes, j),
                                              PyExc_OverflowError);
        if (index == -1 && PyErr_Occurred()) {
            Py_DECREF(self);
            return NULL;
        }
        if (index < 0 || index >= n) {
            PyErr_Format(PyExc_ValueError, "key_indexes[%zd] is %zd, not a column (0-%zd)",
                         j, index, n - 1);
            Py_DECREF(self);
            return NULL;
        }
        self->key_indexes[j] = index;
    }
#define KEEP(field) self->field = Py_NewRef(field);
    WRITER_OBJECTS(KEEP)
#undef KEEP
    self->vectorcall = Writer_vectorcall;
    return (PyObject *)self;
}

static PyObject *
Writer_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    return PyVectorcall_Call(self, args, kwargs);
}

PyDoc_STRVAR(Writer_doc,
"LineWriter(kinds, params, functions, names, nulls, placeholders, memos, key_indexes,\n"
"           key_names, delete, tombstone)\n"
"--\n\n"
"Writes the Debezium JSON line of one table schema's pgoutput row messages of one\n"
"operation: ``writer(data, text, lsn, (head, middle, tail)) -> line``. Built by\n"
"``tidemark.source.postgres.pgoutput_json.FusedCodec``.");

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tidemark.source.postgres._pgoutput_line.LineWriter",
    .tp_basicsize = sizeof(Writer),
    .tp_dealloc = (destructor)Writer_dealloc,
    .tp_vectorcall_offset = offsetof(Writer, vectorcall),
    .tp_call = Writer_call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = Writer_doc,
    .tp_traverse = (traverseproc)Writer_traverse,
    .tp_clear = (inquiry)Writer_clear,
    .tp_new = Writer_new,
};

static struct PyModuleDef line_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tidemark.source.postgres._pgoutput_line",
    .m_doc = "pgoutput row messages to Debezium JSON lines, compiled (see pgoutput_json).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__pgoutput_line(void)
{
    if (PyType_Ready(&WriterType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&line_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "LineWriter", (PyObject *)&WriterType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
