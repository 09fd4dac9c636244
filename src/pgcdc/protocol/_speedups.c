/*
 * Optional C fast path for the per-row steps of the codec: parsing an XLogData frame,
 * decoding an Insert, Update or Delete with its TupleData (or peeking at its relation only),
 * and turning the frames of undecoded row changes into change frames. Loaded by speedups.py.
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
#include <stdint.h>
#include <string.h>
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

static Shape tuple_shape, insert_shape, update_shape, delete_shape, xlog_shape, relation_shape,
    undecoded_shape;
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

/* peek_change(payload, in_stream, relations) -> UndecodedChange | None
 *
 * An Insert, Update or Delete of a known relation, its tuples left undecoded: the message's
 * bytes without a stream block's xid prefix. None for anything else (the Python path then
 * decides or explains). */
static PyObject *
peek_change(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyBytes_Check(args[0]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "peek_change(payload: bytes, in_stream, relations: dict)");
        return NULL;
    }
    if (!configured || undecoded_shape.type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "pgcdc.protocol._speedups is not configured");
        return NULL;
    }
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t len = PyBytes_GET_SIZE(args[0]);
    if (len == 0 || (buf[0] != 'I' && buf[0] != 'U' && buf[0] != 'D'))
        Py_RETURN_NONE;
    int in_stream = PyObject_IsTrue(args[1]);
    if (in_stream < 0)
        return NULL;
    Py_ssize_t start = in_stream ? 5 : 1;
    if (len < start + 5)
        Py_RETURN_NONE;
    PyObject *relid = PyLong_FromUnsignedLong(u32(buf + start));
    if (relid == NULL)
        return NULL;
    int known = PyDict_Contains(args[2], relid);
    if (known <= 0) {
        Py_DECREF(relid);
        if (known < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *fields[4];
    fields[0] = PyLong_FromLong(buf[0]);
    fields[1] = relid;
    if (in_stream) {
        PyObject *message = PyBytes_FromStringAndSize(NULL, len - 4);
        if (message != NULL) {
            char *out = PyBytes_AS_STRING(message);
            out[0] = (char)buf[0];
            memcpy(out + 1, buf + 5, len - 5);
        }
        fields[2] = message;
        fields[3] = PyLong_FromUnsignedLong(u32(buf + 1));
    }
    else {
        fields[2] = Py_NewRef(args[0]);
        fields[3] = Py_NewRef(Py_None);
    }
    if (!fields[0] || !fields[2] || !fields[3]) {
        for (int i = 0; i < 4; i++)
            Py_XDECREF(fields[i]);
        return NULL;
    }
    return shape_new(&undecoded_shape, fields);
}

/* The XLogData header before a frame's payload: 'w', data_start, wal_end, send_time. */
#define XLOG_HEAD 25

/* row_frame(data, relations) -> bool: whether `data` is an XLogData frame carrying an
 * Insert, Update or Delete outside a stream block (no xid prefix) of a relation in
 * `relations`: what peek_change takes as it is. */
static PyObject *
row_frame(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "row_frame(data: bytes, relations: dict)");
        return NULL;
    }
    PyObject *data = args[0];
    if (!PyBytes_Check(data) || PyBytes_GET_SIZE(data) < XLOG_HEAD + 6)
        Py_RETURN_FALSE; /* (as peek_change: its relid and at least a byte after it) */
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(data);
    unsigned char code = buf[XLOG_HEAD];
    if (buf[0] != 'w' || (code != 'I' && code != 'U' && code != 'D'))
        Py_RETURN_FALSE;
    PyObject *relid = PyLong_FromUnsignedLong(u32(buf + XLOG_HEAD + 1));
    if (relid == NULL)
        return NULL;
    int known = PyDict_Contains(args[1], relid);
    Py_DECREF(relid);
    if (known < 0)
        return NULL;
    return PyBool_FromLong(known);
}

/* append_frames(frames, ordinal, chunks) -> (ordinal, counts)
 *
 * Each XLogData frame of `frames` (a list; each one `row_frame` took) as a change frame
 * `ordinal | lsn | length | message`, appended to the bytearray `chunks[relid]` of its
 * relation: the ordinals count on from `ordinal`, the LSN is the frame's data_start, the
 * message its payload. Returns the last ordinal used and the frames appended per relid. */
