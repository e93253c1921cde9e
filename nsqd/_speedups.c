/* nsqd._speedups: the reads and the writes of PUB producers' round trips, and the collector hints of queued
   messages, in C.

   The pure-Python twins of these functions, and what they are for, are in nsqd/fastpath.py (the reads and
   writes) and nsqd/message.py (the collector hints): those modules take this one at import when it was built
   and TRIONSQ_NO_SPEEDUPS is unset (nsqd/speedups.py), the Python code otherwise. Both must answer the same for
   the same bytes: tests/nsqd/test_fastpath.py and tests/nsqd/test_message_collector.py run both. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <structmember.h>

#define RECEIVE_SIZE 65536

/* The number of whole commands `line` + [int32 size][size bytes] with 0 < size <= max_size that make up all of
   buf[0:got] (line is the connection's last PUB line, newline included), or 0 when buf holds anything else. */
static Py_ssize_t
count_pubs(const char *buf, Py_ssize_t got, const char *line, Py_ssize_t line_len, long long max_size)
{
    Py_ssize_t pos = 0, count = 0;
    while (pos < got) {
        if (got - pos < line_len + 4 || memcmp(buf + pos, line, line_len) != 0)
            return 0;
        const unsigned char *field = (const unsigned char *)buf + pos + line_len;
        long long size = (long long)(int32_t)(((uint32_t)field[0] << 24) | ((uint32_t)field[1] << 16) |
                                              ((uint32_t)field[2] << 8) | (uint32_t)field[3]);
        if (size <= 0 || size > max_size || size > got - pos - line_len - 4)
            return 0;
        pos += line_len + 4 + size;
        count++;
    }
    return count;
}

/* Append the bodies of the `count` commands that count_pubs found in buf to the list `into`; -1 on error. */
static int
append_bodies(PyObject *into, const char *buf, Py_ssize_t count, Py_ssize_t line_len)
{
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const unsigned char *field = (const unsigned char *)buf + pos + line_len;
        Py_ssize_t size = (Py_ssize_t)(((uint32_t)field[0] << 24) | ((uint32_t)field[1] << 16) |
                                       ((uint32_t)field[2] << 8) | (uint32_t)field[3]);
        PyObject *body = PyBytes_FromStringAndSize((const char *)field + 4, size);
        if (body == NULL)
            return -1;
        int failed = PyList_Append(into, body);
        Py_DECREF(body);
        if (failed)
            return -1;
        pos += line_len + 4 + size;
    }
    return 0;
}

/* One read buffer for every call: the lock is held throughout, and what leaves the call is copied out of it
   (a fresh 64 KiB bytes object per read, most of it given back at once, was a malloc and a free per PUB). */
static char receive_buffer[RECEIVE_SIZE];

/* read_pubs(fd, line, max_size) -> None | bytes | (nread, [bodies])

   One recv(2) of up to 64 KiB from fd (a socket: recv and send go to the socket layer directly, where read and
   write pass through the file layer's checks first). None: nothing to read (EAGAIN). b"": end of input. A tuple: the read
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
    char *buf = receive_buffer;
    /* the socket is non-blocking: the lock is kept (releasing and taking it again costs more than the call) */
    ssize_t got = recv(fd, buf, RECEIVE_SIZE, 0);
    if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            Py_RETURN_NONE;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    /* a read that is not only whole PUBs goes to the parser untouched */
    Py_ssize_t count = count_pubs(buf, got, line, line_len, max_size);
    if (count == 0)
        return PyBytes_FromStringAndSize(buf, got);
    PyObject *bodies = PyList_New(0);
    if (bodies == NULL)
        return NULL;
    if (append_bodies(bodies, buf, count, line_len) < 0) {
        Py_DECREF(bodies);
        return NULL;
    }
    return Py_BuildValue("(nN)", (Py_ssize_t)got, bodies);
}

