/*
 * pgcdc.snapshot._copytext: the rows of a ``COPY ... TO STDOUT`` (text format) taken from
 * libpq straight into Arrow string columns, with no Python object per row.
 *
 * The server sends one CopyData message per row; psycopg hands them over one call each,
 * which costs more than the rest of a copy's client work. `CopyColumns.drain` calls libpq's
 * PQgetCopyData itself (the functions of the libpq psycopg loaded, found with `bind`) for
 * every row libpq has buffered, without the GIL, and splits each row into its columns:
 *
 *   fields are separated by a tab, the row ends with a newline; a field that is exactly
 *   \N is NULL; in any other field a backslash escapes: \b \f \n \r \t \v (those control
 *   characters), \ooo (1-3 octal digits), \xhh (1-2 hex digits), and \c for any other c.
 *
 * (PostgreSQL's CopyReadAttributesText reads the same syntax; COPY TO writes \\, \b, \f,
 * \n, \r, \t, \v and \N.) Each column collects an Arrow string array's three buffers
 * (validity bitmap, int32 offsets, bytes); `take` hands them over as bytes objects.
 * `pgcdc.snapshot.copy` uses this when it is built and falls back to CSV parsed by
 * pyarrow otherwise; both give the same strings.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

typedef int (*get_copy_data_fn)(void *conn, char **buffer, int async);
typedef void (*freemem_fn)(void *ptr);
typedef int (*lib_version_fn)(void);

static get_copy_data_fn get_copy_data = NULL;
static freemem_fn freemem = NULL;

/* --- growable buffers --------------------------------------------------------------- */

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

static int
buf_reserve(Buf *b, Py_ssize_t more)
{
    if (b->len + more <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more)
        cap *= 2;
    char *data = realloc(b->data, (size_t)cap);
    if (data == NULL)
        return -1;
    b->data = data;
    b->cap = cap;
    return 0;
}

/* --- CopyColumns ---------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    Py_ssize_t ncols;
    Py_ssize_t rows;
    Buf *values;   /* per column: the strings' bytes */
    Buf *offsets;  /* per column: int32 offsets, rows + 1 of them */
    Buf *validity; /* per column: one bit per row, set when not NULL */
    Py_ssize_t *nulls;
    Py_ssize_t value_bytes;
    char error[160];
} CopyColumns;

enum { ROW_OK = 0, ROW_NO_MEMORY = -1, ROW_BAD = -2 };

static int
start_over(CopyColumns *self)
{
    self->rows = 0;
    self->value_bytes = 0;
    for (Py_ssize_t i = 0; i < self->ncols; i++) {
        self->values[i].len = 0;
        self->validity[i].len = 0;
        self->nulls[i] = 0;
        self->offsets[i].len = 0;
        if (buf_reserve(&self->offsets[i], 4) < 0)
            return -1;
        memset(self->offsets[i].data, 0, 4);
        self->offsets[i].len = 4;
    }
    return 0;
}

static void
release(CopyColumns *self)
{
    for (Py_ssize_t i = 0; self->values != NULL && i < self->ncols; i++) {
        free(self->values[i].data);
        free(self->offsets[i].data);
        free(self->validity[i].data);
    }
    PyMem_Free(self->values);
    PyMem_Free(self->offsets);
    PyMem_Free(self->validity);
    PyMem_Free(self->nulls);
    self->values = self->offsets = self->validity = NULL;
    self->nulls = NULL;
}

static int
copycolumns_init(CopyColumns *self, PyObject *args, PyObject *kwds)
{
    Py_ssize_t ncols;
    if (!PyArg_ParseTuple(args, "n", &ncols))
        return -1;
    if (ncols < 0) {
        PyErr_SetString(PyExc_ValueError, "CopyColumns(ncols): ncols must not be negative");
        return -1;
    }
    release(self);
    self->ncols = ncols;
    Py_ssize_t n = ncols ? ncols : 1;
    self->values = PyMem_Calloc((size_t)n, sizeof(Buf));
    self->offsets = PyMem_Calloc((size_t)n, sizeof(Buf));
    self->validity = PyMem_Calloc((size_t)n, sizeof(Buf));
    self->nulls = PyMem_Calloc((size_t)n, sizeof(Py_ssize_t));
    if (!self->values || !self->offsets || !self->validity || !self->nulls
        || start_over(self) < 0) {
        release(self);
        PyErr_NoMemory();
        return -1;
    }
    self->error[0] = 0;
    return 0;
}

