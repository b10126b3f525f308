/* mt-bench-checkpoint: what a checkpoint costs training, and how close its disk traffic comes to
 * dd's on the same folder.
 *
 *   mtrun --standalone --nproc_per_node N mt-bench-checkpoint --dir D [--layers 8]
 *         [--d-model 512] [--heads 8] [--seq 64] [--batch 2] [--tp 1] [--saves 5] [--keep 1]
 *         [--no-drop-caches] [--keep-files] [--verbose] [--json]
 *
 * The model is train_gpt's GPT (include/meshtrain/gpt.h), each block and then the root sharded
 * with FSDP over dp = world / tp, trained with AdamW: a checkpoint holds 12 bytes per parameter
 * (master, m, v). The defaults (8 layers of d_model 512: 25.4M parameters) give about 305 MB.
 * Everything happens in a fresh folder below D (D/mt-bench-ckpt.XXXXXX, removed at the end unless
 * --keep-files). After one warm-up step and one warm-up save (which allocates the staging
 * buffer), each of --saves rounds measures, every rank at once:
 *
 *   step          a training step (forward, backward, clip, AdamW, zero_grad; device idle)
 *   step + save   a training step followed by mt_checkpoint_save
 *   stall         the save call alone, and the stall_s of mt_checkpoint_stats_get; reference: a
 *                 plain device-to-host copy of the rank's checkpoint bytes into a staging buffer
 *                 like the save's (pinned on a GPU). Goal: stall <= host copy. The warm-up
 *                 save's stall (which pays for the staging buffer's first touch) is shown too.
 *   write         all ranks' bytes / the slowest rank's time from the save call to the commit
 *                 (and / the slowest write_s: the data files alone); the bench waits for the
 *                 commit, so no training competes with the writer here. Reference: rank 0 runs
 *                 `dd if=/dev/zero of=<folder>/dd.bin bs=64M count=<the same bytes>
 *                 iflag=count_bytes conv=fsync`. Goal: >= 80% of dd.
 *   read          mt_checkpoint_load of that checkpoint (every rank, the slowest), after the page
 *                 cache was emptied (echo 3 > /proc/sys/vm/drop_caches when permitted, else
 *                 posix_fadvise(DONTNEED) on each file); reference: dd of each rank file to
 *                 /dev/null, bs=64M iflag=direct, one after the other, after the same eviction.
 *
 * dd runs after the library's write and read in even rounds and before them in odd ones (what
 * ran just before changes a disk's speed). Once at the end, a step is timed that starts right
 * after a save, while the writer threads run ("step during write").
 * Times are the slowest rank's, medians over the rounds. Rank 0 prints the folder's filesystem
 * (statfs type and the `df` line), then one row per measurement with its ratio to the reference;
 * with --json one object per line instead, and nothing else on stdout.
 */
#include "core/clock.h"
#include "core/error.h"
#include "core/staging.h" /* the reference copy's host buffer is the save's kind of buffer */

#include <meshtrain/meshtrain.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROG "mt-bench-checkpoint"
#define WORK_KEY "mt-bench-checkpoint/folder"
#define MAX_SAVES 64 /* rounds kept for the medians */

typedef struct options {
    const char *dir;
    int layers, d_model, heads, seq, batch, tp, saves, keep;
    bool json, keep_files, drop_caches, verbose;
} options;

/* What one rank measured in one round (seconds, and its checkpoint bytes). */
enum {
    F_STEP, F_STEP_SAVE, F_STALL_CALL, F_STALL_STATS, F_COPY, F_WRITE, F_COMMIT, F_LOAD,
    F_BYTES, F_FIELDS
};

typedef struct bench {
    const options *o;
    mt_runtime *rt;
    mt_group *world;
    mt_device *dev;
    int rank, nranks;
    mt_mesh *mesh;
    mt_gpt *gpt;
    mt_adamw *adam;
    int *tokens;
    char work[PATH_MAX]; /* the bench's folder below --dir */
    /* The reference copy: a device buffer of the rank's checkpoint size, and a staging buffer. */
    void *copy_src, *copy_dst;
    size_t copy_bytes;
    /* Rank 0: per round, every rank's figures (slowest / summed) and dd's times. */
    double (*rounds)[F_FIELDS];
    double *dd_write_s, *dd_read_s;
    double step_during_write_s;
    double first_stall_s; /* the warm-up save's, slowest rank: it allocates the staging buffer */
    char evict_how[64], dd_read_how[64];
} bench;