/* The OSError (its errno's subclass) of a failed read, as a value rather than raised. */
static PyObject *
read_error(int error)
{
    return PyObject_CallFunction(PyExc_OSError, "is", error, strerror(error));
}

/* Attribute names read_producers looks up, interned once. */
static PyObject *str_fast_line, *str_client, *str_out, *str_send_lock, *str_locked, *str_last_read,
    *str_read_moves_at, *str_pub_counts, *str_poll_actor;

/* The line and topic of the PUBs that fd's member may take the fast path with, as a new reference; None (a new
   reference too) when it may not; NULL with an exception set on error. The twin of Connection.fast_pub in
   nsqd/tcp.py, which says why each of these is checked: its cached ``fast_line`` (a tuple, or None for a
   member that has none, such as a replication peer's ACKs), nothing in its client's output, and no write of
   its writer under way. */
static PyObject *
fast_line_of(PyObject *member)
{
    PyObject *line = PyObject_GetAttr(member, str_fast_line);
    if (line == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return NULL;
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (line == Py_None || !PyTuple_Check(line) || PyTuple_GET_SIZE(line) != 2) {
        Py_DECREF(line);
        Py_RETURN_NONE;
    }
    PyObject *client = PyObject_GetAttr(member, str_client);
    if (client == NULL)
        goto error;
    PyObject *out = PyObject_GetAttr(client, str_out);
    Py_DECREF(client);
    if (out == NULL)
        goto error;
    Py_ssize_t queued = PyObject_Length(out);
    Py_DECREF(out);
    if (queued < 0)
        goto error;
    if (queued > 0)
        goto none;
    PyObject *lock = PyObject_GetAttr(member, str_send_lock);
    if (lock == NULL)
        goto error;
    PyObject *held = PyObject_CallMethodNoArgs(lock, str_locked);
    Py_DECREF(lock);
    if (held == NULL)
        goto error;
    int busy = PyObject_IsTrue(held);
    Py_DECREF(held);
    if (busy < 0)
        goto error;
    if (busy)
        goto none;
    return line;
none:
    Py_DECREF(line);
    Py_RETURN_NONE;
error:
    Py_DECREF(line);
    return NULL;
}

/* Append `item` to `list` (a new reference, consumed); -1 on error (NULL items included). */
static int
append_new(PyObject *list, PyObject *item)
{
    if (item == NULL)
        return -1;
    int failed = PyList_Append(list, item);
    Py_DECREF(item);
    return failed;
}

/* The group of `topic` in `groups` ([bodies, members, fds, counts], created empty when missing), borrowed. */
static PyObject *
group_of(PyObject *groups, PyObject *topic)
{
    PyObject *group = PyDict_GetItemWithError(groups, topic);
    if (group != NULL || PyErr_Occurred())
        return group;
    group = Py_BuildValue("[NNNN]", PyList_New(0), PyList_New(0), PyList_New(0), PyList_New(0));
    if (group == NULL)
        return NULL;
    int failed = PyDict_SetItem(groups, topic, group);
    Py_DECREF(group);  /* the dict holds it */
    return failed ? NULL : group;
}

/* What read_producers and poll_producers do for one producer, `member`, watched on descriptor `fd_object`:
   -1 on error (an exception set), 0 when it may not take the fast path (fast_line_of: nothing was read, it
   goes to its poll_ready), 1 when it was read: a read of nothing but whole PUBs of its line, each body in
   range, adds its bodies, the member, the descriptor and the count to groups[topic] ([bodies, members, fds,
   counts], in read order) and sets the member's last_read; the member goes to `late` when step_time is past
   its _read_moves_at (its read deadline is to move). Anything else read (bytes, b"" at end of input, the
   OSError of a failed read as a value) goes to `others` as (member, result), for its poll_data; nothing to
   read (EAGAIN): nothing more. */
static int
read_producer(PyObject *member, PyObject *fd_object, PyObject *groups, long long max_size, double step_time,
              PyObject *others, PyObject *late)
{
    PyObject *line = fast_line_of(member);
    if (line == NULL)
        return -1;
    if (line == Py_None) {
        Py_DECREF(line);
        return 0;
    }
    int result = -1;
    int fd = (int)PyLong_AsLong(fd_object);
    PyObject *line_bytes = PyTuple_GET_ITEM(line, 0), *topic = PyTuple_GET_ITEM(line, 1);
    if ((fd == -1 && PyErr_Occurred()) || !PyBytes_Check(line_bytes)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "fast_line must hold the line as bytes");
        goto done;
    }
    char *buf = receive_buffer;
    ssize_t got = recv(fd, buf, RECEIVE_SIZE, 0);
    if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || append_new(others, Py_BuildValue("(ON)", member, read_error(errno))) == 0)
            result = 1;
        goto done;
    }
    Py_ssize_t line_len = PyBytes_GET_SIZE(line_bytes);
    Py_ssize_t count = count_pubs(buf, got, PyBytes_AS_STRING(line_bytes), line_len, max_size);
    if (count == 0) {
        if (append_new(others, Py_BuildValue("(Oy#)", member, buf, (Py_ssize_t)got)) == 0)
            result = 1;
        goto done;
    }
    PyObject *group = group_of(groups, topic);
    if (group == NULL || append_bodies(PyList_GET_ITEM(group, 0), buf, count, line_len) < 0 ||
        PyList_Append(PyList_GET_ITEM(group, 1), member) < 0 ||
        PyList_Append(PyList_GET_ITEM(group, 2), fd_object) < 0 ||
        append_new(PyList_GET_ITEM(group, 3), PyLong_FromSsize_t(count)) < 0)
        goto done;
    PyObject *size = PyLong_FromSsize_t((Py_ssize_t)got);
    if (size == NULL)
        goto done;
    int failed = PyObject_SetAttr(member, str_last_read, size);
    Py_DECREF(size);
    if (failed)
        goto done;
    PyObject *moves_at = PyObject_GetAttr(member, str_read_moves_at);
    if (moves_at == NULL)
        goto done;
    double at = PyFloat_AsDouble(moves_at);
    Py_DECREF(moves_at);
    if (at == -1.0 && PyErr_Occurred())
        goto done;
    if (step_time > at && PyList_Append(late, member) < 0)
        goto done;
    result = 1;
