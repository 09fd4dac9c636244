/*
 * Optional C fast path for the two per-row steps of the codec: parsing an XLogData frame and
 * decoding an Insert, Update or Delete with its TupleData. Loaded by speedups.py.
 *
 * The pure-Python code in frames.py and decoder.py is the reference and stays complete. This
 * module only handles well-formed input: whenever anything is off (a short buffer, a bad
 * marker or column kind, an unknown relation, a column count mismatch, trailing bytes) it
 * answers None and the caller re-runs the Python path, which raises the precise error. So the
 * two paths cannot disagree on what is valid, and error messages live in one place.
 *
 * Results are the same frozen slots dataclasses the Python path builds. They are allocated
 * with the type's tp_alloc and their slots filled at the offsets of the classes' member
 * descriptors (what a slots class's __init__ would do, minus the frozen __setattr__ detour);
 * `configure` checks those descriptors once, at import.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#ifndef Py_T_OBJECT_EX
#define Py_T_OBJECT_EX T_OBJECT_EX
#endif

#define MAX_FIELDS 5

typedef struct {
    PyTypeObject *type;
    Py_ssize_t offsets[MAX_FIELDS];
    int nfields;
} Shape;

static Shape tuple_shape, insert_shape, update_shape, delete_shape, xlog_shape, relation_shape;
static PyTypeObject *lsn_type;
static PyObject *str_K, *str_O;
static int configured;

/* 1 = well-formed input could not be read here: let the Python path decide (and explain). */
#define ANOMALY 1

static int
shape_init(Shape *shape, PyObject *cls, const char *const *names, int nfields)
{
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "configure() expects classes");
        return -1;
    }
    for (int i = 0; i < nfields; i++) {
        PyObject *descr = PyObject_GetAttrString(cls, names[i]);
        if (descr == NULL)
            return -1;
        if (!Py_IS_TYPE(descr, &PyMemberDescr_Type)
            || ((PyMemberDescrObject *)descr)->d_member->type != Py_T_OBJECT_EX) {
            Py_DECREF(descr);
            PyErr_Format(PyExc_TypeError, "%s.%s is not a __slots__ field",
                         ((PyTypeObject *)cls)->tp_name, names[i]);
            return -1;
        }
        shape->offsets[i] = ((PyMemberDescrObject *)descr)->d_member->offset;
        Py_DECREF(descr);
    }
    Py_INCREF(cls);
    Py_XSETREF(shape->type, (PyTypeObject *)cls);
    shape->nfields = nfields;
    return 0;
}

/* A new instance of `shape` holding `values` (references stolen, also on failure). */
static PyObject *
shape_new(Shape *shape, PyObject **values)
{
    PyObject *obj = shape->type->tp_alloc(shape->type, 0);
    if (obj == NULL) {
        for (int i = 0; i < shape->nfields; i++)
            Py_DECREF(values[i]);
        return NULL;
    }
    for (int i = 0; i < shape->nfields; i++)
        *(PyObject **)((char *)obj + shape->offsets[i]) = values[i];
    return obj;
}

static inline uint32_t
u32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint64_t
u64(const unsigned char *p)
{
    return ((uint64_t)u32(p) << 32) | u32(p + 4);
}

static PyObject *
new_lsn(uint64_t value)
{
    PyObject *number = PyLong_FromUnsignedLongLong(value);
    if (number == NULL)
        return NULL;
    PyObject *args = PyTuple_Pack(1, number);
    Py_DECREF(number);
    if (args == NULL)
        return NULL;
    PyObject *lsn = PyLong_Type.tp_new(lsn_type, args, NULL);
    Py_DECREF(args);
    return lsn;
}

