/* Binding plans. Every rank first gets a domain: the NUMA node of its GPU (or the GPU's cpu
 * affinity when the node is unknown), or, without GPUs, one of the NUMA nodes that have CPUs,
 * block-wise. numa binds to the domain; core splits each domain's whole cores evenly among the
 * ranks in it, and hands them out round-robin when there are more ranks than cores. Sources
 * without cores (NCCL XML) have their domain's cpu list split instead, which the description
 * says, since hyperthread siblings may then land on different ranks.
 *
 * Cpu lists in the model are strings; here they become bitmaps of 32-bit words so that subsets,
 * intersections and splits are exact. */
#include "topo/bind.h"

#include "core/error.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Highest cpu number accepted in a cpu list: Linux's own limit is 8192; a list naming cpu
 * 4000000 is a damaged file, not a machine. */
#define BIND_CPU_MAX 65535

/* ---- cpu bitmaps --------------------------------------------------------------------------- */

typedef struct bits {
    uint32_t *w;
    size_t n; /* words */
} bits;

static void bits_free(bits *b) {
    free(b->w);
    b->w = NULL;
    b->n = 0;
}

static mt_status bits_set(bits *b, unsigned cpu) {
    size_t need = cpu / 32 + 1;
    if (need > b->n) {
        uint32_t *w = realloc(b->w, need * sizeof *w);
        if (!w) return mt_error(MT_ERR_OUT_OF_MEMORY, "binding: out of memory for a cpu set");
        memset(w + b->n, 0, (need - b->n) * sizeof *w);
        b->w = w;
        b->n = need;
    }
    b->w[cpu / 32] |= 1u << (cpu % 32);
    return MT_OK;
}

static bool bits_test(const bits *b, size_t cpu) {
    return cpu / 32 < b->n && (b->w[cpu / 32] >> (cpu % 32) & 1u);
}

static size_t bits_count(const bits *b) {
    size_t c = 0;
    for (size_t i = 0; i < b->n; i++) c += (size_t)__builtin_popcount(b->w[i]);
    return c;
}

static bool bits_subset(const bits *a, const bits *b) {
    for (size_t i = 0; i < a->n; i++)
        if (a->w[i] & ~(i < b->n ? b->w[i] : 0u)) return false;
    return true;
}

static bool bits_intersect(const bits *a, const bits *b) {
    for (size_t i = 0; i < a->n && i < b->n; i++)
        if (a->w[i] & b->w[i]) return true;
    return false;
}

static void bits_and(bits *dst, const bits *src) {
    for (size_t i = 0; i < dst->n; i++) dst->w[i] &= i < src->n ? src->w[i] : 0u;
}

static bool bits_equal(const bits *a, const bits *b) { return bits_subset(a, b) && bits_subset(b, a); }

static mt_status bits_or(bits *dst, const bits *src) {
    for (size_t i = 0; i < src->n; i++)
        for (unsigned k = 0; k < 32; k++)
            if (src->w[i] >> k & 1u) MT_TRY(bits_set(dst, (unsigned)(i * 32 + k)));
    return MT_OK;
}

/* Parses a cpu list ("0-47,96-143"; "" is the empty set). what names the list in errors. */
static mt_status bits_parse(const char *list, const char *what, bits *out) {
    *out = (bits){0};
    const char *p = list ? list : "";
    long lo, hi;
    int r;
    while ((r = mt_topo_cpulist_next(&p, BIND_CPU_MAX, &lo, &hi)) > 0) {
        for (long c = lo; c <= hi; c++) {
            mt_status s = bits_set(out, (unsigned)c);
            if (s != MT_OK) {
                bits_free(out);
                return s;
            }
        }
    }
    if (r == 0) return MT_OK;
    bits_free(out);
    return mt_error(MT_ERR_INVALID_ARG, "binding: %s has a malformed cpu list '%s'", what, list);
}

static mt_status bits_list(const bits *b, char **out) { return mt_topo_cpulist(b->w, b->n, out); }

/* ---- domains ------------------------------------------------------------------------------- */

typedef struct domain {
    bits cpus;
    char label[64];      /* "NUMA node 1", "the CPUs near GPU 3", "this host" */
    bool numa_unknown;   /* a GPU's affinity stands in for its unknown NUMA node */
    size_t n_ranks;      /* ranks placed in it so far (core: the next rank's position) */
    size_t total_ranks;
} domain;

