/*
 * tidemark.source.mariadb._row_image: the rows of a binlog rows event with full row
 * images, decoded to tidemark's wire values, compiled.
 *
 * The same values as row_decoder's Python readers, which stay the reference (and the
 * fallback where this module is not built); the tests hold the two to identical output
 * over every column kind. Why C: decoding the packed images was half of `tidemark
 * capture`'s time on MariaDB in Python, mostly interpreter overhead around a few bytes
 * of arithmetic per value.
 *
 * A plan is a tuple with one entry per column: (kind, a, b, nullable, reader). Kinds:
 *   FALLBACK   reader(data, pos) -> (value, pos after it): the Python reader
 *   INT        a = width in bytes (1, 2, 3, 4, 8), b = unsigned (8 bytes: always signed,
 *              as Debezium's default bigint.unsigned.handling.mode=long)
 *   DOUBLE     repr() of the little-endian double
 *   DECIMAL    MySQL's packed decimal, a = precision, b = scale
 *   DATETIME2  a = fractional digits
 *   TIMESTAMP2 a = fractional digits
 *   TIME2      a = fractional digits
 *   DATE       the 3-byte day number
 *   YEAR       1 byte, 0 or years since 1900
 *   UTF8       a = bytes of the length prefix; the text decoded as UTF-8
 *   BYTES      a = bytes of the length prefix; the bytes
 * Zero dates give None in a nullable column and the epoch in a NOT NULL one.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum {
    K_FALLBACK = 0, K_INT = 1, K_DOUBLE = 2, K_DECIMAL = 3, K_DATETIME2 = 4,
    K_TIMESTAMP2 = 5, K_TIME2 = 6, K_DATE = 7, K_YEAR = 8, K_UTF8 = 9, K_BYTES = 10,
    K_LAST = 10
};

enum { OP_CREATE = 0, OP_UPDATE = 1, OP_DELETE = 2 };

typedef struct {
    int kind;
    int a;
    int b;
    int nullable;
    PyObject *reader;  /* borrowed from the plan tuple */
    Py_ssize_t width;  /* bytes of a fixed-width kind's value; 0: length-prefixed or
                        * the Python reader */
} Column;

static const int DECIMAL_BYTES[10] = {0, 1, 1, 2, 2, 3, 3, 4, 4, 4};

static PyObject *
short_image(Py_ssize_t pos)
{
    PyErr_Format(PyExc_ValueError, "row image ends early at byte %zd", pos);
    return NULL;
}

