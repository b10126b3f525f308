/* The public collective and point-to-point calls: argument checks, then a work item for the
 * backend that carries the operation (comm/backend.h: the host transport, or the group's NCCL
 * communicator when the buffers are GPU memory). */
#include "comm/backend.h"
#include "comm/coll_squares.h"
#include "comm/group.h"
#include "comm/work.h"

#include "core/error.h"

#include <stdint.h>

static mt_status check_common(mt_group *g, const char *op, size_t count, mt_dtype dtype,
                              const void *a, const void *b) {
    MT_TRY(mt_group_check_usable(g, op));
    if (mt_dtype_size(dtype) == 0)
        return mt_error(MT_ERR_INVALID_ARG, "%s on group '%s': invalid dtype %d", op, g->name,
                        (int)dtype);
    if (count > SIZE_MAX / 8 / (size_t)g->size)
        return mt_error(MT_ERR_INVALID_ARG, "%s on group '%s': count %zu is too large", op,
                        g->name, count);
    if (count > 0 && (!a || !b))
        return mt_error(MT_ERR_INVALID_ARG, "%s on group '%s': a buffer is NULL", op, g->name);
    return MT_OK;
}

static mt_status make_squares(mt_group *g, mt_op_kind kind, const void *send, void *recv,
                              size_t count, mt_dtype dtype, mt_reduce_op rop, int root,
                              const mt_reduce_squares *squares, mt_work **work) {
    const mt_comm_backend *backend;
    MT_TRY(mt_comm_select_backend(g, kind, send, recv, count, &backend));
    /* Only the host backend's reductions take sums of squares (comm/coll_build.c). */
    if (squares && backend != &mt_host_backend)
        return mt_error(MT_ERR_INVALID_ARG, "%s on group '%s': sums of squares of the output "
                        "are taken by the host backend only, and these buffers go to %s",
                        mt_op_name(kind), g->name, backend->name);
    /* The payload: the gathered output or the scattered input is size x count elements. */
    uint64_t payload = (uint64_t)count * mt_dtype_size(dtype);
    if (kind == MT_OP_ALL_GATHER || kind == MT_OP_REDUCE_SCATTER) payload *= (uint64_t)g->size;
    mt_work *w = mt_work_new(g, kind, backend);
    if (!w) return mt_error(MT_ERR_OUT_OF_MEMORY, "%s: allocating the work", mt_op_name(kind));
    w->payload = payload; /* counted by mt_work_submit_or_wait once the backend took the work */
    w->send = send;
    w->recv = recv;
    w->count = count;
    w->dtype = dtype;
    w->rop = rop;
    w->root = root;
    if (squares) w->squares = *squares;
    return mt_work_submit_or_wait(w, work);
}

static mt_status make(mt_group *g, mt_op_kind kind, const void *send, void *recv, size_t count,
                      mt_dtype dtype, mt_reduce_op rop, int root, mt_work **work) {
    return make_squares(g, kind, send, recv, count, dtype, rop, root, NULL, work);
}

mt_status mt_all_gather(mt_group *g, const void *send, void *recv, size_t count, mt_dtype dtype,
                        mt_work **work) {
    if (work) *work = NULL;
    MT_TRY(check_common(g, "all_gather", count, dtype, send, recv));
    return make(g, MT_OP_ALL_GATHER, send, recv, count, dtype, MT_REDUCE_SUM, -1, work);
}

mt_status mt_reduce_scatter(mt_group *g, const void *send, void *recv, size_t count,
                            mt_dtype dtype, mt_reduce_op op, mt_work **work) {
    if (work) *work = NULL;
    MT_TRY(check_common(g, "reduce_scatter", count, dtype, send, recv));
    if (op != MT_REDUCE_SUM && op != MT_REDUCE_AVG)
        return mt_error(MT_ERR_INVALID_ARG, "reduce_scatter on group '%s': op must be sum or avg",
                        g->name);
    return make(g, MT_OP_REDUCE_SCATTER, send, recv, count, dtype, op, -1, work);
}

