/* Which backend carries an operation (comm/backend.h). The only comm/ file that knows of the
 * NCCL backend: everything else reaches a backend through a work's table. */
#include "comm/backend.h"
#include "comm/nccl/nccl_comm.h"

#include "core/error.h"

mt_status mt_comm_select_backend(mt_group *g, mt_op_kind kind, const void *a, const void *b,
                                 size_t count, const mt_comm_backend **out) {
    *out = &mt_host_backend;
    if (count == 0) return MT_OK;
    bool use_nccl = false;
    MT_TRY(mt_nccl_route(g, mt_op_name(kind), a, b, &use_nccl));
    if (!use_nccl) return MT_OK;
#ifdef MT_HAVE_NCCL
    *out = &mt_nccl_backend;
    return MT_OK;
#else
    return mt_error(MT_ERR_INTERNAL, "%s on group '%s': routed to NCCL in a build without NCCL",
                    mt_op_name(kind), mt_group_name(g));
#endif
}