done:
    Py_DECREF(line);
    return result;
}

/* read_producers(fds, members, max_size, groups, step_time) -> (rest, others, late)

   read_producer for the member of each descriptor in order (members[fd]); `rest` lists the descriptors it did
   not read (no member, or one that may not take the fast path), in their order, for their poll_ready.
   PublishBatch.read_producers in nsqd/fastpath.py is the twin and says what for. */
static PyObject *
read_producers(PyObject *self, PyObject *args)
{
    PyObject *fds, *members, *groups;
    long long max_size;
    double step_time;
    if (!PyArg_ParseTuple(args, "O!O!LO!d", &PyList_Type, &fds, &PyDict_Type, &members, &max_size,
                          &PyDict_Type, &groups, &step_time))
        return NULL;
    PyObject *rest = PyList_New(0), *others = PyList_New(0), *late = PyList_New(0);
    if (rest == NULL || others == NULL || late == NULL)
        goto error;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(fds); i++) {
        PyObject *fd_object = PyList_GET_ITEM(fds, i);
        PyObject *member = PyDict_GetItemWithError(members, fd_object);  /* borrowed */
        int read = 0;
        if (member != NULL) {
            Py_INCREF(member);  /* what it calls may drop it from the dict */
            read = read_producer(member, fd_object, groups, max_size, step_time, others, late);
            Py_DECREF(member);
        } else if (PyErr_Occurred()) {
            read = -1;
        }
        if (read < 0 || (read == 0 && PyList_Append(rest, fd_object) < 0))
            goto error;
    }
    return Py_BuildValue("(NNN)", rest, others, late);