static PyObject *
append_frames(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_Check(args[0]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "append_frames(frames: list, ordinal: int, chunks: dict)");
        return NULL;
    }
    unsigned long long ordinal = PyLong_AsUnsignedLongLong(args[1]);
    if (ordinal == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    PyObject *counts = PyDict_New();
    if (counts == NULL)
        return NULL;
    PyObject *frames = args[0];
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(frames); i++) {
        PyObject *frame = PyList_GET_ITEM(frames, i);
        if (!PyBytes_Check(frame) || PyBytes_GET_SIZE(frame) < XLOG_HEAD + 6
            || PyBytes_AS_STRING(frame)[0] != 'w') {
            PyErr_Format(PyExc_ValueError, "frame %zd is not an XLogData row change", i);
            goto fail;
        }
        const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(frame);
        Py_ssize_t length = PyBytes_GET_SIZE(frame) - XLOG_HEAD;
        if (++ordinal > UINT32_MAX || (unsigned long long)length > UINT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "a change frame's ordinal or length overflows");
            goto fail;
        }
        PyObject *relid = PyLong_FromUnsignedLong(u32(buf + XLOG_HEAD + 1));
        if (relid == NULL)
            goto fail;
        PyObject *chunk = PyDict_GetItemWithError(args[2], relid);
        if (chunk == NULL || !PyByteArray_Check(chunk)) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, relid);
            Py_DECREF(relid);
            goto fail;
        }
        Py_ssize_t at = PyByteArray_GET_SIZE(chunk);
        if (PyByteArray_Resize(chunk, at + 16 + length) < 0) {
            Py_DECREF(relid);
            goto fail;
        }
        unsigned char *out = (unsigned char *)PyByteArray_AS_STRING(chunk) + at;
        out[0] = (unsigned char)(ordinal >> 24);
        out[1] = (unsigned char)(ordinal >> 16);
        out[2] = (unsigned char)(ordinal >> 8);
        out[3] = (unsigned char)ordinal;
        memcpy(out + 4, buf + 1, 8); /* data_start, big-endian as on the wire */
        out[12] = (unsigned char)(length >> 24);
        out[13] = (unsigned char)(length >> 16);
        out[14] = (unsigned char)(length >> 8);
        out[15] = (unsigned char)length;
        memcpy(out + 16, buf + XLOG_HEAD, length);
        PyObject *count = PyDict_GetItemWithError(counts, relid);
        if (count == NULL && PyErr_Occurred()) {
            Py_DECREF(relid);
            goto fail;
        }
        PyObject *next = PyLong_FromLong(count == NULL ? 1 : PyLong_AsLong(count) + 1);
        if (next == NULL || PyDict_SetItem(counts, relid, next) < 0) {
            Py_XDECREF(next);
            Py_DECREF(relid);
            goto fail;
        }
        Py_DECREF(next);
        Py_DECREF(relid);
    }
    return Py_BuildValue("(KN)", ordinal, counts);
fail:
    Py_DECREF(counts);
    return NULL;
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

/* ---- RowColumns: change frames of one relation, decoded into column buffers ------------
 *
 * A change frame is `uint32 ordinal | uint64 lsn | uint32 length | message` (big-endian), the
 * message an Insert, Update or Delete without a stream block's xid prefix. `add` decodes the
 * frames of a byte range into growing buffers: per row the ordinal, LSN, operation (0 insert,
 * 1 update, 2 delete) and old tuple kind ('K', 'O' or 0); per cell (row-major, `ncols` cells
 * a row, for the new and the old tuple apart) the kind byte (0 where the row has no such
 * tuple), and the values' bytes with int32 offsets, Arrow's string layout. It stops at the
 * first frame it cannot decode (another message type, a different relation, anything
 * malformed) and returns that frame's offset, so the Python path can take over there.
 */

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

