/* nsqd._speedups: the read and the write of a PUB producer's round trip, in C.

   The pure-Python twins of these functions, and what they are for, are in nsqd/fastpath.py: that module picks
   this one at import when it was built (and TRIONSQ_NO_SPEEDUPS is unset), the Python code otherwise. Both
   must answer the same for the same bytes: tests/nsqd/test_fastpath.py runs the same cases through both. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

#define RECEIVE_SIZE 65536

/* read_pubs(fd, line, max_size) -> None | bytes | (nread, [bodies])

   One read(2) of up to 64 KiB from fd. None: nothing to read (EAGAIN). b"": end of input. A tuple: the read
   held nothing but whole commands `line` + [int32 size][size bytes] with 0 < size <= max_size (line is the
   connection's last PUB line, newline included), and these are their bodies. bytes: anything else, the data
   as read, for the general parser. A failed read raises OSError. */
static PyObject *
read_pubs(PyObject *self, PyObject *args)
{
    int fd;
    const char *line;
    Py_ssize_t line_len;
    long long max_size;
    if (!PyArg_ParseTuple(args, "iy#L", &fd, &line, &line_len, &max_size))
        return NULL;
    PyObject *data = PyBytes_FromStringAndSize(NULL, RECEIVE_SIZE);
    if (data == NULL)
        return NULL;
    char *buf = PyBytes_AS_STRING(data);
    /* the socket is non-blocking: the lock is kept (releasing and taking it again costs more than the call) */
    ssize_t got = read(fd, buf, RECEIVE_SIZE);
    if (got < 0) {
        Py_DECREF(data);
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            Py_RETURN_NONE;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    /* count the commands first: a read that is not only whole PUBs goes to the parser untouched */
    Py_ssize_t pos = 0, count = 0;
    while (pos < got) {
        if (got - pos < line_len + 4 || memcmp(buf + pos, line, line_len) != 0)
            break;
        const unsigned char *field = (const unsigned char *)buf + pos + line_len;
        long long size = (long long)(int32_t)(((uint32_t)field[0] << 24) | ((uint32_t)field[1] << 16) |
                                              ((uint32_t)field[2] << 8) | (uint32_t)field[3]);
        if (size <= 0 || size > max_size || size > got - pos - line_len - 4)
            break;
        pos += line_len + 4 + size;
        count++;
    }
    if (pos != got || count == 0) {
        if (_PyBytes_Resize(&data, got) < 0)
            return NULL;
        return data;
    }
    PyObject *bodies = PyList_New(count);
    if (bodies == NULL) {
        Py_DECREF(data);
        return NULL;
    }
    pos = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const unsigned char *field = (const unsigned char *)buf + pos + line_len;
        Py_ssize_t size = (Py_ssize_t)(((uint32_t)field[0] << 24) | ((uint32_t)field[1] << 16) |
                                       ((uint32_t)field[2] << 8) | (uint32_t)field[3]);
        PyObject *body = PyBytes_FromStringAndSize((const char *)field + 4, size);
        if (body == NULL) {
            Py_DECREF(bodies);
            Py_DECREF(data);
            return NULL;
        }
        PyList_SET_ITEM(bodies, i, body);
        pos += line_len + 4 + size;
    }
    Py_DECREF(data);
    return Py_BuildValue("(nN)", (Py_ssize_t)got, bodies);
}

/* write_many(fds, datas) -> list of int

   write(2) datas[i] to fds[i] for every i, in order; each entry of the result is the bytes written (a short
   count when the socket took less), or -errno when the write failed (EAGAIN included). */
static PyObject *
write_many(PyObject *self, PyObject *args)
{
    PyObject *fds, *datas;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &fds, &PyList_Type, &datas))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(fds);
    if (PyList_GET_SIZE(datas) != n) {
        PyErr_SetString(PyExc_ValueError, "fds and datas differ in length");
        return NULL;
    }
    PyObject *result = PyList_New(n);
    if (result == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *data = PyList_GET_ITEM(datas, i);
        if (!PyBytes_Check(data)) {
            Py_DECREF(result);
            PyErr_SetString(PyExc_TypeError, "datas must hold bytes");
            return NULL;
        }
        int fd = (int)PyLong_AsLong(PyList_GET_ITEM(fds, i));
        if (fd == -1 && PyErr_Occurred()) {
            Py_DECREF(result);
            return NULL;
        }
        ssize_t sent = write(fd, PyBytes_AS_STRING(data), (size_t)PyBytes_GET_SIZE(data));
        PyObject *value = PyLong_FromSsize_t(sent < 0 ? -(Py_ssize_t)errno : (Py_ssize_t)sent);
        if (value == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        PyList_SET_ITEM(result, i, value);
    }
    return result;
}

static PyMethodDef methods[] = {
    {"read_pubs", read_pubs, METH_VARARGS, "Read a socket; its bodies if it held only whole PUBs of one line."},
    {"write_many", write_many, METH_VARARGS, "Write each of several buffers to its socket."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "nsqd._speedups", "The C twins of nsqd.fastpath's read and write.", -1, methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModule_Create(&module);
}
