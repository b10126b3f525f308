/* The CPU ops' use of the rank's pool (core/cpu/parallel.h). */
#include "core/cpu/parallel.h"

#include "core/error.h"

size_t mt_cpu_row_grain(size_t row_elems) {
    if (row_elems == 0 || row_elems >= MT_CPU_ELEM_GRAIN) return 1;
    return MT_CPU_ELEM_GRAIN / row_elems;
}

mt_status mt_cpu_parallel(const char *op, size_t n, size_t grain, mt_parallel_fn fn, void *ctx) {
    if (n == 0) return MT_OK;
    mt_thread_pool *pool = NULL;
    mt_status st = mt_thread_pool_get(&pool);
    if (st == MT_OK) st = mt_parallel_for(pool, n, grain, fn, ctx);
    return st == MT_OK ? MT_OK : mt_error_wrap(st, "%s on the CPU", op);
}
