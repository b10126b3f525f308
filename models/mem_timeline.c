/* The replayed memory timeline (models/mem_timeline.h). */
#include "models/mem_timeline.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void mt_mem_timeline_phase(mt_mem_timeline *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->now, sizeof t->now, fmt, ap);
    va_end(ap);
}

void mt_mem_timeline_alloc(mt_mem_timeline *t, mt_mem_category c, size_t bytes) {
    t->current[c] += bytes;
    t->total += bytes;
    if (t->current[c] > t->peak[c]) t->peak[c] = t->current[c];
    /* Strictly greater: the first moment of the highest total is the one reported. */
    if (t->total > t->total_peak) {
        t->total_peak = t->total;
        memcpy(t->at_total_peak, t->current, sizeof t->current);
        memcpy(t->total_peak_at, t->now, sizeof t->now);
    }
}

void mt_mem_timeline_free(mt_mem_timeline *t, mt_mem_category c, size_t bytes) {
    if (bytes > t->current[c]) {
        t->underflow = true;
        bytes = t->current[c];
    }
    t->current[c] -= bytes;
    t->total -= bytes;
}
