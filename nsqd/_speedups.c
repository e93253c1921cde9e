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
#include <linux/io_uring.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
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
read_pubs(PyObject *Py_UNUSED(self), PyObject *args)
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

/* One io_uring for the reads and writes of a poller step.

   A step reads its ready producers and, at its end, writes their OKs: one recv(2) and one send(2) per
   connection, each a system call, whose entry and exit cost about 0.2 us here (retpolines, a VM). With an
   io_uring the calls of a step are queued in its submission ring and made by one io_uring_enter(2): the
   kernel runs each as the system call would (MSG_DONTWAIT: a socket with nothing to read or no room answers
   -EAGAIN at once instead of waiting), the results land in the completion ring, and the step pays one entry
   and exit for up to RING_ENTRIES calls (bench/HISTORY.md, item 30: about 0.7-1 us per PUB round trip on this
   machine). Same results as the calls: bytes, 0 at end of input, -errno (EAGAIN, EBADF, ECONNRESET, EPIPE;
   a partial send is returned as such).

   The ring is set up at first use; where the kernel has none or refuses it (io_uring_disabled, a seccomp
   profile: ENOSYS, EPERM), or use_uring(False) turned it off, the functions make the system calls
   themselves, one by one, as before. Only the thread that runs the event loop uses it (nsqd's). */

#define RING_ENTRIES 64

static struct {
    int fd;  /* >= 0: set up; -1: not tried yet; -2: unavailable or turned off */
    unsigned *sq_head, *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
    struct io_uring_sqe *sqes;
    struct io_uring_cqe *cqes;
    void *sq_map, *sqe_map;
    size_t sq_size, sqe_size;
} ring = {.fd = -1};

static int
ring_setup(void)
{
    struct io_uring_params params;
    memset(&params, 0, sizeof params);
    params.flags = IORING_SETUP_COOP_TASKRUN;  /* no interrupt to run completion work: it all completes inline */
    int fd = (int)syscall(__NR_io_uring_setup, RING_ENTRIES, &params);
    if (fd < 0 && errno == EINVAL) {  /* a kernel before 5.19 */
        memset(&params, 0, sizeof params);
        fd = (int)syscall(__NR_io_uring_setup, RING_ENTRIES, &params);
    }
    if (fd < 0)
        return -1;
    if (!(params.features & IORING_FEAT_SINGLE_MMAP)) {  /* kernels before 5.4: not worth a second mapping */
        close(fd);
        return -1;
    }
    size_t sq_size = params.sq_off.array + params.sq_entries * sizeof(unsigned);
    size_t cq_size = params.cq_off.cqes + params.cq_entries * sizeof(struct io_uring_cqe);
    if (cq_size > sq_size)
        sq_size = cq_size;
    size_t sqe_size = params.sq_entries * sizeof(struct io_uring_sqe);
    char *rings = mmap(NULL, sq_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQ_RING);
    if (rings == MAP_FAILED) {
        close(fd);
        return -1;
    }
    void *sqes = mmap(NULL, sqe_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQES);
    if (sqes == MAP_FAILED) {
        munmap(rings, sq_size);
        close(fd);
        return -1;
    }
    ring.sq_head = (unsigned *)(rings + params.sq_off.head);
    ring.sq_tail = (unsigned *)(rings + params.sq_off.tail);
    ring.sq_mask = (unsigned *)(rings + params.sq_off.ring_mask);
    ring.sq_array = (unsigned *)(rings + params.sq_off.array);
    ring.cq_head = (unsigned *)(rings + params.cq_off.head);
    ring.cq_tail = (unsigned *)(rings + params.cq_off.tail);
    ring.cq_mask = (unsigned *)(rings + params.cq_off.ring_mask);
    ring.cqes = (struct io_uring_cqe *)(rings + params.cq_off.cqes);
    ring.sqes = sqes;
    ring.sq_map = rings;
    ring.sqe_map = sqes;
    ring.sq_size = sq_size;
    ring.sqe_size = sqe_size;
    ring.fd = fd;
    return 0;
}

static void
ring_close(void)
{
    if (ring.fd >= 0) {
        munmap(ring.sqe_map, ring.sqe_size);
        munmap(ring.sq_map, ring.sq_size);
        close(ring.fd);
    }
    ring.fd = -2;
}

/* Whether the ring is there to use (set up now if it was not tried yet). */
static int
ring_ready(void)
{
    if (ring.fd == -1 && ring_setup() < 0)
        ring.fd = -2;
    return ring.fd >= 0;
}

/* One call of the batch: recv or send `len` bytes at `buf` on `fd`. */
struct io_call {
    int fd;
    char *buf;
    size_t len;
    ssize_t result;  /* what the system call would return, errors as -errno */
};

/* Make the n (<= RING_ENTRIES) calls, each a recv(2) (`sending` 0) or a send(2) with MSG_NOSIGNAL, never
   waiting (MSG_DONTWAIT); their results in calls[i].result. Through the ring when it is there, one system
   call for all of them; else one by one. */
static void
make_calls(struct io_call *calls, int n, int sending)
{
    int flags = MSG_DONTWAIT | (sending ? MSG_NOSIGNAL : 0);
    char reported[RING_ENTRIES] = {0};
    if (n > 0 && ring_ready()) {
        unsigned tail = *ring.sq_tail;
        for (int i = 0; i < n; i++) {
            unsigned slot = tail & *ring.sq_mask;
            struct io_uring_sqe *sqe = &ring.sqes[slot];
            memset(sqe, 0, sizeof *sqe);
            sqe->opcode = sending ? IORING_OP_SEND : IORING_OP_RECV;
            sqe->fd = calls[i].fd;
            sqe->addr = (unsigned long)calls[i].buf;
            sqe->len = (unsigned)calls[i].len;
            sqe->msg_flags = (unsigned)flags;
            sqe->user_data = (unsigned long long)i;
            ring.sq_array[slot] = slot;
            tail++;
        }
        __atomic_store_n(ring.sq_tail, tail, __ATOMIC_RELEASE);
        int submitted = (int)syscall(__NR_io_uring_enter, ring.fd, (unsigned)n, 0U, 0U, NULL, 0);
        int done = 0;
        for (;;) {
            unsigned head = *ring.cq_head, end = __atomic_load_n(ring.cq_tail, __ATOMIC_ACQUIRE);
            for (; head != end; head++) {
                struct io_uring_cqe *cqe = &ring.cqes[head & *ring.cq_mask];
                if (cqe->user_data < (unsigned long long)n && !reported[cqe->user_data]) {
                    calls[cqe->user_data].result = cqe->res;
                    reported[cqe->user_data] = 1;
                    done++;
                }
            }
            __atomic_store_n(ring.cq_head, head, __ATOMIC_RELEASE);
            if (done >= n)
                return;
            if (submitted <= done)
                break;  /* the rest were never taken from the ring: nothing more is coming */
            /* taken but not completed inline (MSG_DONTWAIT calls are): wait for them */
            if (syscall(__NR_io_uring_enter, ring.fd, 0U, (unsigned)(submitted - done), IORING_ENTER_GETEVENTS,
                        NULL, 0) < 0 && errno != EINTR)
                break;
        }
        /* the ring failed under us (it should not): give it up, and make the calls it did not report directly
           (a call it took completed before io_uring_enter returned, and was reported) */
        ring_close();
    }
    for (int i = 0; i < n; i++) {
        if (reported[i])
            continue;
        ssize_t got = sending ? send(calls[i].fd, calls[i].buf, calls[i].len, flags)
                              : recv(calls[i].fd, calls[i].buf, calls[i].len, flags);
        calls[i].result = got < 0 ? -(ssize_t)errno : got;
    }
}

/* use_uring(on=None) -> bool: whether the reads and writes go through the ring; on=False gives it up (the
   system calls one by one from then on, as where the kernel has none), on=True sets it up again if it can. */
static PyObject *
use_uring(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *on = Py_None;
    if (!PyArg_ParseTuple(args, "|O", &on))
        return NULL;
    if (on != Py_None) {
        int want = PyObject_IsTrue(on);
        if (want < 0)
            return NULL;
        if (!want)
            ring_close();
        else if (ring.fd == -2)
            ring.fd = -1;
    }
    return PyBool_FromLong(ring_ready());
}

/* The reads of a step's producers, in batches of RING_ENTRIES: a producer that may take the fast path
   (fast_line_of) is queued with its line; when the batch is full, and at the end, every queued producer is
   read (make_calls) and its read handled in the order queued (take_read). */
static char read_buffers[RING_ENTRIES][RECEIVE_SIZE];  /* pages are touched only as far as reads fill them */

struct read_batch {
    int n;
    struct io_call calls[RING_ENTRIES];
    PyObject *members[RING_ENTRIES], *fd_objects[RING_ENTRIES], *lines[RING_ENTRIES];  /* owned */
    PyObject *groups, *others, *late;
    long long max_size;
    double step_time;
};