static int
buf_reserve(Buf *b, Py_ssize_t extra)
{
    if (b->len + extra <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *data = PyMem_Realloc(b->data, cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

static inline int
buf_put(Buf *b, const void *src, Py_ssize_t size)
{
    if (buf_reserve(b, size) < 0)
        return -1;
    memcpy(b->data + b->len, src, size);
    b->len += size;
    return 0;
}

typedef struct {
    PyObject_HEAD
    Py_ssize_t ncols;
    uint32_t relid;
    Py_ssize_t rows;
    Buf ordinal, lsn, op, old_kind;
    Buf kinds[2], offsets[2], values[2];  /* [0] new tuple, [1] old tuple */
} RowColumns;

static void
rowcolumns_free_bufs(RowColumns *self)
{
    Buf *all[] = {&self->ordinal, &self->lsn, &self->op, &self->old_kind, &self->kinds[0],
                  &self->kinds[1], &self->offsets[0], &self->offsets[1], &self->values[0],
                  &self->values[1]};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        PyMem_Free(all[i]->data);
        all[i]->data = NULL;
        all[i]->len = all[i]->cap = 0;
    }
}

static int
rowcolumns_reset(RowColumns *self)
{
    rowcolumns_free_bufs(self);
    self->rows = 0;
    int32_t zero = 0;
    return buf_put(&self->offsets[0], &zero, 4) < 0 || buf_put(&self->offsets[1], &zero, 4) < 0
               ? -1
               : 0;
}

static int
rowcolumns_init(RowColumns *self, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"relid", "ncols", NULL};
    unsigned long relid;
    Py_ssize_t ncols;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "kn", names, &relid, &ncols))
        return -1;
    if (ncols < 0 || ncols > 1664) {
        PyErr_SetString(PyExc_ValueError, "ncols must be between 0 and 1664");
        return -1;
    }
    self->relid = (uint32_t)relid;
    self->ncols = ncols;
    return rowcolumns_reset(self);
}