mt_status mt_reduce_scatter_squares(mt_group *g, const float *send, float *recv, size_t count,
                                    mt_reduce_op op, const mt_reduce_squares *squares,
                                    mt_work **work) {
    if (work) *work = NULL;
    MT_TRY(check_common(g, "reduce_scatter", count, MT_F32, send, recv));
    if (op != MT_REDUCE_SUM && op != MT_REDUCE_AVG)
        return mt_error(MT_ERR_INVALID_ARG, "reduce_scatter on group '%s': op must be sum or avg",
                        g->name);
    if (!squares || !squares->partial || squares->count > count)
        return mt_error(MT_ERR_INVALID_ARG, "reduce_scatter on group '%s': sums of squares of "
                        "%zu elements asked without room for them or beyond the %zu of the "
                        "output", g->name, squares ? squares->count : 0, count);
    return make_squares(g, MT_OP_REDUCE_SCATTER, send, recv, count, MT_F32, op, -1, squares,
                        work);
}

mt_status mt_all_reduce(mt_group *g, const void *send, void *recv, size_t count, mt_dtype dtype,
                        mt_reduce_op op, mt_work **work) {
    if (work) *work = NULL;
    MT_TRY(check_common(g, "all_reduce", count, dtype, send, recv));
    if (op != MT_REDUCE_SUM && op != MT_REDUCE_AVG && op != MT_REDUCE_MAX)
        return mt_error(MT_ERR_INVALID_ARG, "all_reduce on group '%s': unknown op %d", g->name,
                        (int)op);
    return make(g, MT_OP_ALL_REDUCE, send, recv, count, dtype, op, -1, work);
}

mt_status mt_broadcast(mt_group *g, void *buf, size_t count, mt_dtype dtype, int root,
                       mt_work **work) {
    if (work) *work = NULL;
    MT_TRY(check_common(g, "broadcast", count, dtype, buf, buf));
    if (root < 0 || root >= g->size)
        return mt_error(MT_ERR_INVALID_ARG, "broadcast on group '%s': root %d is not a group rank "
                                            "(0..%d)", g->name, root, g->size - 1);
    return make(g, MT_OP_BROADCAST, buf, buf, count, dtype, MT_REDUCE_SUM, root, work);
}

mt_status mt_barrier(mt_group *g, mt_work **work) {
    if (work) *work = NULL;
    MT_TRY(mt_group_check_usable(g, "barrier"));
    return make(g, MT_OP_BARRIER, NULL, NULL, 0, MT_F32, MT_REDUCE_SUM, -1, work);
}

/* Point-to-point: each ordered pair numbers its messages (a sequence in the tag), so messages
 * between a pair match in the order they were issued, independently of the group's collectives. */
static mt_status p2p(mt_group *g, mt_op_kind kind, const void *send, void *recv, size_t count,
                     mt_dtype dtype, int peer, mt_work **work) {
    if (work) *work = NULL;
    const char *op = mt_op_name(kind);
    const void *buf = kind == MT_OP_SEND ? send : recv;
    MT_TRY(check_common(g, op, count, dtype, buf, buf));
    if (peer < 0 || peer >= g->size)
        return mt_error(MT_ERR_INVALID_ARG, "%s on group '%s': peer %d is not a group rank (0..%d)",
                        op, g->name, peer, g->size - 1);
    return make(g, kind, send, recv, count, dtype, MT_REDUCE_SUM, peer, work);
}

mt_status mt_send(mt_group *g, const void *buf, size_t count, mt_dtype dtype, int peer,
                  mt_work **work) {
    return p2p(g, MT_OP_SEND, buf, NULL, count, dtype, peer, work);
}

mt_status mt_recv(mt_group *g, void *buf, size_t count, mt_dtype dtype, int peer,
                  mt_work **work) {
    return p2p(g, MT_OP_RECV, NULL, buf, count, dtype, peer, work);
}
