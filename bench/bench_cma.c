/* mt-bench-cma: the ceiling for cross-process copies inside a host, without UCX or meshtrain.
 *
 * UCX moves large messages between local processes with cma (process_vm_readv: the receiver
 * copies straight from the sender's memory). A 2-rank all_gather or reduce_scatter copies in both
 * directions at once, ucx_perftest's tag_bw in one. This tool measures both with raw
 * process_vm_readv between a parent and a forked child, so that collective figures can be read
 * against what the machine allows (docs/benchmarks.md).
 *
 *   mt-bench-cma [--bytes B] [--iters N] [--chunk B]
 *
 * Prints two lines on stdout: one-way GB/s, and both-ways GB/s per direction (the slower side).
 * GB = 1e9 bytes. Buffers are 2 MiB aligned and advised to use huge pages, as the CPU device's.
 */
#include "core/host_alloc.h"

#include <meshtrain/memory.h>
#include <meshtrain/status.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Copies `bytes` from the peer's `remote` into `local`, `iters` times; returns GB/s or -1. */
static double pull(pid_t peer, char *local, const char *remote, size_t bytes, size_t chunk,
                   int iters) {
    double t0 = now();
    for (int i = 0; i < iters; i++) {
        for (size_t off = 0; off < bytes; off += chunk) {
            size_t len = bytes - off < chunk ? bytes - off : chunk;
            struct iovec l = {local + off, len}, r = {(void *)(remote + off), len};
            if (process_vm_readv(peer, &l, 1, &r, 1, 0) != (ssize_t)len) {
                fprintf(stderr, "mt-bench-cma: process_vm_readv from pid %d: %s\n", (int)peer,
                        strerror(errno));
                return -1;
            }
        }
    }
    return (double)bytes * iters / (now() - t0) / 1e9;
}

/* One measurement: the child pulls from the parent, and with both_ways the parent pulls from the
 * child at the same time. Returns the slower side's GB/s, or -1. */
static double measure(char *src, char *dst, size_t bytes, size_t chunk, int iters, int both_ways) {
    int to_parent[2], go[2], done[2];
    if (pipe(to_parent) || pipe(go) || pipe(done)) return -1;
    pid_t parent = getpid();
    pid_t child = fork();
    if (child < 0) return -1;
    if (child == 0) {
        char c;
        if (read(go[0], &c, 1) != 1) _exit(1);
        /* After fork both processes have src at the same address: pull the parent's copy. */
        double gbs = pull(parent, dst, src, bytes, chunk, iters);
        ssize_t w = write(to_parent[1], &gbs, sizeof gbs);
        /* Stay alive until the parent has finished pulling from this process's memory. */
        if (read(done[0], &c, 1) != 1) _exit(1);
        _exit(w == (ssize_t)sizeof gbs && gbs > 0 ? 0 : 1);
    }
    if (write(go[1], "g", 1) != 1) return -1;
    double mine = both_ways ? pull(child, dst, src, bytes, chunk, iters) : 0;
    double theirs = -1;
    if (read(to_parent[0], &theirs, sizeof theirs) != (ssize_t)sizeof theirs) theirs = -1;
    if (write(done[1], "d", 1) != 1) theirs = -1;
    waitpid(child, NULL, 0);
    for (int i = 0; i < 2; i++) {
        close(to_parent[i]);
        close(go[i]);
        close(done[i]);
    }
    if (!both_ways) return theirs;
    return mine < theirs ? mine : theirs;
}

int main(int argc, char **argv) {
    size_t bytes = 32u << 20, chunk = 0;
    int iters = 40;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        mt_status st = MT_OK;
        if (!strcmp(argv[i], "--bytes") && v) st = mt_parse_bytes(v, &bytes), i++;
        else if (!strcmp(argv[i], "--chunk") && v) st = mt_parse_bytes(v, &chunk), i++;
        else if (!strcmp(argv[i], "--iters") && v) iters = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: mt-bench-cma [--bytes B] [--iters N] [--chunk B]\n");
            return 2;
        }
        if (st != MT_OK || iters < 1 || bytes == 0) {
            fprintf(stderr, "mt-bench-cma: bad value for %s: %s\n", argv[i - 1], mt_last_error());
            return 2;
        }
    }
    if (chunk == 0 || chunk > bytes) chunk = bytes;
    char *src = mt_host_alloc(bytes, 64), *dst = mt_host_alloc(bytes, 64);
    if (!src || !dst) {
        fprintf(stderr, "mt-bench-cma: cannot allocate 2 x %zu bytes\n", bytes);
        return 1;
    }
    memset(src, 1, bytes); /* touch every page: untouched ones map the shared zero page */
    memset(dst, 2, bytes);
    double one = measure(src, dst, bytes, chunk, iters, 0);
    double both = measure(src, dst, bytes, chunk, iters, 1);
    if (one < 0 || both < 0) return 1;
    printf("cma one-way:   %zu bytes x %d: %.3f GB/s\n", bytes, iters, one);
    printf("cma both ways: %zu bytes x %d: %.3f GB/s per direction\n", bytes, iters, both);
    free(src);
    free(dst);
    return 0;
}
