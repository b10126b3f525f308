/* Reports and the NCCL export: the JSON writer's escaping and misuse errors; the export of every
 * fixture read back gives the same text and JSON report (apart from the source), CPU identity and
 * PCIe links; the export keeps to what NCCL's own XML parser reads and carries what NCCL needs
 * from the <cpu> and <pci> attributes; the mt_* attributes are checked when malformed. */
#include "check.h"
#include "topo_fixture.h"

#include "core/json_writer.h"
#include "topo/report.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Runs fn into a string (caller frees). */
static char *capture_json(void (*fn)(mt_json *), mt_status *st) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    mt_json j;
    mt_json_init(&j, f);
    fn(&j);
    *st = mt_json_end(&j);
    fclose(f);
    return buf;
}

static void doc_strings(mt_json *j) {
    mt_json_begin_object(j);
    mt_json_key(j, "q\"b\\");
    mt_json_string(j, "a\"b\\c\n\t\x01\x7f");
    mt_json_key(j, "utf8");
    mt_json_string(j, "caf\xc3\xa9 \xff \xe2\x82");
    mt_json_key(j, "n");
    mt_json_begin_array_inline(j);
    mt_json_int(j, -3);
    mt_json_null(j);
    mt_json_bool(j, 1);
    mt_json_double(j, 0.5);
    mt_json_double(j, 1.0 / 0.0);
    mt_json_end_array(j);
    mt_json_key(j, "empty");
    mt_json_begin_array(j);
    mt_json_end_array(j);
    mt_json_end_object(j);
}

static void doc_value_without_key(mt_json *j) {
    mt_json_begin_object(j);
    mt_json_int(j, 1);
    mt_json_end_object(j);
}

static void doc_unbalanced(mt_json *j) {
    mt_json_begin_array(j);
    mt_json_end_object(j);
}

static void doc_open(mt_json *j) {
    mt_json_begin_object(j);
    mt_json_key(j, "a");
}

static void test_json_writer(void) {
    mt_status st;
    char *s = capture_json(doc_strings, &st);
    CHECK_OK(st);
    const char *want = "{\n"
                       "  \"q\\\"b\\\\\": \"a\\\"b\\\\c\\n\\t\\u0001\\u007f\",\n"
                       "  \"utf8\": \"caf\xc3\xa9 \\ufffd \\ufffd\\ufffd\",\n"
                       "  \"n\": [-3, null, true, 0.5, null],\n"
                       "  \"empty\": []\n"
                       "}\n";
    CHECK_MSG(s && strcmp(s, want) == 0, "got:\n%s", s ? s : "(null)");
    free(s);
    s = capture_json(doc_value_without_key, &st);
    CHECK(st == MT_ERR_INVALID_ARG && strstr(mt_last_error(), "without a key"));
    free(s);
    s = capture_json(doc_unbalanced, &st);
    CHECK(st == MT_ERR_INVALID_ARG && strstr(mt_last_error(), "unbalanced"));
    free(s);
    s = capture_json(doc_open, &st);
    CHECK(st == MT_ERR_INVALID_ARG && strstr(mt_last_error(), "incomplete"));
    free(s);
}

typedef mt_status (*report_fn)(const mt_topo *, FILE *);

static char *render(const mt_topo *t, report_fn fn) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    mt_status s = fn(t, f);
    fclose(f);
    CHECK_MSG(s == MT_OK, "%s: %s", t->source, mt_last_error());
    return buf;
}

/* The text after the first line (the source line differs by design). */
static const char *after_source(const char *text) {
    const char *nl = text ? strchr(text, '\n') : NULL;
    return nl ? nl + 1 : "";
}

/* Drops the "source" member (the second line of the JSON report). */
static const char *json_after_source(const char *text) {
    const char *p = text ? strstr(text, "\"source\"") : NULL;
    const char *nl = p ? strchr(p, '\n') : NULL;
    return nl ? nl + 1 : "";
}

