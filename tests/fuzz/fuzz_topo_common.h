/* Shared by the topology loader harnesses (fuzz_topo_nccl.c, fuzz_topo_hwloc.c): the property
 * checked on every input, and, without libFuzzer, a fixed-seed driver that mutates the fixture
 * files of one format. A harness defines FUZZ_NAME, FUZZ_PREFIX (fixture name prefix) and
 * fuzz_load(), then includes this file. */
#ifndef MT_TESTS_FUZZ_TOPO_COMMON_H
#define MT_TESTS_FUZZ_TOPO_COMMON_H

#include "topo/topology.h"

#include <meshtrain/status.h>

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static mt_status fuzz_load(const char *path, const char *buf, size_t len, mt_topo **out);

static void fuzz_fail(const char *what, size_t size) {
    fprintf(stderr, "%s: %s (input of %zu bytes)\n", FUZZ_NAME, what, size);
    abort();
}

static int busid_ok(const char *b) { return memchr(b, '\0', MT_TOPO_BUSID_MAX) != NULL; }

static int pci_ok(const mt_topo *t, int i) { return i >= -1 && (i < 0 || (size_t)i < t->n_pci); }

/* Whatever loads must be a model readers can walk without checks of their own. */
static void fuzz_check_model(const mt_topo *t, size_t size) {
    if (!t->source) fuzz_fail("no source", size);
    /* Every package and core holds a CPU of its own: more than there are CPU numbers is a
     * damaged input grown into a model no machine has. */
    if (t->n_packages > MT_TOPO_CPUS_MAX || t->n_cores > MT_TOPO_CPUS_MAX)
        fuzz_fail("more packages or cores than CPU numbers accepted", size);
    for (size_t i = 0; i < t->n_packages; i++)
        if (!t->packages[i].cpus) fuzz_fail("package without cpu list", size);
    for (size_t i = 0; i < t->n_numa; i++)
        if (!t->numa[i].cpus) fuzz_fail("NUMA node without cpu list", size);
    for (size_t i = 0; i < t->n_pci; i++) {
        if (!busid_ok(t->pci[i].bus_id)) fuzz_fail("PCI bus id not terminated", size);
        if (!pci_ok(t, t->pci[i].parent) || t->pci[i].parent == (int)i)
            fuzz_fail("PCI parent out of range", size);
        /* Parent chains must end: a reader walking up must not loop. */
        size_t steps = 0;
        for (int p = t->pci[i].parent; p >= 0; p = t->pci[p].parent)
            if (++steps > t->n_pci) fuzz_fail("PCI parent cycle", size);
    }
    for (size_t i = 0; i < t->n_gpus; i++) {
        const mt_topo_gpu *g = &t->gpus[i];
        if (g->index < 0 || (i > 0 && g->index <= t->gpus[i - 1].index))
            fuzz_fail("GPU indices not unique and sorted", size);
        if (!busid_ok(g->bus_id) || !g->name || !g->cpus || !pci_ok(t, g->pci))
            fuzz_fail("GPU entry incomplete", size);
        if (g->n_links && !g->links) fuzz_fail("GPU links missing", size);
        for (size_t l = 0; l < g->n_links; l++) {
            if (!busid_ok(g->links[l].target)) fuzz_fail("NVLink target not terminated", size);
            if (g->links[l].count < 1 || g->links[l].count > 1024)
                fuzz_fail("absurd NVLink count accepted", size);
        }
    }
    for (size_t i = 0; i < t->n_nics; i++)
        if (!t->nics[i].name || !busid_ok(t->nics[i].bus_id) || !pci_ok(t, t->nics[i].pci))
            fuzz_fail("NIC entry incomplete", size);
    for (size_t i = 0; i < t->n_switches; i++)
        if (!busid_ok(t->switches[i].bus_id) || !pci_ok(t, t->switches[i].pci))
            fuzz_fail("switch entry incomplete", size);
    if (t->nvlink_bw_n && (!t->nvlink_bw || !t->nvlink_bw_labels))
        fuzz_fail("NVLink bandwidth matrix missing", size);
    for (size_t i = 0; i < t->nvlink_bw_n; i++)
        if (!t->nvlink_bw_labels[i]) fuzz_fail("NVLink bandwidth label missing", size);
}

