/*
 * tidemark.source.postgres._copy_data: the replication stream's messages out of
 * libpq's buffer, compiled (see copy_data.read_copy, the same loop in Python, which is
 * the reference and the fallback where this module is not built).
 *
 * Why C: per XLogData message the Python loop made a tuple, a memoryview slice, its
 * bytes, a struct unpack and ran a dozen bytecodes around them; with the pgoutput
 * lines written in C (_pgoutput_line), that loop was a third of tidemark capture's
 * CPU per change.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

enum { GOT_LIMIT = 0, GOT_EMPTY = 1, GOT_END = 2, GOT_OTHER = 3 };

#define XLOG_DATA 'w'
#define XLOG_HEADER 25 /* 'w', dataStart, walEnd, sendTime */

static PyObject *one;

/* read_copy(get, batch, limit) -> (status, message): see copy_data.read_copy. */
static PyObject *
read_copy(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3 || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "read_copy(get, batch: list, limit: int)");
        return NULL;
    }
    PyObject *get = args[0], *batch = args[1];
    Py_ssize_t limit = PyNumber_AsSsize_t(args[2], PyExc_OverflowError);
    if (limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    while (PyList_GET_SIZE(batch) < limit) {
        PyObject *got = PyObject_CallOneArg(get, one);
        if (got == NULL) {
            return NULL;
        }
        if (!PyTuple_Check(got) || PyTuple_GET_SIZE(got) != 2) {
            PyErr_Format(PyExc_TypeError, "get_copy_data returned %R, not (size, data)", got);
            Py_DECREF(got);
            return NULL;
        }
        Py_ssize_t size = PyNumber_AsSsize_t(PyTuple_GET_ITEM(got, 0), PyExc_OverflowError);
        if (size == -1 && PyErr_Occurred()) {
            Py_DECREF(got);
            return NULL;
        }
        if (size <= 0) {
            Py_DECREF(got);
            return Py_BuildValue("(iO)", size == 0 ? GOT_EMPTY : GOT_END, Py_None);
        }
        PyObject *data = PyTuple_GET_ITEM(got, 1);
        Py_buffer view;
        if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
            Py_DECREF(got);
            return NULL;
        }
        const unsigned char *c = view.buf;
        if (view.len < 1 || c[0] != XLOG_DATA || view.len < XLOG_HEADER) {
            /* a keepalive, or anything else: the caller's (a short XLogData too,
             * which the caller's unpack rejects with its own error) */
            PyBuffer_Release(&view);
            PyObject *result = Py_BuildValue("(iO)", GOT_OTHER, data);
            Py_DECREF(got);
            return result;
        }
        unsigned long long start = 0;
        for (int i = 1; i <= 8; i++) {
            start = start << 8 | c[i];
        }
        PyObject *payload = PyBytes_FromStringAndSize((const char *)c + XLOG_HEADER,
                                                      view.len - XLOG_HEADER);
        PyBuffer_Release(&view);
        Py_DECREF(got);
        PyObject *lsn = payload == NULL ? NULL : PyLong_FromUnsignedLongLong(start);
        PyObject *pair = lsn == NULL ? NULL : PyTuple_New(2);
        if (pair == NULL) {
            Py_XDECREF(payload);
            Py_XDECREF(lsn);
            return NULL;
        }
        PyTuple_SET_ITEM(pair, 0, payload);
        PyTuple_SET_ITEM(pair, 1, lsn);
        int failed = PyList_Append(batch, pair);
        Py_DECREF(pair);
        if (failed) {
            return NULL;
        }
    }
    return Py_BuildValue("(iO)", GOT_LIMIT, Py_None);
}

static PyMethodDef methods[] = {
    {"read_copy", (PyCFunction)(void (*)(void))read_copy, METH_FASTCALL,
     "read_copy(get, batch, limit) -> (status, message)\n--\n\n"
     "XLogData messages from ``get`` (PGconn.get_copy_data) appended to *batch* as\n"
     "(payload, dataStart) until it holds *limit*, libpq's buffer is empty, the COPY\n"
     "ended or another message came (returned). See copy_data.read_copy."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef copy_data_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tidemark.source.postgres._copy_data",
    .m_doc = "The replication stream's messages out of libpq's buffer (see copy_data).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__copy_data(void)
{
    if (one == NULL && (one = PyLong_FromLong(1)) == NULL) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&copy_data_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "GOT_LIMIT", GOT_LIMIT) < 0 ||
        PyModule_AddIntConstant(module, "GOT_EMPTY", GOT_EMPTY) < 0 ||
        PyModule_AddIntConstant(module, "GOT_END", GOT_END) < 0 ||
        PyModule_AddIntConstant(module, "GOT_OTHER", GOT_OTHER) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