typedef struct planner {
    const mt_topo *t;
    const int *rank_gpu;
    mt_bind_plan *plan;
    bits allow;          /* the cpus the ranks may use */
    bool restricted;     /* allow is meaningful (else every cpu may be used) */
    const char *allowed; /* allow as given, for messages */
    bits *numa;          /* parsed t->numa[i].cpus */
    bits *cores;         /* parsed t->cores[i].cpus */
    domain *doms;
    size_t n_doms;
    int *dom_of;         /* per rank: index into doms, -1 when the rank cannot be bound */
    size_t shared_doms;  /* domains with more ranks than cores (or cpus) */
    char shared_first[160];
} planner;

static const mt_topo_gpu *find_gpu(const mt_topo *t, int index) {
    for (size_t i = 0; i < t->n_gpus; i++)
        if (t->gpus[i].index == index) return &t->gpus[i];
    return NULL;
}

static const char *topo_name(const mt_topo *t) { return t->source ? t->source : "topology"; }

static mt_status set_desc(mt_bind_rank *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static mt_status set_desc(mt_bind_rank *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    free(r->desc);
    r->desc = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!r->desc) return mt_error(MT_ERR_OUT_OF_MEMORY, "binding: out of memory");
    va_start(ap, fmt);
    vsnprintf(r->desc, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return MT_OK;
}

/* Finds a domain with these cpus or adds one (taking cpus over); returns its index. */
static mt_status add_domain(planner *p, bits *cpus, const char *label, bool numa_unknown,
                            int *index) {
    for (size_t d = 0; d < p->n_doms; d++) {
        if (bits_equal(&p->doms[d].cpus, cpus)) {
            bits_free(cpus);
            *index = (int)d;
            return MT_OK;
        }
    }
    domain *nd = realloc(p->doms, (p->n_doms + 1) * sizeof *nd);
    if (!nd) return mt_error(MT_ERR_OUT_OF_MEMORY, "binding: out of memory");
    p->doms = nd;
    domain *d = &p->doms[p->n_doms];
    *d = (domain){.cpus = *cpus, .numa_unknown = numa_unknown};
    snprintf(d->label, sizeof d->label, "%s", label);
    *cpus = (bits){0};
    *index = (int)p->n_doms++;
    return MT_OK;
}

static mt_status parse_model(planner *p) {
    const mt_topo *t = p->t;
    p->numa = calloc(t->n_numa + 1, sizeof *p->numa);
    p->cores = calloc(t->n_cores + 1, sizeof *p->cores);
    if (!p->numa || !p->cores) return mt_error(MT_ERR_OUT_OF_MEMORY, "binding: out of memory");
    char what[64];
    if (p->allowed) {
        MT_TRY(bits_parse(p->allowed, "the allowed cpu set", &p->allow));
        p->restricted = true;
    }
    /* Only what may be used takes part: a node or core outside it is as good as absent. */
    for (size_t i = 0; i < t->n_numa; i++) {
        snprintf(what, sizeof what, "NUMA node %d", t->numa[i].id);
        MT_TRY(bits_parse(t->numa[i].cpus, what, &p->numa[i]));
        if (p->restricted) bits_and(&p->numa[i], &p->allow);
    }
    for (size_t i = 0; i < t->n_cores; i++) {
        snprintf(what, sizeof what, "core %zu", i);
        MT_TRY(bits_parse(t->cores[i].cpus, what, &p->cores[i]));
        if (p->restricted) bits_and(&p->cores[i], &p->allow);
    }
    return MT_OK;
}

/* The domain of a rank with a GPU: the GPU's NUMA node, else the cpus near it. */
static mt_status gpu_domain(planner *p, size_t rank, const mt_topo_gpu *g) {
    const mt_topo *t = p->t;
    char label[64];
    bits cpus = {0};
    for (size_t i = 0; g->numa >= 0 && i < t->n_numa; i++) {
        if (t->numa[i].id != g->numa || bits_count(&p->numa[i]) == 0) continue;
        MT_TRY(bits_or(&cpus, &p->numa[i]));
        snprintf(label, sizeof label, "NUMA node %d", g->numa);
        return add_domain(p, &cpus, label, false, &p->dom_of[rank]);
    }
    char what[64];
    snprintf(what, sizeof what, "GPU %d's affinity", g->index);
    MT_TRY(bits_parse(g->cpus, what, &cpus));
    bool known = bits_count(&cpus) > 0;
    if (p->restricted) bits_and(&cpus, &p->allow);
    if (bits_count(&cpus) == 0) {
        bits_free(&cpus);
        p->dom_of[rank] = -1;
        if (known || (p->restricted && g->numa >= 0))
            return set_desc(&p->plan->ranks[rank], "none of the CPUs near GPU %d may be used: "
                            "only cpus %s are allowed", g->index, p->allowed);
        return set_desc(&p->plan->ranks[rank], "no CPU is known near GPU %d (topology: %s)",
                        g->index, topo_name(t));
    }
    snprintf(label, sizeof label, "the CPUs near GPU %d", g->index);
    return add_domain(p, &cpus, label, true, &p->dom_of[rank]);
}

/* Without GPUs: rank i of n goes to the (i * m / n)-th of the m NUMA nodes that have CPUs, so
 * that consecutive ranks share a node and every node gets n/m of them, rounded either way. */
static mt_status spread_domain(planner *p, size_t rank) {
    const mt_topo *t = p->t;
    size_t m = 0;
    for (size_t i = 0; i < t->n_numa; i++) m += bits_count(&p->numa[i]) > 0;
    bits cpus = {0};
    char label[64];
    if (m > 0) {
        size_t want = rank * m / p->plan->n_ranks;
        for (size_t i = 0; i < t->n_numa; i++) {
            if (bits_count(&p->numa[i]) == 0) continue;
            if (want-- > 0) continue;
            MT_TRY(bits_or(&cpus, &p->numa[i]));
            snprintf(label, sizeof label, "NUMA node %d", t->numa[i].id);
            return add_domain(p, &cpus, label, false, &p->dom_of[rank]);
        }
    }
    for (size_t i = 0; i < t->n_cores; i++) MT_TRY(bits_or(&cpus, &p->cores[i]));
    if (bits_count(&cpus) == 0) {
        bits_free(&cpus);
        p->dom_of[rank] = -1;
        if (p->restricted)
            return set_desc(&p->plan->ranks[rank], "no NUMA node or core of %s has an allowed "
                            "cpu (allowed: %s)", topo_name(t), p->allowed);
        return set_desc(&p->plan->ranks[rank], "no NUMA node or core with CPUs is known "
                        "(topology: %s)", topo_name(t));
    }
    return add_domain(p, &cpus, "this host", true, &p->dom_of[rank]);
}

/* Memory goes to the NUMA nodes whose CPUs the rank runs on. */
static mt_status memory_nodes(planner *p, const bits *cpus, mt_bind_rank *r) {
    const mt_topo *t = p->t;
    r->numa = calloc(t->n_numa + 1, sizeof *r->numa);
    if (!r->numa) return mt_error(MT_ERR_OUT_OF_MEMORY, "binding: out of memory");
    for (size_t i = 0; i < t->n_numa; i++)
        if (bits_intersect(&p->numa[i], cpus)) r->numa[r->n_numa++] = t->numa[i].id;
    for (size_t i = 1; i < r->n_numa; i++) /* ascending, for stable output */
        for (size_t j = i; j > 0 && r->numa[j - 1] > r->numa[j]; j--) {
            int tmp = r->numa[j];
            r->numa[j] = r->numa[j - 1];
            r->numa[j - 1] = tmp;
        }
    return MT_OK;
}

/* ", nearest GPU 3" or "" */
static void gpu_note(const mt_bind_rank *r, char *buf, size_t cap) {
    if (r->gpu >= 0) snprintf(buf, cap, ", nearest GPU %d", r->gpu);
    else buf[0] = '\0';
}

static mt_status plan_numa(planner *p, size_t rank) {
    mt_bind_rank *r = &p->plan->ranks[rank];
    const domain *d = &p->doms[p->dom_of[rank]];
    MT_TRY(bits_list(&d->cpus, &r->cpus));
    MT_TRY(memory_nodes(p, &d->cpus, r));
    char g[48];
    gpu_note(r, g, sizeof g);
    return set_desc(r, "%s (cpus %s%s%s)", d->label, r->cpus, g,
                    d->numa_unknown && r->gpu >= 0 ? "; its NUMA node is unknown" : "");
}

/* The units core mode hands out in a domain: its whole cores, or single cpus when the source
 * has no cores inside it. Returns them as indices into p->cores, or as cpu numbers. */
typedef struct units {
    size_t *idx;
    size_t n;
    bool cpus; /* idx holds cpu numbers, not core indices */
} units;

static mt_status domain_units(planner *p, const domain *d, units *u) {
    const mt_topo *t = p->t;
    *u = (units){0};
    size_t cap = t->n_cores + bits_count(&d->cpus) + 1;
    u->idx = malloc(cap * sizeof *u->idx);
    if (!u->idx) return mt_error(MT_ERR_OUT_OF_MEMORY, "binding: out of memory");
    for (size_t i = 0; i < t->n_cores; i++)
        if (bits_count(&p->cores[i]) > 0 && bits_subset(&p->cores[i], &d->cpus))
            u->idx[u->n++] = i;
    if (u->n > 0) return MT_OK;
    u->cpus = true;
    for (size_t c = 0; c < d->cpus.n * 32; c++)
        if (bits_test(&d->cpus, c)) u->idx[u->n++] = c;
    return MT_OK;
}

static void note_shared(planner *p, const domain *d, const units *u) {
    if (p->shared_doms++ > 0) return;
    snprintf(p->shared_first, sizeof p->shared_first, "%zu local ranks share the %zu %s%s of %s",
             d->total_ranks, u->n, u->cpus ? "cpu" : "core", u->n == 1 ? "" : "s", d->label);
}

static mt_status plan_core(planner *p, size_t rank) {
    mt_bind_rank *r = &p->plan->ranks[rank];
    domain *d = &p->doms[p->dom_of[rank]];
    units u;
    MT_TRY(domain_units(p, d, &u));
    size_t j = d->n_ranks++, k = d->total_ranks, first, count;
    bool shared = k > u.n;
    if (shared) {
        first = j % u.n;
        count = 1;
        if (j == 0) note_shared(p, d, &u);
    } else {
        first = j * u.n / k;
        count = (j + 1) * u.n / k - first;
    }
    bits cpus = {0};
    mt_status s = MT_OK;
    for (size_t i = first; i < first + count && s == MT_OK; i++)
        s = u.cpus ? bits_set(&cpus, (unsigned)u.idx[i]) : bits_or(&cpus, &p->cores[u.idx[i]]);
    if (s == MT_OK) s = bits_list(&cpus, &r->cpus);
    if (s == MT_OK) s = memory_nodes(p, &cpus, r);
    bits_free(&cpus);
    if (s != MT_OK) {
        free(u.idx);
        return s;
    }
    char g[48];
    gpu_note(r, g, sizeof g);
    const char *unit = u.cpus ? "cpu" : "core";
    if (shared)
        s = set_desc(r, "1 %s of %s, shared round-robin with other ranks (cpus %s%s)", unit,
                     d->label, r->cpus, g);
    else
        s = set_desc(r, "%zu %s%s of %s (cpus %s%s%s)", count, unit, count == 1 ? "" : "s",
                     d->label, r->cpus, g,
                     u.cpus ? "; no core information: its cpu list is split evenly" : "");
    free(u.idx);
    return s;
}

static mt_status make_warning(planner *p) {
    if (p->shared_doms == 0) return MT_OK;
    char more[64] = "";
    if (p->shared_doms > 1)
        snprintf(more, sizeof more, " (and likewise on %zu other node(s))", p->shared_doms - 1);
    size_t len = strlen(p->shared_first) + strlen(more) + 64;
    p->plan->warning = malloc(len);
    if (!p->plan->warning) return mt_error(MT_ERR_OUT_OF_MEMORY, "binding: out of memory");
    snprintf(p->plan->warning, len, "more local ranks than cores: %s round-robin%s",
             p->shared_first, more);
    return MT_OK;
}

static mt_status check_gpus(const mt_topo *t, size_t n_ranks, const int *rank_gpu) {
    for (size_t i = 0; rank_gpu && i < n_ranks; i++)
        if (!find_gpu(t, rank_gpu[i]))
            return mt_error(MT_ERR_INVALID_ARG, "binding: local rank %zu uses GPU %d, which %s "
                            "does not have (%zu GPU(s))", i, rank_gpu[i], topo_name(t),
                            t->n_gpus);
    return MT_OK;
}

static mt_status plan_all(planner *p) {
    mt_bind_plan *plan = p->plan;
    MT_TRY(parse_model(p));
    p->dom_of = calloc(plan->n_ranks, sizeof *p->dom_of);
    if (!p->dom_of) return mt_error(MT_ERR_OUT_OF_MEMORY, "binding: out of memory");
    for (size_t i = 0; i < plan->n_ranks; i++) {
        if (p->rank_gpu) MT_TRY(gpu_domain(p, i, find_gpu(p->t, p->rank_gpu[i])));
        else MT_TRY(spread_domain(p, i));
        if (p->dom_of[i] >= 0) p->doms[p->dom_of[i]].total_ranks++;
    }
    for (size_t i = 0; i < plan->n_ranks; i++) {
        if (p->dom_of[i] < 0) continue;
        MT_TRY(plan->mode == MT_BIND_CORE ? plan_core(p, i) : plan_numa(p, i));
    }
    return make_warning(p);
}

static void planner_free(planner *p) {
    for (size_t i = 0; p->numa && i < p->t->n_numa; i++) bits_free(&p->numa[i]);
    for (size_t i = 0; p->cores && i < p->t->n_cores; i++) bits_free(&p->cores[i]);
    for (size_t d = 0; d < p->n_doms; d++) bits_free(&p->doms[d].cpus);
    bits_free(&p->allow);
    free(p->numa);
    free(p->cores);
    free(p->doms);
    free(p->dom_of);
}

mt_status mt_bind_plan_make(const mt_topo *t, size_t n_ranks, const int *rank_gpu,
                            mt_bind_mode mode, const char *allowed, mt_bind_plan **out) {
    if (!out) return mt_error(MT_ERR_INVALID_ARG, "mt_bind_plan_make: out must not be NULL");
    *out = NULL;
    if (!t || n_ranks == 0)
        return mt_error(MT_ERR_INVALID_ARG, "mt_bind_plan_make: needs a topology and at least "
                        "one local rank");
    if (mode != MT_BIND_NONE && mode != MT_BIND_NUMA && mode != MT_BIND_CORE)
        return mt_error(MT_ERR_INVALID_ARG, "mt_bind_plan_make: unknown mode %d", (int)mode);
    MT_TRY(check_gpus(t, n_ranks, rank_gpu));
    mt_bind_plan *plan = calloc(1, sizeof *plan);
    if (plan) plan->ranks = calloc(n_ranks, sizeof *plan->ranks);
    if (!plan || !plan->ranks) {
        free(plan);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "binding: out of memory for %zu ranks", n_ranks);
    }
    plan->mode = mode;
    plan->n_ranks = n_ranks;
    for (size_t i = 0; i < n_ranks; i++) plan->ranks[i].gpu = rank_gpu ? rank_gpu[i] : -1;
    mt_status s = MT_OK;
    if (mode == MT_BIND_NONE) {
        for (size_t i = 0; i < n_ranks && s == MT_OK; i++)
            s = set_desc(&plan->ranks[i], "--bind none");
    } else {
        planner p = {.t = t, .rank_gpu = rank_gpu, .plan = plan, .allowed = allowed};
        s = plan_all(&p);
        planner_free(&p);
    }
    if (s != MT_OK) {
        mt_bind_plan_destroy(plan);
        return s;
    }
    *out = plan;
    return MT_OK;
}