static uint64_t
big_endian(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

static uint64_t
little_endian(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* A str of ASCII text (the text is known to be ASCII: no check). */
static PyObject *
ascii(const char *text, Py_ssize_t size)
{
    PyObject *s = PyUnicode_New(size, 127);
    if (s != NULL)
        memcpy(PyUnicode_1BYTE_DATA(s), text, (size_t)size);
    return s;
}

/* Writes the decimal digits of v, at least `width` of them (zero-padded), at out;
 * returns the characters written. snprintf costs several times more per value. */
static int
digits(char *out, uint64_t v, int width)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n < width)
        tmp[n++] = '0';
    for (int i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    return n;
}

static int
signed_digits(char *out, int64_t v)
{
    if (v >= 0)
        return digits(out, (uint64_t)v, 1);
    out[0] = '-';
    return 1 + digits(out + 1, (uint64_t)0 - (uint64_t)v, 1);
}

/* "YYYY-MM-DD" (year zero-padded to 4 digits, wider when larger). */
static int
date_text(char *out, int64_t year, int64_t month, int64_t day)
{
    int n = year < 0 ? signed_digits(out, year) : digits(out, (uint64_t)year, 4);
    out[n++] = '-';
    n += digits(out + n, (uint64_t)month, 2);
    out[n++] = '-';
    return n + digits(out + n, (uint64_t)day, 2);
}

/* "HH:MM:SS" */
static int
clock_text(char *out, int64_t hour, int64_t minute, int64_t second)
{
    int n = digits(out, (uint64_t)hour, 2);
    out[n++] = ':';
    n += digits(out + n, (uint64_t)minute, 2);
    out[n++] = ':';
    return n + digits(out + n, (uint64_t)second, 2);
}

static int
fraction_size(int fsp)
{
    return (fsp + 1) / 2;
}

/* Microseconds of a temporal value's fraction (big-endian, size by fsp). */
static long
fraction_micros(const unsigned char *p, int fsp)
{
    if (fsp <= 0)
        return 0;
    if (fsp <= 2)
        return (long)p[0] * 10000;
    if (fsp <= 4)
        return (long)big_endian(p, 2) * 100;
    return (long)big_endian(p, 3);
}

/* ".ffffff" cut to fsp digits, or nothing; returns the characters written. */
static int
fraction_text(char *out, long micros, int fsp)
{
    if (fsp <= 0)
        return 0;
    char six[24];
    digits(six, (uint64_t)micros, 6);
    out[0] = '.';
    int n = fsp > 6 ? 6 : fsp;
    memcpy(out + 1, six, (size_t)n);
    return n + 1;
}

static PyObject *
zero_date(const Column *c, const char *epoch_text)
{
    if (c->nullable)
        Py_RETURN_NONE;
    return ascii(epoch_text, (Py_ssize_t)strlen(epoch_text));
}

static Py_ssize_t
decimal_size(int precision, int scale)
{
    int whole = precision - scale;
    return (Py_ssize_t)(whole / 9 * 4 + DECIMAL_BYTES[whole % 9] + scale / 9 * 4
                        + DECIMAL_BYTES[scale % 9]);
}

/* The decimal's text into *out* (room for 200), returns its length; -1 with an
 * exception for a decimal wider than MariaDB allows. */
static int
decimal_chars(const unsigned char *src, int precision, int scale, char *out)
{
    unsigned char raw[64];
    Py_ssize_t size = decimal_size(precision, scale);
    if (size > (Py_ssize_t)sizeof raw) {
        PyErr_Format(PyExc_ValueError, "decimal(%d, %d) is wider than MariaDB allows",
                     precision, scale);
        return -1;
    }
    memcpy(raw, src, (size_t)size);
    int negative = !(raw[0] & 0x80);
    raw[0] ^= 0x80;
    if (negative)
        for (Py_ssize_t i = 0; i < size; i++)
            raw[i] ^= 0xFF;
    int whole_digits = precision - scale;
    int full_int = whole_digits / 9, left_int = whole_digits % 9;
    int full_frac = scale / 9, left_frac = scale % 9;
    /* Digits of the whole part as zero-padded groups, then its leading zeros dropped. */
    char whole[96], text[200];
    int w = 0, at = 0;
    if (DECIMAL_BYTES[left_int]) {
        w += digits(whole + w, big_endian(raw, DECIMAL_BYTES[left_int]), left_int);
        at = DECIMAL_BYTES[left_int];
    }
    for (int i = 0; i < full_int; i++, at += 4)
        w += digits(whole + w, big_endian(raw + at, 4), 9);
    int start = 0;
    while (start < w - 1 && whole[start] == '0')
        start++;
    int nonzero = 0;
    for (int i = start; i < w; i++)
        nonzero |= whole[i] != '0';
    int t = 1; /* text[0] is kept for the sign */
    if (w == 0) {
        text[t++] = '0';
    } else {
        memcpy(text + t, whole + start, (size_t)(w - start));
        t += w - start;
    }
    if (scale) {
        text[t++] = '.';
        int f0 = t;
        for (int i = 0; i < full_frac; i++, at += 4)
            t += digits(text + t, big_endian(raw + at, 4), 9);
        if (DECIMAL_BYTES[left_frac])
            t += digits(text + t, big_endian(raw + at, DECIMAL_BYTES[left_frac]), left_frac);
        for (int i = f0; i < t; i++)
            nonzero |= text[i] != '0';
    }
    if (negative && nonzero) {
        text[0] = '-';
        memcpy(out, text, (size_t)t);
        return t;
    }
    memcpy(out, text + 1, (size_t)(t - 1));
    return t - 1;
}

static PyObject *
read_decimal(const unsigned char *src, int precision, int scale)
{
    char text[200];
    int n = decimal_chars(src, precision, scale, text);
    return n < 0 ? NULL : ascii(text, n);
}

static PyObject *
read_datetime2(const unsigned char *p, const Column *c)
{
    int64_t packed = (int64_t)big_endian(p, 5) - INT64_C(0x8000000000);
    long micros = fraction_micros(p + 5, c->a);
    int64_t ymd = packed >> 17, hms = packed & 0x1FFFF;
    int64_t year_month = ymd >> 5, day = ymd & 0x1F;
    int64_t year = year_month / 13, month = year_month % 13;
    if (!month || !day)
        return zero_date(c, "1970-01-01 00:00:00");
    char out[64];
    int n = date_text(out, year, month, day);
    out[n++] = ' ';
    n += clock_text(out + n, hms >> 12, hms >> 6 & 0x3F, hms & 0x3F);
    n += fraction_text(out + n, micros, c->a);
    return ascii(out, n);
}

/* The text of a non-zero TIMESTAMP2 into *out* (room for 64); its length. */
static int timestamp2_chars(const unsigned char *p, const Column *c, char *out);

static PyObject *
read_timestamp2(const unsigned char *p, const Column *c)
{
    if (!big_endian(p, 4) && !fraction_micros(p + 4, c->a))
        return zero_date(c, "1970-01-01 00:00:00+00");
    char out[64];
    return ascii(out, timestamp2_chars(p, c, out));
}

static int
timestamp2_chars(const unsigned char *p, const Column *c, char *out)
{
    uint64_t seconds = big_endian(p, 4);
    long micros = fraction_micros(p + 4, c->a);
    /* Days to a civil date (H. Hinnant's days_from_civil, inverted): seconds are
     * unsigned 32-bit, so the date is 1970..2106 and every step stays positive. */
    int64_t days = (int64_t)(seconds / 86400), clock = (int64_t)(seconds % 86400);
    int64_t z = days + 719468, era = z / 146097, doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153;
    int64_t day = doy - (153 * mp + 2) / 5 + 1, month = mp < 10 ? mp + 3 : mp - 9;
    int64_t year = yoe + era * 400 + (month <= 2);
    int n = date_text(out, year, month, day);
    out[n++] = ' ';
    n += clock_text(out + n, clock / 3600, clock / 60 % 60, clock % 60);
    n += fraction_text(out + n, micros, c->a);
    memcpy(out + n, "+00", 3);
    return n + 3;
}

static PyObject *
read_time2(const unsigned char *p, const Column *c)
{
    int fsp = c->a;
    int64_t intpart = (int64_t)big_endian(p, 3) - 0x800000;
    int64_t packed;
    if (fsp <= 0) {
        packed = intpart * (INT64_C(1) << 24);
    } else if (fsp <= 2) {
        int64_t frac = p[3];
        if (intpart < 0 && frac) {
            intpart += 1;
            frac -= 0x100;
        }
        packed = intpart * (INT64_C(1) << 24) + frac * 10000;
    } else if (fsp <= 4) {
        int64_t frac = (int64_t)big_endian(p + 3, 2);
        if (intpart < 0 && frac) {
            intpart += 1;
            frac -= 0x10000;
        }
        packed = intpart * (INT64_C(1) << 24) + frac * 100;
    } else {
        packed = (int64_t)big_endian(p, 6) - INT64_C(0x800000000000);
    }
    const char *sign = packed < 0 ? "-" : "";
    if (packed < 0)
        packed = -packed;
    int64_t hms = packed >> 24;
    long micros = (long)(packed & 0xFFFFFF);
    char out[48];
    int n = 0;
    if (*sign)
        out[n++] = '-';
    n += clock_text(out + n, hms >> 12 & 0x3FF, hms >> 6 & 0x3F, hms & 0x3F);
    n += fraction_text(out + n, micros, fsp);
    return ascii(out, n);
}

static PyObject *
read_date(const unsigned char *p, const Column *c)
{
    uint64_t value = little_endian(p, 3);
    uint64_t day = value & 0x1F, month = value >> 5 & 0xF, year = value >> 9;
    if (!month || !day)
        return zero_date(c, "1970-01-01");
    char out[32];
    return ascii(out, date_text(out, (int64_t)year, (int64_t)month, (int64_t)day));
}

static PyObject *
read_int(const unsigned char *p, const Column *c)
{
    char out[24];
    int n;
    uint64_t raw = little_endian(p, c->a);
    if (c->a == 8) {
        n = signed_digits(out, (int64_t)raw);
    } else if (c->b) {
        n = digits(out, raw, 1);
    } else {
        int shift = 64 - 8 * c->a;
        n = signed_digits(out, (int64_t)(raw << shift) >> shift); /* sign-extend */
    }
    return ascii(out, n);
}

/* Reads one non-null value at *pos, advancing it; NULL with an exception on error. */
static PyObject *
read_value(PyObject *data, const unsigned char *buf, Py_ssize_t size, Py_ssize_t *pos,
           const Column *c)
{
    Py_ssize_t at = *pos;
    const unsigned char *p = buf + at;
    PyObject *value;
    if (c->width) {
        if (at + c->width > size)
            return short_image(at);
        switch (c->kind) {
        case K_INT:
            value = read_int(p, c);
            break;
        case K_DOUBLE: {
            double d;
            memcpy(&d, p, 8); /* little-endian hosts only: checked at import */
            char *text = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
            if (text == NULL)
                return NULL;
            value = ascii(text, (Py_ssize_t)strlen(text));
            PyMem_Free(text);
            break;
        }
        case K_DECIMAL:
            value = read_decimal(p, c->a, c->b);
            break;
        case K_DATETIME2:
            value = read_datetime2(p, c);
            break;
        case K_TIMESTAMP2:
            value = read_timestamp2(p, c);
            break;
        case K_TIME2:
            value = read_time2(p, c);
            break;
        case K_DATE:
            value = read_date(p, c);
            break;
        default: /* K_YEAR */
            if (p[0]) {
                char out[8];
                value = ascii(out, digits(out, (uint64_t)p[0] + 1900, 1));
            } else {
                value = ascii("0", 1);
            }
        }
        if (value != NULL)
            *pos = at + c->width;
        return value;
    }
    if (c->kind == K_UTF8 || c->kind == K_BYTES) {
        if (at + c->a > size)
            return short_image(at);
        Py_ssize_t length = (Py_ssize_t)little_endian(p, c->a);
        if (at + c->a + length > size)
            return short_image(at);
        const char *start = (const char *)p + c->a;
        value = c->kind == K_UTF8 ? PyUnicode_DecodeUTF8(start, length, "strict")
                                  : PyBytes_FromStringAndSize(start, length);
        if (value != NULL)
            *pos = at + c->a + length;
        return value;
    }
    PyObject *result = PyObject_CallFunction(c->reader, "On", data, at);
    if (result == NULL)
        return NULL;
    Py_ssize_t after;
    if (!PyTuple_Check(result) || PyTuple_GET_SIZE(result) != 2
            || (after = PyLong_AsSsize_t(PyTuple_GET_ITEM(result, 1))) < 0) {
        Py_DECREF(result);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "a reader returns (value, position)");
        return NULL;
    }
    value = Py_NewRef(PyTuple_GET_ITEM(result, 0));
    Py_DECREF(result);
    *pos = after;
    return value;
}