static void
rowcolumns_dealloc(RowColumns *self)
{
    rowcolumns_free_bufs(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Parse a TupleData at *pos into the side's buffers; 0 ok, ANOMALY, or -1 (Python error). */
static int
put_tuple(RowColumns *self, int side, const unsigned char *buf, Py_ssize_t end, Py_ssize_t *pos)
{
    Py_ssize_t p = *pos, ncols = self->ncols;
    if (p + 2 > end || (Py_ssize_t)((buf[p] << 8) | buf[p + 1]) != ncols)
        return ANOMALY;
    p += 2;
    if (buf_reserve(&self->kinds[side], ncols) < 0
        || buf_reserve(&self->offsets[side], 4 * ncols) < 0)
        return -1;
    char *kinds = self->kinds[side].data + self->kinds[side].len;
    int32_t *offsets = (int32_t *)(self->offsets[side].data + self->offsets[side].len);
    Buf *values = &self->values[side];
    for (Py_ssize_t i = 0; i < ncols; i++) {
        if (p >= end)
            return ANOMALY;
        unsigned char kind = buf[p];
        if (kind == 't' || kind == 'b') {
            if (end - p < 5)
                return ANOMALY;
            Py_ssize_t size = (Py_ssize_t)u32(buf + p + 1);
            p += 5;
            if (size > end - p || values->len + size > INT32_MAX)
                return ANOMALY;
            if (buf_put(values, buf + p, size) < 0)
                return -1;
            p += size;
        }
        else if (kind == 'n' || kind == 'u') {
            p += 1;
        }
        else {
            return ANOMALY;
        }
        kinds[i] = (char)kind;
        offsets[i] = (int32_t)values->len;
    }
    self->kinds[side].len += ncols;
    self->offsets[side].len += 4 * ncols;
    *pos = p;
    return 0;
}

/* Cells of a row without that tuple: kind 0, empty values. */
static int
put_absent(RowColumns *self, int side)
{
    Py_ssize_t ncols = self->ncols;
    if (buf_reserve(&self->kinds[side], ncols) < 0
        || buf_reserve(&self->offsets[side], 4 * ncols) < 0)
        return -1;
    memset(self->kinds[side].data + self->kinds[side].len, 0, ncols);
    int32_t last = (int32_t)self->values[side].len;
    int32_t *offsets = (int32_t *)(self->offsets[side].data + self->offsets[side].len);
    for (Py_ssize_t i = 0; i < ncols; i++)
        offsets[i] = last;
    self->kinds[side].len += ncols;
    self->offsets[side].len += 4 * ncols;
    return 0;
}

/* Lengths of all buffers, to undo a row that failed half-way. */
typedef struct {
    Py_ssize_t lens[10];
} Mark;

static void
mark_take(RowColumns *self, Mark *m)
{
    Buf *all[] = {&self->ordinal, &self->lsn, &self->op, &self->old_kind, &self->kinds[0],
                  &self->kinds[1], &self->offsets[0], &self->offsets[1], &self->values[0],
                  &self->values[1]};
    for (int i = 0; i < 10; i++)
        m->lens[i] = all[i]->len;
}

static void
mark_undo(RowColumns *self, const Mark *m)
{
    Buf *all[] = {&self->ordinal, &self->lsn, &self->op, &self->old_kind, &self->kinds[0],
                  &self->kinds[1], &self->offsets[0], &self->offsets[1], &self->values[0],
                  &self->values[1]};
    for (int i = 0; i < 10; i++)
        all[i]->len = m->lens[i];
}

/* One frame's message (buf[start:end]) as a row: 0, ANOMALY or -1. */
static int
put_row(RowColumns *self, const unsigned char *buf, Py_ssize_t start, Py_ssize_t end)
{
    if (end - start < 6 || u32(buf + start + 1) != self->relid)
        return ANOMALY;
    unsigned char code = buf[start];
    Py_ssize_t pos = start + 5;
    unsigned char marker = buf[pos], op, old_kind = 0;
    int rc;
    if (code == 'I') {
        if (marker != 'N')
            return ANOMALY;
        pos += 1;
        op = 0;
        if ((rc = put_tuple(self, 0, buf, end, &pos)) != 0)
            return rc;
        if (put_absent(self, 1) < 0)
            return -1;
    }
    else if (code == 'U' || code == 'D') {
        op = code == 'U' ? 1 : 2;
        if (marker == 'K' || marker == 'O') {
            old_kind = marker;
            pos += 1;
            if ((rc = put_tuple(self, 1, buf, end, &pos)) != 0)
                return rc;
        }
        else if (code == 'D') {
            return ANOMALY;
        }
        else if (put_absent(self, 1) < 0) {
            return -1;
        }
        if (code == 'U') {
            if (pos >= end || buf[pos] != 'N')
                return ANOMALY;
            pos += 1;
            if ((rc = put_tuple(self, 0, buf, end, &pos)) != 0)
                return rc;
        }
        else if (put_absent(self, 0) < 0) {
            return -1;
        }
    }
    else {
        return ANOMALY;
    }
    if (pos != end)
        return ANOMALY;
    if (buf_put(&self->op, &op, 1) < 0 || buf_put(&self->old_kind, &old_kind, 1) < 0)
        return -1;
    return 0;
}

/* add(buffer, start, end) -> offset of the first frame not taken (end when all were) */
static PyObject *
rowcolumns_add(RowColumns *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    Py_ssize_t start, end;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "add(buffer, start, end)");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    start = PyLong_AsSsize_t(args[1]);
    end = PyLong_AsSsize_t(args[2]);
    if ((start == -1 || end == -1) && PyErr_Occurred()) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (start < 0 || end > view.len || start > end) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "add(): range out of the buffer");
        return NULL;
    }
    const unsigned char *buf = (const unsigned char *)view.buf;
    Py_ssize_t pos = start;
    while (pos < end) {
        if (end - pos < 16)
            break;
        Py_ssize_t size = (Py_ssize_t)u32(buf + pos + 12);
        if (size > end - pos - 16)
            break;
        Mark mark;
        mark_take(self, &mark);
        int rc = put_row(self, buf, pos + 16, pos + 16 + size);
        if (rc == 0) {
            uint64_t ordinal = u32(buf + pos), lsn = u64(buf + pos + 4);
            int64_t o = (int64_t)ordinal, l = (int64_t)lsn;
            if (buf_put(&self->ordinal, &o, 8) < 0 || buf_put(&self->lsn, &l, 8) < 0)
                rc = -1;
        }
        if (rc != 0) {
            mark_undo(self, &mark);
            if (rc < 0) {
                PyBuffer_Release(&view);
                return NULL;
            }
            break;
        }
        self->rows += 1;
        pos += 16 + size;
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(pos);
}

