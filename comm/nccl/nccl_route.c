/* Whether a collective's buffers are GPU memory the group's NCCL communicator can carry
 * (mt_nccl_route, comm/nccl/nccl_comm.h). Asked by the backend selection (comm/backend.c) only;
 * built with CUDA, with or without NCCL, so that GPU buffers on a group that cannot carry them
 * fail with a reason instead of reaching the host transport. */
#include "comm/group.h"
#include "comm/nccl/nccl_comm.h"

#include "core/error.h"

#include <meshtrain/device.h>

#include <string.h>

#ifdef MT_HAVE_CUDA
#include <cuda_runtime.h>

/* True for memory the GPU addresses directly (cudaMalloc, managed); pinned or plain host memory
 * is host memory for this purpose: the host transport can read it. */
static bool on_gpu(const void *p) {
    if (!p) return false;
    struct cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        (void)cudaGetLastError(); /* not CUDA's: clear the sticky-free error and call it host */
        return false;
    }
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

mt_status mt_nccl_route(mt_group *g, const char *op, const void *a, const void *b,
                        bool *use_nccl) {
    *use_nccl = false;
    mt_device *dev = mt_runtime_device(g->rt);
    if (!dev || mt_device_get_kind(dev) != MT_DEVICE_CUDA) return MT_OK;
    /* On the rank's GPU: a thread that never selected one would make a context on GPU 0. */
    if (cudaSetDevice(mt_device_index(dev)) != cudaSuccess) {
        cudaError_t e = cudaGetLastError();
        return mt_error(MT_ERR_COMM, "%s on group '%s': cannot select GPU %d: %s", op, g->name,
                        mt_device_index(dev), cudaGetErrorString(e));
    }
    bool ga = on_gpu(a), gb = b == a ? ga : on_gpu(b);
    if (!ga && !gb) return MT_OK;
    if ((a && !ga) || (b && !gb))
        return mt_error(MT_ERR_INVALID_ARG, "%s on group '%s': one buffer is GPU memory and the "
                        "other host memory; both must be on the same side", op, g->name);
    if (!g->nccl)
        return mt_error(MT_ERR_INVALID_ARG, "%s on group '%s': the buffers are GPU memory but the "
                        "group has no NCCL communicator (%s); use a mesh dimension's group for "
                        "GPU buffers, or host buffers", op, g->name,
#ifdef MT_HAVE_NCCL
                        g->is_world ? "the world group carries host memory only"
                                    : "only a mesh's groups have one"
#else
                        "this build has no NCCL"
#endif
        );
    /* One stream per communicator: a send and a receive between two ranks queued one after the
     * other would each wait for the other's peer. Until an API issues them together (an NCCL
     * group), point-to-point stays on host buffers. */
    if (!strcmp(op, "send") || !strcmp(op, "recv"))
        return mt_error(MT_ERR_UNSUPPORTED, "%s on group '%s': point-to-point on GPU buffers is "
                        "not supported yet (a send and a receive on one stream can deadlock); "
                        "copy to host memory", op, g->name);
    *use_nccl = true;
    return MT_OK;
}
#else
mt_status mt_nccl_route(mt_group *g, const char *op, const void *a, const void *b,
                        bool *use_nccl) {
    (void)g, (void)op, (void)a, (void)b;
    *use_nccl = false;
    return MT_OK;
}
#endif

