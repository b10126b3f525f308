/* Per-group traffic counters (include/meshtrain/comm.h, mt_group_counters): every collective
 * issued through comm/coll_api.c is counted on its group once its backend has taken it
 * (mt_work_submit_or_wait; one that fails to launch is not), so that a model's communication can be
 * measured rather than derived from the calls its code makes. */
#include "comm/group.h"
#include "comm/work.h"

#include <string.h>

/* mt_coll_kind follows mt_op_kind's first four values, so that the issuing code passes its
 * kind as is. */
_Static_assert((int)MT_COLL_ALL_GATHER == (int)MT_OP_ALL_GATHER &&
                   (int)MT_COLL_REDUCE_SCATTER == (int)MT_OP_REDUCE_SCATTER &&
                   (int)MT_COLL_ALL_REDUCE == (int)MT_OP_ALL_REDUCE &&
                   (int)MT_COLL_BROADCAST == (int)MT_OP_BROADCAST,
               "mt_coll_kind and mt_op_kind disagree");

void mt_group_count(mt_group *g, int kind, uint64_t bytes) {
    if (!g || kind < 0 || kind >= MT_COLL_KINDS) return; /* barriers, point-to-point */
    atomic_fetch_add_explicit(&g->coll_calls[kind], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&g->coll_bytes[kind], bytes, memory_order_relaxed);
}

void mt_group_counters(const mt_group *g, mt_comm_counters *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!g) return;
    mt_group *m = (mt_group *)g; /* atomic loads take non-const pointers before C17's DR 459 */
    for (int k = 0; k < MT_COLL_KINDS; k++) {
        out->calls[k] = atomic_load_explicit(&m->coll_calls[k], memory_order_relaxed);
        out->bytes[k] = atomic_load_explicit(&m->coll_bytes[k], memory_order_relaxed);
    }
}

void mt_group_counters_reset(mt_group *g) {
    if (!g) return;
    for (int k = 0; k < MT_COLL_KINDS; k++) {
        atomic_store_explicit(&g->coll_calls[k], 0, memory_order_relaxed);
        atomic_store_explicit(&g->coll_bytes[k], 0, memory_order_relaxed);
    }
}

const char *mt_coll_kind_name(mt_coll_kind kind) {
    static const char *const names[MT_COLL_KINDS] = {"all_gather", "reduce_scatter",
                                                     "all_reduce", "broadcast"};
    return kind >= 0 && kind < MT_COLL_KINDS ? names[kind] : "?";
}
