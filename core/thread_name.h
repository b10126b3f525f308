/* Names the library's own threads (at most 15 characters) so that top -H, perf report --sort
 * comm and gdb's thread list tell the communication thread from the pool's workers and the
 * training thread. Best effort: a name that cannot be set changes nothing else. */
#ifndef MT_CORE_THREAD_NAME_H
#define MT_CORE_THREAD_NAME_H

#include <pthread.h>

static inline void mt_name_thread(pthread_t thread, const char *name) {
    (void)pthread_setname_np(thread, name);
}

#endif
