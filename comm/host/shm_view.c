/* Views of a buffer sharded over the ranks of one host (comm/shm_view.h).
 *
 * The members exchange where their parts are (pid, memfd, offset: the descriptor the
 * shared-memory path sends, comm/host/shm.c); each rank reserves one range of the whole size
 * and maps every member's memfd over its slice of it with MAP_FIXED, its own included, so that
 * the slices are contiguous. A second exchange agrees on the outcome: the caller must know that
 * every member mapped, since a member that did not still needs the data moved. Runs on the
 * calling thread: it opens its own pidfds instead of the progress thread's. */
#include "comm/group.h"
#include "comm/host/ucx.h"
#include "comm/shm_view.h"

#include "core/error.h"
#include "core/shm_block.h"

#include <meshtrain/runtime.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

/* What a member publishes: whether it can take part, and where its part is. 40 bytes, sent as
 * 10 f32 words (the collectives carry f32 or bf16; an all-gather only moves the bits). */
typedef struct view_entry {
    int32_t ok;
    int32_t pad;
    mt_shm_ref ref;
} view_entry;

#define ENTRY_WORDS (sizeof(view_entry) / sizeof(float))
_Static_assert(sizeof(view_entry) % sizeof(float) == 0, "an entry is whole f32 words");

/* This rank's side of the conditions (a shared block, page-aligned, the shared-memory path on,
 * every member on this host), with where its part is in *ref. No communication. */
static bool local_part(mt_group *g, const void *part, size_t part_bytes, mt_shm_ref *ref) {
    long page = sysconf(_SC_PAGESIZE);
    if (!g || !g->tr || g->size < 2 || page <= 0 || part_bytes == 0 ||
        part_bytes % (size_t)page != 0)
        return false;
    mt_transport *tr = g->tr;
    /* shm.enabled and same_host are settled when the transport starts, before any group. */
    if (!tr->shm.enabled || tr->shm.inject_eperm || !tr->shm.same_host) return false;
    for (int i = 0; i < g->size; i++)
        if (!tr->shm.same_host[g->ranks[i]]) return false;
    return mt_device_shared_range(mt_runtime_device(tr->rt), part, part_bytes, ref) &&
           ref->offset % (size_t)page == 0;
}

/* A descriptor for this process's memfd `fd` of process pid: fd itself for this process, else a
 * copy taken with pidfd_getfd (the caller closes it). -1 with why on failure. */
static int take_fd(const mt_shm_ref *ref, char *why, size_t cap) {
    if (ref->pid == (int32_t)getpid()) return ref->fd;
    int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)ref->pid, 0);
    if (pidfd < 0) {
        snprintf(why, cap, "pidfd_open(%d): %s", (int)ref->pid, strerror(errno));
        return -1;
    }
    int fd = (int)syscall(SYS_pidfd_getfd, pidfd, ref->fd, 0);
    int saved = errno;
    close(pidfd);
    if (fd < 0)
        snprintf(why, cap, "pidfd_getfd(pid %d, fd %d): %s", (int)ref->pid, (int)ref->fd,
                 strerror(saved));
    return fd;
}

/* Maps every entry's part into a new view; NULL with why when one cannot be. */
static char *map_all(const view_entry *all, int n, size_t part_bytes, char *why, size_t cap) {
    size_t total = (size_t)n * part_bytes;
    char *view = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (view == MAP_FAILED) {
        snprintf(why, cap, "reserving %zu bytes of address space: %s", total, strerror(errno));
        return NULL;
    }
    for (int r = 0; r < n; r++) {
        const mt_shm_ref *ref = &all[r].ref;
        int fd = take_fd(ref, why, cap);
        if (fd < 0) break;
        void *at = mmap(view + (size_t)r * part_bytes, part_bytes, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_FIXED, fd, (off_t)ref->offset);
        int saved = errno;
        if (ref->pid != (int32_t)getpid()) close(fd); /* a copy; this process's own stays */
        if (at == MAP_FAILED) {
            snprintf(why, cap, "mapping member %d's %zu bytes: %s", r, part_bytes,
                     strerror(saved));
            break;
        }
        if (r == n - 1) return view;
    }
    munmap(view, total);
    return NULL;
}

mt_status mt_shm_view_map(mt_group *g, void *part, size_t part_bytes, void **view, char *why,
                          size_t why_cap) {
    char scratch[256];
    if (!why || why_cap == 0) why = scratch, why_cap = sizeof scratch;
    why[0] = '\0';
    *view = NULL;
    int n = mt_group_size(g);
    view_entry mine = {0}, *all = calloc((size_t)n, sizeof *all);
    if (!all)
        return mt_error(MT_ERR_OUT_OF_MEMORY, "mapping a sharded buffer: out of host memory");
    mine.ok = local_part(g, part, part_bytes, &mine.ref);
    mt_status st = mt_all_gather(g, &mine, all, ENTRY_WORDS, MT_F32, NULL);
    char *mapped = NULL;
    bool everyone = st == MT_OK;
    for (int r = 0; everyone && r < n; r++) {
        if (all[r].ok) continue;
        everyone = false;
        snprintf(why, why_cap, "rank %d of '%s' cannot share its part (another host, a private "
                 "or unaligned buffer, or the shared-memory path off)",
                 mt_group_global_rank(g, r), mt_group_name(g));
    }
    if (everyone) mapped = map_all(all, n, part_bytes, why, why_cap);
    free(all);
    if (st != MT_OK)
        return mt_error_wrap(st, "exchanging where the parts of a sharded buffer are");
    if (!everyone) return MT_OK;
    /* Every member must know that every other one mapped. An all-gather, not an all-reduce:
     * it needs no scratch in the group, so sharding allocates nothing more than it did. */
    float failed = mapped ? 0.0f : 1.0f, *flags = malloc((size_t)n * sizeof *flags);
    if (!flags) {
        if (mapped) munmap(mapped, (size_t)n * part_bytes);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "mapping a sharded buffer: out of host memory");
    }
    st = mt_all_gather(g, &failed, flags, 1, MT_F32, NULL);
    int refused = -1;
    for (int r = 0; st == MT_OK && r < n && refused < 0; r++)
        if (flags[r] != 0.0f) refused = r;
    free(flags);
    if (st != MT_OK || refused >= 0) {
        if (mapped) munmap(mapped, (size_t)n * part_bytes);
        if (st != MT_OK) return mt_error_wrap(st, "agreeing on a mapped sharded buffer");
        if (!why[0])
            snprintf(why, why_cap, "rank %d of '%s' could not map (see its log)",
                     mt_group_global_rank(g, refused), mt_group_name(g));
        return MT_OK;
    }
    *view = mapped;
    return MT_OK;
}

void mt_shm_view_unmap(void *view, size_t total_bytes) {
    if (view) munmap(view, total_bytes);
}