error:
    Py_XDECREF(rest);
    Py_XDECREF(others);
    Py_XDECREF(late);
    return NULL;
}

#define POLL_EVENTS 1023 /* as many events as select.epoll.poll gives by default */

/* poll_producers(epoll, members, light_read, max_size, groups, step_time) -> (events, taken, others, late)

   The start of a poller step with its light producers read in the same call: one epoll_wait(2) of `epoll`
   (a select.epoll) with no timeout, then read_producer for each ready descriptor whose member is a producer
   (poll_actor None) whose last read was at most light_read bytes. `events` lists the others as (fd, events),
   as select.epoll.poll gives them, in the order they came; `taken` the descriptors read. ReadPoller.poll_once
   (nsqd/poller.py) and PublishBatch.poll_producers (nsqd/fastpath.py, with the twin) say what for. */
static PyObject *
poll_producers(PyObject *self, PyObject *args)
{
    static struct epoll_event ready[POLL_EVENTS];
    PyObject *epoll, *members, *groups;
    long long light_read, max_size;
    double step_time;
    if (!PyArg_ParseTuple(args, "OO!LLO!d", &epoll, &PyDict_Type, &members, &light_read, &max_size,
                          &PyDict_Type, &groups, &step_time))
        return NULL;
    int epfd = PyObject_AsFileDescriptor(epoll);
    if (epfd < 0)
        return NULL;
    int n = epoll_wait(epfd, ready, POLL_EVENTS, 0);
    if (n < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    PyObject *events = PyList_New(0), *taken = PyList_New(0), *others = PyList_New(0), *late = PyList_New(0);
    if (events == NULL || taken == NULL || others == NULL || late == NULL)
        goto error;
    for (int i = 0; i < n; i++) {
        PyObject *fd_object = PyLong_FromLong(ready[i].data.fd);
        if (fd_object == NULL)
            goto error;
        PyObject *member = PyDict_GetItemWithError(members, fd_object);  /* borrowed */
        int read = 0;
        if (member != NULL) {
            Py_INCREF(member);  /* what it calls may drop it from the dict */
            PyObject *size = PyObject_GetAttr(member, str_last_read), *actor = NULL;
            long long last = size == NULL ? -1 : PyLong_AsLongLong(size);
            Py_XDECREF(size);
            if (last == -1 && PyErr_Occurred())
                read = -1;
            else if (last <= light_read && (actor = PyObject_GetAttr(member, str_poll_actor)) == NULL)
                read = -1;
            else if (actor == Py_None)
                read = read_producer(member, fd_object, groups, max_size, step_time, others, late);
            Py_XDECREF(actor);
            Py_DECREF(member);
        } else if (PyErr_Occurred()) {
            read = -1;
        }
        if (read > 0)
            read = PyList_Append(taken, fd_object) < 0 ? -1 : 1;
        else if (read == 0)
            read = append_new(events, Py_BuildValue("(OI)", fd_object, (unsigned int)ready[i].events)) < 0 ? -1 : 0;
        Py_DECREF(fd_object);
        if (read < 0)
            goto error;
    }
    return Py_BuildValue("(NNNN)", events, taken, others, late);
error:
    Py_XDECREF(events);
    Py_XDECREF(taken);
    Py_XDECREF(others);
    Py_XDECREF(late);
    return NULL;
}

/* count_published(connections, counts, topic) -> None

   Client.published(topic, counts[i]) for the client of each connections[i] (nsqd/client.py: the producer's
   figures of /stats), without a Python call each: its pub_counts[topic] grows by counts[i]. */
static PyObject *
count_published(PyObject *self, PyObject *args)
{
    PyObject *connections, *counts, *topic;
    if (!PyArg_ParseTuple(args, "O!O!U", &PyList_Type, &connections, &PyList_Type, &counts, &topic))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(connections);
    if (PyList_GET_SIZE(counts) != n) {
        PyErr_SetString(PyExc_ValueError, "connections and counts differ in length");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *client = PyObject_GetAttr(PyList_GET_ITEM(connections, i), str_client);
        if (client == NULL)
            return NULL;
        PyObject *table = PyObject_GetAttr(client, str_pub_counts);
        Py_DECREF(client);
        if (table == NULL)
            return NULL;
        if (!PyDict_Check(table)) {
            Py_DECREF(table);
            PyErr_SetString(PyExc_TypeError, "pub_counts must be a dict");
            return NULL;
        }
        PyObject *before = PyDict_GetItemWithError(table, topic);  /* borrowed */
        PyObject *after = NULL;
        if (before != NULL)
            after = PyNumber_Add(before, PyList_GET_ITEM(counts, i));
        else if (!PyErr_Occurred())
            after = Py_NewRef(PyList_GET_ITEM(counts, i));
        int failed = after == NULL || PyDict_SetItem(table, topic, after) < 0;
        Py_XDECREF(after);
        Py_DECREF(table);
        if (failed)
            return NULL;
    }
    Py_RETURN_NONE;
}

#define OK_FRAME "\0\0\0\6\0\0\0\0OK"
#define OK_FRAME_SIZE 10
#define OK_RUN 64 /* OK frames written from a static run: a producer rarely owes more in one step */

/* write_oks(fds, counts) -> list of (index, written)

   send(2) counts[i] OK frames to fds[i] for every i, in order (MSG_NOSIGNAL: a closed peer is EPIPE, as
   write gives where SIGPIPE is ignored, which Python does). Returns the writes that did not take all of
   theirs: the index and the bytes written (0 when none, -errno when the write failed, EAGAIN included); an
   empty list when every socket took its OKs whole, which is what the caller looks at. */
static PyObject *
write_oks(PyObject *self, PyObject *args)
{
    static char run[OK_RUN * OK_FRAME_SIZE];
    static int filled = 0;
    PyObject *fds, *counts;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &fds, &PyList_Type, &counts))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(fds);
    if (PyList_GET_SIZE(counts) != n) {
        PyErr_SetString(PyExc_ValueError, "fds and counts differ in length");
        return NULL;
    }
    if (!filled) {
        for (int i = 0; i < OK_RUN; i++)
            memcpy(run + i * OK_FRAME_SIZE, OK_FRAME, OK_FRAME_SIZE);
        filled = 1;
    }
    PyObject *short_writes = PyList_New(0);
    if (short_writes == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        int fd = (int)PyLong_AsLong(PyList_GET_ITEM(fds, i));
        Py_ssize_t count = PyLong_AsSsize_t(PyList_GET_ITEM(counts, i));
        if ((fd == -1 || count == -1) && PyErr_Occurred())
            goto error;
        if (count <= 0)
            continue;
        Py_ssize_t want = count * OK_FRAME_SIZE;
        char *data = run;
        if (count > OK_RUN) {
            data = PyMem_Malloc((size_t)want);
            if (data == NULL) {
                PyErr_NoMemory();
                goto error;
            }
            for (Py_ssize_t k = 0; k < count; k++)
                memcpy(data + k * OK_FRAME_SIZE, OK_FRAME, OK_FRAME_SIZE);
        }
        ssize_t sent = send(fd, data, (size_t)want, MSG_NOSIGNAL);
        int error = errno;
        if (data != run)
            PyMem_Free(data);
        if (sent == want)
            continue;
        PyObject *entry = Py_BuildValue("(nn)", i, sent < 0 ? -(Py_ssize_t)error : (Py_ssize_t)sent);
        if (entry == NULL)
            goto error;
        int failed = PyList_Append(short_writes, entry);
        Py_DECREF(entry);
        if (failed)
            goto error;
    }
    return short_writes;