/* Returns 1 when the input loaded. A rejection must say why. */
static int fuzz_one(const uint8_t *data, size_t size) {
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    mt_topo *t = NULL;
    mt_status s = fuzz_load("fuzz-input", buf, size, &t);
    int ok = s == MT_OK;
    if (ok) {
        if (!t) fuzz_fail("success without a topology", size);
        fuzz_check_model(t, size);
    } else {
        if (t) fuzz_fail("failure with a topology", size);
        const char *e = mt_last_error();
        if (!e || !*e) fuzz_fail("rejected without an error message", size);
    }
    mt_topo_destroy(t);
    free(buf);
    return ok;
}

#ifdef MT_FUZZ_LIBFUZZER
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    setenv("MT_LOG_LEVEL", "error", 0); /* warnings on odd-but-accepted input are expected */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_one(data, size);
    return 0;
}
#else

#define FUZZ_MAX_SEEDS 32

typedef struct fuzz_seed {
    uint8_t *data;
    size_t len;
} fuzz_seed;

static uint64_t fuzz_rng = 0x9e3779b97f4a7c15ull;
static uint32_t fuzz_next(void) {
    fuzz_rng ^= fuzz_rng << 13;
    fuzz_rng ^= fuzz_rng >> 7;
    fuzz_rng ^= fuzz_rng << 17;
    return (uint32_t)(fuzz_rng >> 11);
}

#ifdef FUZZ_EXTRA_SEEDS
/* Seeds a harness adds after the fixture files (n of them so far); returns the new count, or -1
 * after saying why on stderr. */
static int fuzz_extra_seeds(const char *dir, fuzz_seed *seeds, int n);
#endif

static int fuzz_read_seeds(const char *dir, fuzz_seed *seeds) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    /* Sorted names so that the run does not depend on directory order. */
    char *names[FUZZ_MAX_SEEDS];
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < FUZZ_MAX_SEEDS;)
        if (strncmp(e->d_name, FUZZ_PREFIX, strlen(FUZZ_PREFIX)) == 0) names[n++] = strdup(e->d_name);
    closedir(d);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char *x = names[j];
            names[j] = names[j - 1];
            names[j - 1] = x;
        }
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        free(names[i]);
        FILE *f = fopen(path, "rb");
        seeds[i].data = NULL;
        seeds[i].len = 0;
        if (!f) continue;
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        seeds[i].data = malloc(len > 0 ? (size_t)len : 1);
        if (seeds[i].data && len > 0 && fread(seeds[i].data, 1, (size_t)len, f) == (size_t)len)
            seeds[i].len = (size_t)len;
        fclose(f);
    }
    return n;
}

/* Values that probe the loaders' bounds when written over a number or an attribute value. */
static const char *const fuzz_values[] = {"-1", "0", "4294967296", "99999999999999999999",
                                          "0x7fffffff", "", "fffffff:ff:ff.0", "0x068000",
                                          "0x030200", "0000:00:00.0", "&amp;", "<a>",
                                          "0-32767", "0:0*32768;0:0*32768", "1e999"};

/* One edit of buf[0..*len) (capacity cap): byte-level changes plus XML-aware ones that keep the
 * input well-formed often enough to reach the loaders' semantic checks. */