static void
copycolumns_dealloc(CopyColumns *self)
{
    release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Field [p, end) of column `col` (escaped text, or \N) appended; ROW_OK or ROW_NO_MEMORY. */
static int
put_field(CopyColumns *self, Py_ssize_t col, const char *p, const char *end)
{
    Buf *values = &self->values[col], *validity = &self->validity[col];
    Py_ssize_t row = self->rows;
    if (row % 8 == 0) {
        if (buf_reserve(validity, 1) < 0)
            return ROW_NO_MEMORY;
        validity->data[validity->len++] = 0;
    }
    if (end - p == 2 && p[0] == '\\' && p[1] == 'N') {
        self->nulls[col] += 1;
    }
    else {
        validity->data[row / 8] |= (char)(1 << (row % 8));
        if (buf_reserve(values, end - p) < 0)
            return ROW_NO_MEMORY;
        char *out = values->data + values->len;
        const char *slash = memchr(p, '\\', (size_t)(end - p));
        if (slash == NULL) {
            memcpy(out, p, (size_t)(end - p));
            out += end - p;
        }
        else {
            memcpy(out, p, (size_t)(slash - p));
            out += slash - p;
            p = slash;
            while (p < end) {
                char c = *p++;
                if (c != '\\' || p == end) {
                    *out++ = c;
                    continue;
                }
                c = *p++;
                if (c >= '0' && c <= '7') {
                    int v = c - '0';
                    for (int k = 0; k < 2 && p < end && *p >= '0' && *p <= '7'; k++)
                        v = v * 8 + (*p++ - '0');
                    *out++ = (char)(v & 0xff);
                }
                else if (c == 'x' && p < end && hexval(*p) >= 0) {
                    int v = hexval(*p++);
                    if (p < end && hexval(*p) >= 0)
                        v = v * 16 + hexval(*p++);
                    *out++ = (char)v;
                }
                else {
                    switch (c) {
                    case 'b': c = '\b'; break;
                    case 'f': c = '\f'; break;
                    case 'n': c = '\n'; break;
                    case 'r': c = '\r'; break;
                    case 't': c = '\t'; break;
                    case 'v': c = '\v'; break;
                    default: break;
                    }
                    *out++ = c;
                }
            }
        }
        values->len = out - values->data;
    }
    if (values->len > INT32_MAX)
        return ROW_NO_MEMORY; /* the caller's byte limit keeps far below */
    Buf *offsets = &self->offsets[col];
    if (buf_reserve(offsets, 4) < 0)
        return ROW_NO_MEMORY;
    int32_t offset = (int32_t)values->len;
    memcpy(offsets->data + offsets->len, &offset, 4);
    offsets->len += 4;
    return ROW_OK;
}

/* One CopyData message: a row. Written without the GIL: no Python API here. */
static int
put_row(CopyColumns *self, const char *row, Py_ssize_t size)
{
    const char *p = row, *end = row + size;
    if (end > p && end[-1] == '\n')
        end -= 1;
    else {
        snprintf(self->error, sizeof self->error, "a COPY row does not end with a newline");
        return ROW_BAD;
    }
    Py_ssize_t before = 0;
    for (Py_ssize_t col = 0; col < self->ncols; col++) {
        const char *tab = memchr(p, '\t', (size_t)(end - p));
        const char *stop = tab ? tab : end;
        if ((tab == NULL) != (col == self->ncols - 1)) {
            snprintf(self->error, sizeof self->error,
                     "a COPY row has %s fields than the %zd columns",
                     tab == NULL ? "fewer" : "more", self->ncols);
            return ROW_BAD;
        }
        before = self->values[col].len;
        int rc = put_field(self, col, p, stop);
        if (rc != ROW_OK)
            return rc;
        self->value_bytes += self->values[col].len - before;
        p = stop + 1;
    }
    if (self->ncols == 0 && end != row) {
        snprintf(self->error, sizeof self->error, "a COPY row of no columns is not empty");
        return ROW_BAD;
    }
    self->rows += 1;
    return ROW_OK;
}

/* drain(pgconn_ptr, max_rows, max_bytes) -> 1: full (take the rows), 0: libpq has no
 * buffered row (wait for the socket, consume input, drain again), -1: the COPY ended,
 * -2: libpq failed (its error message says why). A malformed row raises ValueError and
 * drops the rows not yet taken. */
static PyObject *
copycolumns_drain(CopyColumns *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "drain(pgconn_ptr, max_rows, max_bytes)");
        return NULL;
    }
    if (get_copy_data == NULL || freemem == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "drain(): libpq is not bound (see bind())");
        return NULL;
    }
    void *conn = PyLong_AsVoidPtr(args[0]);
    Py_ssize_t max_rows = PyLong_AsSsize_t(args[1]);
    Py_ssize_t max_bytes = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (conn == NULL || max_rows < 1 || max_bytes < 1) {
        PyErr_SetString(PyExc_ValueError, "drain(): a connection and positive limits");
        return NULL;
    }
    int status = 1, rc = ROW_OK;
    Py_BEGIN_ALLOW_THREADS
    while (self->rows < max_rows && self->value_bytes < max_bytes) {
        char *row = NULL;
        int size = get_copy_data(conn, &row, 1);
        if (size > 0) {
            rc = put_row(self, row, size);
            freemem(row);
            if (rc != ROW_OK)
                break;
            continue;
        }
        status = size == 0 ? 0 : (size == -1 ? -1 : -2);
        break;
    }
    Py_END_ALLOW_THREADS
    if (rc != ROW_OK) {
        start_over(self); /* the COPY is abandoned: its rows go */
        if (rc == ROW_NO_MEMORY)
            return PyErr_NoMemory();
        PyErr_SetString(PyExc_ValueError, self->error);
        return NULL;
    }
    return PyLong_FromLong(status);
}

