/* mt-topo: the machine's GPU / NVLink / PCIe / NIC topology, laid out like `nvidia-smi topo -m`,
 * as JSON, or exported as an NCCL topology file. See docs/mt-topo.md. */
#include "topo/report.h"
#include "topo/topo_open.h"
#include "topo/topology.h"

#include <meshtrain/status.h>
#include <meshtrain/version.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: mt-topo [--input FILE] [--json] [--export-nccl FILE] [--help] [--version]\n"
    "\n"
    "Reports the GPU, NVLink, PCIe and NIC topology: a matrix like `nvidia-smi topo -m`, then\n"
    "NVLink islands, GPUs per NUMA node, the NIC nearest each GPU and recommended TP groups.\n"
    "\n"
    "  --input FILE        read an hwloc XML (lstopo --of xml) or NCCL topology XML file instead\n"
    "                      of discovering this machine (default: $MT_TOPO_FILE when set)\n"
    "  --json              print the report as one JSON object\n"
    "  --export-nccl FILE  also write the topology as an NCCL topology file (NCCL_TOPO_FILE);\n"
    "                      FILE '-' writes it to stdout in place of the report\n"
    "  -h, --help          print this help\n"
    "  -V, --version       print the version\n";

static int bad_usage(const char *fmt, const char *arg) {
    fprintf(stderr, "mt-topo: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", usage);
    return 2;
}

/* "--name VALUE" or "--name=VALUE"; returns 1 and sets *value when argv[*i] is that option. */
static int option_value(int argc, char **argv, int *i, const char *name, const char **value,
                        int *missing) {
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0) return 0;
    if (a[n] == '=') {
        *value = a + n + 1;
        *missing = **value == '\0';
        return 1;
    }
    if (a[n] != '\0') return 0;
    if (*i + 1 >= argc) {
        *missing = 1;
        return 1;
    }
    *value = argv[++*i];
    return 1;
}

int main(int argc, char **argv) {
    const char *input = NULL, *export_path = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int missing = 0;
        if (option_value(argc, argv, &i, "--input", &input, &missing) ||
            option_value(argc, argv, &i, "--export-nccl", &export_path, &missing)) {
            if (missing) return bad_usage("option '%s' needs a file name", a);
        } else if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        } else if (strcmp(a, "--version") == 0 || strcmp(a, "-V") == 0) {
            printf("mt-topo (meshtrain) %s\n", mt_version());
            return 0;
        } else {
            return bad_usage(a[0] == '-' ? "unknown option '%s'" : "unexpected argument '%s'", a);
        }
    }
    /* Without --input, the topology every meshtrain process uses: MT_TOPO_FILE, else live. */
    mt_topo *t = NULL;
    mt_status s = input ? mt_topo_load_file(input, &t) : mt_topo_open(&t);
    if (s == MT_OK && export_path) s = mt_topo_export_nccl_file(t, export_path, stdout);
    int report = !export_path || strcmp(export_path, "-") != 0;
    if (s == MT_OK && report) s = json ? mt_topo_report_json(t, stdout) : mt_topo_report_text(t, stdout);
    mt_topo_destroy(t);
    if (s != MT_OK) {
        fprintf(stderr, "mt-topo: %s\n", mt_last_error());
        return 1;
    }
    return 0;
}