static const char usage[] =
    "usage: mtrun [mtrun options] " PROG " --dir D [options]\n"
    "  --dir D            folder to measure (the bench works in D/mt-bench-ckpt.XXXXXX)\n"
    "  --layers N         GPT blocks (8)\n"
    "  --d-model N        channels (512)\n"
    "  --heads N          attention heads, divisible by tp (8)\n"
    "  --seq N            tokens per sequence (64)\n"
    "  --batch N          sequences per dp rank per step (2)\n"
    "  --tp N             tensor-parallel size; dp = world / tp (1)\n"
    "  --saves N          measured save rounds, at most 64 (5)\n"
    "  --keep K           checkpoints kept by each save, as mt_checkpoint_options.keep (1)\n"
    "  --no-drop-caches   empty the page cache per file (posix_fadvise) even when root\n"
    "  --keep-files       leave the bench's folder (its last checkpoint) in D\n"
    "  --verbose          also print every round's figures (comment lines)\n"
    "  --json             one JSON object per measurement on stdout, nothing else\n";

/* ---- options ------------------------------------------------------------------------------- */

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.layers = 8, .d_model = 512, .heads = 8, .seq = 64, .batch = 2, .tp = 1,
                   .saves = 5, .keep = 1, .drop_caches = true};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 1;
        }
        bool *flag = !strcmp(a, "--json")             ? &o->json
                     : !strcmp(a, "--keep-files")     ? &o->keep_files
                     : !strcmp(a, "--verbose")        ? &o->verbose
                     : !strcmp(a, "--no-drop-caches") ? &o->drop_caches
                                                      : NULL;
        if (flag) {
            *flag = flag != &o->drop_caches;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, PROG ": %s needs a value\n", a);
            return -1;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--dir")) {
            o->dir = v;
            continue;
        }
        static const struct { const char *name; size_t at; int min; } ints[] = {
            {"--layers", offsetof(options, layers), 1},
            {"--d-model", offsetof(options, d_model), 1},
            {"--heads", offsetof(options, heads), 1},
            {"--seq", offsetof(options, seq), 1},
            {"--batch", offsetof(options, batch), 1},
            {"--tp", offsetof(options, tp), 1},
            {"--saves", offsetof(options, saves), 1},
            {"--keep", offsetof(options, keep), 0}};
        size_t k = 0, n = sizeof ints / sizeof *ints;
        while (k < n && strcmp(a, ints[k].name) != 0) k++;
        if (k == n) {
            fprintf(stderr, PROG ": unknown option %s\n", a);
            return -1;
        }
        char *end;
        errno = 0;
        long x = strtol(v, &end, 10);
        long max = !strcmp(a, "--saves") ? MAX_SAVES : 1000000;
        if (errno || end == v || *end || x < ints[k].min || x > max) {
            fprintf(stderr, PROG ": %s %s: expected an integer from %d to %ld\n", a, v,
                    ints[k].min, max);
            return -1;
        }
        *(int *)((char *)o + ints[k].at) = (int)x;
    }
    if (!o->dir || !*o->dir) {
        fprintf(stderr, PROG ": --dir is required (the folder whose disk is measured)\n");
        return -1;
    }
    return 0;
}

/* ---- small helpers ------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n) {
    double s[MAX_SAVES];
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* 'text' for a POSIX shell, quotes inside escaped as '\''. */
static mt_status shell_quote(const char *s, char *out, size_t cap) {
    size_t n = 0;
    out[n++] = '\'';
    for (; *s; s++) {
        const char *piece = *s == '\'' ? "'\\''" : (char[2]){*s, 0};
        size_t len = strlen(piece);
        if (n + len + 2 > cap) return mt_error(MT_ERR_INVALID_ARG, PROG ": path too long");
        memcpy(out + n, piece, len);
        n += len;
    }
    out[n++] = '\'';
    out[n] = '\0';
    return MT_OK;
}

/* Runs cmd through the shell, stderr with stdout; *seconds is its wall time. The last line of
 * its output goes to last (for messages). Returns the exit status (-1: could not run). */
static int run_command(const char *cmd, double *seconds, char *last, size_t cap) {
    char full[8192];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    double t0 = mt_clock_now_s();
    FILE *p = popen(full, "r");
    if (!p) return -1;
    char line[1024];
    if (last && cap) last[0] = '\0';
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = '\0';
        if (last && *line) snprintf(last, cap, "%s", line);
    }
    int rc = pclose(p);
    *seconds = mt_clock_now_s() - t0;
    return rc == -1 ? -1 : WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