/* take() -> (rows, [(validity or None, offsets, values, null_count) per column]); the
 * buffers start over. */
static PyObject *
copycolumns_take(CopyColumns *self, PyObject *unused)
{
    PyObject *columns = PyList_New(self->ncols);
    if (columns == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < self->ncols; i++) {
        PyObject *validity;
        if (self->nulls[i])
            validity = PyBytes_FromStringAndSize(self->validity[i].data, self->validity[i].len);
        else
            validity = Py_NewRef(Py_None);
        PyObject *column = Py_BuildValue(
            "(Ny#y#n)", validity, self->offsets[i].data, self->offsets[i].len,
            self->values[i].data ? self->values[i].data : "", self->values[i].len,
            self->nulls[i]);
        if (column == NULL) {
            Py_DECREF(columns);
            return NULL;
        }
        PyList_SET_ITEM(columns, i, column);
    }
    PyObject *result = Py_BuildValue("(nN)", self->rows, columns);
    if (result != NULL && start_over(self) < 0) {
        Py_DECREF(result);
        return PyErr_NoMemory();
    }
    return result;
}

static PyObject *
copycolumns_get_rows(CopyColumns *self, void *closure)
{
    return PyLong_FromSsize_t(self->rows);
}

static PyMethodDef copycolumns_methods[] = {
    {"drain", (PyCFunction)(void (*)(void))copycolumns_drain, METH_FASTCALL, NULL},
    {"take", (PyCFunction)copycolumns_take, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef copycolumns_getset[] = {
    {"rows", (getter)copycolumns_get_rows, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CopyColumnsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pgcdc.snapshot._copytext.CopyColumns",
    .tp_basicsize = sizeof(CopyColumns),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)copycolumns_init,
    .tp_dealloc = (destructor)copycolumns_dealloc,
    .tp_methods = copycolumns_methods,
    .tp_getset = copycolumns_getset,
};

/* bind(path, version) -> bool: use the libpq already loaded from `path` if its
 * PQlibVersion() is `version` (psycopg's); nothing is loaded that was not. */
static PyObject *
bind(PyObject *module, PyObject *args)
{
    const char *path;
    int version;
    if (!PyArg_ParseTuple(args, "si", &path, &version))
        return NULL;
    void *handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (handle == NULL)
        Py_RETURN_FALSE;
    lib_version_fn lib_version = (lib_version_fn)dlsym(handle, "PQlibVersion");
    get_copy_data_fn get = (get_copy_data_fn)dlsym(handle, "PQgetCopyData");
    freemem_fn free_ = (freemem_fn)dlsym(handle, "PQfreemem");
    if (lib_version == NULL || get == NULL || free_ == NULL || lib_version() != version) {
        dlclose(handle);
        Py_RETURN_FALSE;
    }
    get_copy_data = get; /* the handle stays open: the library is psycopg's, loaded anyway */
    freemem = free_;
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "pgcdc.snapshot._copytext",
    "COPY text-format rows from libpq into Arrow string columns (see the source's header).",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__copytext(void)
{
    if (PyType_Ready(&CopyColumnsType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "CopyColumns", (PyObject *)&CopyColumnsType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