/* Bytes of a value of *c*'s kind when they are fixed, else 0. */
static Py_ssize_t
fixed_width(const Column *c)
{
    switch (c->kind) {
    case K_INT:
        return c->a;
    case K_DOUBLE:
        return 8;
    case K_DECIMAL:
        return decimal_size(c->a, c->b);
    case K_DATETIME2:
        return 5 + fraction_size(c->a);
    case K_TIMESTAMP2:
        return 4 + fraction_size(c->a);
    case K_TIME2:
        return 3 + fraction_size(c->a);
    case K_DATE:
        return 3;
    case K_YEAR:
        return 1;
    default:
        return 0;
    }
}

static PyObject *
read_image(PyObject *data, const unsigned char *buf, Py_ssize_t size, Py_ssize_t *pos,
           const Column *columns, Py_ssize_t width)
{
    Py_ssize_t null_size = (width + 7) >> 3;
    if (*pos + null_size > size)
        return short_image(*pos);
    const unsigned char *nulls = buf + *pos;
    *pos += null_size;
    PyObject *image = PyTuple_New(width);
    if (image == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < width; i++) {
        PyObject *value;
        if (columns[i].nullable && nulls[i >> 3] >> (i & 7) & 1) {
            value = Py_NewRef(Py_None);
        } else {
            value = read_value(data, buf, size, pos, &columns[i]);
            if (value == NULL) {
                Py_DECREF(image);
                return NULL;
            }
        }
        PyTuple_SET_ITEM(image, i, value);
    }
    return image;
}

static int
parse_plan(PyObject *plan, Column **out, Py_ssize_t *width)
{
    if (!PyTuple_Check(plan)) {
        PyErr_SetString(PyExc_TypeError, "plan must be a tuple");
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(plan);
    Column *columns = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Column));
    if (columns == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *entry = PyTuple_GET_ITEM(plan, i);
        Column *c = &columns[i];
        if (!PyArg_ParseTuple(entry, "iiipO", &c->kind, &c->a, &c->b, &c->nullable,
                              &c->reader)) {
            PyMem_Free(columns);
            return -1;
        }
        int bad = c->kind < 0 || c->kind > K_LAST
                  || (c->kind == K_FALLBACK && !PyCallable_Check(c->reader))
                  || (c->kind == K_INT && c->a != 1 && c->a != 2 && c->a != 3 && c->a != 4
                      && c->a != 8)
                  || ((c->kind == K_UTF8 || c->kind == K_BYTES) && (c->a < 1 || c->a > 4))
                  || (c->kind == K_DECIMAL && (c->a < 1 || c->a > 65 || c->b < 0
                                               || c->b > c->a))
                  || ((c->kind == K_DATETIME2 || c->kind == K_TIMESTAMP2
                       || c->kind == K_TIME2) && (c->a < 0 || c->a > 6));
        if (bad) {
            PyMem_Free(columns);
            PyErr_Format(PyExc_ValueError, "plan entry %zd is not a column plan", i);
            return -1;
        }
        c->width = fixed_width(c);
    }
    *out = columns;
    *width = n;
    return 0;
}