/* The names of the filesystems a checkpoint folder is likely to be on (statfs f_type). */
static const char *fs_name(long type) {
    static const struct { unsigned long magic; const char *name; } known[] = {
        {0xEF53, "ext2/3/4"},   {0x58465342, "xfs"},    {0x9123683E, "btrfs"},
        {0x01021994, "tmpfs"},  {0x794C7630, "overlayfs"}, {0x6969, "nfs"},
        {0x2FC12FC1, "zfs"},    {0x65735546, "fuse"},   {0x0BD00BD0, "lustre"},
        {0x01021997, "9p"},     {0x00C36400, "ceph"},   {0x47504653, "gpfs"},
        {0xFF534D42, "cifs"},   {0x5346544E, "ntfs"},   {0x6A656A63, "fakeowner"}};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if ((unsigned long)type == known[i].magic) return known[i].name;
    return "unknown";
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    return (flag == FTW_DP ? rmdir(path) : unlink(path)) != 0 && errno != ENOENT ? -1 : 0;
}

/* ---- the page cache ------------------------------------------------------------------------ */

/* Empties the page cache of the files in folder, so that the next read comes from the disk:
 * the whole cache when permitted (root), else each file's pages (clean after the save's fsync,
 * so the kernel drops them). Says which in how. */
static mt_status evict(bench *b, const char *folder, char *how, size_t cap) {
    sync();
    if (b->o->drop_caches) {
        FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
        if (f) {
            bool ok = fputs("3\n", f) >= 0;
            ok = fclose(f) == 0 && ok;
            if (ok) {
                snprintf(how, cap, "drop_caches");
                return MT_OK;
            }
        }
    }
    DIR *d = opendir(folder);
    if (!d) return mt_error_errno(MT_ERR_IO, errno, PROG ": cannot list '%s'", folder);
    struct dirent *e;
    mt_status st = MT_OK;
    while (st == MT_OK && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", folder, e->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue; /* a folder or a file removed meanwhile */
        int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
        if (rc != 0) st = mt_error_errno(MT_ERR_IO, rc, PROG ": posix_fadvise of '%s'", path);
    }
    closedir(d);
    snprintf(how, cap, "posix_fadvise DONTNEED");
    return st;
}

/* ---- training -------------------------------------------------------------------------------- */

static mt_status build(bench *b) {
    const options *o = b->o;
    if (b->nranks % o->tp != 0)
        return mt_error(MT_ERR_INVALID_ARG, PROG ": --tp %d does not divide the %d ranks", o->tp,
                        b->nranks);
    int dp = b->nranks / o->tp;
    MT_TRY(mt_mesh_create(b->rt, 2, (int[]){dp, o->tp}, (const char *[]){"dp", "tp"}, &b->mesh));
    mt_gpt_config cfg = {.layers = o->layers, .d_model = o->d_model, .heads = o->heads,
                         .seq = o->seq, .vocab = 256, .seed = 1};
    MT_TRY(mt_gpt_create(b->mesh, &cfg, &b->gpt));
    mt_fsdp_options fo = mt_fsdp_defaults(b->mesh, "dp");
    for (int l = 0; l < o->layers; l++) MT_TRY(mt_fsdp_shard(mt_gpt_block(b->gpt, l), &fo));
    MT_TRY(mt_fsdp_shard(mt_gpt_root(b->gpt), &fo));
    MT_TRY(mt_adamw_create(mt_gpt_root(b->gpt), &(mt_adamw_options){.lr = 1e-4f}, &b->adam));
    b->tokens = malloc((size_t)o->batch * (size_t)(o->seq + 1) * sizeof *b->tokens);
    if (!b->tokens) return mt_error(MT_ERR_OUT_OF_MEMORY, PROG ": no memory for the tokens");
    return MT_OK;
}

/* One training step on pseudo-random bytes; it ends when the device is idle. */
static mt_status train_step(bench *b) {
    const options *o = b->o;
    mt_module *root = mt_gpt_root(b->gpt);
    size_t n = (size_t)o->batch * (size_t)(o->seq + 1);
    for (size_t i = 0; i < n; i++)
        b->tokens[i] = (int)(((i * 2654435761u + (size_t)b->rank) >> 7) & 255);
    float loss;
    MT_TRY(mt_gpt_forward_backward(b->gpt, b->tokens, o->batch, 1.0f, &loss));
    MT_TRY(mt_clip_grad_norm(root, 1.0f, NULL));
    MT_TRY(mt_adamw_step(b->adam));
    MT_TRY(mt_zero_grad(root));
    return mt_device_synchronize(b->dev);
}

