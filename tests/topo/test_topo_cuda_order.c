/* GPU numbering by CUDA index (topo/topo_cuda.c) on the AWS p4d fixture, whose 8 A100 in PCI bus
 * order are 10:1c, 10:1d, 20:1c, 20:1d, 90:1c, 90:1d, a0:1c, a0:1d: CUDA_VISIBLE_DEVICES as CUDA
 * reads it, CUDA_DEVICE_ORDER, the bus ids a CUDA runtime reports, and the driver's GPU list
 * (UUIDs, GPUs hidden from a container). Plus bus id spelling (mt_topo_busid_canon). */
#include "check.h"
#include "topo_fixture.h"
#include "topo/topo_cuda.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define P4D "hwloc-aws-p4d.24xl-nixl.xml"

static const char *const bus[8] = {"0000:10:1c.0", "0000:10:1d.0", "0000:20:1c.0", "0000:20:1d.0",
                                   "0000:90:1c.0", "0000:90:1d.0", "0000:a0:1c.0", "0000:a0:1d.0"};

/* The driver's view of p4d, as NVML spells it (8-digit domain, upper case). */
static mt_nvml_gpu driver[9];

static void make_driver(void) {
    for (int i = 0; i < 8; i++) {
        unsigned b, d;
        sscanf(bus[i], "0000:%x:%x.0", &b, &d);
        snprintf(driver[i].bus_id, sizeof(driver[i].bus_id), "00000000:%02X:%02X.0", b, d);
        snprintf(driver[i].uuid, sizeof(driver[i].uuid), "GPU-a100000%d-0000-4000-8000-%012d", i,
                 i);
    }
    snprintf(driver[8].bus_id, sizeof(driver[8].bus_id), "00000000:B0:00.0");
    snprintf(driver[8].uuid, sizeof(driver[8].uuid), "GPU-b0b0b0b0-0000-4000-8000-000000000000");
}

/* Numbers p4d under view v and checks the result: want_status, then the visible GPUs' bus ids
 * in index order (a NULL-terminated list of bus[] positions, -1 ends) and their indices. */
static void expect(const char *what, const mt_topo_cuda_view *v, mt_status want_status,
                   const int *want_pos, const int *want_index) {
    mt_topo *t = load_fixture(P4D);
    if (!t) return;
    mt_status s = mt_topo_cuda_number(t, v);
    CHECK_MSG(s == want_status, "%s: status %s (%s), expected %s", what, mt_status_str(s),
              mt_last_error(), mt_status_str(want_status));
    size_t n = 0;
    while (want_pos[n] >= 0) n++;
    CHECK_MSG(t->n_gpus == n, "%s: %zu GPUs visible, expected %zu", what, t->n_gpus, n);
    for (size_t i = 0; i < n && i < t->n_gpus; i++) {
        int idx = want_index ? want_index[i] : (int)i;
        CHECK_MSG(strcmp(t->gpus[i].bus_id, bus[want_pos[i]]) == 0 && t->gpus[i].index == idx,
                  "%s: gpus[%zu] is %s with index %d, expected %s with index %d", what, i,
                  t->gpus[i].bus_id, t->gpus[i].index, bus[want_pos[i]], idx);
        /* the GPU keeps what the loader knew of it */
        int want_numa = want_pos[i] < 4 ? 0 : 1;
        CHECK_MSG(t->gpus[i].numa == want_numa && strstr(t->gpus[i].name, "A100"),
                  "%s: %s lost its NUMA node or name", what, t->gpus[i].bus_id);
    }
    mt_topo_destroy(t);
}

#define LIST(...) ((const int[]){__VA_ARGS__, -1})
#define NONE ((const int[]){-1})
#define ALL LIST(0, 1, 2, 3, 4, 5, 6, 7)

static void env_case(const char *visible, const char *order, const int *want) {
    char what[128];
    snprintf(what, sizeof(what), "CUDA_VISIBLE_DEVICES=%s%s%s CUDA_DEVICE_ORDER=%s",
             visible ? "\"" : "", visible ? visible : "(unset)", visible ? "\"" : "",
             order ? order : "(unset)");
    mt_topo_cuda_view v = {.visible_devices = visible, .device_order = order};
    expect(what, &v, MT_OK, want, NULL);
}