/* What a read of a producer gave (calls' result): a read of nothing but whole PUBs of its line, each body in
   range, adds its bodies, the member, the descriptor and the count to groups[topic] ([bodies, members, fds,
   counts], in read order) and sets the member's last_read; the member goes to `late` when step_time is past
   its _read_moves_at (its read deadline is to move). Anything else read (bytes, b"" at end of input, the
   OSError of a failed read as a value) goes to `others` as (member, result), for its poll_data; nothing to
   read (EAGAIN): nothing. -1 on error. */
static int
take_read(struct read_batch *batch, int k)
{
    PyObject *member = batch->members[k], *fd_object = batch->fd_objects[k], *line = batch->lines[k];
    ssize_t got = batch->calls[k].result;
    const char *buf = batch->calls[k].buf;
    if (got < 0) {
        if (got == -EAGAIN || got == -EWOULDBLOCK)
            return 0;
        return append_new(batch->others, Py_BuildValue("(ON)", member, read_error((int)-got)));
    }
    PyObject *line_bytes = PyTuple_GET_ITEM(line, 0), *topic = PyTuple_GET_ITEM(line, 1);
    Py_ssize_t line_len = PyBytes_GET_SIZE(line_bytes);
    Py_ssize_t count = count_pubs(buf, got, PyBytes_AS_STRING(line_bytes), line_len, batch->max_size);
    if (count == 0)
        return append_new(batch->others, Py_BuildValue("(Oy#)", member, buf, (Py_ssize_t)got));
    PyObject *group = group_of(batch->groups, topic);
    if (group == NULL || append_bodies(PyList_GET_ITEM(group, 0), buf, count, line_len) < 0 ||
        PyList_Append(PyList_GET_ITEM(group, 1), member) < 0 ||
        PyList_Append(PyList_GET_ITEM(group, 2), fd_object) < 0 ||
        append_new(PyList_GET_ITEM(group, 3), PyLong_FromSsize_t(count)) < 0)
        return -1;
    PyObject *size = PyLong_FromSsize_t((Py_ssize_t)got);
    if (size == NULL)
        return -1;
    int failed = PyObject_SetAttr(member, str_last_read, size);
    Py_DECREF(size);
    if (failed)
        return -1;
    PyObject *moves_at = PyObject_GetAttr(member, str_read_moves_at);
    if (moves_at == NULL)
        return -1;
    double at = PyFloat_AsDouble(moves_at);
    Py_DECREF(moves_at);
    if (at == -1.0 && PyErr_Occurred())
        return -1;
    if (batch->step_time > at && PyList_Append(batch->late, member) < 0)
        return -1;
    return 0;
}

/* Read every queued producer and handle the reads in order; the batch is empty afterwards. -1 on error. */
static int
flush_reads(struct read_batch *batch)
{
    make_calls(batch->calls, batch->n, 0);
    int result = 0;
    for (int k = 0; k < batch->n; k++) {
        if (result == 0 && take_read(batch, k) < 0)
            result = -1;
        Py_DECREF(batch->members[k]);
        Py_DECREF(batch->fd_objects[k]);
        Py_DECREF(batch->lines[k]);
    }
    batch->n = 0;
    return result;
}

/* Queue `member`, watched on `fd_object`, for a read if it may take the fast path: 1 when queued, 0 when it
   may not (nothing read: it goes to its poll_ready), -1 on error. */
static int
queue_read(struct read_batch *batch, PyObject *member, PyObject *fd_object)
{
    PyObject *line = fast_line_of(member);
    if (line == NULL)
        return -1;
    if (line == Py_None) {
        Py_DECREF(line);
        return 0;
    }
    int fd = (int)PyLong_AsLong(fd_object);
    if ((fd == -1 && PyErr_Occurred()) || !PyBytes_Check(PyTuple_GET_ITEM(line, 0))) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "fast_line must hold the line as bytes");
        Py_DECREF(line);
        return -1;
    }
    int k = batch->n++;
    batch->calls[k] = (struct io_call){.fd = fd, .buf = read_buffers[k], .len = RECEIVE_SIZE};
    batch->members[k] = Py_NewRef(member);
    batch->fd_objects[k] = Py_NewRef(fd_object);
    batch->lines[k] = line;
    if (batch->n == RING_ENTRIES && flush_reads(batch) < 0)
        return -1;
    return 1;
}

/* Drop what a batch still holds (after an error). */
static void
clear_reads(struct read_batch *batch)
{
    for (int k = 0; k < batch->n; k++) {
        Py_DECREF(batch->members[k]);
        Py_DECREF(batch->fd_objects[k]);
        Py_DECREF(batch->lines[k]);
    }
    batch->n = 0;
}

/* read_producers(fds, members, max_size, groups, step_time) -> (rest, others, late)

   For the member of each descriptor in order (members[fd]) that may take the fast path (fast_line_of), one
   read, handled as take_read says; `rest` lists the descriptors not read (no member, or one that may not
   take the fast path), in their order, for their poll_ready. PublishBatch.read_producers in nsqd/fastpath.py
   is the twin and says what for. */
static PyObject *
read_producers(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *fds, *members;
    struct read_batch batch = {.n = 0};
    if (!PyArg_ParseTuple(args, "O!O!LO!d", &PyList_Type, &fds, &PyDict_Type, &members, &batch.max_size,
                          &PyDict_Type, &batch.groups, &batch.step_time))
        return NULL;
    PyObject *rest = PyList_New(0);
    batch.others = PyList_New(0);
    batch.late = PyList_New(0);
    if (rest == NULL || batch.others == NULL || batch.late == NULL)
        goto error;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(fds); i++) {
        PyObject *fd_object = PyList_GET_ITEM(fds, i);
        PyObject *member = PyDict_GetItemWithError(members, fd_object);  /* borrowed */
        int queued = 0;
        if (member != NULL)
            queued = queue_read(&batch, member, fd_object);
        else if (PyErr_Occurred())
            queued = -1;
        if (queued < 0 || (queued == 0 && PyList_Append(rest, fd_object) < 0))
            goto error;
    }
    if (flush_reads(&batch) < 0)
        goto error;
    return Py_BuildValue("(NNN)", rest, batch.others, batch.late);
error:
    clear_reads(&batch);
    Py_XDECREF(rest);
    Py_XDECREF(batch.others);
    Py_XDECREF(batch.late);
    return NULL;
}

#define POLL_EVENTS 1023 /* as many events as select.epoll.poll gives by default */

/* poll_producers(epoll, members, light_read, max_size, groups, step_time) -> (events, taken, others, late)

   The start of a poller step with its light producers read in the same call: one epoll_wait(2) of `epoll`
   (a select.epoll) with no timeout, then, for each ready descriptor whose member is a producer (poll_actor
   None) whose last read was at most light_read bytes and that may take the fast path (fast_line_of), one
   read, handled as take_read says. `events` lists the other ready descriptors as (fd, events), as
   select.epoll.poll gives them, in the order they came; `taken` the descriptors read. ReadPoller.poll_once
   (nsqd/poller.py) and PublishBatch.poll_producers (nsqd/fastpath.py, with the twin) say what for. */