static mt_status save(bench *b) {
    mt_checkpoint_options co = mt_checkpoint_defaults();
    co.keep = b->o->keep;
    return mt_checkpoint_save(mt_gpt_root(b->gpt), b->adam, b->work, &co);
}

/* ---- the work folder ----------------------------------------------------------------------- */

/* Rank 0 creates D/mt-bench-ckpt.XXXXXX and tells the others its name through the store. */
static mt_status make_work_folder(bench *b) {
    mt_store *store = mt_runtime_store(b->rt);
    if (b->rank == 0) {
        if (mkdir(b->o->dir, 0755) != 0 && errno != EEXIST)
            return mt_error_errno(MT_ERR_IO, errno, PROG ": cannot create '%s'", b->o->dir);
        if (snprintf(b->work, sizeof b->work, "%s/mt-bench-ckpt.XXXXXX", b->o->dir) >=
            (int)sizeof b->work - 64)
            return mt_error(MT_ERR_INVALID_ARG, PROG ": --dir '%s' is too long", b->o->dir);
        if (!mkdtemp(b->work))
            return mt_error_errno(MT_ERR_IO, errno, PROG ": cannot create a folder in '%s'",
                                  b->o->dir);
        return mt_store_set(store, WORK_KEY, b->work, strlen(b->work) + 1);
    }
    void *v = NULL;
    size_t len = 0;
    MT_TRY(mt_store_get(store, WORK_KEY, -1.0, &v, &len));
    snprintf(b->work, sizeof b->work, "%s", (const char *)v);
    free(v);
    return MT_OK;
}

/* The data files of the checkpoint `latest` names, as one shell word each, into list. */
static mt_status rank_files(bench *b, char *list, size_t cap, char *folder, size_t fcap) {
    bool found = false;
    MT_TRY(mt_checkpoint_resolve(b->work, folder, fcap, &found));
    if (!found) return mt_error(MT_ERR_NOT_FOUND, PROG ": no checkpoint in '%s'", b->work);
    DIR *d = opendir(folder);
    if (!d) return mt_error_errno(MT_ERR_IO, errno, PROG ": cannot list '%s'", folder);
    size_t n = 0;
    list[0] = '\0';
    struct dirent *e;
    mt_status st = MT_OK;
    while (st == MT_OK && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "rank-", 5) != 0) continue;
        char path[PATH_MAX], quoted[2 * PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", folder, e->d_name);
        st = shell_quote(path, quoted, sizeof quoted);
        if (st == MT_OK && n + strlen(quoted) + 2 > cap)
            st = mt_error(MT_ERR_INVALID_ARG, PROG ": too many rank files for one command");
        if (st == MT_OK) n += (size_t)snprintf(list + n, cap - n, " %s", quoted);
    }
    closedir(d);
    return st;
}

/* ---- the references (rank 0) ----------------------------------------------------------------- */

static mt_status dd_write(bench *b, double bytes, double *seconds) {
    char path[PATH_MAX + 16], quoted[2 * PATH_MAX + 64], cmd[4 * PATH_MAX], last[1024];
    snprintf(path, sizeof path, "%s/dd.bin", b->work);
    MT_TRY(shell_quote(path, quoted, sizeof quoted));
    snprintf(cmd, sizeof cmd, "dd if=/dev/zero of=%s bs=64M count=%.0f iflag=count_bytes "
             "conv=fsync", quoted, bytes);
    int rc = run_command(cmd, seconds, last, sizeof last);
    unlink(path);
    if (rc != 0)
        return mt_error(MT_ERR_IO, PROG ": '%s' failed (exit %d): %s", cmd, rc, last);
    return MT_OK;
}

/* dd of every rank file to /dev/null after emptying the cache: O_DIRECT when the filesystem
 * takes it (tmpfs, for one, may not), else buffered. */
static mt_status dd_read(bench *b, double *seconds) {
    char files[16384], folder[PATH_MAX], cmd[20000], last[1024];
    MT_TRY(rank_files(b, files, sizeof files, folder, sizeof folder));
    for (int direct = 1; direct >= 0; direct--) {
        char how[64];
        MT_TRY(evict(b, folder, how, sizeof how));
        snprintf(cmd, sizeof cmd, "for f in%s; do dd if=\"$f\" of=/dev/null bs=64M%s || exit 1; "
                 "done", files, direct ? " iflag=direct" : "");
        int rc = run_command(cmd, seconds, last, sizeof last);
        if (rc == 0) {
            snprintf(b->dd_read_how, sizeof b->dd_read_how, "%s",
                     direct ? "iflag=direct" : "buffered (O_DIRECT refused)");
            return MT_OK;
        }
        if (!direct) return mt_error(MT_ERR_IO, PROG ": '%s' failed (exit %d): %s", cmd, rc, last);
    }
    return MT_OK;
}