/* NCCL's parser: attributes separated by exactly one space, values in double quotes of at most
 * 253 characters, no declaration or comment, spaces (no tabs) between elements. */
static void check_nccl_syntax(const char *name, const char *xml) {
    CHECK_MSG(strncmp(xml, "<system version=\"1\"", 19) == 0, "%s: starts %.30s", name, xml);
    CHECK_MSG(!strstr(xml, "<?") && !strstr(xml, "<!--") && !strchr(xml, '\t'),
              "%s: declaration, comment or tab in the export", name);
    for (const char *p = xml; (p = strchr(p, '=')) != NULL; p++) {
        CHECK_MSG(p[1] == '"', "%s: unquoted value near %.30s", name, p - 10);
        const char *end = strchr(p + 2, '"');
        CHECK_MSG(end && end - (p + 2) <= 253, "%s: long value near %.30s", name, p - 10);
        CHECK_MSG(end && (end[1] == ' ' || end[1] == '>' || end[1] == '/'),
                  "%s: no single space after a value near %.30s", name, p - 10);
    }
    CHECK_MSG(!strstr(xml, "  =") && !strstr(xml, "\" \"") && !strstr(xml, "\" />"),
              "%s: spacing NCCL does not parse", name);
}

static const mt_topo_pci *pci_at(const mt_topo *t, const char *busid) {
    for (size_t i = 0; i < t->n_pci; i++)
        if (strcmp(t->pci[i].bus_id, busid) == 0) return &t->pci[i];
    return NULL;
}

/* The CPU identity of every NUMA node and the link of every PCI entry written survive. */
static void check_cpu_and_links_kept(const char *name, const mt_topo *t, const mt_topo *back) {
    CHECK_MSG(back->n_numa == t->n_numa, "%s: %zu NUMA nodes back, %zu before", name,
              back->n_numa, t->n_numa);
    for (size_t i = 0; i < t->n_numa && i < back->n_numa; i++) {
        const mt_topo_cpu_id *a = &t->numa[i].cpu, *b = &back->numa[i].cpu;
        CHECK_MSG(strcmp(a->arch, b->arch) == 0 && strcmp(a->vendor, b->vendor) == 0 &&
                      a->family == b->family && a->model == b->model,
                  "%s: NUMA node %d: CPU '%s' '%s' %d %d became '%s' '%s' %d %d", name,
                  t->numa[i].id, a->arch, a->vendor, a->family, a->model, b->arch, b->vendor,
                  b->family, b->model);
    }
    size_t compared = 0;
    for (size_t i = 0; i < back->n_pci; i++) {
        const mt_topo_pci *b = &back->pci[i], *a = pci_at(t, b->bus_id);
        if (b->kind == MT_TOPO_PCI_HOST_BRIDGE) continue;
        CHECK_MSG(a != NULL, "%s: PCI %s appeared", name, b->bus_id);
        if (!a) continue;
        compared++;
        CHECK_MSG(strcmp(a->link_speed, b->link_speed) == 0 && a->link_width == b->link_width &&
                      a->link_gbps == b->link_gbps,
                  "%s: PCI %s link '%s' x%d %.9g GB/s became '%s' x%d %.9g", name, a->bus_id,
                  a->link_speed, a->link_width, (double)a->link_gbps, b->link_speed,
                  b->link_width, (double)b->link_gbps);
    }
    CHECK_MSG(compared > 0 || back->n_gpus + back->n_nics == 0, "%s: no PCI entry came back",
              name);
}