PyDoc_STRVAR(decode_rows_doc,
"decode_rows(data, pos, op, plan) -> list of (before, after)\n\n"
"The rows of a rows event whose images hold every column, from *pos* to the end of\n"
"*data*; *op* is 0 (insert: (None, after)), 1 (update) or 2 (delete: (before, None)).");

static PyObject *
decode_rows(PyObject *module, PyObject *args)
{
    PyObject *data, *plan;
    Py_ssize_t pos;
    int op;
    if (!PyArg_ParseTuple(args, "SniO!:decode_rows", &data, &pos, &op, &PyTuple_Type,
                          &plan))
        return NULL;
    if (op < OP_CREATE || op > OP_DELETE || pos < 0) {
        PyErr_SetString(PyExc_ValueError, "op must be 0, 1 or 2 and pos not negative");
        return NULL;
    }
    Column *columns;
    Py_ssize_t width;
    if (parse_plan(plan, &columns, &width) < 0)
        return NULL;
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t size = PyBytes_GET_SIZE(data);
    PyObject *rows = PyList_New(0);
    if (rows == NULL)
        goto fail;
    while (pos < size) {
        PyObject *first = read_image(data, buf, size, &pos, columns, width);
        if (first == NULL)
            goto fail;
        PyObject *second = NULL;
        if (op == OP_UPDATE) {
            second = read_image(data, buf, size, &pos, columns, width);
            if (second == NULL) {
                Py_DECREF(first);
                goto fail;
            }
        }
        PyObject *row;
        if (op == OP_CREATE)
            row = PyTuple_Pack(2, Py_None, first);
        else if (op == OP_UPDATE)
            row = PyTuple_Pack(2, first, second);
        else
            row = PyTuple_Pack(2, first, Py_None);
        Py_DECREF(first);
        Py_XDECREF(second);
        if (row == NULL || PyList_Append(rows, row) < 0) {
            Py_XDECREF(row);
            goto fail;
        }
        Py_DECREF(row);
    }
    PyMem_Free(columns);
    return rows;
fail:
    PyMem_Free(columns);
    Py_XDECREF(rows);
    return NULL;
}

/* -- Debezium JSON lines straight from the images ----------------------------------
 * For a table whose every column has one of the J_ kinds below, the lines of a rows
 * event are written here from the packed images, with no Python object per value: the
 * same text the decoder's value followed by tidemark.serde._render's column kind writes
 * (the comment of each kind names the two), computed from the same characters. A value
 * of another shape than those two handle in C, a short image or text that is not
 * UTF-8 give None: the caller then decodes and renders the event the usual way (which
 * writes the same, or raises the usual error). Twin: json_lines.PythonRowLines over
 * RowDecoder's values; the tests hold this to it. */
enum { J_INT = 1, J_STRING = 2, J_DATE = 3, J_ZONED = 4, J_DECIMAL = 5, J_DOUBLE = 6,
       J_LAST = 6 };

typedef struct {
    char *data;
    Py_ssize_t n, cap;
} Out;