/* ---- one round ------------------------------------------------------------------------------- */

/* Every rank's figures of one round to rank 0: the collectives carry f32 only, and an all-gather
 * copies bits, so each double travels as two f32 words. */
static mt_status gather(bench *b, const double *mine, double (*out)[F_FIELDS]) {
    double *all = malloc((size_t)b->nranks * F_FIELDS * sizeof *all);
    if (!all) return mt_error(MT_ERR_OUT_OF_MEMORY, PROG ": out of host memory");
    mt_status st = mt_all_gather(b->world, mine, all, F_FIELDS * 2, MT_F32, NULL);
    if (st == MT_OK && out) {
        for (int f = 0; f < F_FIELDS; f++) {
            double agg = 0.0;
            for (int r = 0; r < b->nranks; r++) {
                double v = all[(size_t)r * F_FIELDS + (size_t)f];
                agg = f == F_BYTES ? agg + v : (v > agg ? v : agg); /* bytes summed, times max */
            }
            (*out)[f] = agg;
        }
    }
    free(all);
    return st;
}

/* The reference write: dd of as many bytes as all ranks saved, from rank 0; the others wait in
 * the barrier (asleep: the progress thread polls only while work is queued). */
static mt_status reference_write(bench *b, double total, int round) {
    MT_TRY(mt_barrier(b->world, NULL));
    if (b->rank == 0) MT_TRY(dd_write(b, total, &b->dd_write_s[round]));
    return mt_barrier(b->world, NULL);
}

static mt_status reference_read(bench *b, int round) {
    MT_TRY(mt_barrier(b->world, NULL));
    if (b->rank == 0) MT_TRY(dd_read(b, &b->dd_read_s[round]));
    return mt_barrier(b->world, NULL);
}

/* One round. The disk's state depends on what came just before (a VM's host may still be
 * flushing the last file when the next one starts), so dd goes after the library's write and
 * read in even rounds and before them in odd rounds. */
static mt_status round_once(bench *b, int round, double total) {
    mt_module *root = mt_gpt_root(b->gpt);
    bool dd_first = round % 2 == 1;
    double f[F_FIELDS] = {0};
    if (dd_first) MT_TRY(reference_write(b, total, round));
    MT_TRY(mt_barrier(b->world, NULL));
    double t0 = mt_clock_now_s();
    MT_TRY(train_step(b));
    f[F_STEP] = mt_clock_now_s() - t0;

    MT_TRY(mt_barrier(b->world, NULL));
    t0 = mt_clock_now_s();
    MT_TRY(train_step(b));
    double t1 = mt_clock_now_s();
    MT_TRY(save(b));
    double t2 = mt_clock_now_s();
    f[F_STEP_SAVE] = t2 - t0;
    f[F_STALL_CALL] = t2 - t1;
    mt_checkpoint_stats cs;
    MT_TRY(mt_checkpoint_stats_get(root, &cs)); /* waits for the commit */
    f[F_STALL_STATS] = cs.stall_s;
    f[F_WRITE] = cs.write_s;
    f[F_COMMIT] = cs.commit_s;
    f[F_BYTES] = (double)cs.bytes;

    /* The reference copy, every rank at once as the save's copies are. */
    MT_TRY(mt_barrier(b->world, NULL));
    t0 = mt_clock_now_s();
    MT_TRY(mt_device_copy(b->dev, b->copy_dst, b->copy_src, b->copy_bytes,
                          MT_COPY_DEVICE_TO_HOST, NULL));
    MT_TRY(mt_device_synchronize(b->dev));
    f[F_COPY] = mt_clock_now_s() - t0;
    if (!dd_first) MT_TRY(reference_write(b, total, round));

    /* Read: the cache emptied by one rank per host, then every rank loads. */
    if (dd_first) MT_TRY(reference_read(b, round));
    char folder[PATH_MAX];
    bool found = false;
    MT_TRY(mt_checkpoint_resolve(b->work, folder, sizeof folder, &found));
    if (mt_runtime_local_rank(b->rt) == 0)
        MT_TRY(evict(b, folder, b->evict_how, sizeof b->evict_how));
    MT_TRY(mt_barrier(b->world, NULL));
    t0 = mt_clock_now_s();
    MT_TRY(mt_checkpoint_load(root, b->adam, b->work, NULL, 0, NULL));
    MT_TRY(mt_device_synchronize(b->dev));
    f[F_LOAD] = mt_clock_now_s() - t0;
    if (!dd_first) MT_TRY(reference_read(b, round));
    return gather(b, f, b->rank == 0 ? &b->rounds[round] : NULL);
}

