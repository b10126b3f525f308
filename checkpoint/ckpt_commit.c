/* Committing a checkpoint, pruning old ones, and the offline writer (checkpoint/ckpt_commit.h). */
#include "checkpoint/ckpt_commit.h"

#include "checkpoint/ckpt_fs.h"
#include "checkpoint/ckpt_meta.h"
#include "checkpoint/ckpt_save.h"
#include "core/error.h"

#include <meshtrain/checkpoint.h>
#include <meshtrain/version.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* step-NNNNNNNN exactly: its step, else -1. */
static long step_of(const char *name) {
    long step;
    int used = 0;
    if (strncmp(name, "step-", 5) != 0 || strlen(name) != 13) return -1;
    if (sscanf(name + 5, "%8ld%n", &step, &used) != 1 || used != 8) return -1;
    for (int i = 5; i < 13; i++)
        if (name[i] < '0' || name[i] > '9') return -1;
    return step;
}

static int cmp_long_desc(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Removes leftovers of interrupted saves (step-*.tmp, *.replaced) and, with keep > 0, all but
 * the newest keep - 1 checkpoints besides the one just committed. */
mt_status mt_ckpt_prune(const char *dir, int keep, long current) {
    DIR *d = opendir(dir);
    if (!d) return mt_error_errno(MT_ERR_IO, errno, "checkpoint: cannot list '%s'", dir);
    long *steps = NULL;
    size_t n = 0, cap = 0;
    mt_status st = MT_OK;
    struct dirent *e;
    while (st == MT_OK && (e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        char path[PATH_MAX];
        bool leftover = strncmp(e->d_name, "step-", 5) == 0 &&
                        ((len > 4 && strcmp(e->d_name + len - 4, ".tmp") == 0) ||
                         (len > 9 && strcmp(e->d_name + len - 9, ".replaced") == 0));
        if (leftover) {
            st = mt_ckpt_join(path, sizeof path, dir, e->d_name);
            if (st == MT_OK) st = mt_ckpt_remove_tree(path);
            continue;
        }
        long step = step_of(e->d_name);
        if (step < 0 || step == current) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            long *grown = realloc(steps, cap * sizeof *steps);
            if (!grown) {
                st = mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
                break;
            }
            steps = grown;
        }
        steps[n++] = step;
    }
    closedir(d);
    if (st == MT_OK && keep > 0 && n > 0) {
        qsort(steps, n, sizeof *steps, cmp_long_desc);
        for (size_t i = (size_t)keep - 1; i < n && st == MT_OK; i++) {
            char name[32], path[PATH_MAX];
            snprintf(name, sizeof name, "step-%08ld", steps[i]);
            st = mt_ckpt_join(path, sizeof path, dir, name);
            if (st == MT_OK) st = mt_ckpt_remove_tree(path);
        }
    }
    free(steps);
    if (st == MT_OK) st = mt_ckpt_fsync_path(dir);
    return st;
}

/* tmp -> final. A step saved again (a run resumed from an older checkpoint) replaces the old
 * folder, which is moved aside first: a rename cannot replace a non-empty folder. */
static mt_status publish_folder(const char *dir, const char *tmp, const char *final) {
    if (mt_ckpt_is_dir(final)) {
        char aside[PATH_MAX];
        if (snprintf(aside, sizeof aside, "%s.replaced", final) >= (int)sizeof aside)
            return mt_error(MT_ERR_INVALID_ARG, "checkpoint: path too long");
        MT_TRY(mt_ckpt_remove_tree(aside));
        if (rename(final, aside) != 0)
            return mt_error_errno(MT_ERR_IO, errno, "checkpoint: cannot move '%s' aside", final);
    }
    if (rename(tmp, final) != 0)
        return mt_error_errno(MT_ERR_IO, errno, "checkpoint: cannot rename '%s' to '%s'", tmp,
                              final);
    return mt_ckpt_fsync_path(dir);
}

mt_status mt_ckpt_commit(const char *dir, const char *name, json_t *meta, long step, int rank) {
    char final[PATH_MAX], tmp[PATH_MAX], path[PATH_MAX];
    MT_TRY(mt_ckpt_join(final, sizeof final, dir, name));
    if (snprintf(tmp, sizeof tmp, "%s.tmp", final) >= (int)sizeof tmp)
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint: folder name too long");
    MT_TRY(mt_ckpt_join(path, sizeof path, tmp, MT_CKPT_META_FILE));
    char *text = json_dumps(meta, JSON_INDENT(1) | JSON_SORT_KEYS);
    if (!text) return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: cannot format metadata");
    mt_status st = mt_ckpt_write_data_file(path, text, strlen(text), NULL, NULL);
    free(text);
    MT_TRY(st);
    MT_TRY(mt_ckpt_fsync_path(tmp));
    mt_ckpt_crash_point("before-rename", rank, step);
    MT_TRY(publish_folder(dir, tmp, final));
    mt_ckpt_crash_point("before-latest", rank, step);
    char line[80];
    int n = snprintf(line, sizeof line, "%s\n", name);
    return mt_ckpt_replace_file(dir, MT_CKPT_LATEST_FILE, line, (size_t)n);
}

json_t *mt_ckpt_meta_frame(long step, int world, json_t *mesh) {
    time_t now = time(NULL);
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    return json_pack("{s:s,s:i,s:s,s:s,s:I,s:i,s:o,s:{},s:{},s:{}}", "format",
                     MT_CKPT_FORMAT_NAME, "version", MT_CHECKPOINT_FORMAT_VERSION,
                     "meshtrain_version", mt_version(), "created", when, "step", (json_int_t)step,
                     "world_size", world, "mesh", mesh, "files", "tensors", "extras");
}

json_t *mt_ckpt_tensor_entry(int ndim, const int64_t *shape, int tp_dim) {
    json_t *dims = json_array();
    for (int d = 0; d < ndim; d++) json_array_append_new(dims, json_integer(shape[d]));
    json_t *tp = tp_dim >= 0 ? json_pack("{s:s,s:i}", "placement", "shard", "dim", tp_dim)
                             : json_pack("{s:s}", "placement", "replicate");
    return json_pack("{s:s,s:o,s:o,s:[]}", "dtype", "f32", "shape", dims, "tp", tp, "chunks");
}

/* ---- the offline writer ---------------------------------------------------------------------- */

static json_t *chunk_json(const char *file, uint64_t offset, uint64_t bytes, const void *data) {
    char hex[17];
    mt_ckpt_hash_hex(mt_ckpt_hash(data, bytes), hex);
    return json_pack("{s:s,s:I,s:I,s:s}", "file", file, "offset", (json_int_t)offset, "bytes",
                     (json_int_t)bytes, "xxh3", hex);
}

mt_status mt_ckpt_write_whole(const char *dir, long step, const mt_ckpt_whole_tensor *tensors,
                              size_t n, const mt_ckpt_whole_extra *extras, size_t n_extras) {
    static const char file[] = "rank-00000.bin";
    char name[32], tmp[PATH_MAX], path[PATH_MAX];
    snprintf(name, sizeof name, "step-%08ld", step);
    MT_TRY(mt_ckpt_mkdirs(dir));
    MT_TRY(mt_ckpt_join(tmp, sizeof tmp, dir, name));
    if (strlen(tmp) + 4 >= sizeof tmp)
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint: folder name too long");
    strcat(tmp, ".tmp");
    MT_TRY(mt_ckpt_remove_tree(tmp));
    MT_TRY(mt_ckpt_mkdirs(tmp));
    MT_TRY(mt_ckpt_join(path, sizeof path, tmp, file));
    json_t *meta = mt_ckpt_meta_frame(step, 1, json_pack("{s:i}", "world", 1));
    if (!meta) return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: cannot build metadata");
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    mt_status st = fd >= 0 ? MT_OK
                           : mt_error_errno(MT_ERR_IO, errno, "checkpoint: cannot create '%s'",
                                            path);
    uint64_t at = 0;
    for (size_t i = 0; i < n && st == MT_OK; i++) {
        const mt_ckpt_whole_tensor *t = &tensors[i];
        uint64_t numel = 1;
        json_t *zeros = json_array();
        for (int d = 0; d < t->ndim; d++) {
            numel *= (uint64_t)t->shape[d];
            json_array_append_new(zeros, json_integer(0));
        }
        uint64_t bytes = numel * sizeof(float);
        json_t *entry = mt_ckpt_tensor_entry(t->ndim, t->shape, t->tp_dim);
        json_t *chunk = chunk_json(file, at, bytes, t->data); /* the whole tensor */
        json_object_set_new(chunk, "offsets", zeros);
        json_object_set(chunk, "extents", json_object_get(entry, "shape"));
        json_array_append_new(json_object_get(entry, "chunks"), chunk);
        json_object_set_new(json_object_get(meta, "tensors"), t->name, entry);
        st = mt_ckpt_write_all(fd, t->data, bytes, path);
        at += bytes;
    }
    for (size_t i = 0; i < n_extras && st == MT_OK; i++) {
        const mt_ckpt_whole_extra *e = &extras[i];
        json_t *chunk = chunk_json(file, at, e->bytes, e->data);
        json_object_set_new(chunk, "rank", json_integer(0));
        json_object_set_new(json_object_get(meta, "extras"), e->name,
                            json_pack("{s:I,s:b,s:[o]}", "bytes", (json_int_t)e->bytes,
                                      "per_rank", 0, "chunks", chunk));
        st = mt_ckpt_write_all(fd, e->data, e->bytes, path);
        at += e->bytes;
    }
    if (st == MT_OK && fsync(fd) != 0)
        st = mt_error_errno(MT_ERR_IO, errno, "checkpoint: fsync of '%s'", path);
    if (fd >= 0) close(fd);
    if (st == MT_OK) {
        json_object_set_new(json_object_get(meta, "files"), file,
                            json_pack("{s:I}", "bytes", (json_int_t)at));
        st = mt_ckpt_commit(dir, name, meta, step, 0);
    }
    json_decref(meta);
    if (st == MT_OK) st = mt_ckpt_prune(dir, 0, step);
    return st;
}
