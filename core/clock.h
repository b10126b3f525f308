/* Internal: the monotonic clock that the library's deadlines are measured on. Every deadline is
 * monotonic: an NTP step of the wall clock must neither fire nor freeze one. */
#ifndef MT_CORE_CLOCK_H
#define MT_CORE_CLOCK_H

#include <pthread.h>
#include <time.h>

/* Seconds on the monotonic clock (CLOCK_MONOTONIC): only differences mean anything. */
double mt_clock_now_s(void);

/* Initialises a condition variable whose pthread_cond_timedwait deadlines are CLOCK_MONOTONIC
 * times (pthread's default is CLOCK_REALTIME). Returns 0 or the pthread error. */
int mt_cond_init_monotonic(pthread_cond_t *cv);

/* The CLOCK_MONOTONIC time `seconds` from now, for pthread_cond_timedwait on such a variable. */
struct timespec mt_clock_deadline(double seconds);

#endif
