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

static PyObject *
read_decimal(const unsigned char *src, int precision, int scale)
{
    unsigned char raw[64];
    Py_ssize_t size = decimal_size(precision, scale);
    if (size > (Py_ssize_t)sizeof raw) {
        PyErr_Format(PyExc_ValueError, "decimal(%d, %d) is wider than MariaDB allows",
                     precision, scale);
        return NULL;
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
        return ascii(text, t);
    }
    return ascii(text + 1, t - 1);
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

static PyObject *
read_timestamp2(const unsigned char *p, const Column *c)
{
    uint64_t seconds = big_endian(p, 4);
    long micros = fraction_micros(p + 4, c->a);
    if (!seconds && !micros)
        return zero_date(c, "1970-01-01 00:00:00+00");
    /* Days to a civil date (H. Hinnant's days_from_civil, inverted): seconds are
     * unsigned 32-bit, so the date is 1970..2106 and every step stays positive. */
    int64_t days = (int64_t)(seconds / 86400), clock = (int64_t)(seconds % 86400);
    int64_t z = days + 719468, era = z / 146097, doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153;
    int64_t day = doy - (153 * mp + 2) / 5 + 1, month = mp < 10 ? mp + 3 : mp - 9;
    int64_t year = yoe + era * 400 + (month <= 2);
    char out[64];
    int n = date_text(out, year, month, day);
    out[n++] = ' ';
    n += clock_text(out + n, clock / 3600, clock / 60 % 60, clock % 60);
    n += fraction_text(out + n, micros, c->a);
    memcpy(out + n, "+00", 3);
    return ascii(out, n + 3);
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

static PyMethodDef row_image_methods[] = {
    {"decode_rows", decode_rows, METH_VARARGS, decode_rows_doc},
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
        {"BYTES", K_BYTES},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (PyModule_AddIntConstant(module, kinds[i].name, kinds[i].value) < 0) {
            Py_DECREF(module);
            return NULL;
        }
    }
    return module;
}
