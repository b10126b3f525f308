/* Page-locked host memory for staging copies (core/cuda/cuda_internal.h). */
#include "core/cuda/cuda_internal.h"
#include "core/error.h"

#include <meshtrain/log.h>
#include <meshtrain/memory.h>

mt_status mt_cuda_host_alloc(size_t bytes, void **out) {
    if (!out) return mt_error(MT_ERR_INVALID_ARG, "mt_cuda_host_alloc: out must not be NULL");
    *out = NULL;
    cudaError_t err = cudaMallocHost(out, bytes ? bytes : 1);
    if (err == cudaSuccess) return MT_OK;
    (void)cudaGetLastError();
    *out = NULL;
    char asked[32];
    return mt_error(err == cudaErrorMemoryAllocation ? MT_ERR_OUT_OF_MEMORY : MT_ERR_SYSTEM,
                    "cannot allocate %s of pinned host memory: cudaMallocHost: %s (%s)",
                    mt_format_bytes(bytes, asked, sizeof asked), cudaGetErrorString(err),
                    cudaGetErrorName(err));
}

void mt_cuda_host_free(void *ptr) {
    if (!ptr) return;
    cudaError_t err = cudaFreeHost(ptr);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        mt_log(MT_LOG_WARN, "cudaFreeHost(%p) failed: %s", ptr, cudaGetErrorString(err));
    }
}