/* A step started right after a save, while the writer threads checksum and write. */
static mt_status step_during_write(bench *b) {
    /* A step first: the load before left the optimizer at the step saved last, and a save of
     * the same step would replace that folder rather than write a new one. */
    MT_TRY(train_step(b));
    MT_TRY(mt_barrier(b->world, NULL));
    MT_TRY(save(b));
    double t0 = mt_clock_now_s();
    MT_TRY(train_step(b));
    double mine[F_FIELDS] = {0}, worst[F_FIELDS];
    mine[F_STEP] = mt_clock_now_s() - t0;
    MT_TRY(mt_checkpoint_wait(mt_gpt_root(b->gpt)));
    MT_TRY(gather(b, mine, &worst));
    b->step_during_write_s = worst[F_STEP];
    return MT_OK;
}

/* ---- the report (rank 0) --------------------------------------------------------------------- */

/* One JSON object on one line (jansson escapes the strings: paths, the df line). */
static void print_json(json_t *o) {
    char *text = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    if (text) printf("%s\n", text);
    free(text);
    json_decref(o);
}

typedef struct row {
    const char *key, *name;             /* in JSON, in the table */
    const char *ref_name, *goal;        /* goal: "<= 1.00", ">= 0.80" or NULL */
    double bytes, time_s, ref_s;        /* ref_s 0: no reference */
    bool ratio_of_rates;                /* ratio = ref time / time (a rate); else time / ref */
} row;

static void print_disk(bench *b) {
    struct statfs sf;
    char quoted[2 * PATH_MAX], cmd[4 * PATH_MAX], df[1024] = "?";
    double ignored;
    long type = statfs(b->work, &sf) == 0 ? (long)sf.f_type : -1;
    if (shell_quote(b->work, quoted, sizeof quoted) == MT_OK) {
        snprintf(cmd, sizeof cmd, "df -hT -- %s", quoted);
        if (run_command(cmd, &ignored, df, sizeof df) != 0) snprintf(df, sizeof df, "?");
    }
    if (b->o->json) {
        char hex[32];
        snprintf(hex, sizeof hex, "0x%lx", (unsigned long)type);
        print_json(json_pack("{s:s,s:i,s:s,s:s,s:s,s:s,s:s,s:s}", "measure", "disk", "ranks",
                             b->nranks, "dir", b->work, "statfs_type", hex, "fs", fs_name(type),
                             "df", df, "read_cache", b->evict_how, "dd_read", b->dd_read_how));
        return;
    }
    printf("# folder %s: %s (statfs type 0x%lx)\n# df: %s\n", b->work, fs_name(type),
           (unsigned long)type, df);
    printf("# read: page cache emptied by %s before each read; dd reads with %s\n", b->evict_how,
           b->dd_read_how);
}

