/* Internal: a reduce-scatter that also takes the sums of squares of the output it writes, for
 * gradient clipping (fsdp/clip.c reads them instead of the gradient shard). */
#ifndef MT_COMM_COLL_SQUARES_H
#define MT_COMM_COLL_SQUARES_H

#include "comm/reduce.h"

#include <meshtrain/comm.h>

#include <stdbool.h>

/* mt_reduce_scatter of f32 that, where the host backend's schedule allows (every final
 * reduction starts at a chunk of the sums, comm/coll_build.c), fills squares (comm/reduce.h: the
 * first squares->count elements of recv, squares->partial sized for them) and sets
 * *squares_done once the work is built; otherwise *squares_done stays false and the partials
 * are not written. Read both only after the work completed. */
mt_status mt_reduce_scatter_squares(mt_group *g, const float *send, float *recv, size_t count,
                                    mt_reduce_op op, const mt_reduce_squares *squares,
                                    bool *squares_done, mt_work **work);

#endif
