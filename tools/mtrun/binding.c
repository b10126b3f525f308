/* Applying a plan: the thread that forks a rank binds itself first, through hwloc, and the child
 * inherits both its CPU affinity and its memory policy (fork copies them, exec keeps them). The
 * child between fork and exec therefore calls nothing (hwloc allocates, which is not safe there
 * while the store's threads run), and the binding is in force before the rank's first
 * instruction, its first allocation included. Only the forking thread is bound, and only until
 * the fork is done; the store's threads never are.
 *
 * Under MT_TOPO_FILE the plan describes another machine: it is reported, never applied. */
#include "binding.h"

#include "msg.h"

#include "core/error.h"
#include "mesh/mesh_placement.h"
#include "topo/bind.h"
#include "topo/topo_open.h"

#include <meshtrain/status.h>

#include <errno.h>
#include <hwloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mtrun_binding {
    mt_bind_plan *plan;    /* NULL when nothing was planned (see why_none) */
    char why_none[160];
    const char *file;      /* MT_TOPO_FILE: report only */
    bool apply;
    hwloc_topology_t h;    /* this machine, for the binding calls */
    hwloc_cpuset_t saved_cpus;
    hwloc_nodeset_t saved_nodes;
    hwloc_membind_policy_t saved_policy;
    bool saved_mem;
    bool mem_warned;
    char line[2048];
};

/* Opens this machine for binding and records the forking thread's own binding. */
static int open_apply(mtrun_binding *b) {
    hwloc_topology_t h;
    if (hwloc_topology_init(&h) != 0) {
        mtrun_msg("cannot bind the ranks: hwloc cannot initialize");
        return 1;
    }
    b->h = h;
    if (hwloc_topology_load(h) != 0) {
        mtrun_msg("cannot bind the ranks: hwloc cannot load this machine's topology");
        return 1;
    }
    b->saved_cpus = hwloc_bitmap_alloc();
    b->saved_nodes = hwloc_bitmap_alloc();
    if (!b->saved_cpus || !b->saved_nodes) {
        mtrun_msg("cannot bind the ranks: out of memory");
        return 1;
    }
    if (hwloc_get_cpubind(b->h, b->saved_cpus, HWLOC_CPUBIND_THREAD) != 0) {
        mtrun_msg("cannot bind the ranks: cannot read mtrun's own CPU binding: %s",
                  strerror(errno));
        return 1;
    }
    b->saved_mem = hwloc_get_membind(b->h, b->saved_nodes, &b->saved_policy,
                                     HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET) == 0;
    /* hwloc reports the kernel's default policy as first-touch, and setting first-touch would
     * install MPOL_LOCAL: put the default back instead, as it was. */
    if (b->saved_policy == HWLOC_MEMBIND_FIRSTTOUCH) b->saved_policy = HWLOC_MEMBIND_DEFAULT;
    b->apply = true;
    return 0;
}

/* The GPU of each local rank as the runtime will pick it (mesh/mesh_placement.h) before it knows
 * the mesh's tp size: MT_DEVICE_MAP when set, else local rank i on the i-th GPU. *out stays NULL
 * without GPUs. */
static mt_status local_gpus(const mt_topo *t, int n, int **out) {
    *out = NULL;
    if (t->n_gpus == 0) return MT_OK;
    int *g = malloc((size_t)n * sizeof *g);
    if (!g) return mt_error(MT_ERR_OUT_OF_MEMORY, "out of memory for %d ranks", n);
    char why[160];
    mt_status s = mt_placement_compute(t, n, 1, getenv("MT_DEVICE_MAP"), g, why, sizeof why);
    if (s != MT_OK) {
        free(g);
        return s;
    }
    *out = g;
    return MT_OK;
}

/* The plan itself, from the topology this node should use. */
static int make_plan(mtrun_binding *b, const mtrun_options *o, mt_bind_mode mode, bool chosen) {
    mt_topo *t = NULL;
    if (mt_topo_open(&t) != MT_OK) {
        if (b->file) {
            mtrun_msg("%s", mt_last_error());
            return 2;
        }
        if (chosen) {
            mtrun_msg("cannot bind the ranks (%s %s): %s", o->bind_from, mt_bind_mode_name(mode),
                      mt_last_error());
            return 1;
        }
        mtrun_msg("the ranks are not bound: %s", mt_last_error());
        snprintf(b->why_none, sizeof b->why_none, "this machine's topology is unknown");
        return 0;
    }
    if (!chosen) mode = mt_bind_default_mode(t);
    if (mode == MT_BIND_NONE) {
        snprintf(b->why_none, sizeof b->why_none, "--bind none, the default without GPUs");
        mt_topo_destroy(t);
        return 0;
    }
    /* A map the ranks will refuse is theirs to report, with the job's exit code; binding them
     * to GPUs they will not use would be wrong, so they are left unbound. */
    int *gpus = NULL;
    mt_status s = local_gpus(t, o->nproc_per_node, &gpus);
    if (s != MT_OK) {
        mt_topo_destroy(t);
        if (s == MT_ERR_OUT_OF_MEMORY) {
            mtrun_msg("cannot plan the binding: %s", mt_last_error());
            return 1;
        }
        mtrun_msg("the ranks are not bound: %s", mt_last_error());
        snprintf(b->why_none, sizeof b->why_none, "MT_DEVICE_MAP cannot be used");
        return 0;
    }
    /* On this machine, the ranks stay within what mtrun itself may use (taskset, a batch
     * system's affinity): hwloc's topology only leaves out what the cgroup forbids. */
    char *allowed = NULL;
    if (!b->file) {
        int code = open_apply(b);
        if (code == 0 && hwloc_bitmap_list_asprintf(&allowed, b->saved_cpus) < 0) {
            mtrun_msg("cannot bind the ranks: out of memory");
            code = 1;
        }
        if (code != 0) {
            free(gpus);
            mt_topo_destroy(t);
            return code;
        }
    }
    s = mt_bind_plan_make(t, (size_t)o->nproc_per_node, gpus, mode, allowed, &b->plan);
    free(gpus);
    free(allowed);
    mt_topo_destroy(t);
    if (s != MT_OK) {
        mtrun_msg("cannot plan the binding (%s %s): %s", chosen ? o->bind_from : "default",
                  mt_bind_mode_name(mode), mt_last_error());
        return 1;
    }
    if (b->plan->warning)
        mtrun_msg("%s%s", b->plan->warning, b->file ? " (MT_TOPO_FILE: not applied)" : "");
    return 0;
}