static PyObject *
poll_producers(PyObject *Py_UNUSED(self), PyObject *args)
{
    static struct epoll_event ready[POLL_EVENTS];
    PyObject *epoll, *members;
    long long light_read;
    struct read_batch batch = {.n = 0};
    if (!PyArg_ParseTuple(args, "OO!LLO!d", &epoll, &PyDict_Type, &members, &light_read, &batch.max_size,
                          &PyDict_Type, &batch.groups, &batch.step_time))
        return NULL;
    int epfd = PyObject_AsFileDescriptor(epoll);
    if (epfd < 0)
        return NULL;
    int n = epoll_wait(epfd, ready, POLL_EVENTS, 0);
    if (n < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    PyObject *events = PyList_New(0), *taken = PyList_New(0);
    batch.others = PyList_New(0);
    batch.late = PyList_New(0);
    if (events == NULL || taken == NULL || batch.others == NULL || batch.late == NULL)
        goto error;
    for (int i = 0; i < n; i++) {
        PyObject *fd_object = PyLong_FromLong(ready[i].data.fd);
        if (fd_object == NULL)
            goto error;
        PyObject *member = PyDict_GetItemWithError(members, fd_object);  /* borrowed */
        int queued = 0;
        if (member != NULL) {
            PyObject *size = PyObject_GetAttr(member, str_last_read), *actor = NULL;
            long long last = size == NULL ? -1 : PyLong_AsLongLong(size);
            Py_XDECREF(size);
            if (last == -1 && PyErr_Occurred())
                queued = -1;
            else if (last <= light_read && (actor = PyObject_GetAttr(member, str_poll_actor)) == NULL)
                queued = -1;
            else if (actor == Py_None)
                queued = queue_read(&batch, member, fd_object);
            Py_XDECREF(actor);
        } else if (PyErr_Occurred()) {
            queued = -1;
        }
        if (queued > 0)
            queued = PyList_Append(taken, fd_object) < 0 ? -1 : 1;
        else if (queued == 0)
            queued = append_new(events, Py_BuildValue("(OI)", fd_object, (unsigned int)ready[i].events)) < 0 ? -1 : 0;
        Py_DECREF(fd_object);
        if (queued < 0)
            goto error;
    }
    if (flush_reads(&batch) < 0)
        goto error;
    return Py_BuildValue("(NNNN)", events, taken, batch.others, batch.late);
error:
    clear_reads(&batch);
    Py_XDECREF(events);
    Py_XDECREF(taken);
    Py_XDECREF(batch.others);
    Py_XDECREF(batch.late);
    return NULL;
}

/* count_published(connections, counts, topic) -> None

   Client.published(topic, counts[i]) for the client of each connections[i] (nsqd/client.py: the producer's
   figures of /stats), without a Python call each: its pub_counts[topic] grows by counts[i]. */
static PyObject *
count_published(PyObject *Py_UNUSED(self), PyObject *args)
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
   write gives where SIGPIPE is ignored, which Python does), through the ring in batches (make_calls).
   Returns the writes that did not take all of theirs: the index and the bytes written (0 when none, -errno
   when the write failed, EAGAIN included); an empty list when every socket took its OKs whole, which is what
   the caller looks at. */
static PyObject *
write_oks(PyObject *Py_UNUSED(self), PyObject *args)
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
    struct io_call calls[RING_ENTRIES];
    Py_ssize_t indexes[RING_ENTRIES];
    int queued = 0, failed = 0;
    for (Py_ssize_t i = 0; i <= n && !failed; i++) {
        if (i < n) {
            int fd = (int)PyLong_AsLong(PyList_GET_ITEM(fds, i));
            Py_ssize_t count = PyLong_AsSsize_t(PyList_GET_ITEM(counts, i));
            if ((fd == -1 || count == -1) && PyErr_Occurred()) {
                failed = 1;
            } else if (count > 0) {
                size_t want = (size_t)count * OK_FRAME_SIZE;
                char *data = run;
                if (count > OK_RUN) {
                    data = PyMem_Malloc(want);
                    if (data == NULL) {
                        PyErr_NoMemory();
                        failed = 1;
                    } else {
                        for (Py_ssize_t k = 0; k < count; k++)
                            memcpy(data + k * OK_FRAME_SIZE, OK_FRAME, OK_FRAME_SIZE);
                    }
                }
                if (!failed) {
                    calls[queued] = (struct io_call){.fd = fd, .buf = data, .len = want};
                    indexes[queued++] = i;
                }
            }
        }
        if (queued == RING_ENTRIES || (queued > 0 && (i == n || failed))) {
            if (!failed)
                make_calls(calls, queued, 1);
            for (int k = 0; k < queued; k++) {
                if (!failed && calls[k].result != (ssize_t)calls[k].len &&
                    append_new(short_writes, Py_BuildValue("(nn)", indexes[k], (Py_ssize_t)calls[k].result)) < 0)
                    failed = 1;
                if (calls[k].buf != run)
                    PyMem_Free(calls[k].buf);
            }
            queued = 0;
        }
    }
    if (failed) {
        Py_DECREF(short_writes);
        return NULL;
    }
    return short_writes;
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
untrack_atomic(PyObject *Py_UNUSED(self), PyObject *objects)
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
track_all(PyObject *Py_UNUSED(self), PyObject *objects)
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

/* Message: nsqd.message.Message in C (the Python class is its twin, used without the accelerator).

   A message's fields in one 96-byte object: the ID's 16 bytes inline (the Python class keeps a bytes object of
   them: 64 bytes more per message), the body and the client as references, the numbers as C numbers. Reading
   .id makes a bytes object each time; MessageIndex (below) finds messages by their inline IDs, so the in-flight
   queue (nsqd/queues/inflight.py) needs no bytes object per message.

   It is not followed by the cyclic collector (no collector header: 16 bytes less, and nothing for a young
   collection to walk): a message references its body and, while in flight, its client, whose channel's
   in-flight queue holds the message; that cycle is never left for the collector to find, as the channel empties
   its in-flight queue when it is closed (nsqd/channel.py). in_flight is the number of the in-flight queue's bucket
   that holds it (-1: none).

   A message waiting in a deferred heap is neither delivered nor in flight: its delivered_at then holds its due
   time and in_flight its number in the order of pushes, and the message is its own heap entry, ordered by those
   two (nsqd/queues/deferred.py): 8 bytes of heap slot where a (due, seq, message) tuple, a float and an int cost
   128. A delivery writes both again. */
#define MESSAGE_ID_SIZE 16  /* nsqd's IDs (protocol.message.MESSAGE_ID_LENGTH) */

typedef struct {
    PyObject_HEAD
    char id[MESSAGE_ID_SIZE];
    PyObject *body;
    PyObject *client;
    long long timestamp;
    long long attempts;
    double defer;
    double delivered_at;
    long long disk_token;
    long long in_flight;
} MessageObject;

static PyTypeObject MessageType;

#define Message_Check(op) Py_IS_TYPE(op, &MessageType)

/* Copy a 16-byte ID from a bytes object into to; -1 with ValueError/TypeError otherwise. */
static int
message_id_from(PyObject *id, char *to)
{
    if (!PyBytes_Check(id)) {
        PyErr_Format(PyExc_TypeError, "a message ID is bytes, not %.200s", Py_TYPE(id)->tp_name);
        return -1;
    }
    if (PyBytes_GET_SIZE(id) != MESSAGE_ID_SIZE) {
        PyErr_Format(PyExc_ValueError, "a message ID is %d bytes, not %zd", MESSAGE_ID_SIZE, PyBytes_GET_SIZE(id));
        return -1;
    }
    memcpy(to, PyBytes_AS_STRING(id), MESSAGE_ID_SIZE);
    return 0;
}

/* A new message with every field as Message's constructor leaves it (body and client referenced anew). */
static MessageObject *
message_alloc(const char *id, PyObject *body, long long timestamp, long long attempts, double defer)
{
    MessageObject *made = PyObject_New(MessageObject, &MessageType);
    if (made == NULL)
        return NULL;
    memcpy(made->id, id, MESSAGE_ID_SIZE);
    Py_INCREF(body);
    made->body = body;
    Py_INCREF(Py_None);
    made->client = Py_None;
    made->timestamp = timestamp;
    made->attempts = attempts;
    made->defer = defer;
    made->delivered_at = 0.0;
    made->disk_token = -1;
    made->in_flight = -1;
    return made;
}

static PyObject *
message_new(PyTypeObject *Py_UNUSED(type), PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"id", "body", "timestamp", "attempts", "defer", NULL};
    PyObject *id, *body;
    long long timestamp, attempts = 0;
    double defer = 0.0;
    char raw[MESSAGE_ID_SIZE];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOL|Ld:Message", keywords, &id, &body, &timestamp, &attempts,
                                     &defer))
        return NULL;
    if (message_id_from(id, raw) < 0)
        return NULL;
    return (PyObject *)message_alloc(raw, body, timestamp, attempts, defer);
}

static void
message_dealloc(MessageObject *self)
{
    Py_XDECREF(self->body);
    Py_XDECREF(self->client);
    PyObject_Free(self);
}

/* Messages order as deferred heap entries: by due time (delivered_at), then number (in_flight); see the type's
   notes. Nothing else is compared: equality stays identity. */
static PyObject *
message_richcompare(MessageObject *self, PyObject *other, int op)
{
    if (!Message_Check(other) || op == Py_EQ || op == Py_NE)
        Py_RETURN_NOTIMPLEMENTED;
    MessageObject *them = (MessageObject *)other;
    int order = self->delivered_at < them->delivered_at   ? -1
                : self->delivered_at > them->delivered_at ? 1
                : self->in_flight < them->in_flight       ? -1
                : self->in_flight > them->in_flight       ? 1
                                                          : 0;
    int result = op == Py_LT ? order < 0 : op == Py_LE ? order <= 0 : op == Py_GT ? order > 0 : order >= 0;
    return PyBool_FromLong(result);
}

static PyObject *
message_repr(MessageObject *self)
{
    Py_ssize_t size = self->body == NULL ? -1 : PyObject_Length(self->body);
    if (size < 0)
        PyErr_Clear();
    PyObject *id = PyBytes_FromStringAndSize(self->id, MESSAGE_ID_SIZE);
    if (id == NULL)
        return NULL;
    PyObject *text = PyUnicode_FromFormat("Message(id=%R, body=<%zd bytes>, timestamp=%lld, attempts=%lld)", id,
                                          size, self->timestamp, self->attempts);
    Py_DECREF(id);
    return text;
}