void mt_bind_plan_destroy(mt_bind_plan *plan) {
    if (!plan) return;
    for (size_t i = 0; plan->ranks && i < plan->n_ranks; i++) {
        free(plan->ranks[i].cpus);
        free(plan->ranks[i].numa);
        free(plan->ranks[i].desc);
    }
    free(plan->ranks);
    free(plan->warning);
    free(plan);
}

/* ---- modes and defaults -------------------------------------------------------------------- */

mt_status mt_bind_mode_parse(const char *text, mt_bind_mode *out) {
    static const mt_bind_mode modes[] = {MT_BIND_NONE, MT_BIND_NUMA, MT_BIND_CORE};
    for (size_t i = 0; text && i < sizeof modes / sizeof modes[0]; i++) {
        if (strcmp(text, mt_bind_mode_name(modes[i])) == 0) {
            *out = modes[i];
            return MT_OK;
        }
    }
    return mt_error(MT_ERR_INVALID_ARG, "'%s' is not a binding mode: expected none, numa or core",
                    text ? text : "(null)");
}

const char *mt_bind_mode_name(mt_bind_mode mode) {
    switch (mode) {
    case MT_BIND_NONE: return "none";
    case MT_BIND_NUMA: return "numa";
    case MT_BIND_CORE: return "core";
    }
    return "?";
}

mt_bind_mode mt_bind_default_mode(const mt_topo *t) {
    return t && t->n_gpus > 0 ? MT_BIND_NUMA : MT_BIND_NONE;
}

mt_status mt_bind_default_gpus(const mt_topo *t, size_t n_ranks, int **out) {
    *out = NULL;
    if (!t || t->n_gpus == 0) return MT_OK;
    int *g = malloc((n_ranks ? n_ranks : 1) * sizeof *g);
    if (!g) return mt_error(MT_ERR_OUT_OF_MEMORY, "binding: out of memory for %zu ranks", n_ranks);
    for (size_t i = 0; i < n_ranks; i++) g[i] = t->gpus[i % t->n_gpus].index;
    *out = g;
    return MT_OK;
}