static void round_trip(const char *name) {
    mt_topo *t = load_fixture(name);
    if (!t) return;
    char path[] = "/tmp/mt_topo_report_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) {
        mt_topo_destroy(t);
        return;
    }
    close(fd);
    char *xml = render(t, mt_topo_export_nccl);
    if (xml) check_nccl_syntax(name, xml);
    CHECK_OK(mt_topo_export_nccl_file(t, path, NULL));
    mt_topo *back = NULL;
    mt_status s = mt_topo_load_file(path, &back);
    CHECK_MSG(s == MT_OK, "%s: the export does not load: %s", name, mt_last_error());
    if (s == MT_OK) {
        char *a = render(t, mt_topo_report_text), *b = render(back, mt_topo_report_text);
        CHECK_MSG(a && b && strcmp(after_source(a), after_source(b)) == 0,
                  "%s: text report differs after the round trip:\n%s\n---\n%s", name, a, b);
        CHECK_MSG(a && strstr(a, "Recommended TP groups") && strncmp(a, "Source: ", 8) == 0,
                  "%s: text report lacks its parts", name);
        free(a);
        free(b);
        a = render(t, mt_topo_report_json);
        b = render(back, mt_topo_report_json);
        CHECK_MSG(a && b && strcmp(json_after_source(a), json_after_source(b)) == 0,
                  "%s: JSON report differs after the round trip", name);
        free(a);
        free(b);
        /* the PHB/NODE distinction and the core list survive */
        CHECK_MSG(back->n_cores == t->n_cores && back->n_packages == t->n_packages &&
                      back->n_pus == t->n_pus,
                  "%s: cores %zu/%zu packages %zu/%zu", name, back->n_cores, t->n_cores,
                  back->n_packages, t->n_packages);
        for (size_t i = 0; i < t->n_cores && i < back->n_cores; i++)
            CHECK_MSG(strcmp(t->cores[i].cpus, back->cores[i].cpus) == 0 &&
                          t->cores[i].id == back->cores[i].id,
                      "%s: core %zu", name, i);
        check_cpu_and_links_kept(name, t, back);
    }
    mt_topo_destroy(back);
    free(xml);
    unlink(path);
    mt_topo_destroy(t);
}

static void test_round_trips(void) {
    DIR *d = opendir(MT_TOPO_FIXTURES);
    CHECK(d != NULL);
    if (!d) return;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".xml") != 0) continue;
        round_trip(e->d_name);
        n++;
    }
    closedir(d);
    CHECK_MSG(n == 15, "%d fixtures found, expected 15", n);
}

/* A PHB pair (AWS p4d: GPU and EFA under one host bridge) stays PHB: without mt_host_bridge the
 * NCCL format would make it NODE. */
static void test_host_bridge_kept(void) {
    mt_topo *t = load_fixture("hwloc-aws-p4d.24xl-nixl.xml");
    if (!t) return;
    char *xml = render(t, mt_topo_export_nccl);
    CHECK(xml && strstr(xml, "mt_host_bridge=\"0000:10\""));
    free(xml);
    mt_topo_destroy(t);
}

/* Exports t, returning the XML and (in *err) what was logged on stderr meanwhile. */
static char *export_capturing_stderr(const mt_topo *t, char **err) {
    char path[] = "/tmp/mt_topo_stderr_XXXXXX";
    int fd = mkstemp(path), saved = dup(2);
    CHECK(fd >= 0 && saved >= 0);
    *err = NULL;
    if (fd < 0 || saved < 0) return NULL;
    fflush(stderr);
    dup2(fd, 2);
    char *xml = render(t, mt_topo_export_nccl);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    off_t len = lseek(fd, 0, SEEK_END);
    *err = calloc(1, (size_t)(len > 0 ? len : 0) + 1);
    if (*err && len > 0) CHECK(pread(fd, *err, (size_t)len, 0) == len);
    close(fd);
    unlink(path);
    return xml;
}

/* What NCCL reads from the export: <cpu arch vendor familyid modelid> from NCCL files and hwloc
 * files that have them, PCIe links as written or derived from hwloc's rate; a file without CPU
 * identity gets none (and a warning naming the NUMA nodes and NCCL's error), not a guess. */
