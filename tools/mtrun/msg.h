/* mtrun's own messages: one line on stderr prefixed "mtrun: ". */
#ifndef MTRUN_MSG_H
#define MTRUN_MSG_H

#include <stddef.h>
#include <sys/types.h>

/* Prints "mtrun: <message>\n" on stderr with a single write. */
void mtrun_msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Writes all of buf to fd, retrying on EINTR and short writes. Returns 0, or -1 with errno. */
int mtrun_write_all(int fd, const void *buf, size_t len);

/* "SIGKILL" for 9; "signal 70" style text for numbers without a name. Never NULL. */
const char *mtrun_signal_name(int sig, char *buf, size_t cap);

/* Seconds on the monotonic clock. */
double mtrun_now(void);

#endif