static PyObject *
message_get_id(MessageObject *self, void *Py_UNUSED(closure))
{
    return PyBytes_FromStringAndSize(self->id, MESSAGE_ID_SIZE);
}

static int
message_set_id(MessageObject *self, PyObject *value, void *Py_UNUSED(closure))
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a message's ID cannot be deleted");
        return -1;
    }
    return message_id_from(value, self->id);
}

static PyObject *
message_get_body(MessageObject *self, void *Py_UNUSED(closure))
{
    Py_INCREF(self->body);
    return self->body;
}

static int
message_set_body(MessageObject *self, PyObject *value, void *Py_UNUSED(closure))
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a message's body cannot be deleted");
        return -1;
    }
    Py_INCREF(value);
    Py_SETREF(self->body, value);
    return 0;
}

static PyObject *
message_get_client(MessageObject *self, void *Py_UNUSED(closure))
{
    Py_INCREF(self->client);
    return self->client;
}

static int
message_set_client(MessageObject *self, PyObject *value, void *Py_UNUSED(closure))
{
    if (value == NULL)
        value = Py_None;
    Py_INCREF(value);
    Py_SETREF(self->client, value);
    return 0;
}

static PyGetSetDef message_getset[] = {
    {"id", (getter)message_get_id, (setter)message_set_id, "The 16-byte ID (a new bytes object each read).", NULL},
    {"body", (getter)message_get_body, (setter)message_set_body, "The body.", NULL},
    {"client", (getter)message_get_client, (setter)message_set_client, "The consumer holding it in flight.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef message_members[] = {
    {"timestamp", T_LONGLONG, offsetof(MessageObject, timestamp), 0, "Publish time, ns since the epoch."},
    {"attempts", T_LONGLONG, offsetof(MessageObject, attempts), 0, "Deliveries so far."},
    {"defer", T_DOUBLE, offsetof(MessageObject, defer), 0, "The delay a DPUB asked for, in seconds."},
    {"delivered_at", T_DOUBLE, offsetof(MessageObject, delivered_at), 0, "Trio time of the delivery."},
    {"disk_token", T_LONGLONG, offsetof(MessageObject, disk_token), 0, "Durable mode: its disk record's token."},
    {"in_flight", T_LONGLONG, offsetof(MessageObject, in_flight), 0, "Its in-flight bucket's number, or -1."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject MessageType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "nsqd._speedups.Message",
    .tp_basicsize = sizeof(MessageObject),
    .tp_dealloc = (destructor)message_dealloc,
    .tp_repr = (reprfunc)message_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A message inside nsqd (nsqd/message.py): its fields in one object, the ID inline.",
    .tp_richcompare = (richcmpfunc)message_richcompare,
    .tp_members = message_members,
    .tp_getset = message_getset,
    .tp_new = message_new,
};

/* MessageIndex: C Messages by their IDs, the in-flight queue's index (nsqd/queues/inflight.py; a dict keyed by
   the IDs is its Python twin there).

   An open-addressing table of pointers to the messages, with linear probing and deletion by backward shift (no
   tombstones), at most 3/4 full and halved when under 1/8 full: 11-21 bytes per message where a dict's entry
   costs 36-72 and needs a bytes object for the key. A slot's hash is not stored: the ID inline in the message is
   hashed again when needed, by Python's own (randomised) hash of bytes. It holds only C Messages, which the
   cyclic collector does not follow, so it is not followed either. A key is a 16-byte bytes object or a Message
   (its ID).

   A table of INDEX_MAP_BYTES or more is mapped on its own (mmap: its pages zeroed by the kernel as first touched)
   and unmapped when outgrown, so its memory goes back to the system. From the C heap, the tables a growing index
   leaves behind (half, a quarter... of the new one) stay in the heap as free blocks, and glibc's malloc, having
   freed one large mapped block, serves the next ones up to that size from the heap as well: with four channels
   of 1,000,000 messages each in flight, 22 bytes of resident set per message and channel. */
typedef struct {
    PyObject_HEAD
    MessageObject **slots;  /* NULL until the first add */
    size_t mask;            /* capacity - 1 (a power of 2); 0 without slots */
    Py_ssize_t used;
} IndexObject;

static PyTypeObject IndexType;

#define INDEX_MIN 8

static size_t
index_hash(const char *id)
{
    return (size_t)_Py_HashBytes(id, MESSAGE_ID_SIZE);
}

/* The ID a key names: 1 and *id set, 0 for bytes of another size (no message has it), -1 with TypeError. */
static int
index_key(PyObject *key, const char **id)
{
    if (Message_Check(key)) {
        *id = ((MessageObject *)key)->id;
        return 1;
    }
    if (PyBytes_Check(key)) {
        *id = PyBytes_AS_STRING(key);
        return PyBytes_GET_SIZE(key) == MESSAGE_ID_SIZE;
    }
    PyErr_Format(PyExc_TypeError, "a message ID is bytes, not %.200s", Py_TYPE(key)->tp_name);
    return -1;
}

/* The slot holding the message with this ID, or the empty slot where its probe ends. */
static size_t
index_slot(IndexObject *self, const char *id)
{
    size_t i = index_hash(id) & self->mask;
    MessageObject *at;
    while ((at = self->slots[i]) != NULL && memcmp(at->id, id, MESSAGE_ID_SIZE) != 0)
        i = (i + 1) & self->mask;
    return i;
}

#define INDEX_MAP_BYTES ((size_t)1 << 16)

/* A table of capacity empty slots (NULL on failure, no exception set). */
static MessageObject **
index_table_new(size_t capacity)
{
    size_t bytes = capacity * sizeof(MessageObject *);
    if (bytes < INDEX_MAP_BYTES)
        return PyMem_Calloc(capacity, sizeof(MessageObject *));
    void *mapped = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return mapped == MAP_FAILED ? NULL : mapped;
}

static void
index_table_free(MessageObject **slots, size_t capacity)
{
    size_t bytes = capacity * sizeof(MessageObject *);
    if (slots == NULL)
        return;
    if (bytes < INDEX_MAP_BYTES)
        PyMem_Free(slots);
    else
        munmap(slots, bytes);
}

static int
index_resize(IndexObject *self, size_t capacity)
{
    MessageObject **slots = index_table_new(capacity);
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    MessageObject **old = self->slots;
    size_t old_capacity = old == NULL ? 0 : self->mask + 1;
    self->slots = slots;
    self->mask = capacity - 1;
    for (size_t k = 0; k < old_capacity; k++) {
        if (old[k] != NULL)
            slots[index_slot(self, old[k]->id)] = old[k];
    }
    index_table_free(old, old_capacity);
    return 0;
}

/* Take the message out of slot i (its reference goes to the caller) and close the gap. */
static MessageObject *
index_take(IndexObject *self, size_t i)
{
    MessageObject **slots = self->slots;
    size_t mask = self->mask;
    MessageObject *taken = slots[i];
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (slots[j] == NULL)
            break;
        size_t home = index_hash(slots[j]->id) & mask;
        /* slot j may fill the gap at i unless its home lies cyclically in (i, j] */
        int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            slots[i] = slots[j];
            i = j;
        }
    }
    slots[i] = NULL;
    self->used--;
    size_t capacity = mask + 1;
    if (capacity > INDEX_MIN && (size_t)self->used < capacity / 8 && index_resize(self, capacity / 2) < 0)
        PyErr_Clear();  /* it stays larger: no harm */
    return taken;
}

static PyObject *
index_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (!_PyArg_NoPositional("MessageIndex", args) || !_PyArg_NoKeywords("MessageIndex", kwds))
        return NULL;
    IndexObject *self = PyObject_New(IndexObject, type);
    if (self == NULL)
        return NULL;
    self->slots = NULL;
    self->mask = 0;
    self->used = 0;
    return (PyObject *)self;
}

static void
index_release(IndexObject *self)
{
    MessageObject **slots = self->slots;
    size_t capacity = slots == NULL ? 0 : self->mask + 1;
    self->slots = NULL;
    self->mask = 0;
    self->used = 0;
    for (size_t k = 0; k < capacity; k++)
        Py_XDECREF(slots[k]);
    index_table_free(slots, capacity);
}

static void
index_dealloc(IndexObject *self)
{
    index_release(self);
    PyObject_Free(self);
}