static void test_visible_devices(void) {
    env_case(NULL, NULL, ALL);
    env_case("0,1,2,3,4,5,6,7", NULL, ALL);
    env_case("3,1", NULL, LIST(3, 1));
    env_case("", NULL, NONE);
    env_case("  ", NULL, NONE);
    env_case("1,foo,2", NULL, LIST(1));       /* the list ends at the invalid entry */
    env_case("1gpu2,2", NULL, LIST(1, 2));    /* read like strtoul: "1gpu2" is 1 */
    env_case(" 5 , 4", NULL, LIST(5, 4));     /* blanks around entries */
    env_case("+3", NULL, LIST(3));
    env_case("0,0", NULL, NONE);              /* a repeated device hides all */
    env_case("2,3,2", NULL, NONE);
    env_case("2,-1,5", NULL, LIST(2));        /* negative ends the list */
    env_case("9", NULL, NONE);                /* out of range */
    env_case("7,8,1", NULL, LIST(7));
    env_case("6,", NULL, LIST(6));            /* an empty entry is invalid */
    env_case(",6", NULL, NONE);
    /* Without the runtime, bus order is used under either order (and a bad value). */
    env_case("3,1", "PCI_BUS_ID", LIST(3, 1));
    env_case("3,1", "FASTEST_FIRST", LIST(3, 1));
    env_case(NULL, "PCI_BUS_ID", ALL);
    env_case(NULL, "bogus", ALL);
}

static void test_runtime(void) {
    /* The runtime's list decides, in its order, whatever the variables say. */
    const char *rev[8] = {"00000000:A0:1D.0", "0000:A0:1C.0", "0000:90:1d.0", "0000:90:1C.0",
                          "0000:20:1D.0",     "0000:20:1C.0", "0000:10:1D.0", "10:1c.0"};
    mt_topo_cuda_view v = {.visible_devices = "0", .device_order = "PCI_BUS_ID",
                           .runtime_busids = rev, .n_runtime = 8};
    expect("runtime, reversed (FASTEST_FIRST-like)", &v, MT_OK, LIST(7, 6, 5, 4, 3, 2, 1, 0), NULL);

    const char *three[3] = {"0000:90:1C.0", "0000:10:1C.0", "0000:20:1D.0"};
    mt_topo_cuda_view v3 = {.runtime_busids = three, .n_runtime = 3};
    expect("runtime, 3 visible", &v3, MT_OK, LIST(4, 0, 3), NULL);

    /* A device hwloc did not find keeps its index unused; a malformed id is skipped. */
    const char *gap[4] = {"0000:10:1C.0", "0000:ff:00.0", "0000:20:1C.0", "xyz"};
    mt_topo_cuda_view vg = {.runtime_busids = gap, .n_runtime = 4};
    expect("runtime with a device hwloc does not show", &vg, MT_OK, LIST(0, 2), LIST(0, 2));

    mt_topo_cuda_view none = {.runtime_busids = rev, .n_runtime = 0};
    expect("runtime with no device", &none, MT_OK, NONE, NULL);
}

static void driver_case(const char *visible, size_t n_driver, mt_status want_status,
                        const int *want, const int *want_index) {
    char what[160];
    snprintf(what, sizeof(what), "driver list of %zu, CUDA_VISIBLE_DEVICES=%s", n_driver,
             visible ? visible : "(unset)");
    mt_topo_cuda_view v = {.visible_devices = visible,
                           .driver = n_driver ? driver : NULL,
                           .n_driver = n_driver};
    expect(what, &v, want_status, want, want_index);
}

static void test_driver_and_uuids(void) {
    make_driver();
    driver_case(NULL, 8, MT_OK, ALL, NULL);
    driver_case("GPU-a1000003,GPU-a1000001", 8, MT_OK, LIST(3, 1), NULL);
    driver_case("GPU-A1000003-0000-4000-8000-000000000003", 8, MT_OK, LIST(3), NULL);
    driver_case("GPU-a1000005,2", 8, MT_OK, LIST(5, 2), NULL);      /* mixed entries */
    driver_case("4,GPU-a100000,1", 8, MT_OK, LIST(4), NULL);        /* ambiguous prefix */
    driver_case("GPU-ffff,1", 8, MT_OK, NONE, NULL);                 /* unknown UUID */
    driver_case("GPU-a1000002,2", 8, MT_OK, NONE, NULL);             /* same GPU twice */
    /* Without NVML a UUID cannot be resolved: an error, and the model is left as it was. */
    driver_case("GPU-a1000003", 0, MT_ERR_UNSUPPORTED, ALL, NULL);
    driver_case("MIG-a1000003-0000", 8, MT_ERR_UNSUPPORTED, ALL, NULL);
    /* A container given 7 of the 8 GPUs: the eighth is never visible, and ordinals count 7. */
    driver_case(NULL, 7, MT_OK, LIST(0, 1, 2, 3, 4, 5, 6), NULL);
    driver_case("7", 7, MT_OK, NONE, NULL);
    driver_case("6,0", 7, MT_OK, LIST(6, 0), NULL);
    /* The driver shows a GPU hwloc does not (ordinal 8): its CUDA index stays unused. */
    driver_case("8,0", 9, MT_OK, LIST(0), LIST(1));
    driver_case(NULL, 9, MT_OK, ALL, NULL);
}