static PyObject *
buf_bytes(Buf *b)
{
    return PyBytes_FromStringAndSize(b->data ? b->data : "", b->len);
}

/* finish() -> (rows, ordinal, lsn, op, old_kind, new kinds, new offsets, new values,
 *              old kinds, old offsets, old values) as bytes; the buffers start over. */
static PyObject *
rowcolumns_finish(RowColumns *self, PyObject *unused)
{
    PyObject *result = Py_BuildValue(
        "(nNNNNNNNNNN)", self->rows, buf_bytes(&self->ordinal), buf_bytes(&self->lsn),
        buf_bytes(&self->op), buf_bytes(&self->old_kind), buf_bytes(&self->kinds[0]),
        buf_bytes(&self->offsets[0]), buf_bytes(&self->values[0]), buf_bytes(&self->kinds[1]),
        buf_bytes(&self->offsets[1]), buf_bytes(&self->values[1]));
    if (result == NULL)
        return NULL;
    if (rowcolumns_reset(self) < 0) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

static PyObject *
rowcolumns_get_rows(RowColumns *self, void *closure)
{
    return PyLong_FromSsize_t(self->rows);
}

static PyObject *
rowcolumns_get_bytes(RowColumns *self, void *closure)
{
    return PyLong_FromSsize_t(self->values[0].len + self->values[1].len);
}

static PyMethodDef rowcolumns_methods[] = {
    {"add", (PyCFunction)(void (*)(void))rowcolumns_add, METH_FASTCALL, NULL},
    {"finish", (PyCFunction)rowcolumns_finish, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef rowcolumns_getset[] = {
    {"rows", (getter)rowcolumns_get_rows, NULL, NULL, NULL},
    {"value_bytes", (getter)rowcolumns_get_bytes, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RowColumnsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pgcdc.protocol._speedups.RowColumns",
    .tp_basicsize = sizeof(RowColumns),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)rowcolumns_init,
    .tp_dealloc = (destructor)rowcolumns_dealloc,
    .tp_methods = rowcolumns_methods,
    .tp_getset = rowcolumns_getset,
};

/* configure(TupleData, Insert, Update, Delete, Relation, XLogData, Lsn, UndecodedChange) */
static PyObject *
configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    static const char *const tuple_fields[] = {"kinds", "values"};
    static const char *const insert_fields[] = {"relid", "new", "xid"};
    static const char *const update_fields[] = {"relid", "old_kind", "old", "new", "xid"};
    static const char *const delete_fields[] = {"relid", "old_kind", "old", "xid"};
    static const char *const relation_fields[] = {"columns"};
    static const char *const xlog_fields[] = {"data_start", "wal_end", "send_time", "payload"};
    static const char *const undecoded_fields[] = {"code", "relid", "message", "xid"};
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "configure() takes 8 arguments");
        return NULL;
    }
    if (shape_init(&tuple_shape, args[0], tuple_fields, 2) < 0
        || shape_init(&insert_shape, args[1], insert_fields, 3) < 0
        || shape_init(&update_shape, args[2], update_fields, 5) < 0
        || shape_init(&delete_shape, args[3], delete_fields, 4) < 0
        || shape_init(&relation_shape, args[4], relation_fields, 1) < 0
        || shape_init(&xlog_shape, args[5], xlog_fields, 4) < 0
        || shape_init(&undecoded_shape, args[7], undecoded_fields, 4) < 0)
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
    {"peek_change", (PyCFunction)(void (*)(void))peek_change, METH_FASTCALL, NULL},
    {"row_frame", (PyCFunction)(void (*)(void))row_frame, METH_FASTCALL, NULL},
    {"append_frames", (PyCFunction)(void (*)(void))append_frames, METH_FASTCALL, NULL},
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
    if (PyType_Ready(&RowColumnsType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "RowColumns", (PyObject *)&RowColumnsType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