/* Read the TupleData at *pos into *out: 0 ok, ANOMALY, or -1 with a Python error set. */
static int
read_tuple(const unsigned char *buf, Py_ssize_t len, Py_ssize_t *pos, Py_ssize_t ncols,
           PyObject **out)
{
    Py_ssize_t p = *pos;
    if (p + 2 > len || (Py_ssize_t)((buf[p] << 8) | buf[p + 1]) != ncols)
        return ANOMALY;
    p += 2;
    PyObject *kinds = PyBytes_FromStringAndSize(NULL, ncols);
    PyObject *values = PyTuple_New(ncols);
    if (kinds == NULL || values == NULL)
        goto error;
    char *kind_bytes = PyBytes_AS_STRING(kinds);
    for (Py_ssize_t i = 0; i < ncols; i++) {
        if (p >= len)
            goto anomaly;
        unsigned char kind = buf[p];
        kind_bytes[i] = (char)kind;
        if (kind == 't' || kind == 'b') {
            if (len - p < 5)
                goto anomaly;
            Py_ssize_t size = (Py_ssize_t)u32(buf + p + 1);
            p += 5;
            if (size > len - p)
                goto anomaly;
            PyObject *value = PyBytes_FromStringAndSize((const char *)buf + p, size);
            if (value == NULL)
                goto error;
            PyTuple_SET_ITEM(values, i, value);
            p += size;
        }
        else if (kind == 'n' || kind == 'u') {
            PyTuple_SET_ITEM(values, i, Py_NewRef(Py_None));
            p += 1;
        }
        else {
            goto anomaly;
        }
    }
    PyObject *fields[2] = {kinds, values};
    *out = shape_new(&tuple_shape, fields);
    if (*out == NULL)
        return -1;
    *pos = p;
    return 0;
anomaly:
    Py_DECREF(kinds);
    Py_DECREF(values);
    return ANOMALY;
error:
    Py_XDECREF(kinds);
    Py_XDECREF(values);
    return -1;
}

/* decode_change(payload, in_stream, relations) -> Insert | Update | Delete | None */
static PyObject *
decode_change(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyBytes_Check(args[0]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "decode_change(payload: bytes, in_stream, relations: dict)");
        return NULL;
    }
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "pgcdc.protocol._speedups is not configured");
        return NULL;
    }
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t len = PyBytes_GET_SIZE(args[0]);
    if (len == 0 || (buf[0] != 'I' && buf[0] != 'U' && buf[0] != 'D'))
        Py_RETURN_NONE;
    unsigned char code = buf[0];
    int in_stream = PyObject_IsTrue(args[1]);
    if (in_stream < 0)
        return NULL;
    Py_ssize_t pos = in_stream ? 5 : 1;
    if (pos + 5 > len)
        Py_RETURN_NONE;

    PyObject *relid = NULL, *xid = NULL, *old = NULL, *new = NULL, *result = NULL;
    relid = PyLong_FromUnsignedLong(u32(buf + pos));
    if (relid == NULL)
        return NULL;
    PyObject *relation = PyDict_GetItemWithError(args[2], relid);  /* borrowed */
    if (relation == NULL || !Py_IS_TYPE(relation, relation_shape.type)) {
        if (PyErr_Occurred())
            goto done;
        goto anomaly;
    }
    PyObject *columns = *(PyObject **)((char *)relation + relation_shape.offsets[0]);
    if (columns == NULL || !PyTuple_Check(columns))
        goto anomaly;
    Py_ssize_t ncols = PyTuple_GET_SIZE(columns);
    pos += 4;

    int rc;
    PyObject *old_kind = Py_None;
    unsigned char marker = buf[pos];
    if (code == 'I') {
        if (marker != 'N')
            goto anomaly;
        pos += 1;
        rc = read_tuple(buf, len, &pos, ncols, &new);
    }
    else {
        if (marker == 'K' || marker == 'O') {
            old_kind = marker == 'K' ? str_K : str_O;
            pos += 1;
            rc = read_tuple(buf, len, &pos, ncols, &old);
            if (rc != 0)
                goto check;
            if (code == 'U') {
                if (pos >= len || buf[pos] != 'N')
                    goto anomaly;
                marker = 'N';
            }
        }
        else if (code == 'D') {
            goto anomaly;
        }
        if (code == 'U') {
            if (marker != 'N')
                goto anomaly;
            pos += 1;
            rc = read_tuple(buf, len, &pos, ncols, &new);
        }
        else {
            rc = 0;
        }
    }