error:
    Py_DECREF(short_writes);
    return NULL;
}

/* The cyclic collector and the messages nsqd keeps.

   A message waiting in a topic's or channel's memory queue references nothing but bytes and numbers (and its
   class), so it can never be part of a reference cycle; yet as an instance of a Python class it is tracked,
   and each of the collector's young and middle collections walks it (for a scenario that keeps its messages
   queued, about 0.4 us per message: bench/HISTORY.md, item 29). untrack_atomic takes such objects out of the
   collector's lists, as CPython does for tuples and dicts of atomic values; track_all puts them back before
   anything that may close a cycle (a delivery's client) is stored in them. nsqd/message.py says where. */

/* tp_traverse visitor: 1 (stop) at the first referent the collector follows, other than the object's class. */
static int
visit_container(PyObject *referent, void *own_type)
{
    return referent != (PyObject *)own_type && PyObject_IS_GC(referent);
}

/* Untrack object if it is tracked and its referents are all atomic (no object the collector follows, its own
   class aside). */
static void
untrack_if_atomic(PyObject *object)
{
    if (!PyObject_GC_IsTracked(object))
        return;
    traverseproc traverse = Py_TYPE(object)->tp_traverse;
    if (traverse == NULL || traverse(object, visit_container, (void *)Py_TYPE(object)) == 0)
        PyObject_GC_UnTrack(object);
}