/* add(message) -> bool: False (and nothing changed) when a message with its ID is in already. */
static PyObject *
index_add(IndexObject *self, PyObject *message)
{
    if (!Message_Check(message)) {
        PyErr_Format(PyExc_TypeError, "MessageIndex holds Message objects, not %.200s", Py_TYPE(message)->tp_name);
        return NULL;
    }
    size_t capacity = self->slots == NULL ? 0 : self->mask + 1;
    if ((size_t)(self->used + 1) * 4 > capacity * 3 && index_resize(self, capacity ? capacity * 2 : INDEX_MIN) < 0)
        return NULL;
    size_t i = index_slot(self, ((MessageObject *)message)->id);
    if (self->slots[i] != NULL)
        Py_RETURN_FALSE;
    Py_INCREF(message);
    self->slots[i] = (MessageObject *)message;
    self->used++;
    Py_RETURN_TRUE;
}

/* The slot of key's message, or -1 (none, or an error when PyErr_Occurred). */
static Py_ssize_t
index_lookup(IndexObject *self, PyObject *key)
{
    const char *id;
    int named = index_key(key, &id);
    if (named <= 0 || self->used == 0)
        return -1;
    size_t i = index_slot(self, id);
    return self->slots[i] == NULL ? -1 : (Py_ssize_t)i;
}

static PyObject *
index_get_or_pop(IndexObject *self, PyObject *const *args, Py_ssize_t nargs, int pop)
{
    if (!_PyArg_CheckPositional(pop ? "pop" : "get", nargs, 1, 2))
        return NULL;
    Py_ssize_t i = index_lookup(self, args[0]);
    if (i < 0) {
        if (PyErr_Occurred())
            return NULL;
        if (pop && nargs == 1) {
            PyErr_SetObject(PyExc_KeyError, args[0]);
            return NULL;
        }
        PyObject *fallback = nargs > 1 ? args[1] : Py_None;
        Py_INCREF(fallback);
        return fallback;
    }
    if (pop)
        return (PyObject *)index_take(self, (size_t)i);
    Py_INCREF(self->slots[i]);
    return (PyObject *)self->slots[i];
}

/* get(key, default=None) */
static PyObject *
index_get(IndexObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return index_get_or_pop(self, args, nargs, 0);
}

/* pop(key[, default]): the message taken out, or default (KeyError without one), as a dict's */
static PyObject *
index_pop(IndexObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return index_get_or_pop(self, args, nargs, 1);
}

/* values() -> list, in no particular order */
static PyObject *
index_values(IndexObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *values = PyList_New(self->used);
    if (values == NULL)
        return NULL;
    Py_ssize_t n = 0;
    size_t capacity = self->slots == NULL ? 0 : self->mask + 1;
    for (size_t k = 0; k < capacity; k++) {
        if (self->slots[k] != NULL) {
            Py_INCREF(self->slots[k]);
            PyList_SET_ITEM(values, n++, (PyObject *)self->slots[k]);
        }
    }
    return values;
}

static PyObject *
index_clear(IndexObject *self, PyObject *Py_UNUSED(ignored))
{
    index_release(self);
    Py_RETURN_NONE;
}

static Py_ssize_t
index_length(IndexObject *self)
{
    return self->used;
}

static int
index_contains(IndexObject *self, PyObject *key)
{
    Py_ssize_t i = index_lookup(self, key);
    return i >= 0 ? 1 : PyErr_Occurred() ? -1 : 0;
}

static PyObject *
index_sizeof(IndexObject *self, PyObject *Py_UNUSED(ignored))
{
    size_t capacity = self->slots == NULL ? 0 : self->mask + 1;
    return PyLong_FromSize_t(sizeof(IndexObject) + capacity * sizeof(MessageObject *));
}

static PyMethodDef index_methods[] = {
    {"add", (PyCFunction)index_add, METH_O, "Add a message; False when one with its ID is in already."},
    {"get", (PyCFunction)(void (*)(void))index_get, METH_FASTCALL, "The message with this ID, or default."},
    {"pop", (PyCFunction)(void (*)(void))index_pop, METH_FASTCALL, "Take out the message with this ID (a dict's pop)."},
    {"values", (PyCFunction)index_values, METH_NOARGS, "The messages, as a list."},
    {"clear", (PyCFunction)index_clear, METH_NOARGS, "Take every message out."},
    {"__sizeof__", (PyCFunction)index_sizeof, METH_NOARGS, "Bytes taken, the table included."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods index_as_sequence = {
    .sq_length = (lenfunc)index_length,
    .sq_contains = (objobjproc)index_contains,
};

static PyTypeObject IndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "nsqd._speedups.MessageIndex",
    .tp_basicsize = sizeof(IndexObject),
    .tp_dealloc = (destructor)index_dealloc,
    .tp_as_sequence = &index_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "C Messages by their IDs: an open-addressing table of pointers (nsqd/queues/inflight.py).",
    .tp_methods = index_methods,
    .tp_new = index_new,
};

/* new_messages(cls, ids, bodies, timestamp, defer) -> list

   nsqd.message.new_messages in C: cls(ids[i], bodies[i], timestamp, 0, defer) for each i (timestamp[i] when
   timestamp is a list; the i-th 16 bytes when ids is a bytes object of them joined: the module's
   NEW_MESSAGES_PACKED says this build takes both, as a packed queue hands them), with every slot that
   Message.__init__ sets (MESSAGE_SLOTS, in this order: id, body, timestamp, attempts, defer, client,
   delivered_at, disk_token) written directly where its member descriptor says, then untracked as untrack_atomic
   would. The Python class call runs __init__ as a Python frame per message, most of a PUB's publish;
   tests/nsqd/test_message_collector.py compares every slot with the Python twin's. */
#define MESSAGE_SLOTS 9
static const char *message_slots[MESSAGE_SLOTS] = {"id", "body", "timestamp", "attempts", "defer", "client",
                                                   "delivered_at", "disk_token", "in_flight"};
static PyTypeObject *message_class = NULL;  /* the class whose offsets are cached (a strong reference) */
static Py_ssize_t message_offsets[MESSAGE_SLOTS];
static PyObject *zero_float = NULL, *minus_one = NULL, *zero_int = NULL;

/* Where the writable slot `name` of the class `cls` (a __slots__ entry) is in its instances: *offset; -1 with
   TypeError when it is not one. */
static int
slot_offset(PyTypeObject *cls, const char *name, Py_ssize_t *offset)
{
    PyObject *descr = PyObject_GetAttrString((PyObject *)cls, name);
    if (descr == NULL)
        return -1;
    int is_member = Py_IS_TYPE(descr, &PyMemberDescr_Type);
    if (is_member) {
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        is_member = member->type == T_OBJECT_EX && !(member->flags & READONLY);
        *offset = member->offset;
    }
    Py_DECREF(descr);
    if (!is_member) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a writable slot", cls->tp_name, name);
        return -1;
    }
    return 0;
}

/* The slot at `offset` of `object` (borrowed; NULL when unset). */
#define SLOT(object, offset) (*(PyObject **)((char *)(object) + (offset)))