static void test_cpu_and_links_exported(void) {
    static const struct {
        const char *file, *want[3], *absent, *warning;
    } cases[] = {
        {"nccl-ibmcloud-gx3d-h100x8-vsi-topo.xml",
         {"<cpu numaid=\"0\" affinity=", "<cpu numaid=\"1\" affinity=",
          "arch=\"x86_64\" vendor=\"GenuineIntel\" "
          "familyid=\"6\" modelid=\"143\">"},
         NULL, NULL},
        {"nccl-issue2397-2xA100pcie-cx6dx-icelake-hostA.xml",
         {"arch=\"x86_64\" vendor=\"GenuineIntel\" familyid=\"6\" modelid=\"106\">",
          "busid=\"0000:16:00.0\" class=\"0x020000\" link_speed=\"16.0 GT/s PCIe\" "
          "link_width=\"8\"",
          "busid=\"0000:69:00.0\" class=\"0x030200\" vendor=\"0x10de\" device=\"0x20b5\" "
          "link_speed=\"16.0 GT/s PCIe\" link_width=\"16\""},
         "mt_link_gbps", NULL},
        {"nccl-azure-ncv4-a100x4-topo.xml",
         {"vendor=\"AuthenticAMD\" familyid=\"175\" modelid=\"1\"",
          "link_speed=\"\" link_width=\"0\"", "arch=\"x86_64\""},
         NULL, NULL},
        {"hwloc-nvidia-dgx2-v100-nvswitch.v2.xml",
         {"arch=\"x86_64\" vendor=\"GenuineIntel\" familyid=\"6\" modelid=\"85\">",
          "busid=\"0000:34:00.0\" class=\"0x030200\" link_speed=\"8.0 GT/s PCIe\" "
          "link_width=\"16\" mt_link_gbps=\"15.7538462\"",
          "<cpu numaid=\"1\""},
         NULL, NULL},
        {"hwloc-ibm-power8-minsky-4xP100-nvlink.v2.xml",
         {"affinity=\"03030303\" arch=\"ppc64\">",
          "busid=\"0002:00:00.0\" class=\"0x060400\" link_speed=\"8.0 GT/s PCIe\" "
          "link_width=\"8\" mt_link_gbps=\"7.87692308\"",
          "<cpu numaid=\"1\""},
         "vendor=\"", NULL},
        {"hwloc-aws-p5.48xl-nixl.xml",
         {"busid=\"0000:53:00.0\" class=\"0x030200\" link_speed=\"32.0 GT/s PCIe\" "
          "link_width=\"16\" mt_link_gbps=\"63.0153847\"",
          "<cpu numaid=\"0\" affinity=\"0000ffff,ffffffff\">", "<cpu numaid=\"1\""},
         "arch=", "NUMA node(s) 0 (arch), 1 (arch), whose <cpu> holds NICs"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        mt_topo *t = load_fixture(cases[i].file);
        if (!t) continue;
        char *err = NULL, *xml = export_capturing_stderr(t, &err);
        for (int k = 0; k < 3; k++)
            CHECK_MSG(xml && strstr(xml, cases[i].want[k]), "%s: the export lacks %s",
                      cases[i].file, cases[i].want[k]);
        if (cases[i].absent)
            CHECK_MSG(xml && !strstr(xml, cases[i].absent), "%s: the export has %s",
                      cases[i].file, cases[i].absent);
        if (cases[i].warning)
            CHECK_MSG(err && strstr(err, cases[i].warning) &&
                          strstr(err, "Attribute arch of node cpu not found"),
                      "%s: warning missing or wrong: %s", cases[i].file, err ? err : "");
        else
            CHECK_MSG(err && !strstr(err, "CPU identity"), "%s: unexpected warning: %s",
                      cases[i].file, err ? err : "");
        free(err);
        free(xml);
        mt_topo_destroy(t);
    }
}

/* hwloc's link rates (GB/s, the whole link) written as a rate x width pair NCCL reads (x16 first,
 * the pair's product being the rate) and read back as the rate alone; a rate no pair gives is
 * written with empty link attributes. An Intel CPU without a model draws the warning, naming
 * the attribute NCCL will miss; an AMD one needs no family or model. */
static void test_link_rates(void) {
    static const struct {
        float gbps;
        const char *written;
    } rates[] = {
        {2.0f, "link_speed=\"2.5 GT/s PCIe\" link_width=\"8\""},
        {1.0f, "link_speed=\"2.5 GT/s PCIe\" link_width=\"4\""},
        {8.0f, "link_speed=\"5.0 GT/s PCIe\" link_width=\"16\""},
        {3.938462f, "link_speed=\"8.0 GT/s PCIe\" link_width=\"4\""},
        {7.876923f, "link_speed=\"8.0 GT/s PCIe\" link_width=\"8\""},
        {31.507692f, "link_speed=\"16.0 GT/s PCIe\" link_width=\"16\""},
        {121.0f, "link_speed=\"64.0 GT/s PCIe\" link_width=\"16\""},
        {3.3f, "link_speed=\"\" link_width=\"\" mt_link_gbps=\"3.29999995\""},
    };
    const size_t n = sizeof(rates) / sizeof(rates[0]);
    for (int amd = 0; amd < 2; amd++) {
        mt_topo *t = NULL;
        CHECK_OK(mt_topo_create("synthetic", &t));
        if (!t) return;
        CHECK_OK(mt_topo_add_cpuset(t, 0, 0, "0-3"));
        CHECK_OK(mt_topo_set_cpu_id(&t->numa[0], "amd64", amd ? "AuthenticAMD" : "GenuineIntel",
                                    amd ? -1 : 6, -1));
        CHECK(strcmp(t->numa[0].cpu.arch, "x86_64") == 0);
        for (size_t i = 0; i < n; i++) {
            char busid[16], name[16];
            int idx = -1;
            snprintf(busid, sizeof(busid), "0000:%02zx:00.0", i + 1);
            snprintf(name, sizeof(name), "mlx5_%zu", i);
            CHECK_OK(mt_topo_add_pci(t, busid, MT_TOPO_PCI_DEVICE, -1, 0x020700, 0, &idx));
            CHECK_OK(mt_topo_pci_set_link(t, idx, NULL, -1, rates[i].gbps));
            CHECK_OK(mt_topo_add_nic(t, name, busid, 0, 100000, idx, 1));
        }
        CHECK_OK(mt_topo_finish(t));
        char *err = NULL, *xml = export_capturing_stderr(t, &err);
        for (size_t i = 0; i < n; i++)
            CHECK_MSG(xml && strstr(xml, rates[i].written), "%.6f GB/s is not written as %s",
                      (double)rates[i].gbps, rates[i].written);
        if (amd)
            CHECK_MSG(err && !strstr(err, "CPU identity"), "AMD: unexpected warning %s", err);
        else
            CHECK_MSG(err && strstr(err, "NUMA node(s) 0 (modelid)") &&
                          strstr(err, "Attribute modelid of node cpu not found"),
                      "Intel without a model: warning missing: %s", err ? err : "");
        mt_topo *back = NULL;
        CHECK_OK(mt_topo_load_nccl_xml("synthetic.xml", xml ? xml : "", xml ? strlen(xml) : 0,
                                       &back));
        for (size_t i = 0; back && i < n; i++) {
            const mt_topo_pci *p = &back->pci[back->nics[i].pci];
            CHECK_MSG(p->link_gbps == rates[i].gbps && !*p->link_speed && p->link_width == -1,
                      "%.6f GB/s came back as %.6f '%s' x%d", (double)rates[i].gbps,
                      (double)p->link_gbps, p->link_speed, p->link_width);
        }
        CHECK(back && back->n_numa == 1 && back->numa[0].cpu.family == (amd ? -1 : 6) &&
              back->numa[0].cpu.model == -1);
        mt_topo_destroy(back);
        free(err);
        free(xml);
        mt_topo_destroy(t);
    }
}

static mt_status load_string(const char *xml, mt_topo **out) {
    return mt_topo_load_nccl_xml("test.xml", xml, strlen(xml), out);
}

static void test_mt_attributes(void) {
    static const char *const bad[] = {
        "<system version=\"1\" mt_packages=\"x\"/>",
        "<system version=\"1\" mt_packages=\"0:5-2\"/>",
        "<system version=\"1\" mt_cores=\"0:0*0\"/>",
        "<system version=\"1\" mt_cores=\"0:40000\"/>",
        "<system version=\"1\" mt_pus=\"-1\"/>",
        "<system version=\"1\"><cpu numaid=\"0\"><pci busid=\"0000:01:00.0\" class=\"0x030200\">"
        "<gpu dev=\"0\" mt_nvlink=\"maybe\"/></pci></cpu></system>",
        "<system version=\"1\"><cpu numaid=\"0\"><pci busid=\"0000:01:00.0\" class=\"0x030200\">"
        "<gpu dev=\"0\" mt_nvlink=\"unknown\"><nvlink target=\"0000:02:00.0\" count=\"1\" "
        "tclass=\"0x068000\"/></gpu></pci></cpu></system>",
        "<system version=\"1\"><cpu numaid=\"0\"><pci busid=\"0000:01:00.0\" class=\"0x030200\" "
        "mt_host_bridge=\"\"/></cpu></system>",
        "<system version=\"1\"><cpu numaid=\"0\"><pci busid=\"0000:01:00.0\" class=\"0x030200\" "
        "mt_link_gbps=\"fast\"/></cpu></system>",
        "<system version=\"1\"><cpu numaid=\"0\"><pci busid=\"0000:01:00.0\" class=\"0x030200\" "
        "mt_link_gbps=\"-2\"/></cpu></system>",
        "<system version=\"1\"><cpu numaid=\"0\"><pci busid=\"0000:01:00.0\" class=\"0x030200\" "
        "mt_link_gbps=\"nan\"/></cpu></system>",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        mt_topo *t = NULL;
        mt_status s = load_string(bad[i], &t);
        CHECK_MSG(s == MT_ERR_INVALID_ARG && t == NULL && strstr(mt_last_error(), "test.xml"),
                  "accepted or wrong error for %s: %s", bad[i], mt_last_error());
        mt_topo_destroy(t);
    }
    mt_topo *t = NULL;
    CHECK_OK(load_string("<system version=\"1\" mt_cores=\"0:0,4*2;1:2\" mt_pus=\"6\"><cpu "
                         "numaid=\"0\" affinity=\"33\"><pci busid=\"0000:01:00.0\" "
                         "class=\"0x030200\" mt_host_bridge=\"0000:00\"><gpu dev=\"0\" "
                         "mt_name=\"Tesla &amp; Co\" mt_nvlink=\"unknown\"/></pci></cpu></system>",
                         &t));
    if (t) {
        CHECK(t->n_cores == 3 && strcmp(t->cores[1].cpus, "1,5") == 0 && t->cores[2].id == 1);
        CHECK(t->n_pus == 6 && t->n_gpus == 1 && strcmp(t->gpus[0].name, "Tesla & Co") == 0);
        CHECK(!t->gpus[0].nvlink_known && t->nvlink_note && strstr(t->nvlink_note, "test.xml"));
        CHECK(t->gpus[0].pci >= 0 && t->pci[t->gpus[0].pci].parent >= 0 &&
              t->pci[t->pci[t->gpus[0].pci].parent].kind == MT_TOPO_PCI_HOST_BRIDGE);
    }
    mt_topo_destroy(t);
}

int main(void) {
    test_json_writer();
    test_round_trips();
    test_host_bridge_kept();
    test_cpu_and_links_exported();
    test_link_rates();
    test_mt_attributes();
    return check_report("test_topo_report");
}