/* untrack_atomic(objects) -> None: untrack_if_atomic for each object of the list. */
static PyObject *
untrack_atomic(PyObject *self, PyObject *objects)
{
    if (!PyList_Check(objects)) {
        PyErr_SetString(PyExc_TypeError, "untrack_atomic takes a list");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(objects); i++)
        untrack_if_atomic(PyList_GET_ITEM(objects, i));
    Py_RETURN_NONE;
}

/* track_all(objects) -> None: track again each object of the list that the collector can follow and does not. */
static PyObject *
track_all(PyObject *self, PyObject *objects)
{
    if (!PyList_Check(objects)) {
        PyErr_SetString(PyExc_TypeError, "track_all takes a list");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(objects); i++) {
        PyObject *object = PyList_GET_ITEM(objects, i);
        if (PyObject_IS_GC(object) && !PyObject_GC_IsTracked(object))
            PyObject_GC_Track(object);
    }
    Py_RETURN_NONE;
}

/* new_messages(cls, ids, bodies, timestamp, defer) -> list

   nsqd.message.new_messages in C: cls(ids[i], bodies[i], timestamp, 0, defer) for each i, with every slot that
   Message.__init__ sets (MESSAGE_SLOTS, in this order: id, body, timestamp, attempts, defer, client,
   delivered_at, disk_token) written directly where its member descriptor says, then untracked as untrack_atomic
   would. The Python class call runs __init__ as a Python frame per message, most of a PUB's publish;
   tests/nsqd/test_message_collector.py compares every slot with the Python twin's. */
#define MESSAGE_SLOTS 8
static const char *message_slots[MESSAGE_SLOTS] = {"id", "body", "timestamp", "attempts", "defer", "client",
                                                   "delivered_at", "disk_token"};
static PyTypeObject *message_class = NULL;  /* the class whose offsets are cached (a strong reference) */
static Py_ssize_t message_offsets[MESSAGE_SLOTS];
static PyObject *zero_float = NULL, *minus_one = NULL, *zero_int = NULL;