static int
message_layout(PyTypeObject *cls)
{
    Py_ssize_t offsets[MESSAGE_SLOTS];
    for (int i = 0; i < MESSAGE_SLOTS; i++) {
        if (slot_offset(cls, message_slots[i], &offsets[i]) < 0)
            return -1;
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

/* new_messages for the C Message: defer NULL for none. */
static PyObject *
new_compact_messages(PyObject *ids, int joined, PyObject *bodies, PyObject *timestamp, int stamps, PyObject *defer)
{
    Py_ssize_t n = PyList_GET_SIZE(bodies);
    double delay = defer == NULL ? 0.0 : PyFloat_AsDouble(defer);
    long long stamp = stamps ? 0 : PyLong_AsLongLong(timestamp);
    if ((delay == -1.0 || stamp == -1) && PyErr_Occurred())
        return NULL;
    PyObject *messages = PyList_New(n);
    if (messages == NULL)
        return NULL;
    char raw[MESSAGE_ID_SIZE];
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *id = raw;
        if (joined)
            id = PyBytes_AS_STRING(ids) + i * MESSAGE_ID_SIZE;
        else if (message_id_from(PyList_GET_ITEM(ids, i), raw) < 0)
            goto error;
        if (stamps && (stamp = PyLong_AsLongLong(PyList_GET_ITEM(timestamp, i))) == -1 && PyErr_Occurred())
            goto error;
        MessageObject *message = message_alloc(id, PyList_GET_ITEM(bodies, i), stamp, 0, delay);
        if (message == NULL)
            goto error;
        PyList_SET_ITEM(messages, i, (PyObject *)message);
    }
    return messages;
error:
    Py_DECREF(messages);  /* the slots not set yet are NULL, which the list's dealloc skips */
    return NULL;
}

static PyObject *
new_messages(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyTypeObject *cls;
    PyObject *ids, *bodies, *timestamp, *defer;
    if (!PyArg_ParseTuple(args, "O!OO!OO", &PyType_Type, &cls, &ids, &PyList_Type, &bodies, &timestamp, &defer))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(bodies);
    int joined = PyBytes_Check(ids);  /* the IDs joined, MESSAGE_ID_SIZE bytes each: a bytes object made for each */
    if (!joined && !PyList_Check(ids)) {
        PyErr_SetString(PyExc_TypeError, "new_messages takes the ids as a list or joined in bytes");
        return NULL;
    }
    if (joined ? PyBytes_GET_SIZE(ids) != n * MESSAGE_ID_SIZE : PyList_GET_SIZE(ids) != n) {
        PyErr_SetString(PyExc_ValueError, "ids and bodies differ in length");
        return NULL;
    }
    int compact = cls == &MessageType;  /* the C Message: its fields written directly */
    if (!compact && cls != message_class && message_layout(cls) < 0)
        return NULL;
    int stamps = PyList_Check(timestamp);  /* one timestamp per message */
    if (stamps && PyList_GET_SIZE(timestamp) != n) {
        PyErr_SetString(PyExc_ValueError, "ids and timestamps differ in length");
        return NULL;
    }
    int deferred = PyObject_IsTrue(defer);
    if (deferred < 0)
        return NULL;
    if (compact)
        return new_compact_messages(ids, joined, bodies, timestamp, stamps, deferred ? defer : NULL);
    if (!deferred)
        defer = zero_float;  /* as Message's default: a falsy delay is stored as 0.0 */
    PyObject *messages = PyList_New(n);
    if (messages == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *id;
        if (joined)
            id = PyBytes_FromStringAndSize(PyBytes_AS_STRING(ids) + i * MESSAGE_ID_SIZE, MESSAGE_ID_SIZE);
        else {
            id = PyList_GET_ITEM(ids, i);
            Py_INCREF(id);
        }
        PyObject *message = id == NULL ? NULL : cls->tp_alloc(cls, 0);
        if (message == NULL) {
            Py_XDECREF(id);
            Py_DECREF(messages);
            return NULL;
        }
        PyObject *values[MESSAGE_SLOTS] = {id, PyList_GET_ITEM(bodies, i),
                                           stamps ? PyList_GET_ITEM(timestamp, i) : timestamp,
                                           zero_int, defer, Py_None, zero_float, minus_one, minus_one};
        for (int k = 1; k < MESSAGE_SLOTS; k++)
            Py_INCREF(values[k]);  /* the id's reference is already the message's */
        for (int k = 0; k < MESSAGE_SLOTS; k++)
            *(PyObject **)((char *)message + message_offsets[k]) = values[k];
        untrack_if_atomic(message);
        PyList_SET_ITEM(messages, i, message);
    }
    return messages;
}

/* claim_shared(batch) -> None

   nsqd.message.claim_shared in C: each message of the list that something besides the list references (another
   channel's queue or deferred heap: the topic hands every channel the same objects) is replaced in the list by
   a copy of all its slots (MESSAGE_SLOTS), made as new_messages makes a message; the others are left as they
   are, with no call. Only the channel's dispatcher calls it, on a batch it popped and is about to deliver. */
static PyObject *
claim_shared(PyObject *Py_UNUSED(self), PyObject *batch)
{
    if (!PyList_Check(batch)) {
        PyErr_SetString(PyExc_TypeError, "claim_shared takes a list");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(batch); i++) {
        PyObject *message = PyList_GET_ITEM(batch, i);
        if (Py_REFCNT(message) <= 1)
            continue;
        if (Message_Check(message)) {
            MessageObject *from = (MessageObject *)message;
            MessageObject *copy = message_alloc(from->id, from->body, from->timestamp, from->attempts, from->defer);
            if (copy == NULL)
                return NULL;
            Py_INCREF(from->client);
            Py_SETREF(copy->client, from->client);
            copy->delivered_at = from->delivered_at;
            copy->disk_token = from->disk_token;
            copy->in_flight = from->in_flight;
            PyList_SET_ITEM(batch, i, (PyObject *)copy);
            Py_DECREF(message);
            continue;
        }
        PyTypeObject *cls = Py_TYPE(message);
        if (cls != message_class && message_layout(cls) < 0)
            return NULL;
        PyObject *copy = cls->tp_alloc(cls, 0);
        if (copy == NULL)
            return NULL;
        for (int k = 0; k < MESSAGE_SLOTS; k++) {
            PyObject *value = *(PyObject **)((char *)message + message_offsets[k]);
            if (value == NULL) {
                Py_DECREF(copy);
                PyErr_Format(PyExc_AttributeError, "%s.%s is not set", cls->tp_name, message_slots[k]);
                return NULL;
            }
            Py_INCREF(value);
            *(PyObject **)((char *)copy + message_offsets[k]) = value;
        }
        PyList_SET_ITEM(batch, i, copy);  /* the list's reference to the original goes */
        Py_DECREF(message);
    }
    Py_RETURN_NONE;
}

/* deliver_frames(batch, client, now, out) -> int

   nsqd.dispatch.deliver_frames in C: for each message of the list, attempts + 1, client and delivered_at (the
   float now) stored, and its frame appended to the list out in three pieces: the header up to the attempts
   (size, frame type 2, timestamp, attempts; the same bytes object again while those stay the same, as the
   messages of one publish share their timestamp and usually their size), the ID and the body. Returns the
   bodies' bytes. The slots are written where Message's member descriptors say (MESSAGE_SLOTS); the batch's
   messages are the channel's own (claim_shared ran before). */
#define FRAME_PREFIX_SIZE 18  /* int32 size, int32 frame type, int64 timestamp, uint16 attempts */
#define FRAME_OVERHEAD 30     /* what the size field counts besides the body: frame type 4 + message header 26 */

static void
put_be(unsigned char *at, unsigned long long value, int bytes)
{
    for (int i = bytes - 1; i >= 0; i--, value >>= 8)
        at[i] = (unsigned char)(value & 0xff);
}

/* deliver_frames' marks on a message of a Python class (slots written where its member descriptors say): sets
   *id (a new reference), *body (borrowed), the attempts counted and the timestamp; -1 with an exception. */
static int
deliver_slots(PyObject *message, PyObject *client, PyObject *now, PyObject **id, PyObject **body, long long *count,
              long long *stamp, Py_ssize_t *size)
{
    PyTypeObject *cls = Py_TYPE(message);
    if (cls != message_class && message_layout(cls) < 0)
        return -1;
    PyObject **slot[MESSAGE_SLOTS];
    for (int k = 0; k < MESSAGE_SLOTS; k++)
        slot[k] = (PyObject **)((char *)message + message_offsets[k]);
    PyObject *timestamp = *slot[2], *attempts = *slot[3];
    if (*slot[0] == NULL || *slot[1] == NULL || timestamp == NULL || attempts == NULL) {
        PyErr_Format(PyExc_AttributeError, "%s has a slot not set", cls->tp_name);
        return -1;
    }
    *count = PyLong_AsLongLong(attempts);
    *stamp = PyLong_AsLongLong(timestamp);
    *size = PyObject_Length(*slot[1]);
    if ((*count == -1 || *stamp == -1 || *size < 0) && PyErr_Occurred())
        return -1;
    *count += 1;
    PyObject *counted = PyLong_FromLongLong(*count);
    if (counted == NULL)
        return -1;
    Py_SETREF(*slot[3], counted);
    Py_INCREF(client);
    Py_SETREF(*slot[5], client);
    Py_INCREF(now);
    Py_SETREF(*slot[6], now);
    *id = *slot[0];
    Py_INCREF(*id);
    *body = *slot[1];
    return 0;
}

static PyObject *
deliver_frames(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *batch, *client, *now, *out;
    if (!PyArg_ParseTuple(args, "O!OO!O!", &PyList_Type, &batch, &client, &PyFloat_Type, &now, &PyList_Type, &out))
        return NULL;
    PyObject *prefix = NULL;
    long long last_size = -1, last_timestamp = 0, last_attempts = -1;
    long long total = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(batch); i++) {
        PyObject *message = PyList_GET_ITEM(batch, i);
        PyObject *id, *body;
        long long count, stamp;
        Py_ssize_t size;
        if (Message_Check(message)) {
            MessageObject *compact = (MessageObject *)message;
            body = compact->body;
            if ((size = PyObject_Length(body)) < 0)
                goto error;
            count = compact->attempts += 1;
            stamp = compact->timestamp;
            Py_INCREF(client);
            Py_SETREF(compact->client, client);
            compact->delivered_at = PyFloat_AS_DOUBLE(now);
            if ((id = PyBytes_FromStringAndSize(compact->id, MESSAGE_ID_SIZE)) == NULL)
                goto error;
        }
        else if (deliver_slots(message, client, now, &id, &body, &count, &stamp, &size) < 0)
            goto error;
        if (prefix == NULL || size != last_size || stamp != last_timestamp || count != last_attempts) {
            PyObject *made = PyBytes_FromStringAndSize(NULL, FRAME_PREFIX_SIZE);
            if (made == NULL)
                goto error;
            unsigned char *at = (unsigned char *)PyBytes_AS_STRING(made);
            put_be(at, (unsigned long long)(size + FRAME_OVERHEAD), 4);
            put_be(at + 4, 2, 4);  /* FRAME_TYPE_MESSAGE */
            put_be(at + 8, (unsigned long long)stamp, 8);
            put_be(at + 16, (unsigned long long)count, 2);
            Py_XSETREF(prefix, made);
            last_size = size;
            last_timestamp = stamp;
            last_attempts = count;
        }
        int failed = PyList_Append(out, prefix) < 0 || PyList_Append(out, id) < 0 || PyList_Append(out, body) < 0;
        Py_DECREF(id);
        if (failed)
            goto error;
        total += size;
    }
    Py_XDECREF(prefix);
    return PyLong_FromLongLong(total);
error:
    Py_XDECREF(prefix);
    return NULL;
}

