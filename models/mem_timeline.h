/* Internal: a device-memory timeline replayed without allocating (models/gpt_memory.c). The
 * predictor calls alloc and free in the order the program would; this keeps current and peak
 * bytes per category and in total, as the device's accounting (core/device.c) does, and what the
 * program was doing when the total peaked. */
#ifndef MT_MODELS_MEM_TIMELINE_H
#define MT_MODELS_MEM_TIMELINE_H

#include <meshtrain/memory.h>

#include <stdbool.h>
#include <stddef.h>

typedef struct mt_mem_timeline {
    size_t current[MT_MEM_CATEGORY_COUNT], peak[MT_MEM_CATEGORY_COUNT];
    size_t total, total_peak;
    size_t at_total_peak[MT_MEM_CATEGORY_COUNT]; /* current[] when the total peaked */
    char now[64];           /* the phase being replayed */
    char total_peak_at[64]; /* the phase of the total peak */
    bool underflow;         /* a free of more than was allocated: the replay itself is wrong */
} mt_mem_timeline;

/* Names the phase that the following allocations belong to (printf format). */
void mt_mem_timeline_phase(mt_mem_timeline *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void mt_mem_timeline_alloc(mt_mem_timeline *t, mt_mem_category c, size_t bytes);
void mt_mem_timeline_free(mt_mem_timeline *t, mt_mem_category c, size_t bytes);

#endif