check:
    if (rc < 0)
        goto done;
    if (rc == ANOMALY || pos != len)
        goto anomaly;
    if (in_stream) {
        xid = PyLong_FromUnsignedLong(u32(buf + 1));
        if (xid == NULL)
            goto done;
    }
    else {
        xid = Py_NewRef(Py_None);
    }
    if (code == 'I') {
        PyObject *fields[3] = {relid, new, xid};
        result = shape_new(&insert_shape, fields);
    }
    else if (code == 'U') {
        PyObject *fields[5] = {relid, Py_NewRef(old_kind), old ? old : Py_NewRef(Py_None), new,
                               xid};
        result = shape_new(&update_shape, fields);
    }
    else {
        PyObject *fields[4] = {relid, Py_NewRef(old_kind), old, xid};
        result = shape_new(&delete_shape, fields);
    }
    return result;  /* the fields' references went to the new object */

anomaly:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(relid);
    Py_XDECREF(xid);
    Py_XDECREF(old);
    Py_XDECREF(new);
    return result;
}

/* parse_xlogdata(data) -> XLogData for a well-formed 'w' frame, else None */
static PyObject *
parse_xlogdata(PyObject *module, PyObject *data)
{
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "pgcdc.protocol._speedups is not configured");
        return NULL;
    }
    if (!PyBytes_Check(data) || PyBytes_GET_SIZE(data) < 25 || PyBytes_AS_STRING(data)[0] != 'w')
        Py_RETURN_NONE;
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(data);
    PyObject *fields[4];
    fields[0] = new_lsn(u64(buf + 1));
    fields[1] = new_lsn(u64(buf + 9));
    fields[2] = PyLong_FromLongLong((long long)u64(buf + 17));
    fields[3] = PyBytes_FromStringAndSize((const char *)buf + 25, PyBytes_GET_SIZE(data) - 25);
    if (!fields[0] || !fields[1] || !fields[2] || !fields[3]) {
        for (int i = 0; i < 4; i++)
            Py_XDECREF(fields[i]);
        return NULL;
    }
    return shape_new(&xlog_shape, fields);
}

/* configure(TupleData, Insert, Update, Delete, Relation, XLogData, Lsn) */
static PyObject *
configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    static const char *const tuple_fields[] = {"kinds", "values"};
    static const char *const insert_fields[] = {"relid", "new", "xid"};
    static const char *const update_fields[] = {"relid", "old_kind", "old", "new", "xid"};
    static const char *const delete_fields[] = {"relid", "old_kind", "old", "xid"};
    static const char *const relation_fields[] = {"columns"};
    static const char *const xlog_fields[] = {"data_start", "wal_end", "send_time", "payload"};
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "configure() takes 7 arguments");
        return NULL;
    }
    if (shape_init(&tuple_shape, args[0], tuple_fields, 2) < 0
        || shape_init(&insert_shape, args[1], insert_fields, 3) < 0
        || shape_init(&update_shape, args[2], update_fields, 5) < 0
        || shape_init(&delete_shape, args[3], delete_fields, 4) < 0
        || shape_init(&relation_shape, args[4], relation_fields, 1) < 0
        || shape_init(&xlog_shape, args[5], xlog_fields, 4) < 0)
        return NULL;
    if (!PyType_Check(args[6]) || !PyType_IsSubtype((PyTypeObject *)args[6], &PyLong_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure(): Lsn must be an int subclass");
        return NULL;
    }
    Py_XSETREF(lsn_type, (PyTypeObject *)Py_NewRef(args[6]));
    configured = 1;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL, NULL},
    {"decode_change", (PyCFunction)(void (*)(void))decode_change, METH_FASTCALL, NULL},
    {"parse_xlogdata", parse_xlogdata, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "pgcdc.protocol._speedups",
    "C fast path for the pgoutput codec's per-row work (see the source's header).", -1, methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    str_K = PyUnicode_InternFromString("K");
    str_O = PyUnicode_InternFromString("O");
    if (str_K == NULL || str_O == NULL)
        return NULL;
    return PyModule_Create(&module_def);
}