/* packed_layout(queue_class, window_class, packed_class, segment_messages, segment_bytes) -> None
   extend_open(queue, packed, joined_ids, bodies, timestamp, size) -> bool

   nsqd.queues.packed's extend_open in C: a publish with no delay appended to the topic's open segment `packed`
   and the window that ends the topic's queue `queue` extended over it, when that window is on `packed`, ends
   where `packed` does, and `packed` has room (fewer than segment_messages messages and segment_bytes bytes of
   bodies); False, with nothing changed, otherwise (the caller then goes the general way: Segments.add, then
   PackedQueue.extend_window). The containers change as _Packed.append changes them (the same slice assignments,
   the same array appends, so they grow alike), and the slots of the three classes that packed_layout names
   (PackedQueue, _Window, _Packed) are read and written where their member descriptors say, as new_messages does
   a Python Message's. tests/nsqd/test_packed.py compares the two twins' segments and queues. */
static PyTypeObject *queue_class = NULL, *window_class = NULL, *packed_class = NULL;
static Py_ssize_t queue_runs_at, queue_count_at, window_packed_at, window_end_at, packed_ids_at, packed_bodies_at,
    packed_count_at, packed_size_at, packed_stamps_at, packed_delays_at, packed_ends_at;
static Py_ssize_t segment_messages, segment_bytes;
static PyObject *str_append = NULL;

#define PACKED_ID_SIZE 8  /* an ID as a segment keeps it (nsqd.queues.packed.ID_SIZE) */

static PyObject *
packed_layout(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyTypeObject *queue, *window, *packed;
    Py_ssize_t messages, bytes;
    if (!PyArg_ParseTuple(args, "O!O!O!nn", &PyType_Type, &queue, &PyType_Type, &window, &PyType_Type, &packed,
                          &messages, &bytes))
        return NULL;
    struct { PyTypeObject *cls; const char *name; Py_ssize_t *at; } slots[] = {
        {queue, "_runs", &queue_runs_at}, {queue, "count", &queue_count_at}, {window, "packed", &window_packed_at},
        {window, "end", &window_end_at}, {packed, "ids", &packed_ids_at}, {packed, "bodies", &packed_bodies_at},
        {packed, "count", &packed_count_at}, {packed, "size", &packed_size_at},
        {packed, "stamps", &packed_stamps_at}, {packed, "delays", &packed_delays_at},
        {packed, "ends", &packed_ends_at},
    };
    Py_ssize_t offsets[sizeof(slots) / sizeof(slots[0])];
    for (size_t i = 0; i < sizeof(slots) / sizeof(slots[0]); i++) {
        if (slot_offset(slots[i].cls, slots[i].name, &offsets[i]) < 0)
            return NULL;
    }
    if (zero_float == NULL && (zero_float = PyFloat_FromDouble(0.0)) == NULL)
        return NULL;
    for (size_t i = 0; i < sizeof(slots) / sizeof(slots[0]); i++)
        *slots[i].at = offsets[i];
    segment_messages = messages;
    segment_bytes = bytes;
    Py_INCREF(queue);
    Py_XSETREF(queue_class, queue);
    Py_INCREF(window);
    Py_XSETREF(window_class, window);
    Py_INCREF(packed);
    Py_XSETREF(packed_class, packed);
    Py_RETURN_NONE;
}

/* The int slot at `offset` of `object` as a Py_ssize_t: -1 with an error set when it holds no int. */
static Py_ssize_t
int_slot(PyObject *object, Py_ssize_t offset)
{
    PyObject *value = SLOT(object, offset);
    if (value == NULL || !PyLong_CheckExact(value)) {
        PyErr_SetString(PyExc_TypeError, "a slot that holds a count holds no int");
        return -1;
    }
    return PyLong_AsSsize_t(value);
}

/* Set the slot at `offset` of `object` to the new reference `value` (NULL: an error, returned as -1). */
static int
set_slot(PyObject *object, Py_ssize_t offset, PyObject *value)
{
    if (value == NULL)
        return -1;
    Py_XSETREF(SLOT(object, offset), value);
    return 0;
}

/* Append `value` to the array `to` (its own append method: it grows as a Python call grows it). */
static int
array_append(PyObject *to, PyObject *value)
{
    PyObject *done = PyObject_CallMethodOneArg(to, str_append, value);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

static PyObject *
extend_open(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "extend_open takes 6 arguments");
        return NULL;
    }
    PyObject *queue = args[0], *packed = args[1], *joined = args[2], *bodies = args[3], *timestamp = args[4];
    if (queue_class == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "extend_open before packed_layout");
        return NULL;
    }
    if (!Py_IS_TYPE(queue, queue_class) || !Py_IS_TYPE(packed, packed_class) || !PyBytes_Check(joined) ||
        !PyList_Check(bodies))
        Py_RETURN_FALSE;
    PyObject *runs = SLOT(queue, queue_runs_at);
    Py_ssize_t n = PyList_GET_SIZE(bodies);
    if (runs == NULL || n == 0 || PyBytes_GET_SIZE(joined) != n * PACKED_ID_SIZE)
        Py_RETURN_FALSE;
    Py_ssize_t held = PyObject_Length(runs);
    if (held <= 0)
        return held < 0 ? NULL : Py_NewRef(Py_False);
    PyObject *last = PySequence_GetItem(runs, held - 1);  /* a new reference: released at the end */
    if (last == NULL)
        return NULL;
    PyObject *result = Py_False;
    if (!Py_IS_TYPE(last, window_class) || SLOT(last, window_packed_at) != packed)
        goto done;
    Py_ssize_t start = int_slot(packed, packed_count_at), last_end = int_slot(last, window_end_at);
    Py_ssize_t size = int_slot(packed, packed_size_at), added = PyLong_AsSsize_t(args[5]);
    long long stamp = PyLong_AsLongLong(timestamp);
    if (PyErr_Occurred())
        goto error;
    if (last_end != start || start >= segment_messages || size >= segment_bytes)
        goto done;
    PyObject *ids = SLOT(packed, packed_ids_at), *kept = SLOT(packed, packed_bodies_at);
    PyObject *stamps = SLOT(packed, packed_stamps_at), *delays = SLOT(packed, packed_delays_at);
    PyObject *ends = SLOT(packed, packed_ends_at);
    if (ids == NULL || !PyByteArray_CheckExact(ids) || kept == NULL || !PyList_CheckExact(kept) || stamps == NULL ||
        delays == NULL || ends == NULL)
        goto done;
    /* _Packed.append: ids[start * 8 : end * 8] = joined (grown as the slice assignment grows it) */
    Py_ssize_t end = start + n;
    if (PyByteArray_GET_SIZE(ids) < end * PACKED_ID_SIZE && PyByteArray_Resize(ids, end * PACKED_ID_SIZE) < 0)
        goto error;
    memcpy(PyByteArray_AS_STRING(ids) + start * PACKED_ID_SIZE, PyBytes_AS_STRING(joined), n * PACKED_ID_SIZE);
    if (PyList_SetSlice(kept, start, end, bodies) < 0)
        goto error;
    PyObject *end_object = PyLong_FromSsize_t(end);
    if (end_object == NULL)
        goto error;
    int failed = set_slot(packed, packed_count_at, Py_NewRef(end_object)) < 0 ||
                 set_slot(packed, packed_size_at, PyLong_FromSsize_t(size + added)) < 0;
    /* one entry per run of publishes with the same timestamp and no delay */
    Py_ssize_t runs_count = failed ? -1 : PyObject_Length(stamps);
    int same = 0;
    if (runs_count > 0) {
        PyObject *last_stamp = PySequence_GetItem(stamps, runs_count - 1);
        PyObject *last_delay = last_stamp == NULL ? NULL : PySequence_GetItem(delays, runs_count - 1);
        if (last_delay != NULL) {
            long long previous = PyLong_AsLongLong(last_stamp);
            double delay = PyFloat_AsDouble(last_delay);
            same = previous == stamp && delay == 0.0;
        }
        Py_XDECREF(last_stamp);
        Py_XDECREF(last_delay);
        failed = PyErr_Occurred() != NULL;
    }
    else
        failed = runs_count < 0;
    if (!failed && same)
        failed = PySequence_SetItem(ends, runs_count - 1, end_object) < 0;
    else if (!failed)
        failed = array_append(stamps, timestamp) < 0 || array_append(delays, zero_float) < 0 ||
                 array_append(ends, end_object) < 0;
    if (failed) {
        Py_DECREF(end_object);
        goto error;
    }
    set_slot(last, window_end_at, end_object);  /* the reference passes to the slot */
    Py_ssize_t count = int_slot(queue, queue_count_at);
    if (count < 0 && PyErr_Occurred())
        goto error;
    if (set_slot(queue, queue_count_at, PyLong_FromSsize_t(count + n)) < 0)
        goto error;
    result = Py_True;
