/* mt-ckpt: inspect, verify and convert meshtrain checkpoints (docs/checkpoint.md).
 *
 *   mt-ckpt info CKPT            the metadata as a table
 *   mt-ckpt verify CKPT          every chunk read back against its checksum
 *   mt-ckpt export CKPT DIR      model.safetensors + config.json (Hugging Face GPT-2)
 *   mt-ckpt import FILE DIR      a model-only checkpoint from a GPT-2 safetensors file
 *
 * CKPT is a step-N folder or a checkpoint directory (its `latest` is used). */
#include "tools/mt-ckpt/mt_ckpt.h"

#include "core/clock.h"

#include <meshtrain/memory.h>
#include <meshtrain/status.h>

#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: mt-ckpt COMMAND ...\n"
    "  info CKPT              print the checkpoint's metadata as a table\n"
    "  verify CKPT            read every chunk and extra back and check its checksum\n"
    "  export CKPT DIR        write DIR/model.safetensors and DIR/config.json in Hugging Face\n"
    "                         GPT-2 naming (GPT2LMHeadModel.from_pretrained(DIR) loads it)\n"
    "  import FILE DIR [--heads N] [--step S]\n"
    "                         write a model-only checkpoint of a GPT-2 safetensors FILE into DIR\n"
    "                         (config.json beside FILE gives the heads; else --heads)\n"
    "CKPT is a step-N folder or a checkpoint directory (the checkpoint its 'latest' names).\n"
    "Exit status: 0 ok, 1 a bad checkpoint or a failed operation, 2 bad usage.\n";

void mt_ckpt_tool_error(void) { fprintf(stderr, "mt-ckpt: %s\n", mt_last_error()); }

int mt_ckpt_tool_open(const char *path, mt_ckpt_meta *meta) {
    char dir[PATH_MAX];
    bool found = false;
    if (mt_ckpt_resolve(path, dir, sizeof dir, &found) != MT_OK) {
        mt_ckpt_tool_error();
        return MT_CKPT_EXIT_FAIL;
    }
    if (!found) {
        fprintf(stderr, "mt-ckpt: '%s' holds no checkpoint (no metadata.json, no latest)\n",
                path);
        return MT_CKPT_EXIT_FAIL;
    }
    if (mt_ckpt_meta_read(dir, meta) != MT_OK) {
        mt_ckpt_tool_error();
        return MT_CKPT_EXIT_FAIL;
    }
    return MT_CKPT_EXIT_OK;
}

static int cmd_info(const char *path) {
    mt_ckpt_meta m;
    int rc = mt_ckpt_tool_open(path, &m);
    if (rc) return rc;
    uint64_t total = 0;
    for (size_t i = 0; i < m.n_files; i++) total += m.files[i].bytes;
    char bytes[32];
    printf("checkpoint %s\n", m.dir);
    printf("  format version %d, written by meshtrain %s\n", m.version, m.meshtrain_version);
    printf("  step %ld, saved by %d rank(s) on mesh %s\n", m.step, m.world_size, m.mesh);
    if (m.has_optimizer)
        printf("  optimizer: AdamW at step %ld, lr %g, betas (%g, %g), eps %g, weight decay %g\n",
               m.optim_step, (double)m.optim.lr, (double)m.optim.beta1, (double)m.optim.beta2,
               (double)m.optim.eps, (double)m.optim.weight_decay);
    else
        printf("  optimizer: none (a model-only checkpoint)\n");
    printf("  %zu data file(s), %s\n", m.n_files, mt_format_bytes(total, bytes, sizeof bytes));
    size_t width = strlen("tensor");
    for (size_t i = 0; i < m.n_tensors; i++)
        if (strlen(m.tensors[i].name) > width) width = strlen(m.tensors[i].name);
    printf("\n  %-*s  %-20s  %-9s  %6s  %10s\n", (int)width, "tensor", "shape", "tp", "chunks",
           "bytes");
    for (size_t i = 0; i < m.n_tensors; i++) {
        const mt_ckpt_tensor_meta *t = &m.tensors[i];
        char shape[96], tp[16];
        mt_ckpt_dims_text(t->shape, t->ndim, shape, sizeof shape);
        if (t->tp_dim >= 0) snprintf(tp, sizeof tp, "shard(%d)", t->tp_dim);
        else snprintf(tp, sizeof tp, "replicate");
        printf("  %-*s  %-20s  %-9s  %6zu  %10s\n", (int)width, t->name, shape, tp, t->n_chunks,
               mt_format_bytes(t->numel * sizeof(float), bytes, sizeof bytes));
    }
    if (m.n_extras) {
        printf("\n  %-*s  %-20s  %s\n", (int)width, "extra", "bytes", "saved");
        for (size_t i = 0; i < m.n_extras; i++)
            printf("  %-*s  %-20" PRIu64 "  %s\n", (int)width, m.extras[i].name,
                   m.extras[i].bytes, m.extras[i].per_rank ? "per rank" : "once (rank 0)");
    }
    mt_ckpt_meta_free(&m);
    return MT_CKPT_EXIT_OK;
}