static void print_rows(bench *b, const row *rows, int n) {
    const options *o = b->o;
    if (!o->json)
        printf("# %-20s %10s %10s %8s  %-10s %10s %8s %7s %8s\n", "measure", "MB", "time(ms)",
               "GB/s", "reference", "ref(ms)", "ref GB/s", "ratio", "goal");
    for (int i = 0; i < n; i++) {
        const row *r = &rows[i];
        double rate = r->bytes > 0 ? r->bytes / r->time_s / 1e9 : 0.0;
        double ref_rate = r->bytes > 0 && r->ref_s > 0 ? r->bytes / r->ref_s / 1e9 : 0.0;
        double ratio = r->ref_s <= 0 ? 0.0 : r->ratio_of_rates ? r->ref_s / r->time_s
                                                                : r->time_s / r->ref_s;
        bool met = !r->goal || (r->goal[0] == '<' ? ratio <= atof(r->goal + 3)
                                                   : ratio >= atof(r->goal + 3));
        if (o->json) {
            json_t *j = json_pack("{s:s,s:i,s:f}", "measure", r->key, "ranks", b->nranks,
                                  "time_s", r->time_s);
            if (j && r->bytes > 0)
                json_object_update_new(j, json_pack("{s:I,s:f}", "bytes", (json_int_t)r->bytes,
                                                    "gbs", rate));
            if (j && r->ref_s > 0)
                json_object_update_new(j, json_pack("{s:s,s:f,s:f}", "ref", r->ref_name,
                                                    "ref_time_s", r->ref_s, "ratio", ratio));
            if (j && r->ref_s > 0 && r->bytes > 0)
                json_object_set_new(j, "ref_gbs", json_real(ref_rate));
            if (j && r->goal)
                json_object_update_new(j, json_pack("{s:s,s:b}", "goal", r->goal, "met", met));
            print_json(j);
            continue;
        }
        char mb[16] = "-", gbs[16] = "-", ref_ms[16] = "-", ref_gbs[16] = "-", rt[16] = "-";
        if (r->bytes > 0) {
            snprintf(mb, sizeof mb, "%.1f", r->bytes / 1e6);
            snprintf(gbs, sizeof gbs, "%.3f", rate);
        }
        if (r->ref_s > 0) {
            snprintf(ref_ms, sizeof ref_ms, "%.1f", r->ref_s * 1e3);
            snprintf(rt, sizeof rt, "%.2f", ratio);
            if (r->bytes > 0) snprintf(ref_gbs, sizeof ref_gbs, "%.3f", ref_rate);
        }
        char goal[24] = "-";
        if (r->goal) snprintf(goal, sizeof goal, "%s %s", r->goal, met ? "ok" : "MISSED");
        printf("  %-20s %10s %10.1f %8s  %-10s %10s %8s %7s %s\n", r->name, mb, r->time_s * 1e3,
               gbs, r->ref_name ? r->ref_name : "-", ref_ms, ref_gbs, rt, goal);
    }
}

static void report(bench *b, size_t params) {
    const options *o = b->o;
    int n = o->saves;
    double med[F_FIELDS], v[MAX_SAVES];
    for (int f = 0; f < F_FIELDS; f++) {
        for (int r = 0; r < n; r++) v[r] = b->rounds[r][f];
        med[f] = median(v, n);
    }
    double dd_w = median(b->dd_write_s, n), dd_r = median(b->dd_read_s, n);
    double rank_bytes = med[F_BYTES] / b->nranks; /* the copy reference: one rank's share */
    if (!o->json)
        printf("# " PROG ": %d ranks (dp %d x tp %d), GPT %d layers, d_model %d, %d heads, seq "
               "%d: %zu parameters; checkpoint %.1f MB (model + AdamW m, v), %d saves "
               "(medians, slowest rank)\n", b->nranks, b->nranks / o->tp, o->tp, o->layers,
               o->d_model, o->heads, o->seq, params, med[F_BYTES] / 1e6, n);
    print_disk(b);
    static const char *names[F_FIELDS] = {"step", "step+save", "stall call", "stall stats",
                                          "host copy", "write_s", "commit_s", "load", "MB"};
    for (int r = 0; o->verbose && !o->json && r < n; r++) {
        printf("# round %d (ms):", r);
        for (int f = 0; f < F_FIELDS; f++)
            printf(" %s %.1f", names[f],
                   f == F_BYTES ? b->rounds[r][f] / 1e6 : b->rounds[r][f] * 1e3);
        printf(" dd write %.1f dd read %.1f\n", b->dd_write_s[r] * 1e3, b->dd_read_s[r] * 1e3);
    }
    row rows[] = {
        {"step", "step", NULL, NULL, 0, med[F_STEP], 0, false},
        {"step_save", "step+save", "step", NULL, 0, med[F_STEP_SAVE], med[F_STEP], false},
        {"step_during_write", "step during write", "step", NULL, 0, b->step_during_write_s,
         med[F_STEP], false},
        {"stall_call", "stall (save call)", "host copy", "<= 1.00", rank_bytes,
         med[F_STALL_CALL], med[F_COPY], false},
        {"stall_stats", "stall (stats)", "host copy", "<= 1.00", rank_bytes, med[F_STALL_STATS],
         med[F_COPY], false},
        {"stall_first", "stall (first save)", "host copy", NULL, rank_bytes, b->first_stall_s,
         med[F_COPY], false},
        {"write_files", "write (data files)", "dd write", NULL, med[F_BYTES], med[F_WRITE], dd_w,
         true},
        {"write_commit", "write (to commit)", "dd write", ">= 0.80", med[F_BYTES], med[F_COMMIT],
         dd_w, true},
        {"read_load", "read (load)", "dd read", NULL, med[F_BYTES], med[F_LOAD], dd_r, true},
    };
    print_rows(b, rows, (int)(sizeof rows / sizeof *rows));
    fflush(stdout);
}