done:
    Py_DECREF(last);
    return Py_NewRef(result);
error:
    Py_DECREF(last);
    return NULL;
}

/* guid_layout(factory_class, twepoch, tick_shift, node_id_bits, sequence_bits) -> None
   next_packed_one(factory, now_ns) -> bytes | None

   nsqd.guid's next_packed_one in C: a GUIDFactory's next ID as the 8 big-endian bytes a segment keeps, when it is
   the first of a new tick or the next of the clock's tick; None, with nothing used, otherwise (the factory's
   next_packed then claims it its own way). The slots _last_tick, _sequence and _ahead change as the Python twin
   changes them, read and written where guid_layout found them; the value is nsqd.guid's layout, with the
   constants it hands over. tests/nsqd/test_guid.py runs both twins against next_ids. */
static PyTypeObject *factory_class = NULL;
static Py_ssize_t factory_node_id_at, factory_first_at, factory_end_at, factory_last_tick_at, factory_sequence_at,
    factory_ahead_at;
static long long guid_twepoch, guid_tick_shift, guid_node_id_bits, guid_sequence_bits;

static PyObject *
guid_layout(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyTypeObject *cls;
    long long twepoch, tick_shift, node_id_bits, sequence_bits;
    if (!PyArg_ParseTuple(args, "O!LLLL", &PyType_Type, &cls, &twepoch, &tick_shift, &node_id_bits, &sequence_bits))
        return NULL;
    struct { const char *name; Py_ssize_t *at; } slots[] = {
        {"node_id", &factory_node_id_at}, {"_first", &factory_first_at}, {"_end", &factory_end_at},
        {"_last_tick", &factory_last_tick_at}, {"_sequence", &factory_sequence_at}, {"_ahead", &factory_ahead_at},
    };
    Py_ssize_t offsets[sizeof(slots) / sizeof(slots[0])];
    for (size_t i = 0; i < sizeof(slots) / sizeof(slots[0]); i++) {
        if (slot_offset(cls, slots[i].name, &offsets[i]) < 0)
            return NULL;
    }
    for (size_t i = 0; i < sizeof(slots) / sizeof(slots[0]); i++)
        *slots[i].at = offsets[i];
    guid_twepoch = twepoch;
    guid_tick_shift = tick_shift;
    guid_node_id_bits = node_id_bits;
    guid_sequence_bits = sequence_bits;
    Py_INCREF(cls);
    Py_XSETREF(factory_class, cls);
    Py_RETURN_NONE;
}

static PyObject *
next_packed_one(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "next_packed_one takes 2 arguments");
        return NULL;
    }
    PyObject *factory = args[0];
    if (factory_class == NULL || !Py_IS_TYPE(factory, factory_class))
        Py_RETURN_NONE;
    long long now_ns = PyLong_AsLongLong(args[1]);
    Py_ssize_t node_id = int_slot(factory, factory_node_id_at), first = int_slot(factory, factory_first_at);
    Py_ssize_t end = int_slot(factory, factory_end_at), last = int_slot(factory, factory_last_tick_at);
    Py_ssize_t sequence = int_slot(factory, factory_sequence_at);
    if (PyErr_Occurred())
        return NULL;
    long long now_tick = now_ns >> guid_tick_shift;
    if (now_tick > last && now_tick >= guid_twepoch)
        sequence = first;
    else if (now_tick == last && sequence + 1 < end)
        sequence += 1;
    else
        Py_RETURN_NONE;
    if (now_tick != last && set_slot(factory, factory_last_tick_at, PyLong_FromLongLong(now_tick)) < 0)
        return NULL;
    if (set_slot(factory, factory_sequence_at, PyLong_FromSsize_t(sequence)) < 0)
        return NULL;
    set_slot(factory, factory_ahead_at, Py_NewRef(Py_False));
    unsigned long long value = (unsigned long long)(now_tick - guid_twepoch) << guid_node_id_bits;
    value <<= guid_sequence_bits;
    value |= ((unsigned long long)node_id << guid_sequence_bits) | (unsigned long long)sequence;
    unsigned char packed[PACKED_ID_SIZE];
    for (int i = PACKED_ID_SIZE - 1; i >= 0; i--, value >>= 8)
        packed[i] = (unsigned char)(value & 0xFF);
    return PyBytes_FromStringAndSize((const char *)packed, PACKED_ID_SIZE);
}

static PyMethodDef methods[] = {
    {"read_pubs", read_pubs, METH_VARARGS, "Read a socket; its bodies if it held only whole PUBs of one line."},
    {"read_producers", read_producers, METH_VARARGS, "A poller step's light producers read in one call."},
    {"use_uring", use_uring, METH_VARARGS, "Whether the reads and writes go through the io_uring (on=False: not)."},
    {"poll_producers", poll_producers, METH_VARARGS, "A poller step's epoll wait with its light producers read."},
    {"count_published", count_published, METH_VARARGS, "Add a batch's counts to each producer's figures."},
    {"write_oks", write_oks, METH_VARARGS, "Write each socket the OK frames it is owed."},
    {"untrack_atomic", untrack_atomic, METH_O, "Untrack the objects of a list that reference only atomic values."},
    {"new_messages", new_messages, METH_VARARGS, "Messages of a published batch, made without __init__."},
    {"track_all", track_all, METH_O, "Track again the objects of a list that the collector does not."},
    {"claim_shared", claim_shared, METH_O, "Replace the messages of a list that are referenced elsewhere by copies."},
    {"deliver_frames", deliver_frames, METH_VARARGS, "Mark a batch delivered and append its frames to a list."},
    {"packed_layout", packed_layout, METH_VARARGS, "Name the packed queue's classes and a segment's bounds."},
    {"guid_layout", guid_layout, METH_VARARGS, "Name the GUID factory's class and the IDs' layout."},
    {"next_packed_one", (PyCFunction)(void (*)(void))next_packed_one, METH_FASTCALL,
     "A factory's next ID as 8 bytes, when it is the first of a new tick or the next of the clock's tick."},
    {"extend_open", (PyCFunction)(void (*)(void))extend_open, METH_FASTCALL,
     "Append a publish to the open segment and the queue's last window on it, when that is where it goes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "nsqd._speedups",
    .m_doc = "The C twins of nsqd.fastpath's reads and write, and of nsqd.message's collector hints.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    struct { PyObject **name; const char *text; } names[] = {
        {&str_fast_line, "fast_line"}, {&str_client, "client"}, {&str_out, "out"}, {&str_send_lock, "_send_lock"},
        {&str_locked, "locked"}, {&str_last_read, "last_read"}, {&str_read_moves_at, "_read_moves_at"},
        {&str_pub_counts, "pub_counts"}, {&str_poll_actor, "poll_actor"}, {&str_append, "append"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (*names[i].name == NULL && (*names[i].name = PyUnicode_InternFromString(names[i].text)) == NULL)
            return NULL;
    }
    MessageType.tp_hash = PyBaseObject_Type.tp_hash;  /* by identity, as an object's (not left out with the order) */
    if (PyType_Ready(&MessageType) < 0 || PyType_Ready(&IndexType) < 0)
        return NULL;
    PyObject *created = PyModule_Create(&module);
    if (created != NULL && PyModule_AddIntConstant(created, "NEW_MESSAGES_PACKED", 1) < 0)
        Py_CLEAR(created);
    if (created != NULL && PyModule_AddObjectRef(created, "Message", (PyObject *)&MessageType) < 0)
        Py_CLEAR(created);
    if (created != NULL && PyModule_AddObjectRef(created, "MessageIndex", (PyObject *)&IndexType) < 0)
        Py_CLEAR(created);
    return created;
}
