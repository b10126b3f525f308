/* Memory accounting: every device allocation is charged to a category; current and peak bytes
 * are kept per category and in total, against an optional capacity. */
#ifndef MESHTRAIN_MEMORY_H
#define MESHTRAIN_MEMORY_H

#include <meshtrain/api.h>
#include <meshtrain/status.h>

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mt_mem_category {
    MT_MEM_PARAMS = 0,
    MT_MEM_GRADS,
    MT_MEM_OPTIMIZER,
    MT_MEM_ACTIVATIONS,
    MT_MEM_COMM,
    MT_MEM_OTHER,
    MT_MEM_CATEGORY_COUNT
} mt_mem_category;

typedef struct mt_mem_stats {
    size_t current[MT_MEM_CATEGORY_COUNT]; /* bytes allocated now, per category */
    size_t peak[MT_MEM_CATEGORY_COUNT];    /* highest value of current[c] so far */
    size_t total_current;                  /* sum of current[] */
    size_t total_peak;                     /* highest value of total_current so far */
    size_t capacity;                       /* bytes the device may hold; 0 = unlimited */
} mt_mem_stats;

/* "params", "grads", "optimizer", "activations", "comm", "other". */
MT_API const char *mt_mem_category_name(mt_mem_category category);

/* Parses a byte count: a bare number is bytes; KiB, MiB, GiB, TiB (powers of 1024) and
 * KB, MB, GB, TB (powers of 1000) suffixes are accepted, with optional space ("512 MiB"). Units
 * are case-insensitive; "B" is bytes; with a unit the number may have a fraction ("1.5GiB").
 * Negative, malformed or too large values are MT_ERR_INVALID_ARG with a message quoting text. */
MT_API mt_status mt_parse_bytes(const char *text, size_t *out);

/* Formats a byte count for people ("1.50 GiB") into buf; returns buf. */
MT_API const char *mt_format_bytes(size_t bytes, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
