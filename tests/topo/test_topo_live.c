/* Live discovery (topo/topo_live.c) on the machine running the test: at least one package and
 * NUMA node, NUMA cpu lists that together cover exactly the online CPUs, each once, core and PU
 * counts consistent with them, and (unless an NVIDIA device node exists) no GPU. */
#include "check.h"
#include "topo/topology.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_CPUS 16384

/* Parses a cpu list ("0-3,8,10-11") into counts per CPU; returns -1 on a malformed list. */
static int parse_cpulist(const char *s, unsigned char *seen) {
    while (*s && *s != '\n') {
        if (!isdigit((unsigned char)*s)) return -1;
        char *end;
        long a = strtol(s, &end, 10), b = a;
        if (*end == '-') {
            if (!isdigit((unsigned char)end[1])) return -1;
            b = strtol(end + 1, &end, 10);
        }
        if (a < 0 || b < a || b >= MAX_CPUS) return -1;
        for (long c = a; c <= b; c++) seen[c]++;
        s = end;
        if (*s == ',') s++;
        else if (*s && *s != '\n') return -1;
    }
    return 0;
}

/* The online CPUs from sysfs, else 0..sysconf(_SC_NPROCESSORS_ONLN)-1. */
static void online_cpus(unsigned char *online) {
    FILE *f = fopen("/sys/devices/system/cpu/online", "r");
    char line[4096];
    if (f && fgets(line, sizeof line, f) && parse_cpulist(line, online) == 0) {
        fclose(f);
        return;
    }
    if (f) fclose(f);
    memset(online, 0, MAX_CPUS);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (long c = 0; c < n && c < MAX_CPUS; c++) online[c] = 1;
}

int main(void) {
    mt_topo *t = NULL;
    CHECK_OK(mt_topo_discover(&t));
    if (!t) return check_report("test_topo_live");
    CHECK(t->source && strcmp(t->source, "live") == 0);
    CHECK_MSG(t->n_packages >= 1, "%zu packages", t->n_packages);
    CHECK_MSG(t->n_numa >= 1, "%zu NUMA nodes", t->n_numa);

    static unsigned char online[MAX_CPUS], covered[MAX_CPUS];
    online_cpus(online);
    for (size_t i = 0; i < t->n_numa; i++) {
        CHECK_MSG(t->numa[i].cpus && parse_cpulist(t->numa[i].cpus, covered) == 0,
                  "NUMA node %d cpu list \"%s\"", t->numa[i].id,
                  t->numa[i].cpus ? t->numa[i].cpus : "(null)");
        printf("NUMA node %d: cpus %s\n", t->numa[i].id, t->numa[i].cpus);
    }
    size_t n_online = 0, mismatches = 0;
    for (int c = 0; c < MAX_CPUS; c++) {
        n_online += online[c] != 0;
        if (covered[c] != (online[c] ? 1 : 0)) {
            mismatches++;
            fprintf(stderr, "cpu %d: online %d, in %d NUMA node(s)\n", c, online[c], covered[c]);
        }
    }
    CHECK_MSG(mismatches == 0, "%zu CPUs differ between NUMA cpu lists and online CPUs",
              mismatches);
    CHECK_MSG(t->n_pus == n_online, "%zu PUs, %zu online CPUs", t->n_pus, n_online);
    CHECK_MSG(t->n_cores >= t->n_packages && t->n_cores <= t->n_pus, "%zu cores", t->n_cores);
    for (size_t i = 0; i < t->n_packages; i++)
        CHECK(t->packages[i].cpus && t->packages[i].cpus[0]);
    /* Every core has PUs and, on a machine with one NUMA node, belongs to it. */
    for (size_t i = 0; i < t->n_cores; i++) {
        CHECK(t->cores[i].cpus && t->cores[i].cpus[0]);
        if (t->n_numa == 1) CHECK(t->cores[i].id == t->numa[0].id);
    }

    for (size_t i = 0; i < t->n_pci; i++)
        CHECK(t->pci[i].parent >= -1 && t->pci[i].parent < (int)i);
    for (size_t i = 0; i < t->n_nics; i++) {
        CHECK(t->nics[i].name && t->nics[i].name[0]);
        printf("NIC %s at %s, NUMA %d\n", t->nics[i].name, t->nics[i].bus_id, t->nics[i].numa);
    }
    if (access("/dev/nvidia0", F_OK) == 0) {
        printf("/dev/nvidia0 exists: %zu GPU(s) found, the no-GPU check is skipped\n", t->n_gpus);
    } else {
        CHECK_MSG(t->n_gpus == 0, "%zu GPUs found on a machine without /dev/nvidia0", t->n_gpus);
    }
    printf("live: %zu package(s), %zu NUMA node(s), %zu cores, %zu PUs, %zu PCI objects, "
           "%zu NIC(s), %zu GPU(s)\n",
           t->n_packages, t->n_numa, t->n_cores, t->n_pus, t->n_pci, t->n_nics, t->n_gpus);
    mt_topo_destroy(t);
    return check_report("test_topo_live");
}