int mtrun_binding_prepare(const mtrun_options *o, mtrun_binding **out) {
    *out = NULL;
    mtrun_binding *b = calloc(1, sizeof *b);
    if (!b) {
        mtrun_msg("out of memory");
        return 1;
    }
    b->file = mt_topo_file_env();
    mt_bind_mode mode = o->bind;
    bool chosen = o->bind_from != NULL;
    int code = 0;
    if (chosen && mode == MT_BIND_NONE)
        snprintf(b->why_none, sizeof b->why_none, "%s", strcmp(o->bind_from, "MT_BIND") == 0
                 ? "MT_BIND=none" : "--bind none");
    else
        code = make_plan(b, o, mode, chosen);
    if (code != 0) {
        mtrun_binding_close(b);
        return code;
    }
    *out = b;
    return 0;
}

/* Memory goes to the rank's NUMA node(s). Containers often forbid it (Docker's default seccomp
 * profile refuses set_mempolicy without CAP_SYS_NICE): the CPUs stay bound, and the line and
 * one warning say so. Returns 0, or the errno of the refusal. */
static int bind_memory(mtrun_binding *b, const mt_bind_rank *r) {
    if (r->n_numa == 0) return 0;
    hwloc_nodeset_t ns = hwloc_bitmap_alloc();
    if (!ns) return ENOMEM;
    for (size_t i = 0; i < r->n_numa; i++) hwloc_bitmap_set(ns, (unsigned)r->numa[i]);
    int e = 0;
    if (hwloc_set_membind(b->h, ns, HWLOC_MEMBIND_BIND,
                          HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET) != 0)
        e = errno ? errno : ENOSYS;
    hwloc_bitmap_free(ns);
    if (e && !b->mem_warned) {
        b->mem_warned = true;
        mtrun_msg("cannot bind the ranks' memory to their NUMA nodes (%s); their CPUs are bound",
                  strerror(e));
    }
    return e;
}

int mtrun_binding_enter(mtrun_binding *b, int local, char *err, size_t cap) {
    const mt_bind_rank *r = b->plan ? &b->plan->ranks[local] : NULL;
    if (!r) {
        snprintf(b->line, sizeof b->line, "not bound (%s)", b->why_none);
        return 0;
    }
    if (!r->cpus) {
        snprintf(b->line, sizeof b->line, "not bound (%s)", r->desc);
        return 0;
    }
    if (!b->apply) {
        snprintf(b->line, sizeof b->line, "would bind to %s (MT_TOPO_FILE=%s: not applied)",
                 r->desc, b->file);
        return 0;
    }
    hwloc_cpuset_t set = hwloc_bitmap_alloc();
    int bad = !set || hwloc_bitmap_list_sscanf(set, r->cpus) != 0;
    int e = 0;
    if (!bad && hwloc_set_cpubind(b->h, set, HWLOC_CPUBIND_THREAD) != 0) {
        bad = 1;
        e = errno;
    }
    hwloc_bitmap_free(set);
    if (bad) {
        snprintf(err, cap, "cannot bind local rank %d to cpus %s: %s", local, r->cpus,
                 e ? strerror(e) : "hwloc refused the cpu list");
        return -1;
    }
    int mem = bind_memory(b, r);
    snprintf(b->line, sizeof b->line, "bound to %s%s%s%s", r->desc,
             mem ? " (memory not bound: " : "", mem ? strerror(mem) : "", mem ? ")" : "");
    return 0;
}

int mtrun_binding_sharers(const mtrun_binding *b, int local) {
    const mt_bind_plan *p = b ? b->plan : NULL;
    if (!p || !b->apply || (size_t)local >= p->n_ranks || !p->ranks[local].cpus) return 0;
    int n = 0;
    /* The plan hands out whole domains (numa) or equal lists (cores shared round-robin), so
     * ranks that share cpus have the same list. */
    for (size_t i = 0; i < p->n_ranks; i++)
        n += p->ranks[i].cpus && strcmp(p->ranks[i].cpus, p->ranks[local].cpus) == 0;
    return n;
}

void mtrun_binding_leave(mtrun_binding *b) {
    if (!b->apply) return;
    if (hwloc_set_cpubind(b->h, b->saved_cpus, HWLOC_CPUBIND_THREAD) != 0)
        mtrun_msg("cannot restore mtrun's own CPU binding: %s", strerror(errno));
    /* Only after a successful read: restoring a policy we never knew would invent one. */
    if (b->saved_mem)
        hwloc_set_membind(b->h, b->saved_nodes, b->saved_policy,
                          HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET);
}

const char *mtrun_binding_line(const mtrun_binding *b) { return b->line; }

void mtrun_binding_close(mtrun_binding *b) {
    if (!b) return;
    mt_bind_plan_destroy(b->plan);
    if (b->saved_cpus) hwloc_bitmap_free(b->saved_cpus);
    if (b->saved_nodes) hwloc_bitmap_free(b->saved_nodes);
    if (b->h) hwloc_topology_destroy(b->h);
    free(b);
}