static int
message_layout(PyTypeObject *cls)
{
    Py_ssize_t offsets[MESSAGE_SLOTS];
    for (int i = 0; i < MESSAGE_SLOTS; i++) {
        PyObject *descr = PyObject_GetAttrString((PyObject *)cls, message_slots[i]);
        if (descr == NULL)
            return -1;
        int is_member = Py_IS_TYPE(descr, &PyMemberDescr_Type);
        if (is_member) {
            PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
            is_member = member->type == T_OBJECT_EX && !(member->flags & READONLY);
            offsets[i] = member->offset;
        }
        Py_DECREF(descr);
        if (!is_member) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a writable slot", cls->tp_name, message_slots[i]);
            return -1;
        }
    }
    if (zero_float == NULL && (zero_float = PyFloat_FromDouble(0.0)) == NULL)
        return -1;
    if (minus_one == NULL && (minus_one = PyLong_FromLong(-1)) == NULL)
        return -1;
    if (zero_int == NULL && (zero_int = PyLong_FromLong(0)) == NULL)
        return -1;
    memcpy(message_offsets, offsets, sizeof(offsets));
    Py_INCREF(cls);
    Py_XSETREF(message_class, cls);
    return 0;
}

static PyObject *
new_messages(PyObject *self, PyObject *args)
{
    PyTypeObject *cls;
    PyObject *ids, *bodies, *timestamp, *defer;
    if (!PyArg_ParseTuple(args, "O!O!O!OO", &PyType_Type, &cls, &PyList_Type, &ids, &PyList_Type, &bodies,
                          &timestamp, &defer))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(ids);
    if (PyList_GET_SIZE(bodies) != n) {
        PyErr_SetString(PyExc_ValueError, "ids and bodies differ in length");
        return NULL;
    }
    if (cls != message_class && message_layout(cls) < 0)
        return NULL;
    int deferred = PyObject_IsTrue(defer);
    if (deferred < 0)
        return NULL;
    if (!deferred)
        defer = zero_float;  /* as Message's default: a falsy delay is stored as 0.0 */
    PyObject *messages = PyList_New(n);
    if (messages == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *message = cls->tp_alloc(cls, 0);
        if (message == NULL) {
            Py_DECREF(messages);
            return NULL;
        }
        PyObject *values[MESSAGE_SLOTS] = {PyList_GET_ITEM(ids, i), PyList_GET_ITEM(bodies, i), timestamp,
                                           zero_int, defer, Py_None, zero_float, minus_one};
        for (int k = 0; k < MESSAGE_SLOTS; k++) {
            Py_INCREF(values[k]);
            *(PyObject **)((char *)message + message_offsets[k]) = values[k];
        }
        untrack_if_atomic(message);
        PyList_SET_ITEM(messages, i, message);
    }
    return messages;
}

static PyMethodDef methods[] = {
    {"read_pubs", read_pubs, METH_VARARGS, "Read a socket; its bodies if it held only whole PUBs of one line."},
    {"read_producers", read_producers, METH_VARARGS, "A poller step's light producers read in one call."},
    {"poll_producers", poll_producers, METH_VARARGS, "A poller step's epoll wait with its light producers read."},
    {"count_published", count_published, METH_VARARGS, "Add a batch's counts to each producer's figures."},
    {"write_oks", write_oks, METH_VARARGS, "Write each socket the OK frames it is owed."},
    {"untrack_atomic", untrack_atomic, METH_O, "Untrack the objects of a list that reference only atomic values."},
    {"new_messages", new_messages, METH_VARARGS, "Messages of a published batch, made without __init__."},
    {"track_all", track_all, METH_O, "Track again the objects of a list that the collector does not."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "nsqd._speedups",
    "The C twins of nsqd.fastpath's reads and write, and of nsqd.message's collector hints.", -1, methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    struct { PyObject **name; const char *text; } names[] = {
        {&str_fast_line, "fast_line"}, {&str_client, "client"}, {&str_out, "out"}, {&str_send_lock, "_send_lock"},
        {&str_locked, "locked"}, {&str_last_read, "last_read"}, {&str_read_moves_at, "_read_moves_at"},
        {&str_pub_counts, "pub_counts"}, {&str_poll_actor, "poll_actor"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (*names[i].name == NULL && (*names[i].name = PyUnicode_InternFromString(names[i].text)) == NULL)
            return NULL;
    }
    return PyModule_Create(&module);
}
