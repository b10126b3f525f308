/* Test program for mtrun --bind: reports where it runs.
 *
 *   prog_bind_report            "affinity L" (sched_getaffinity), "status L" (Cpus_allowed_list)
 *                               and "mempolicy MODE NODES" (get_mempolicy, or "mempolicy ?"),
 *                               "sharers N" (MT_CPU_SHARERS as mtrun set it, or "unset")
 *   prog_bind_report --init     also mt_init, then the runtime's topology: "topology SOURCE
 *                               numa=N gpus=G" or "topology-error MESSAGE" (exit 3), and the
 *                               rank's thread pool: "threads N"
 *   prog_bind_report --machine  the machine as hwloc sees it, for the test to compare with:
 *                               "cores N", "core I L" for each core, "numa ID L" for each node
 * Every cpu or node list is written as a cpu list ("0-3,8"). */
#include "core/thread_pool.h"
#include "mesh/runtime_topo.h"

#include <meshtrain/runtime.h>

#include <hwloc.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_CPUS 8192

/* Writes the set bits of a bit test over [0, n) as a cpu list. */
static void print_list(const char *label, int n, int (*has)(int, const void *), const void *ctx) {
    printf("%s ", label);
    int first = 1;
    for (int i = 0; i < n; i++) {
        if (!has(i, ctx)) continue;
        int j = i;
        while (j + 1 < n && has(j + 1, ctx)) j++;
        printf(j > i ? "%s%d-%d" : "%s%d", first ? "" : ",", i, j);
        first = 0;
        i = j;
    }
    printf("\n");
}

static int cpu_in(int c, const void *set) {
    return CPU_ISSET_S(c, CPU_ALLOC_SIZE(MAX_CPUS), (const cpu_set_t *)set);
}

static int bit_in(int i, const void *mask) {
    const unsigned long *m = mask;
    size_t bits = 8 * sizeof *m;
    return (int)(m[(size_t)i / bits] >> ((size_t)i % bits) & 1ul);
}

static void report_self(void) {
    cpu_set_t *set = CPU_ALLOC(MAX_CPUS);
    if (set && sched_getaffinity(0, CPU_ALLOC_SIZE(MAX_CPUS), set) == 0)
        print_list("affinity", MAX_CPUS, cpu_in, set);
    else
        printf("affinity ?\n");
    CPU_FREE(set);
    FILE *f = fopen("/proc/self/status", "r");
    char line[4096];
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "Cpus_allowed_list:", 18) == 0) {
            char *v = line + 18;
            while (*v == ' ' || *v == '\t') v++;
            printf("status %s", v);
        }
    if (f) fclose(f);
    const char *sharers = getenv("MT_CPU_SHARERS");
    printf("sharers %s\n", sharers ? sharers : "unset");
    /* The raw system call: what the kernel holds, not what a library makes of it. */
    enum { NODE_BITS = 1024 };
    unsigned long mask[NODE_BITS / (8 * sizeof(unsigned long))] = {0};
    int mode = -1;
    if (syscall(SYS_get_mempolicy, &mode, mask, (unsigned long)NODE_BITS, NULL, 0ul) == 0) {
        char label[32];
        snprintf(label, sizeof label, "mempolicy %d", mode);
        print_list(label, NODE_BITS, bit_in, mask);
    } else {
        printf("mempolicy ?\n");
    }
}

static int hw_in(int i, const void *bitmap) { return hwloc_bitmap_isset(bitmap, (unsigned)i); }

static int report_machine(void) {
    hwloc_topology_t h;
    if (hwloc_topology_init(&h) != 0 || hwloc_topology_load(h) != 0) {
        fprintf(stderr, "prog_bind_report: hwloc cannot load this machine\n");
        return 1;
    }
    int cores = hwloc_get_nbobjs_by_type(h, HWLOC_OBJ_CORE);
    printf("cores %d\n", cores);
    for (int i = 0; i < cores; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(h, HWLOC_OBJ_CORE, (unsigned)i);
        char label[32];
        snprintf(label, sizeof label, "core %d", i);
        print_list(label, MAX_CPUS, hw_in, o->cpuset);
    }
    for (hwloc_obj_t o = NULL; (o = hwloc_get_next_obj_by_type(h, HWLOC_OBJ_NUMANODE, o));) {
        char label[32];
        snprintf(label, sizeof label, "numa %u", o->os_index);
        print_list(label, MAX_CPUS, hw_in, o->cpuset);
    }
    hwloc_topology_destroy(h);
    return 0;
}

static int report_runtime(void) {
    mt_runtime *rt;
    if (mt_init(&rt, NULL, NULL) != MT_OK) {
        fprintf(stderr, "prog_bind_report: mt_init: %s\n", mt_last_error());
        return 1;
    }
    const mt_topo *t;
    int code = 0;
    if (mt_runtime_topology(rt, &t) == MT_OK) {
        printf("topology %s numa=%zu gpus=%zu\n", t->source, t->n_numa, t->n_gpus);
        const mt_topo *again;
        if (mt_runtime_topology(rt, &again) != MT_OK || again != t) {
            printf("topology-error the second call did not return the same model\n");
            code = 3;
        }
    } else {
        printf("topology-error %s\n", mt_last_error());
        code = 3;
    }
    mt_thread_pool *pool = NULL;
    if (mt_thread_pool_get(&pool) == MT_OK) printf("threads %d\n", mt_thread_pool_threads(pool));
    fflush(stdout);
    mt_finalize(rt);
    return code;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--machine") == 0) return report_machine();
    if (argc > 2 || (argc == 2 && strcmp(argv[1], "--init") != 0)) {
        fprintf(stderr, "usage: prog_bind_report [--init | --machine]\n");
        return 64;
    }
    report_self();
    fflush(stdout);
    return argc == 2 ? report_runtime() : 0;
}
