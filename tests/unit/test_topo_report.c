/* Reports and the NCCL export: the JSON writer's escaping and misuse errors; the export of every
 * fixture read back gives the same text and JSON report (apart from the source); the export keeps
 * to what NCCL's own XML parser reads; the mt_* attributes are checked when malformed. */
#include "check.h"
#include "topo_fixture.h"

#include "core/json_writer.h"
#include "topo/report.h"

#include <dirent.h>
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
    test_mt_attributes();
    return check_report("test_topo_report");
}
