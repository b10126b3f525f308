/* Names the calling thread (at most 15 characters) so that top -H, perf report --sort comm and
 * gdb's thread list tell the library's threads apart: each of its threads calls this first
 * thing in its start routine (naming itself needs no /proc write and leaves no moment under
 * its creator's name). Best effort: a name that cannot be set changes nothing else. */
#ifndef MT_CORE_THREAD_NAME_H
#define MT_CORE_THREAD_NAME_H

#include <pthread.h>

static inline void mt_name_this_thread(const char *name) {
    (void)pthread_setname_np(pthread_self(), name);
}

#endif
