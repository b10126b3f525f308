/* Lines are assembled per stream and written with one write() each, so that lines of different
 * ranks never interleave and a long line is never cut: the buffer grows until the newline comes
 * (up to MTRUN_MAX_LINE, past which the line is forwarded in pieces rather than exhausting
 * memory). */
#include "output.h"

#include "logfiles.h"
#include "msg.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MTRUN_MAX_LINE ((size_t)64 << 20)

int mtrun_stream_open(mtrun_stream *s, int fd, int out_fd, int rank, const char *log_path) {
    *s = (mtrun_stream){.fd = fd, .out_fd = out_fd, .log_fd = -1, .rank = rank};
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    if (log_path) {
        s->log_fd = mtrun_logs_open_file(log_path);
        if (s->log_fd < 0) return -1;
    }
    return 0;
}

/* Writes "[rankN]:" + text + "\n" in one write. A closed stdout (mtrun piped into `head`) must
 * not stop the job, so write errors are dropped. */
static void emit_line(mtrun_stream *s, const char *text, size_t len) {
    char prefix[32];
    int plen = snprintf(prefix, sizeof prefix, "[rank%d]:", s->rank);
    size_t total = (size_t)plen + len + 1;
    char stack[8192];
    char *line = total <= sizeof stack ? stack : malloc(total);
    if (!line) { /* no memory for one copy: two writes are better than nothing */
        (void)mtrun_write_all(s->out_fd, prefix, (size_t)plen);
        (void)mtrun_write_all(s->out_fd, text, len);
        (void)mtrun_write_all(s->out_fd, "\n", 1);
        return;
    }
    memcpy(line, prefix, (size_t)plen);
    memcpy(line + plen, text, len);
    line[total - 1] = '\n';
    (void)mtrun_write_all(s->out_fd, line, total);
    if (line != stack) free(line);
}

static int reserve(mtrun_stream *s, size_t extra) {
    if (s->len + extra <= s->cap) return 0;
    size_t cap = s->cap ? s->cap : 4096;
    while (cap < s->len + extra) cap *= 2;
    char *p = realloc(s->buf, cap);
    if (!p) return -1;
    s->buf = p;
    s->cap = cap;
    return 0;
}

/* Emits every complete line in the buffer and keeps the rest. */
static void emit_complete_lines(mtrun_stream *s) {
    size_t start = 0;
    for (;;) {
        char *nl = memchr(s->buf + start, '\n', s->len - start);
        if (!nl) break;
        size_t end = (size_t)(nl - s->buf);
        emit_line(s, s->buf + start, end - start);
        start = end + 1;
    }
    if (start > 0) {
        memmove(s->buf, s->buf + start, s->len - start);
        s->len -= start;
    }
    if (s->len >= MTRUN_MAX_LINE) {
        emit_line(s, s->buf, s->len);
        s->len = 0;
    }
}

static void flush_partial(mtrun_stream *s) {
    if (s->len > 0) emit_line(s, s->buf, s->len);
    s->len = 0;
}

static void release(mtrun_stream *s) {
    flush_partial(s);
    if (s->fd >= 0) close(s->fd);
    if (s->log_fd >= 0) close(s->log_fd);
    free(s->buf);
    s->fd = s->log_fd = -1;
    s->buf = NULL;
    s->len = s->cap = 0;
}

/* Reads up to `rounds` chunks. Returns 0 once the stream is closed (end of file), 1 when nothing
 * more is readable now, 2 when there may be more. */
static int pump(mtrun_stream *s, int rounds) {
    if (s->fd < 0) return 0;
    for (int r = 0; r < rounds; r++) {
        if (reserve(s, 65536) != 0) {
            /* Out of memory: forward what we hold as it is rather than losing it. */
            flush_partial(s);
            if (reserve(s, 65536) != 0) return 1;
        }
        ssize_t n = read(s->fd, s->buf + s->len, s->cap - s->len);
        if (n > 0) {
            if (s->log_fd >= 0 && mtrun_write_all(s->log_fd, s->buf + s->len, (size_t)n) != 0) {
                mtrun_msg("cannot write the log of rank %d: %s; no longer logging it", s->rank,
                          strerror(errno));
                close(s->log_fd);
                s->log_fd = -1;
            }
            if (s->out_fd < 0) continue; /* redirected: the file is its only destination */
            s->len += (size_t)n;
            emit_complete_lines(s);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 1;
        release(s); /* end of file, or an error that will not go away */
        return 0;
    }
    return 2;
}

bool mtrun_stream_pump(mtrun_stream *s) {
    /* A bounded number of chunks per call so that one chatty rank cannot starve the others. */
    return pump(s, 16) != 0;
}

void mtrun_stream_close(mtrun_stream *s) {
    while (pump(s, 16) == 2) {
    }
    release(s);
}
