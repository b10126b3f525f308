/* Point-to-point send/recv within a group. Each ordered pair numbers its messages (sequence in
 * the tag) so that messages between a pair match in the order they were issued, independently of
 * the group's collectives. */
#include "mesh/transport_internal.h"

#include "core/error.h"

static mt_status p2p(mt_group *g, mt_op_kind kind, const void *send, void *recv, size_t count,
                     mt_dtype dtype, int peer, mt_work **work) {
    if (work) *work = NULL;
    const char *op = kind == MT_OP_SEND ? "send" : "recv";
    MT_TRY(mt_group_check_usable(g, op));
    if (mt_dtype_size(dtype) == 0)
        return mt_error(MT_ERR_INVALID_ARG, "%s on group '%s': invalid dtype %d", op, g->name,
                        (int)dtype);
    if (peer < 0 || peer >= g->size)
        return mt_error(MT_ERR_INVALID_ARG, "%s on group '%s': peer %d is not a group rank (0..%d)",
                        op, g->name, peer, g->size - 1);
    if (count > 0 && !(kind == MT_OP_SEND ? send != NULL : recv != NULL))
        return mt_error(MT_ERR_INVALID_ARG, "%s on group '%s': buffer is NULL", op, g->name);
    mt_work *w = mt_work_new(g, kind);
    if (!w) return mt_error(MT_ERR_OUT_OF_MEMORY, "%s: allocating the work", op);
    w->send = send;
    w->recv = recv;
    w->count = count;
    w->dtype = dtype;
    w->root = peer;
    return mt_work_submit_or_wait(w, work);
}

mt_status mt_send(mt_group *g, const void *buf, size_t count, mt_dtype dtype, int peer,
                  mt_work **work) {
    return p2p(g, MT_OP_SEND, buf, NULL, count, dtype, peer, work);
}

mt_status mt_recv(mt_group *g, void *buf, size_t count, mt_dtype dtype, int peer,
                  mt_work **work) {
    return p2p(g, MT_OP_RECV, NULL, buf, count, dtype, peer, work);
}
