/* Internal: a reduce-scatter that also takes the sums of squares of the output it writes, for
 * gradient clipping (fsdp/clip.c reads them instead of the gradient shard). */
#ifndef MT_COMM_COLL_SQUARES_H
#define MT_COMM_COLL_SQUARES_H

#include "comm/reduce.h"

#include <meshtrain/comm.h>

/* mt_reduce_scatter of f32 that also fills squares (comm/reduce.h: the first squares->count
 * elements of recv, squares->partial sized for them): from the final reductions where each
 * starts on a chunk of the sums, else from a pass over the output after the last of them
 * (comm/coll_build.c). Read the partials only after the work completed. Host backend only:
 * buffers that route to NCCL are MT_ERR_INVALID_ARG, before anything starts. */
mt_status mt_reduce_scatter_squares(mt_group *g, const float *send, float *recv, size_t count,
                                    mt_reduce_op op, const mt_reduce_squares *squares,
                                    mt_work **work);

#endif