/* ---- main ------------------------------------------------------------------------------------ */

static mt_status run(bench *b) {
    const options *o = b->o;
    MT_TRY(build(b));
    MT_TRY(make_work_folder(b));
    if (b->rank == 0) {
        b->rounds = calloc((size_t)o->saves, sizeof *b->rounds);
        b->dd_write_s = calloc((size_t)o->saves, sizeof *b->dd_write_s);
        b->dd_read_s = calloc((size_t)o->saves, sizeof *b->dd_read_s);
        if (!b->rounds || !b->dd_write_s || !b->dd_read_s)
            return mt_error(MT_ERR_OUT_OF_MEMORY, PROG ": out of host memory");
    }
    /* Warm-up: the first step records FSDP's prefetch order, the first save allocates its
     * staging buffer; neither is measured. */
    MT_TRY(train_step(b));
    MT_TRY(save(b));
    mt_checkpoint_stats cs;
    MT_TRY(mt_checkpoint_stats_get(mt_gpt_root(b->gpt), &cs));
    b->copy_bytes = cs.bytes ? cs.bytes : 1;
    MT_TRY(mt_device_alloc(b->dev, b->copy_bytes, MT_MEM_OTHER, &b->copy_src));
    MT_TRY(mt_device_memset(b->dev, b->copy_src, 1, b->copy_bytes, NULL));
    MT_TRY(mt_staging_alloc(b->dev, b->copy_bytes, &b->copy_dst));
    memset(b->copy_dst, 0, b->copy_bytes); /* its pages exist, as the save's reused ones do */
    /* dd writes as many bytes as all ranks save. */
    double mine[F_FIELDS] = {[F_BYTES] = (double)cs.bytes, [F_STALL_STATS] = cs.stall_s};
    double sum[F_FIELDS];
    MT_TRY(gather(b, mine, &sum));
    b->first_stall_s = sum[F_STALL_STATS];
    for (int r = 0; r < o->saves; r++) MT_TRY(round_once(b, r, sum[F_BYTES]));
    MT_TRY(step_during_write(b));
    if (b->rank == 0) report(b, mt_gpt_param_count(b->gpt));
    /* Every rank is done with the folder before rank 0 removes it. */
    MT_TRY(mt_barrier(b->world, NULL));
    if (b->rank == 0 && !o->keep_files && nftw(b->work, remove_entry, 16, FTW_DEPTH | FTW_PHYS))
        return mt_error_errno(MT_ERR_IO, errno, PROG ": cannot remove '%s'", b->work);
    return MT_OK;
}

static void cleanup(bench *b) {
    if (b->gpt) mt_checkpoint_wait(mt_gpt_root(b->gpt));
    if (b->copy_src) mt_device_free(b->dev, b->copy_src);
    if (b->copy_dst) mt_staging_free(b->dev, b->copy_dst);
    if (b->adam) mt_adamw_destroy(b->adam);
    if (b->gpt) mt_gpt_destroy(b->gpt);
    if (b->mesh) mt_mesh_destroy(b->mesh);
    free(b->tokens);
    free(b->rounds);
    free(b->dd_write_s);
    free(b->dd_read_s);
}

int main(int argc, char **argv) {
    options o;
    int prc = parse_args(argc, argv, &o);
    if (prc != 0) {
        if (prc < 0) fputs(usage, stderr);
        return prc < 0 ? 2 : 0;
    }
    bench b = {.o = &o};
    mt_status st = mt_init(&b.rt, &argc, &argv);
    if (st == MT_OK) {
        b.world = mt_runtime_world(b.rt);
        b.dev = mt_runtime_device(b.rt);
        b.rank = mt_runtime_rank(b.rt);
        b.nranks = mt_runtime_world_size(b.rt);
        snprintf(b.evict_how, sizeof b.evict_how, "-");
        snprintf(b.dd_read_how, sizeof b.dd_read_how, "-");
        st = run(&b);
    }
    if (st != MT_OK) {
        fprintf(stderr, PROG ": %s\n", mt_last_error());
        if (b.rank == 0 && b.work[0]) fprintf(stderr, PROG ": its files are left in %s\n", b.work);
    }
    cleanup(&b);
    if (b.rt) mt_finalize(b.rt);
    return st == MT_OK ? 0 : 1;
}
