/* A rank's stdout or stderr pipe: whole lines are forwarded with a "[rankN]:" prefix, and the
 * raw bytes optionally copied to a log file. */
#ifndef MTRUN_OUTPUT_H
#define MTRUN_OUTPUT_H

#include <stdbool.h>
#include <stddef.h>

typedef struct mtrun_stream {
    int fd;         /* read end of the rank's pipe; -1 once closed */
    int out_fd;     /* where prefixed lines go: mtrun's stdout or stderr; -1: nowhere */
    int log_fd;     /* raw copy, -1 when there is no --log_dir */
    int rank;       /* global rank shown in the prefix */
    char *buf;      /* the incomplete last line */
    size_t len, cap;
} mtrun_stream;

/* Sets up a stream reading fd (made non-blocking) for rank, forwarding to out_fd (-1: not
 * forwarded). When log_path
 * is not NULL the raw output is also written there; returns -1 with errno if it cannot be
 * opened (the stream still forwards). */
int mtrun_stream_open(mtrun_stream *s, int fd, int out_fd, int rank, const char *log_path);

/* Reads what is available and forwards every complete line. Returns true while the pipe is open,
 * false at end of file (the stream is then closed, its last partial line printed). */
bool mtrun_stream_pump(mtrun_stream *s);

/* Forwards what is still in the pipe without waiting and closes the stream: used once the rank
 * has exited, since a background child of the rank may keep the pipe open forever. */
void mtrun_stream_close(mtrun_stream *s);

#endif