/* Reads every chunk of every tensor and extra back; reports every failure, not only the
 * first. */
static int cmd_verify(const char *path) {
    mt_ckpt_meta m;
    int rc = mt_ckpt_tool_open(path, &m);
    if (rc) return rc;
    mt_ckpt_reader *r = NULL;
    if (mt_ckpt_reader_open(&m, &r) != MT_OK) {
        mt_ckpt_tool_error();
        mt_ckpt_meta_free(&m);
        return MT_CKPT_EXIT_FAIL;
    }
    double t0 = mt_clock_now_s();
    uint64_t chunks = 0, bytes = 0, bad = 0;
    void *buf = NULL;
    size_t cap = 0;
    for (size_t i = 0; i < m.n_tensors + m.n_extras; i++) {
        bool is_extra = i >= m.n_tensors;
        const mt_ckpt_chunk *list = is_extra ? m.extras[i - m.n_tensors].chunks : m.tensors[i].chunks;
        size_t n = is_extra ? m.extras[i - m.n_tensors].n_chunks : m.tensors[i].n_chunks;
        char what[1100];
        snprintf(what, sizeof what, "%s '%s'", is_extra ? "extra" : "tensor",
                 is_extra ? m.extras[i - m.n_tensors].name : m.tensors[i].name);
        for (size_t c = 0; c < n; c++) {
            if (list[c].bytes > cap) {
                free(buf);
                cap = list[c].bytes;
                buf = malloc(cap);
                if (!buf) {
                    fprintf(stderr, "mt-ckpt: no memory for a chunk of %" PRIu64 " bytes\n",
                            list[c].bytes);
                    mt_ckpt_reader_close(r);
                    mt_ckpt_meta_free(&m);
                    return MT_CKPT_EXIT_FAIL;
                }
            }
            chunks++;
            if (mt_ckpt_read_chunk(r, &list[c], what, buf) != MT_OK) {
                mt_ckpt_tool_error();
                bad++;
            } else {
                bytes += list[c].bytes;
            }
        }
    }
    double s = mt_clock_now_s() - t0;
    free(buf);
    mt_ckpt_reader_close(r);
    char text[32];
    if (bad)
        printf("%s: FAILED: %" PRIu64 " of %" PRIu64 " chunks bad\n", m.dir, bad, chunks);
    else
        printf("%s: OK: %" PRIu64 " chunks, %s in %zu file(s) verified in %.3f s (%.2f GB/s)\n",
               m.dir, chunks, mt_format_bytes(bytes, text, sizeof text), m.n_files, s,
               s > 0 ? (double)bytes / s / 1e9 : 0.0);
    mt_ckpt_meta_free(&m);
    return bad ? MT_CKPT_EXIT_FAIL : MT_CKPT_EXIT_OK;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? MT_CKPT_EXIT_USAGE : MT_CKPT_EXIT_OK;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "info") && argc == 3) return cmd_info(argv[2]);
    if (!strcmp(cmd, "verify") && argc == 3) return cmd_verify(argv[2]);
    if (!strcmp(cmd, "export")) return mt_ckpt_cmd_export(argc - 2, argv + 2);
    if (!strcmp(cmd, "import")) return mt_ckpt_cmd_import(argc - 2, argv + 2);
    fprintf(stderr, "mt-ckpt: unknown command or wrong arguments: '%s'\n%s", cmd, usage);
    return MT_CKPT_EXIT_USAGE;
}