static void canon_case(const char *in, const char *want) {
    char out[MT_TOPO_BUSID_MAX] = "";
    mt_status s = mt_topo_busid_canon(in, out);
    if (want)
        CHECK_MSG(s == MT_OK && strcmp(out, want) == 0, "canon '%s' gives '%s' (%s), expected %s",
                  in, out, mt_status_str(s), want);
    else
        CHECK_MSG(s == MT_ERR_INVALID_ARG, "canon '%s' gives %s, expected an error", in,
                  mt_status_str(s));
}

static void test_busid_canon(void) {
    canon_case("0000:3B:00.0", "0000:3b:00.0");
    canon_case("00000000:3B:00.0", "0000:3b:00.0");
    canon_case("3b:00.0", "0000:3b:00.0");
    canon_case("0001:00:1f.7", "0001:00:1f.7");
    canon_case("10000:01:00.0", "10000:01:00.0");
    canon_case("", NULL);
    canon_case("zz", NULL);
    canon_case("0000:3b:00", NULL);
    canon_case("0000:3b:20.0", NULL);
    canon_case("0000:3b:00.0x", NULL);
    canon_case("000000000:3b:00.0", NULL);
    canon_case("0:0:0:0.0", NULL);
}

/* The live numbering on a fixture model: on a machine without a CUDA device (this one) the CUDA
 * runtime, when built in, answers nothing and the environment decides, without a warning. */
static void test_live_fallback(void) {
    if (access("/dev/nvidia0", F_OK) == 0) {
        printf("/dev/nvidia0 exists: the no-device fallback is not checked here\n");
        return;
    }
    const char *cases[3][2] = {{NULL, "8"}, {"3,1", "2"}, {"", "0"}};
    for (int c = 0; c < 3; c++) {
        mt_topo *t = load_fixture(P4D);
        if (!t) return;
        if (cases[c][0])
            setenv("CUDA_VISIBLE_DEVICES", cases[c][0], 1);
        else
            unsetenv("CUDA_VISIBLE_DEVICES");
        char path[64];
        snprintf(path, sizeof(path), "/tmp/mt_cuda_err_%d", (int)getpid());
        fflush(stderr);
        int saved = dup(2), fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
        if (fd >= 0) dup2(fd, 2);
        mt_status s = mt_topo_cuda_number_live(t, NULL, 0);
        fflush(stderr);
        if (saved >= 0) dup2(saved, 2), close(saved);
        if (fd >= 0) close(fd);
        long size = 0;
        FILE *f = fopen(path, "r");
        if (f) {
            fseek(f, 0, SEEK_END);
            size = ftell(f);
            fclose(f);
        }
        unlink(path);
        CHECK_MSG(s == MT_OK, "live numbering, CUDA_VISIBLE_DEVICES=%s: %s",
                  cases[c][0] ? cases[c][0] : "(unset)", mt_last_error());
        CHECK_MSG(t->n_gpus == (size_t)atoi(cases[c][1]), "live numbering, "
                  "CUDA_VISIBLE_DEVICES=%s: %zu GPUs, expected %s",
                  cases[c][0] ? cases[c][0] : "(unset)", t->n_gpus, cases[c][1]);
        CHECK_MSG(size == 0, "live numbering printed %ld bytes at warn level", size);
        if (c == 1 && t->n_gpus == 2)
            CHECK(strcmp(t->gpus[0].bus_id, bus[3]) == 0 && strcmp(t->gpus[1].bus_id, bus[1]) == 0);
        mt_topo_destroy(t);
    }
    unsetenv("CUDA_VISIBLE_DEVICES");
}

int main(void) {
    setenv("MT_LOG_LEVEL", "warn", 1); /* the quiet checks count warn-level lines */
    test_visible_devices();
    test_runtime();
    test_driver_and_uuids();
    test_busid_canon();
    test_live_fallback();
    return check_report("test_topo_cuda_order");
}
