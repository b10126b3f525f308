/* Internal: the monotonic clock that the library's deadlines are measured on. */
#ifndef MT_CORE_CLOCK_H
#define MT_CORE_CLOCK_H

/* Seconds on the monotonic clock (CLOCK_MONOTONIC): only differences mean anything. */
double mt_clock_now_s(void);

#endif