static int
out_reserve(Out *o, Py_ssize_t extra)
{
    if (o->n + extra <= o->cap)
        return 0;
    Py_ssize_t cap = o->cap ? o->cap * 2 : 4096;
    while (cap < o->n + extra)
        cap *= 2;
    char *data = PyMem_Realloc(o->data, (size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->data = data;
    o->cap = cap;
    return 0;
}

/* Appends; the caller has reserved room. */
static inline void
out_put(Out *o, const char *s, Py_ssize_t n)
{
    memcpy(o->data + o->n, s, (size_t)n);
    o->n += n;
}

#define OUT_LITERAL(o, text) out_put((o), (text), (Py_ssize_t)(sizeof(text) - 1))

/* A str's UTF-8 and whether it is ASCII. */
typedef struct {
    const char *s;
    Py_ssize_t n;
    int ascii;
} Text;

static int
text_of(PyObject *str, Text *t)
{
    if (!PyUnicode_Check(str)) {
        PyErr_SetString(PyExc_TypeError, "the JSON pieces must be str");
        return -1;
    }
    t->s = PyUnicode_AsUTF8AndSize(str, &t->n);
    t->ascii = PyUnicode_IS_ASCII(str);
    return t->s == NULL ? -1 : 0;
}

typedef struct {
    int kind;
    int param; /* ZONED: fraction digits written; DECIMAL: the scale */
    Text name, null;
} JColumn;

/* _render.c's java_plain_float, over characters. */
static int
java_plain_chars(const char *c, Py_ssize_t len)
{
    Py_ssize_t i = 0, point = -1;
    if (len > 0 && c[0] == '-')
        i = 1;
    Py_ssize_t start = i;
    for (; i < len; i++) {
        if (c[i] == '.' && point < 0)
            point = i;
        else if (c[i] < '0' || c[i] > '9')
            return 0;
    }
    Py_ssize_t whole = point - start;
    if (point < 0 || point == len - 1 || whole < 1 || whole > 7)
        return 0;
    if (c[start] != '0')
        return 1;
    if (whole != 1)
        return 0;
    for (i = point + 1; i < len && i <= point + 3; i++)
        if (c[i] != '0')
            return 1;
    return 0;
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

/* _render.c's decimal_text, over characters: the base64 JSON string into *out* (room
 * for 32); its length, or -1 for a shape it leaves to Python. */
static int
decimal_base64(const char *c, Py_ssize_t len, int scale, char *out)
{
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if (scale <= 0 || len <= scale || c[len - scale - 1] != '.' || c[len - 1] < '0' ||
        c[len - 1] > '9')
        return -1;
    Py_ssize_t i = c[0] == '-' ? 1 : 0;
    int negative = (int)i, count = 0;
    unsigned __int128 u = 0;
    for (; i < len; i++) {
        if (i == len - scale - 1)
            continue; /* the point */
        if (c[i] < '0' || c[i] > '9' || ++count > 38)
            return -1;
        u = u * 10 + (unsigned)(c[i] - '0');
    }
    unsigned char raw[17];
    int n;
    unsigned __int128 t = u;
    if (negative && u != 0) {
        unsigned __int128 m = u - 1; /* ~(-u) */
        n = (bit_length(m) >> 3) + 1;
        t = ~m;
    } else {
        n = (bit_length(u) >> 3) + 1;
    }
    for (int k = 0; k < n; k++)
        raw[n - 1 - k] = (unsigned char)(t >> (8 * k));
    int o = 0;
    out[o++] = '"';
    for (int k = 0; k < n; k += 3) {
        unsigned int chunk = (unsigned int)raw[k] << 16;
        if (k + 1 < n)
            chunk |= (unsigned int)raw[k + 1] << 8;
        if (k + 2 < n)
            chunk |= raw[k + 2];
        out[o++] = alphabet[(chunk >> 18) & 63];
        out[o++] = alphabet[(chunk >> 12) & 63];
        out[o++] = k + 1 < n ? alphabet[(chunk >> 6) & 63] : '=';
        out[o++] = k + 2 < n ? alphabet[chunk & 63] : '=';
    }
    out[o++] = '"';
    return o;
}

/* _render.c's zoned_text, over characters: into *out* (room for 48); -1: not its
 * shape. */
static int
zoned_chars(const char *c, Py_ssize_t len, int width, char *out)
{
    int o = 0;
    if (width > 9)
        return -1;
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
        return o;
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
        return o;
    }
    return -1;
}

/* _render.c's date_text, over characters: days since 1970-01-01 into *out* (room for
 * 24); -1: not its shape. */
static int
date_days(const char *c, Py_ssize_t len, char *out)
{
    static const int digit_at[] = {0, 1, 2, 3, 5, 6, 8, 9};
    if (len != 10 || c[4] != '-' || c[7] != '-')
        return -1;
    for (size_t k = 0; k < sizeof(digit_at) / sizeof(digit_at[0]); k++)
        if (c[digit_at[k]] < '0' || c[digit_at[k]] > '9')
            return -1;
    long year = (c[0] - '0') * 1000 + (c[1] - '0') * 100 + (c[2] - '0') * 10 + (c[3] - '0');
    int month = (c[5] - '0') * 10 + (c[6] - '0');
    int day = (c[8] - '0') * 10 + (c[9] - '0');
    if (month < 1 || month > 12 || day < 1 || day > 31)
        return -1;
    if (month <= 2)
        year -= 1;
    long era = (year >= 0 ? year : year - 399) / 400;
    long year_of_era = year - era * 400;
    long day_of_year = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1;
    long day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    return signed_digits(out, era * 146097 + day_of_era - 719468);
}

/* read_int's text into *out* (room for 24); its length. */
static int
int_chars(const unsigned char *p, const Column *c, char *out)
{
    uint64_t raw = little_endian(p, c->a);
    if (c->a == 8)
        return signed_digits(out, (int64_t)raw);
    if (c->b)
        return digits(out, raw, 1);
    int shift = 64 - 8 * c->a;
    return signed_digits(out, (int64_t)(raw << shift) >> shift);
}

/* A UTF-8 string as json.encoder.encode_basestring writes it (quotes; '"', '\\' and
 * controls escaped, everything else as it is). */
static int
put_string(Out *o, const unsigned char *s, Py_ssize_t len, int *ascii_only)
{
    static const char hex[] = "0123456789abcdef";
    if (out_reserve(o, 6 * len + 2) < 0)
        return -1;
    char *w = o->data + o->n;
    *w++ = '"';
    for (Py_ssize_t i = 0; i < len; i++) {
        unsigned char b = s[i];
        if (b >= 0x20 && b != '"' && b != '\\') {
            *w++ = (char)b;
            if (b >= 0x80)
                *ascii_only = 0;
            continue;
        }
        *w++ = '\\';
        switch (b) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '\n': *w++ = 'n'; break;
        case '\r': *w++ = 'r'; break;
        case '\t': *w++ = 't'; break;
        case '\b': *w++ = 'b'; break;
        case '\f': *w++ = 'f'; break;
        default:
            *w++ = 'u';
            *w++ = '0';
            *w++ = '0';
            *w++ = hex[b >> 4];
            *w++ = hex[b & 15];
        }
    }
    *w++ = '"';
    o->n = w - o->data;
    return 0;
}

/* One image as a JSON object at the end of *o*. frag[2i], frag[2i+1]: where column
 * i's value is in *o*; raw[2i], raw[2i+1]: its bytes in the image. 1: written, 0: a
 * value or image this code leaves to the usual path, -1: an error. */
static int
write_image(const unsigned char *buf, Py_ssize_t size, Py_ssize_t *pos, const Column *cols,
            const JColumn *js, Py_ssize_t width, Out *o, Py_ssize_t *frag, Py_ssize_t *raw,
            int *ascii_only)
{
    Py_ssize_t null_size = (width + 7) >> 3;
    if (*pos + null_size > size)
        return 0;
    const unsigned char *nulls = buf + *pos;
    *pos += null_size;
    for (Py_ssize_t i = 0; i < width; i++) {
        const Column *c = &cols[i];
        const JColumn *j = &js[i];
        char text[208], json[64];
        int n = 0, m = -1;
        if (out_reserve(o, j->name.n + j->null.n + 64) < 0)
            return -1;
        out_put(o, j->name.s, j->name.n);
        *ascii_only &= j->name.ascii;
        frag[2 * i] = o->n;
        raw[2 * i] = *pos;
        if (c->nullable && nulls[i >> 3] >> (i & 7) & 1) {
            out_put(o, j->null.s, j->null.n);
            *ascii_only &= j->null.ascii;
            frag[2 * i + 1] = o->n;
            raw[2 * i + 1] = *pos;
            continue;
        }
        const unsigned char *p = buf + *pos;
        if (j->kind == J_STRING) {
            if (*pos + c->a > size)
                return 0;
            Py_ssize_t length = (Py_ssize_t)little_endian(p, c->a);
            if (*pos + c->a + length > size)
                return 0;
            if (put_string(o, p + c->a, length, ascii_only) < 0)
                return -1;
            *pos += c->a + length;
        } else {
            if (*pos + c->width > size)
                return 0;
            switch (j->kind) {
            case J_INT: /* INT + RAW: the text itself */
                m = int_chars(p, c, json);
                break;
            case J_DOUBLE: { /* DOUBLE + FLOAT: repr, where it is Java's text */
                double d;
                memcpy(&d, p, 8);
                char *r = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
                if (r == NULL)
                    return -1;
                n = (int)strlen(r);
                if (n < 48 && java_plain_chars(r, n)) {
                    memcpy(json, r, (size_t)n);
                    m = n;
                }
                PyMem_Free(r);
                break;
            }
            case J_DECIMAL: /* DECIMAL + DECIMAL */
                n = decimal_chars(p, c->a, c->b, text);
                if (n < 0)
                    return -1;
                m = decimal_base64(text, n, j->param, json);
                break;
            case J_DATE: { /* DATE + DATE: days */
                uint64_t value = little_endian(p, 3);
                uint64_t day = value & 0x1F, month = value >> 5 & 0xF, year = value >> 9;
                if (month && day) { /* zero dates: the usual path */
                    n = date_text(text, (int64_t)year, (int64_t)month, (int64_t)day);
                    m = date_days(text, n, json);
                }
                break;
            }
            default: /* J_ZONED: TIMESTAMP2 + ZONED */
                if (big_endian(p, 4) || fraction_micros(p + 4, c->a)) {
                    n = timestamp2_chars(p, c, text);
                    m = zoned_chars(text, n, j->param, json);
                }
            }
            if (m < 0)
                return 0;
            out_put(o, json, m);
            *pos += c->width;
        }
        frag[2 * i + 1] = o->n;
        raw[2 * i + 1] = *pos;
    }
    if (out_reserve(o, 1) < 0)
        return -1;
    OUT_LITERAL(o, "}");
    return 1;
}

typedef struct {
    Py_ssize_t start, end; /* the object in the scratch buffer */
    Py_ssize_t *frag, *raw;
} Image;

/* The key object of *image* into *o*. */
static int
put_key(Out *o, const Out *scratch, const Image *image, const Py_ssize_t *keys,
        const Text *key_names, Py_ssize_t n_keys)
{
    for (Py_ssize_t k = 0; k < n_keys; k++) {
        Py_ssize_t i = keys[k], from = image->frag[2 * i], to = image->frag[2 * i + 1];
        if (out_reserve(o, key_names[k].n + to - from + 1) < 0)
            return -1;
        out_put(o, key_names[k].s, key_names[k].n);
        out_put(o, scratch->data + from, to - from);
    }
    if (out_reserve(o, 1) < 0)
        return -1;
    OUT_LITERAL(o, "}");
    return 0;
}

typedef struct {
    Text head, tail, ts;
    const Py_ssize_t *keys;
    const Text *key_names;
    Py_ssize_t n_keys;
    int tombstones, ascii_pieces;
} Line;

/* One change event's line (and its tombstone's) appended to *lines* as a str; 1, 0
 * (not UTF-8: the usual path), -1. */
static int
add_line(PyObject *lines, Out *o, const Out *scratch, const Line *l, char op,
         const Image *before, const Image *after, const char *row, int row_len,
         int ascii_only)
{
    o->n = 0;
    const Image *key = op == 'd' ? before : after;
    int keyed = l->n_keys > 0 && key != NULL;
    Py_ssize_t before_n = before ? before->end - before->start : 4;
    Py_ssize_t after_n = after ? after->end - after->start : 4;
    if (out_reserve(o, 96 + before_n + after_n + l->head.n + l->tail.n + l->ts.n) < 0)
        return -1;
    OUT_LITERAL(o, "{\"key\":");
    if (!keyed)
        OUT_LITERAL(o, "null");
    else if (put_key(o, scratch, key, l->keys, l->key_names, l->n_keys) < 0)
        return -1;
    Py_ssize_t key_end = o->n;
    if (out_reserve(o, 96 + before_n + after_n + l->head.n + l->tail.n + l->ts.n) < 0)
        return -1;
    OUT_LITERAL(o, ",\"value\":{\"before\":");
    if (before)
        out_put(o, scratch->data + before->start, before_n);
    else
        OUT_LITERAL(o, "null");
    OUT_LITERAL(o, ",\"after\":");
    if (after)
        out_put(o, scratch->data + after->start, after_n);
    else
        OUT_LITERAL(o, "null");
    OUT_LITERAL(o, ",\"source\":");
    out_put(o, l->head.s, l->head.n);
    out_put(o, row, row_len);
    out_put(o, l->tail.s, l->tail.n);
    OUT_LITERAL(o, ",\"transaction\":null,\"op\":\"");
    out_put(o, &op, 1);
    OUT_LITERAL(o, "\",");
    out_put(o, l->ts.s, l->ts.n);
    OUT_LITERAL(o, "}\n");
    if (l->tombstones && op == 'd' && keyed) {
        Py_ssize_t key_n = key_end - 7; /* the key object after '{"key":' */
        if (out_reserve(o, key_n + 32) < 0)
            return -1;
        OUT_LITERAL(o, "{\"key\":");
        out_put(o, o->data + 7, key_n);
        OUT_LITERAL(o, ",\"value\":null}\n");
    }
    PyObject *line;
    if (ascii_only && l->ascii_pieces) {
        line = PyUnicode_New(o->n, 127);
        if (line != NULL)
            memcpy(PyUnicode_1BYTE_DATA(line), o->data, (size_t)o->n);
    } else {
        line = PyUnicode_DecodeUTF8(o->data, o->n, "strict");
        if (line == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            return 0;
        }
    }
    if (line == NULL)
        return -1;
    int failed = PyList_Append(lines, line);
    Py_DECREF(line);
    return failed ? -1 : 1;
}

static int
same_key(const Image *a, const Image *b, const unsigned char *buf, const Py_ssize_t *keys,
         Py_ssize_t n_keys)
{
    for (Py_ssize_t k = 0; k < n_keys; k++) {
        Py_ssize_t i = keys[k];
        Py_ssize_t an = a->raw[2 * i + 1] - a->raw[2 * i], bn = b->raw[2 * i + 1] - b->raw[2 * i];
        if (an != bn || memcmp(buf + a->raw[2 * i], buf + b->raw[2 * i], (size_t)an) != 0)
            return 0;
    }
    return 1;
}

PyDoc_STRVAR(rows_lines_doc,
"rows_lines(data, pos, op, plan, json, head, tail, ts_text, tombstones)\n"
"    -> list of str, or None\n\n"
"The Debezium JSON lines of a rows event with full images (see decode_rows), one per\n"
"change event: an update of the key is a delete and a create, a delete with a key is\n"
"followed by its tombstone's line with *tombstones*. *json*: (kinds, params, names,\n"
"nulls, key_indexes, key_names) of the table (json_lines.fused_plan); row i's source\n"
"block is head + str(i) + tail, the value ends with ts_text. None: a value this code\n"
"leaves to the usual path (decode_rows, then the renderer's lines).");

static PyObject *
rows_lines(PyObject *module, PyObject *args)
{
    PyObject *data, *plan, *json, *head, *tail, *ts;
    Py_ssize_t pos;
    int op, tombstones;
    if (!PyArg_ParseTuple(args, "SniO!O!UUUp:rows_lines", &data, &pos, &op, &PyTuple_Type,
                          &plan, &PyTuple_Type, &json, &head, &tail, &ts, &tombstones))
        return NULL;
    PyObject *kinds, *params, *names, *nulls, *key_indexes, *key_names_obj;
    if (!PyArg_ParseTuple(json, "SSO!O!O!O!:rows_lines json", &kinds, &params,
                          &PyTuple_Type, &names, &PyTuple_Type, &nulls, &PyTuple_Type,
                          &key_indexes, &PyTuple_Type, &key_names_obj))
        return NULL;
    if (op < OP_CREATE || op > OP_DELETE || pos < 0) {
        PyErr_SetString(PyExc_ValueError, "op must be 0, 1 or 2 and pos not negative");
        return NULL;
    }
    Column *cols;
    Py_ssize_t width;
    if (parse_plan(plan, &cols, &width) < 0)
        return NULL;
    Py_ssize_t n_keys = PyTuple_GET_SIZE(key_indexes);
    PyObject *lines = NULL, *result = NULL;
    JColumn *js = PyMem_Calloc((size_t)(width ? width : 1), sizeof(JColumn));
    Py_ssize_t *keys = PyMem_Calloc((size_t)(n_keys ? n_keys : 1), sizeof(Py_ssize_t));
    Text *key_names = PyMem_Calloc((size_t)(n_keys ? n_keys : 1), sizeof(Text));
    Py_ssize_t *offsets = PyMem_Calloc((size_t)(8 * width + 8), sizeof(Py_ssize_t));
    Out scratch = {0}, line = {0};
    Line l = {0};
    if (js == NULL || keys == NULL || key_names == NULL || offsets == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (PyBytes_GET_SIZE(kinds) != width || PyBytes_GET_SIZE(params) != width ||
        PyTuple_GET_SIZE(names) != width || PyTuple_GET_SIZE(nulls) != width ||
        PyTuple_GET_SIZE(key_names_obj) != n_keys) {
        PyErr_SetString(PyExc_ValueError, "json must describe every column of the plan");
        goto done;
    }
    for (Py_ssize_t i = 0; i < width; i++) {
        JColumn *j = &js[i];
        j->kind = (unsigned char)PyBytes_AS_STRING(kinds)[i];
        j->param = (unsigned char)PyBytes_AS_STRING(params)[i];
        int decoder = cols[i].kind;
        int fits = (j->kind == J_INT && decoder == K_INT) ||
                   (j->kind == J_STRING && decoder == K_UTF8) ||
                   (j->kind == J_DATE && decoder == K_DATE) ||
                   (j->kind == J_ZONED && decoder == K_TIMESTAMP2) ||
                   (j->kind == J_DECIMAL && decoder == K_DECIMAL) ||
                   (j->kind == J_DOUBLE && decoder == K_DOUBLE);
        if (!fits) {
            PyErr_Format(PyExc_ValueError, "column %zd: JSON kind %d does not write what "
                         "decoder kind %d reads", i, j->kind, decoder);
            goto done;
        }
        if (text_of(PyTuple_GET_ITEM(names, i), &j->name) < 0 ||
            text_of(PyTuple_GET_ITEM(nulls, i), &j->null) < 0)
            goto done;
    }
    for (Py_ssize_t k = 0; k < n_keys; k++) {
        keys[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(key_indexes, k));
        if (keys[k] == -1 && PyErr_Occurred())
            goto done;
        if (keys[k] < 0 || keys[k] >= width ||
            (js[keys[k]].kind != J_INT && js[keys[k]].kind != J_STRING)) {
            PyErr_Format(PyExc_ValueError, "key column %zd is not an INT or UTF8 column",
                         keys[k]);
            goto done;
        }
        if (text_of(PyTuple_GET_ITEM(key_names_obj, k), &key_names[k]) < 0)
            goto done;
    }
    if (text_of(head, &l.head) < 0 || text_of(tail, &l.tail) < 0 || text_of(ts, &l.ts) < 0)
        goto done;
    l.keys = keys;
    l.key_names = key_names;
    l.n_keys = n_keys;
    l.tombstones = tombstones;
    l.ascii_pieces = l.head.ascii && l.tail.ascii && l.ts.ascii;
    for (Py_ssize_t k = 0; k < n_keys; k++)
        l.ascii_pieces &= key_names[k].ascii;
    if ((lines = PyList_New(0)) == NULL)
        goto done;
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t size = PyBytes_GET_SIZE(data);
    Image first = {0, 0, offsets, offsets + 2 * width};
    Image second = {0, 0, offsets + 4 * width, offsets + 6 * width};
    for (long r = 0; pos < size; r++) {
        int ascii_only = 1, w;
        scratch.n = 0;
        first.start = scratch.n;
        if ((w = write_image(buf, size, &pos, cols, js, width, &scratch, first.frag,
                             first.raw, &ascii_only)) <= 0)
            goto fallback_or_error;
        first.end = scratch.n;
        if (op == OP_UPDATE) {
            second.start = scratch.n;
            if ((w = write_image(buf, size, &pos, cols, js, width, &scratch, second.frag,
                                 second.raw, &ascii_only)) <= 0)
                goto fallback_or_error;
            second.end = scratch.n;
        }
        char row[24];
        int row_len = digits(row, (uint64_t)r, 1);
        if (op == OP_CREATE)
            w = add_line(lines, &line, &scratch, &l, 'c', NULL, &first, row, row_len,
                         ascii_only);
        else if (op == OP_DELETE)
            w = add_line(lines, &line, &scratch, &l, 'd', &first, NULL, row, row_len,
                         ascii_only);
        else if (n_keys > 0 && !same_key(&first, &second, buf, keys, n_keys)) {
            w = add_line(lines, &line, &scratch, &l, 'd', &first, NULL, row, row_len,
                         ascii_only);
            if (w > 0)
                w = add_line(lines, &line, &scratch, &l, 'c', NULL, &second, row, row_len,
                             ascii_only);
        } else
            w = add_line(lines, &line, &scratch, &l, 'u', &first, &second, row, row_len,
                         ascii_only);
        if (w <= 0)
            goto fallback_or_error;
    }
    result = Py_NewRef(lines);
    goto done;
fallback_or_error:
    if (!PyErr_Occurred())
        result = Py_NewRef(Py_None);
done:
    Py_XDECREF(lines);
    PyMem_Free(scratch.data);
    PyMem_Free(line.data);
    PyMem_Free(js);
    PyMem_Free(keys);
    PyMem_Free(key_names);
    PyMem_Free(offsets);
    PyMem_Free(cols);
    return result;
}

PyDoc_STRVAR(count_rows_doc,
"count_rows(data, pos, op, plan) -> int, or -1\n\n"
"How many rows a rows event with full images holds, from the images' sizes alone; -1\n"
"if a column's size needs its Python reader, or the images are short.");

static PyObject *
count_rows(PyObject *module, PyObject *args)
{
    PyObject *data, *plan;
    Py_ssize_t pos;
    int op;
    if (!PyArg_ParseTuple(args, "SniO!:count_rows", &data, &pos, &op, &PyTuple_Type, &plan))
        return NULL;
    Column *cols;
    Py_ssize_t width;
    if (parse_plan(plan, &cols, &width) < 0)
        return NULL;
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t size = PyBytes_GET_SIZE(data), images = 0, null_size = (width + 7) >> 3;
    long count = -1;
    while (pos >= 0 && pos < size) {
        if (pos + null_size > size)
            goto done;
        const unsigned char *nulls = buf + pos;
        pos += null_size;
        for (Py_ssize_t i = 0; i < width; i++) {
            const Column *c = &cols[i];
            if (c->nullable && nulls[i >> 3] >> (i & 7) & 1)
                continue;
            if (c->width)
                pos += c->width;
            else if (c->kind == K_UTF8 || c->kind == K_BYTES) {
                if (pos + c->a > size)
                    goto done;
                pos += c->a + (Py_ssize_t)little_endian(buf + pos, c->a);
            } else
                goto done;
            if (pos > size)
                goto done;
        }
        images++;
    }
    if (pos == size)
        count = (long)(op == OP_UPDATE ? images / 2 : images);
done:
    PyMem_Free(cols);
    return PyLong_FromLong(count);
}

static PyMethodDef row_image_methods[] = {
    {"decode_rows", decode_rows, METH_VARARGS, decode_rows_doc},
    {"rows_lines", rows_lines, METH_VARARGS, rows_lines_doc},
    {"count_rows", count_rows, METH_VARARGS, count_rows_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef row_image_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tidemark.source.mariadb._row_image",
    .m_doc = "The compiled decoder of full binlog row images (see row_decoder).",
    .m_size = -1,
    .m_methods = row_image_methods,
};

PyMODINIT_FUNC
PyInit__row_image(void)
{
    const uint16_t probe = 1;
    if (*(const unsigned char *)&probe != 1) {
        /* The DOUBLE kind copies the binlog's little-endian bytes as they are. */
        PyErr_SetString(PyExc_ImportError, "_row_image is for little-endian hosts");
        return NULL;
    }
    PyObject *module = PyModule_Create(&row_image_module);
    if (module == NULL)
        return NULL;
    const struct {
        const char *name;
        int value;
    } kinds[] = {
        {"FALLBACK", K_FALLBACK}, {"INT", K_INT}, {"DOUBLE", K_DOUBLE},
        {"DECIMAL", K_DECIMAL}, {"DATETIME2", K_DATETIME2}, {"TIMESTAMP2", K_TIMESTAMP2},
        {"TIME2", K_TIME2}, {"DATE", K_DATE}, {"YEAR", K_YEAR}, {"UTF8", K_UTF8},
        {"BYTES", K_BYTES}, {"J_INT", J_INT}, {"J_STRING", J_STRING}, {"J_DATE", J_DATE},
        {"J_ZONED", J_ZONED}, {"J_DECIMAL", J_DECIMAL}, {"J_DOUBLE", J_DOUBLE},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (PyModule_AddIntConstant(module, kinds[i].name, kinds[i].value) < 0) {
            Py_DECREF(module);
            return NULL;
        }
    }
    return module;
}