static void fuzz_mutate(uint8_t *buf, size_t *len, size_t cap, const fuzz_seed *seeds, int n) {
    size_t l = *len;
    switch (fuzz_next() % 7) {
    case 0: /* flip a bit */
        if (l) buf[fuzz_next() % l] ^= (uint8_t)(1u << (fuzz_next() % 8));
        break;
    case 1: /* truncate */
        if (l) l = fuzz_next() % l;
        break;
    case 2: { /* delete a range */
        if (l < 2) break;
        size_t at = fuzz_next() % l, n_del = 1 + fuzz_next() % 64;
        if (n_del > l - at) n_del = l - at;
        memmove(buf + at, buf + at + n_del, l - at - n_del);
        l -= n_del;
        break;
    }
    case 3: { /* duplicate a range (repeated elements, deeper nesting) */
        if (!l) break;
        size_t at = fuzz_next() % l, n_dup = 1 + fuzz_next() % 512;
        if (n_dup > l - at) n_dup = l - at;
        if (l + n_dup > cap) break;
        memmove(buf + at + n_dup, buf + at, l - at);
        l += n_dup;
        break;
    }
    case 4: { /* splice in a piece of another seed */
        const fuzz_seed *s = &seeds[fuzz_next() % (uint32_t)n];
        if (!l || !s->len) break;
        size_t at = fuzz_next() % l, from = fuzz_next() % s->len, k = 1 + fuzz_next() % 256;
        if (k > s->len - from) k = s->len - from;
        if (k > cap - at) k = cap - at;
        memcpy(buf + at, s->data + from, k);
        if (at + k > l) l = at + k;
        break;
    }
    default: { /* replace the value of an attribute (between quotes) with a probing one */
        if (!l) break;
        size_t at = fuzz_next() % l;
        while (at < l && buf[at] != '"') at++;
        size_t end = at + 1;
        while (end < l && buf[end] != '"') end++;
        if (end >= l) break;
        const char *v = fuzz_values[fuzz_next() % (sizeof fuzz_values / sizeof *fuzz_values)];
        size_t vl = strlen(v), old = end - at - 1;
        if (l - old + vl > cap) break;
        memmove(buf + at + 1 + vl, buf + end, l - end);
        memcpy(buf + at + 1, v, vl);
        l = l - old + vl;
        break;
    }
    }
    *len = l;
}

int main(int argc, char **argv) {
    long iterations = argc > 1 ? atol(argv[1]) : FUZZ_DEFAULT_ITERATIONS;
    const char *dir = argc > 2 ? argv[2] : MT_TOPO_FIXTURES;
    fuzz_seed seeds[FUZZ_MAX_SEEDS];
    int n = fuzz_read_seeds(dir, seeds);
    if (n == 0) {
        fprintf(stderr, "%s: no %s* fixture files in %s\n", FUZZ_NAME, FUZZ_PREFIX, dir);
        return 1;
    }
#ifdef FUZZ_EXTRA_SEEDS
    n = fuzz_extra_seeds(dir, seeds, n);
    if (n < 0) return 1;
#endif
    size_t maxlen = 0;
    for (int i = 0; i < n; i++) {
        if (!seeds[i].data || !seeds[i].len) {
            fprintf(stderr, "%s: fixture %d of %s could not be read\n", FUZZ_NAME, i, dir);
            return 1;
        }
        if (seeds[i].len > maxlen) maxlen = seeds[i].len;
        /* Every seed must load: otherwise the mutations start from inputs already rejected. */
        if (!fuzz_one(seeds[i].data, seeds[i].len)) {
            fprintf(stderr, "%s: fixture %d does not load: %s\n", FUZZ_NAME, i, mt_last_error());
            return 1;
        }
    }
    size_t cap = maxlen * 2 + 1024;
    uint8_t *buf = malloc(cap);
    if (!buf) return 1;
    long accepted = 0;
    for (long it = 0; it < iterations; it++) {
        const fuzz_seed *s = &seeds[fuzz_next() % (uint32_t)n];
        size_t len = s->len;
        memcpy(buf, s->data, len);
        int edits = 1 + (int)(fuzz_next() % 4);
        for (int e = 0; e < edits; e++) fuzz_mutate(buf, &len, cap, seeds, n);
        accepted += fuzz_one(buf, len);
    }
    free(buf);
    for (int i = 0; i < n; i++) free(seeds[i].data);
    printf("%s: %d seeds loaded, %ld mutated inputs, %ld accepted, every check held\n", FUZZ_NAME,
           n, iterations, accepted);
    /* Nothing accepted at all would mean the mutator only produces garbage. */
    return accepted > 0 ? 0 : 1;
}
#endif

#endif
