/* Asynchronous, crash-safe save (include/meshtrain/checkpoint.h).
 *
 * On the calling thread: wait for the previous save, copy this rank's chunks (the boxes of its
 * shards that it is responsible for: see ckpt_plan.h) and extras into one staging buffer laid out
 * exactly as its data file will be, and start the writer thread. That copy is the training
 * stall. The writer thread checksums and writes the file into step-N.tmp/ block by block
 * (straight from the staging buffer, with O_DIRECT where the filesystem takes it: ckpt_fs.h),
 * fsyncs it and publishes its chunk list in the rendezvous store; rank 0's writer then merges
 * every rank's list into metadata.json, fsyncs it and the folder, renames step-N.tmp to step-N,
 * replaces `latest` and publishes the verdict, which every rank's writer waits for; it then
 * removes old checkpoints (nobody waits for that). The threads use the store only with short
 * requests (polling), never a blocking wait, so that the training thread's store use is not
 * held up. */


#include "checkpoint/ckpt_save.h"

#include "checkpoint/ckpt_commit.h"
#include "checkpoint/ckpt_fs.h"
#include "checkpoint/ckpt_meta.h"
#include "checkpoint/ckpt_plan.h"
#include "checkpoint/ckpt_stage.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/thread_name.h"
#include "mesh/abort_key.h"
#include "store/store_internal.h"

#include <meshtrain/checkpoint.h>
#include <meshtrain/comm.h>
#include <meshtrain/log.h>
#include <meshtrain/memory.h>
#include <meshtrain/mesh.h>
#include <meshtrain/runtime.h>
#include <meshtrain/store.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char saver_owner = 0; /* our hook registration on the root */

typedef struct saver {
    mt_module *root;
    mt_runtime *rt;
    mt_store *store;
    int rank, world;
    long seq; /* saves started on this root: names the store keys */
    pthread_t thread;
    bool thread_live;

    /* The save in flight (read by the thread). */
    long step;
    int keep;
    char dir[PATH_MAX], name[64], tmp[PATH_MAX], file[64];
    mt_ckpt_stage stage; /* this rank's data file, in host memory */
    json_t *meta; /* rank 0: metadata.json without chunks, files and extras */
    double started_s;

    /* The outcome, set by the thread. */
    mt_status result;
    char *message;
    mt_checkpoint_stats stats;
} saver;

/* ---- test hook ----------------------------------------------------------------------------- */

/* Whether the test hook in variable var names point, rank and step. */
static bool hook_matches(const char *var, const char *point, int rank, long step) {
    const char *spec = getenv(var);
    if (!spec || !*spec) return false;
    char p[64];
    int r = -1;
    long s = -1;
    if (sscanf(spec, "%63[^:]:%d:%ld", p, &r, &s) != 3) return false;
    return strcmp(p, point) == 0 && r == rank && s == step;
}

const char *mt_ckpt_without_rank(const char *msg, int rank) {
    char prefix[32];
    int n = snprintf(prefix, sizeof prefix, "rank %d: ", rank);
    return strncmp(msg, prefix, (size_t)n) == 0 ? msg + n : msg;
}

mt_status mt_ckpt_agree(mt_runtime *rt, mt_status mine, const char *what, long seq) {
    int world = mt_runtime_world_size(rt), rank = mt_runtime_rank(rt);
    float v = (float)mine, *all = malloc((size_t)world * sizeof *all);
    if (!all) return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
    char saved[2048];
    snprintf(saved, sizeof saved, "%s", mine != MT_OK ? mt_last_error() : "");
    mt_status st = mt_all_gather(mt_runtime_world(rt), &v, all, 1, MT_F32, NULL);
    int first = -1;
    mt_status first_st = MT_OK;
    for (int r = 0; st == MT_OK && r < world && first < 0; r++)
        if (all[r] != 0.0f) {
            first = r;
            first_st = (mt_status)(int)all[r];
        }
    free(all);
    if (st != MT_OK) return mt_error_wrap(st, "checkpoint %s: agreeing on the outcome", what);
    if (first < 0) return MT_OK;
    char key[128];
    snprintf(key, sizeof key, "mt/ckpt-agree/%s/%ld/error", what, seq);
    mt_store *store = mt_runtime_store(rt);
    if (rank == first) {
        mt_store_set(store, key, saved, strlen(saved));
        return mt_error_restore(mine, saved);
    }
    void *msg = NULL;
    size_t len = 0;
    st = mt_store_get(store, key, mt_runtime_timeout(rt), &msg, &len);
    if (st != MT_OK)
        return mt_error(first_st, "checkpoint %s failed on rank %d (its message could not be "
                        "read)", what, first);
    st = mt_error(first_st, "checkpoint %s failed on rank %d: %s", what, first,
                  mt_ckpt_without_rank(msg, first));
    free(msg);
    return st;
}

bool mt_ckpt_fail_point(const char *point, int rank, long step) {
    return hook_matches("MT_TEST_CKPT_FAIL", point, rank, step);
}

void mt_ckpt_crash_point(const char *point, int rank, long step) {
    if (!hook_matches("MT_TEST_CKPT_CRASH", point, rank, step)) return;
    fprintf(stderr, "rank %d: MT_TEST_CKPT_CRASH: killed at %s of step %ld\n", rank, point, step);
    fflush(stderr);
    raise(SIGKILL);
}

/* ---- the store: short requests only -------------------------------------------------------- */

/* Waits until key exists (polling), or until the job is aborted or the deadline passes. The
 * interval doubles from 2 ms up to a ceiling that grows with the job: 4 ms for a few ranks, whose
 * waits (for rank 0's verdict, for the last rank's file) are then late by at most that much
 * after a write of a fraction of a second, and 64 ms from 128 ranks on, where the store serves
 * every rank's polls: about 2 x world / ceiling requests a second. */
static mt_status poll_key(saver *s, const char *key, double deadline, const char *what,
                          char **value) {
    double delay = 0.002, ceiling = 0.0005 * s->world;
    ceiling = ceiling < 0.004 ? 0.004 : ceiling > 0.064 ? 0.064 : ceiling;
    for (;;) {
        void *v = NULL;
        size_t len = 0;
        bool found = false;
        MT_TRY(mt_store_try_get(s->store, key, &v, &len, &found));
        if (found) {
            *value = v;
            return MT_OK;
        }
        MT_TRY(mt_store_try_get(s->store, MT_JOB_ABORT_KEY, &v, &len, &found));
        if (found) {
            mt_status ast;
            const char *msg = mt_store_abort_parse(v, &ast);
            mt_status st = mt_error(ast, "checkpoint %s: the job was aborted while waiting for "
                                    "%s: %s", s->name, what, msg);
            free(v);
            return st;
        }
        if (mt_clock_now_s() >= deadline)
            return mt_error(MT_ERR_TIMEOUT, "checkpoint %s: timed out waiting for %s", s->name,
                            what);
        struct timespec ts = {0, (long)(delay * 1e9)};
        nanosleep(&ts, NULL);
        delay = 2 * delay < ceiling ? 2 * delay : ceiling;
    }
}

static void key_of(const saver *s, char *buf, size_t cap, const char *what, int rank) {
    if (rank >= 0)
        snprintf(buf, cap, "mt/ckpt/%s/%ld/%s/%d", mt_module_name(s->root), s->seq, what, rank);
    else
        snprintf(buf, cap, "mt/ckpt/%s/%ld/%s", mt_module_name(s->root), s->seq, what);
}

/* ---- writing this rank's file --------------------------------------------------------------- */

/* This rank's record for rank 0: its file and the pieces in it, with checksums. */
static json_t *rank_record(saver *s, mt_status st, const uint64_t *hashes) {
    json_t *rec = json_object();
    if (!rec) return NULL;
    if (st != MT_OK) {
        json_object_set_new(rec, "error", json_string(mt_last_error()));
        return rec;
    }
    json_object_set_new(rec, "file", s->stage.len ? json_string(s->file) : json_null());
    json_object_set_new(rec, "bytes", json_integer((json_int_t)s->stage.len));
    json_t *chunks = json_array(), *extras = json_array();
    for (size_t i = 0; i < s->stage.n_pieces; i++) {
        const mt_ckpt_piece *p = &s->stage.pieces[i];
        char hex[17];
        mt_ckpt_hash_hex(hashes[i], hex);
        json_t *o = json_object();
        json_object_set_new(o, p->is_extra ? "name" : "tensor", json_string(p->name));
        json_object_set_new(o, "offset", json_integer((json_int_t)p->offset));
        json_object_set_new(o, "bytes", json_integer((json_int_t)p->bytes));
        if (p->is_extra) {
            json_object_set_new(o, "per_rank", json_boolean(p->per_rank));
        } else {
            json_t *off = json_array(), *ext = json_array();
            for (int d = 0; d < p->ndim; d++) {
                json_array_append_new(off, json_integer(p->offsets[d]));
                json_array_append_new(ext, json_integer(p->extents[d]));
            }
            json_object_set_new(o, "offsets", off);
            json_object_set_new(o, "extents", ext);
        }
        json_object_set_new(o, "xxh3", json_string(hex));
        json_array_append_new(p->is_extra ? extras : chunks, o);
    }
    json_object_set_new(rec, "chunks", chunks);
    json_object_set_new(rec, "extras", extras);
    return rec;
}

/* The checksums of the pieces, computed block by block as mt_ckpt_write_data_file reaches them:
 * each block is checksummed just before it is written, while it is in the cache, rather than
 * the whole buffer first. Pieces are contiguous and in file order; one may span several
 * blocks. */
typedef struct piece_hashing {
    saver *s;
    uint64_t *hashes;
    size_t next; /* the piece being checksummed */
    mt_ckpt_hasher *h;
} piece_hashing;

static void hash_block(void *arg, size_t off, size_t len) {
    piece_hashing *c = arg;
    const char *base = c->s->stage.buf;
    size_t end = off + len;
    while (c->next < c->s->stage.n_pieces) {
        const mt_ckpt_piece *p = &c->s->stage.pieces[c->next];
        uint64_t from = p->offset > off ? p->offset : off;
        uint64_t pend = p->offset + p->bytes, to = pend < end ? pend : end;
        if (to > from) mt_ckpt_hasher_update(c->h, base + from, (size_t)(to - from));
        if (pend > end) return; /* continues in the next block */
        c->hashes[c->next++] = mt_ckpt_hasher_digest(c->h);
        mt_ckpt_hasher_reset(c->h);
    }
}

static mt_status write_rank_file(saver *s, uint64_t *hashes) {
    if (s->stage.len == 0) { /* nothing of ours to write (an HSDP replica) */
        for (size_t i = 0; i < s->stage.n_pieces; i++) hashes[i] = mt_ckpt_hash(s->stage.buf, 0);
        return MT_OK;
    }
    if (mt_ckpt_fail_point("write", s->rank, s->step))
        return mt_error(MT_ERR_IO, "checkpoint: cannot write '%s/%s': injected by "
                        "MT_TEST_CKPT_FAIL", s->tmp, s->file);
    piece_hashing hc = {s, hashes, 0, mt_ckpt_hasher_create()};
    if (!hc.h) return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of memory");
    char path[PATH_MAX];
    mt_status st = mt_ckpt_join(path, sizeof path, s->tmp, s->file);
    if (st == MT_OK)
        st = mt_ckpt_write_data_file(path, s->stage.buf, s->stage.len, hash_block, &hc);
    if (st == MT_OK && hc.next != s->stage.n_pieces)
        st = mt_error(MT_ERR_INTERNAL, "checkpoint: %zu of %zu pieces checksummed", hc.next,
                      s->stage.n_pieces);
    mt_ckpt_hasher_free(hc.h);
    return st;
}

/* ---- rank 0: metadata, rename, latest, keep ------------------------------------------------ */

static mt_status merge_record(saver *s, json_t *meta, int rank, json_t *rec) {
    const char *err = json_string_value(json_object_get(rec, "error"));
    if (err) return mt_error(MT_ERR_IO, "checkpoint %s: rank %d could not write its part: %s",
                             s->name, rank, mt_ckpt_without_rank(err, rank));
    const char *file = json_string_value(json_object_get(rec, "file"));
    if (!file) return MT_OK;
    json_object_set_new(json_object_get(meta, "files"), file,
                        json_pack("{s:O}", "bytes", json_object_get(rec, "bytes")));
    json_t *tensors = json_object_get(meta, "tensors"), *extras = json_object_get(meta, "extras");
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(rec, "chunks"), i, c) {
        const char *name = json_string_value(json_object_get(c, "tensor"));
        json_t *t = json_object_get(tensors, name ? name : "");
        if (!t)
            return mt_error(MT_ERR_MISMATCH, "checkpoint %s: rank %d saved tensor '%s', which "
                            "rank 0's model does not have (different models on the ranks?)",
                            s->name, rank, name ? name : "?");
        json_t *chunk = json_deep_copy(c);
        json_object_del(chunk, "tensor");
        json_object_set_new(chunk, "file", json_string(file));
        json_array_append_new(json_object_get(t, "chunks"), chunk);
    }
    json_array_foreach(json_object_get(rec, "extras"), i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *e = json_object_get(extras, name);
        if (!e) {
            e = json_pack("{s:O,s:O,s:[]}", "bytes", json_object_get(c, "bytes"), "per_rank",
                          json_object_get(c, "per_rank"), "chunks");
            json_object_set_new(extras, name, e);
        }
        json_t *chunk = json_pack("{s:i,s:s,s:O,s:O,s:O}", "rank", rank, "file", file, "offset",
                                  json_object_get(c, "offset"), "bytes",
                                  json_object_get(c, "bytes"), "xxh3", json_object_get(c, "xxh3"));
        json_array_append_new(json_object_get(e, "chunks"), chunk);
    }
    return MT_OK;
}

static mt_status commit(saver *s, double deadline) {
    json_t *meta = s->meta;
    for (int r = 0; r < s->world; r++) {
        char key[256], what[64];
        key_of(s, key, sizeof key, "rank", r);
        snprintf(what, sizeof what, "rank %d's data file", r);
        char *value = NULL;
        MT_TRY(poll_key(s, key, deadline, what, &value));
        json_error_t jerr;
        json_t *rec = json_loads(value, 0, &jerr);
        free(value);
        mt_store_delete(s->store, key, NULL);
        if (!rec)
            return mt_error(MT_ERR_PROTOCOL, "checkpoint %s: rank %d's record is not JSON: %s",
                            s->name, r, jerr.text);
        mt_status st = merge_record(s, meta, r, rec);
        json_decref(rec);
        MT_TRY(st);
    }
    mt_ckpt_crash_point("before-metadata", s->rank, s->step);
    return mt_ckpt_commit(s->dir, s->name, meta, s->step, s->rank);
}

/* ---- the writer thread ---------------------------------------------------------------------- */

static mt_status prepare_folder(saver *s) {
    /* A folder of this name left by an interrupted save is stale. */
    MT_TRY(mt_ckpt_mkdirs(s->dir));
    MT_TRY(mt_ckpt_remove_tree(s->tmp));
    MT_TRY(mt_ckpt_mkdirs(s->tmp));
    return mt_ckpt_fsync_path(s->dir);
}

/* Rank 0 publishes a verdict for every save it starts, so that no rank waits for one that
 * never comes. */
static void publish(saver *s, const char *what, mt_status st) {
    char key[256];
    key_of(s, key, sizeof key, what, -1);
    const char *v = st == MT_OK ? "ok" : mt_last_error();
    mt_store_set(s->store, key, v, strlen(v));
}

/* Waits for rank 0's verdict on what: MT_OK for "ok", else its message. */
static mt_status await(saver *s, const char *what, double deadline, const char *desc) {
    char key[256];
    char *value = NULL;
    key_of(s, key, sizeof key, what, -1);
    MT_TRY(poll_key(s, key, deadline, desc, &value));
    mt_status st = strcmp(value, "ok") == 0
                       ? MT_OK
                       : mt_error(MT_ERR_IO, "checkpoint %s failed on rank 0: %s", s->name,
                                  mt_ckpt_without_rank(value, 0));
    free(value);
    return st;
}

static mt_status run_save(saver *s) {
    double timeout = mt_runtime_timeout(s->rt);
    if (s->rank == 0) {
        mt_status st = prepare_folder(s);
        publish(s, "ready", st);
        if (st != MT_OK) {
            publish(s, "commit", st);
            return st;
        }
    } else {
        MT_TRY(await(s, "ready", mt_clock_now_s() + timeout, "rank 0 to create the folder"));
    }
    uint64_t *hashes = calloc(s->stage.n_pieces + 1, sizeof *hashes);
    mt_status wst = hashes ? MT_OK : mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of memory");
    double t0 = mt_clock_now_s();
    if (wst == MT_OK) wst = write_rank_file(s, hashes);
    s->stats.write_s = mt_clock_now_s() - t0;
    if (wst == MT_OK) mt_ckpt_crash_point("after-file", s->rank, s->step);
    json_t *rec = rank_record(s, wst, hashes);
    free(hashes);
    char *text = rec ? json_dumps(rec, JSON_COMPACT) : NULL;
    json_decref(rec);
    char key[256];
    key_of(s, key, sizeof key, "rank", s->rank);
    mt_status st = text ? mt_store_set(s->store, key, text, strlen(text))
                        : mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: cannot format the record");
    free(text);
    if (wst != MT_OK) st = wst;
    /* The others write about as much as this rank: their files may take as long again. */
    double deadline = mt_clock_now_s() + timeout + 2.0 * s->stats.write_s;
    if (s->rank == 0) {
        if (st == MT_OK) st = commit(s, deadline);
        publish(s, "commit", st);
        s->stats.commit_s = mt_clock_now_s() - s->started_s;
        /* Committed: removing old checkpoints is housekeeping that nobody waits for, and a
         * failure there leaves a valid checkpoint that the next save's prune retries. */
        if (st == MT_OK && mt_ckpt_prune(s->dir, s->keep, s->step) != MT_OK)
            mt_log(MT_LOG_WARN, "checkpoint %s is committed, but cleaning up '%s' failed (the "
                   "next save tries again): %s", s->name, s->dir, mt_last_error());
        return st;
    }
    MT_TRY(st);
    st = await(s, "commit", deadline, "rank 0 to commit");
    s->stats.commit_s = mt_clock_now_s() - s->started_s;
    return st;
}

/* This rank could not stage its part: its record says why; rank 0 also ends the save for the
 * others (they wait for its folder and its verdict), and the failure is recorded as the
 * program's, which a later successful step clears. */
static void publish_local_failure(saver *s, mt_status st) {
    char key[256];
    char *msg = strdup(mt_last_error());
    json_t *rec = json_pack("{s:s}", "error", msg ? msg : "out of memory");
    char *text = rec ? json_dumps(rec, JSON_COMPACT) : NULL;
    key_of(s, key, sizeof key, "rank", s->rank);
    if (text) mt_store_set(s->store, key, text, strlen(text));
    if (s->rank == 0) {
        publish(s, "ready", st);
        publish(s, "commit", st);
    }
    free(text);
    json_decref(rec);
    mt_error_restore(st, msg ? msg : "checkpoint: out of memory");
    /* The other ranks go on training until their next save: if this program gives up now, its
     * mt_finalize must not wait for them but abort the job (as after a failed forward). */
    mt_failure_note(st, mt_last_error());
    free(msg);
}

static void *writer_main(void *arg) {
    mt_name_this_thread("mt-ckpt-write");
    saver *s = arg;
    mt_status st = run_save(s);
    s->result = st;
    if (s->stats.commit_s == 0.0) s->stats.commit_s = mt_clock_now_s() - s->started_s; /* failed */
    if (st != MT_OK) {
        s->message = strdup(mt_last_error());
        mt_log(MT_LOG_ERROR, "checkpoint %s failed: %s", s->name, mt_last_error());
    } else if (s->rank == 0) {
        char bytes[32];
        mt_log(MT_LOG_INFO, "checkpoint %s committed in %s: rank 0 wrote %s in %.3f s (stall "
               "%.3f s, %.2f s after the save began)", s->name, s->dir,
               mt_format_bytes(s->stage.len, bytes, sizeof bytes), s->stats.write_s,
               s->stats.stall_s, s->stats.commit_s);
    }
    return NULL;
}

/* ---- the saver on the root ------------------------------------------------------------------ */

/* Frees what one save held besides the staging buffer (kept for the next save). */
static void release_job(saver *s) {
    json_decref(s->meta);
    s->meta = NULL;
    mt_ckpt_stage_clear(&s->stage);
}

/* The outcome of the save that ran, as the caller's error. */
static mt_status take_result(saver *s) {
    if (s->result == MT_OK) return MT_OK;
    mt_status st = mt_error_restore(s->result, s->message ? s->message : "checkpoint failed");
    free(s->message);
    s->message = NULL;
    s->result = MT_OK;
    return st;
}

static mt_status join_writer(saver *s) {
    if (!s->thread_live) return MT_OK;
    pthread_join(s->thread, NULL);
    s->thread_live = false;
    release_job(s);
    return take_result(s);
}

static void saver_release(mt_module *module, void *user) {
    (void)module;
    saver *s = user;
    if (join_writer(s) != MT_OK)
        mt_log(MT_LOG_ERROR, "checkpoint: the last save of '%s' failed: %s",
               mt_module_name(s->root), mt_last_error());
    mt_ckpt_stage_free(&s->stage);
    free(s);
}

static saver *saver_of(mt_module *root) { return mt_module_hooks_user(root, &saver_owner); }

static mt_status saver_get(mt_module *root, saver **out) {
    saver *s = saver_of(root);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s) return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
        s->root = root;
        s->rt = mt_mesh_runtime(mt_module_mesh(root));
        s->store = mt_runtime_store(s->rt);
        s->rank = mt_runtime_rank(s->rt);
        s->world = mt_runtime_world_size(s->rt);
        static const mt_module_hooks hooks = {.release = saver_release};
        mt_status st = mt_module_add_hooks(root, &saver_owner, &hooks, s);
        if (st != MT_OK) {
            free(s);
            return st;
        }
    }
    *out = s;
    return MT_OK;
}

mt_status mt_ckpt_save_wait(mt_module *root) {
    saver *s = root ? saver_of(root) : NULL;
    return s ? join_writer(s) : MT_OK;
}

mt_status mt_checkpoint_wait(mt_module *root) {
    if (!root) return mt_error(MT_ERR_INVALID_ARG, "mt_checkpoint_wait: root must not be NULL");
    return mt_ckpt_save_wait(root);
}

mt_status mt_checkpoint_stats_get(mt_module *root, mt_checkpoint_stats *out) {
    if (!root || !out)
        return mt_error(MT_ERR_INVALID_ARG, "mt_checkpoint_stats_get: NULL argument");
    saver *s = saver_of(root);
    if (!s) return mt_error(MT_ERR_NOT_FOUND, "checkpoint: module '%s' has not been saved",
                            mt_module_name(root));
    MT_TRY(join_writer(s));
    *out = s->stats;
    return MT_OK;
}

/* metadata.json of this save but for its chunks, files and extras: rank 0 adds every rank's. */
static json_t *base_metadata(saver *s, const mt_ckpt_plan *plan, mt_adamw *opt) {
    mt_mesh *mesh = mt_module_mesh(s->root);
    json_t *dims = json_object();
    for (int d = 0; d < mt_mesh_ndim(mesh); d++)
        json_object_set_new(dims, mt_mesh_dim_name(mesh, d),
                            json_integer(mt_mesh_dim_size(mesh, d)));
    json_t *meta = mt_ckpt_meta_frame(s->step, s->world, dims);
    json_t *tensors = json_object_get(meta, "tensors");
    for (size_t i = 0; meta && i < plan->n_params; i++) {
        const mt_ckpt_param_layout *l = &plan->params[i].layout;
        for (int k = 0; k < (plan->has_optimizer ? MT_CKPT_KINDS : 1); k++) {
            char name[1024];
            mt_ckpt_tensor_name(plan, i, (mt_ckpt_kind)k, name, sizeof name);
            json_object_set_new(tensors, name,
                                mt_ckpt_tensor_entry(l->ndim, plan->params[i].shape, l->tp_dim));
        }
    }
    if (meta && opt) {
        mt_adamw_options o = mt_adamw_get_options(opt);
        json_object_set_new(meta, "optimizer",
                            json_pack("{s:s,s:I,s:f,s:f,s:f,s:f,s:f}", "type", "adamw", "step",
                                      (json_int_t)mt_adamw_steps(opt), "lr", (double)o.lr,
                                      "beta1", (double)o.beta1, "beta2", (double)o.beta2, "eps",
                                      (double)o.eps, "weight_decay", (double)o.weight_decay));
    }
    return meta;
}

static mt_status prepare(saver *s, const mt_ckpt_plan *plan, mt_adamw *opt, const char *dir,
                         const mt_checkpoint_options *o) {
    s->step = o->step >= 0 ? o->step : opt ? mt_adamw_steps(opt) : 0;
    if (s->step > 99999999)
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint: step %ld has more than 8 digits",
                        s->step);
    s->keep = o->keep;
    snprintf(s->name, sizeof s->name, "step-%08ld", s->step);
    snprintf(s->file, sizeof s->file, "rank-%05d.bin", s->rank);
    if (snprintf(s->dir, sizeof s->dir, "%s", dir) >= (int)sizeof s->dir)
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint: folder name too long");
    char final[PATH_MAX];
    MT_TRY(mt_ckpt_join(final, sizeof final, dir, s->name));
    if (snprintf(s->tmp, sizeof s->tmp, "%s.tmp", final) >= (int)sizeof s->tmp)
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint: folder name too long");
    if (mt_ckpt_fail_point("stage", s->rank, s->step))
        return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: cannot stage step %ld: injected by "
                        "MT_TEST_CKPT_FAIL", s->step);
    MT_TRY(mt_ckpt_stage_fill(&s->stage, plan, s->rank, o->extras, o->n_extras));
    if (s->rank == 0) {
        s->meta = base_metadata(s, plan, opt);
        if (!s->meta) return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: cannot build metadata");
    }
    return MT_OK;
}

mt_checkpoint_options mt_checkpoint_defaults(void) {
    return (mt_checkpoint_options){.step = -1, .keep = 0, .sync = false};
}

mt_status mt_checkpoint_save(mt_module *root, mt_adamw *opt, const char *dir,
                             const mt_checkpoint_options *options) {
    if (!root || !dir || !*dir)
        return mt_error(MT_ERR_INVALID_ARG, "mt_checkpoint_save: root and dir must be given");
    mt_checkpoint_options o = options ? *options : mt_checkpoint_defaults();
    if (o.keep < 0) return mt_error(MT_ERR_INVALID_ARG, "checkpoint: keep %d < 0", o.keep);
    MT_TRY(mt_ckpt_check_extras(o.extras, o.n_extras));
    double t0 = mt_clock_now_s();
    mt_ckpt_plan plan;
    MT_TRY(mt_ckpt_plan_build(root, opt, &plan));
    saver *s = NULL;
    /* A deferred parameter never initialised would be saved as zeros, as if they were its
     * values. Initialisation is per rank (it has no collectives), so one rank may refuse while
     * the others would go on into the save and wait for it: all agree first, and every rank
     * returns the refusal. */
    static long checks; /* saves in this process: collective, so the same count on every rank */
    mt_status st = mt_fsdp_check_initialised(root, "saving a checkpoint");
    st = mt_ckpt_agree(mt_mesh_runtime(mt_module_mesh(root)), st, "save", ++checks);
    if (st == MT_OK) st = saver_get(root, &s);
    if (st == MT_OK) st = join_writer(s); /* the previous save's outcome, the same everywhere */
    if (st != MT_OK) {
        mt_ckpt_plan_free(&plan);
        return st;
    }
    /* From here a failure may be this rank's alone (host memory, a device copy): the others'
     * writers are told through the store, so that they fail with its message instead of
     * waiting, and the next save's keys stay in step. */
    s->seq++;
    s->started_s = t0;
    st = prepare(s, &plan, opt, dir, &o);
    mt_ckpt_plan_free(&plan);
    if (st != MT_OK) {
        publish_local_failure(s, st);
        release_job(s);
        return st;
    }
    memset(&s->stats, 0, sizeof s->stats);
    s->stats.bytes = s->stage.len;
    s->stats.step = s->step;
    s->stats.stall_s = mt_clock_now_s() - t0;
    int rc = pthread_create(&s->thread, NULL, writer_main, s);
    if (rc != 0) {
        /* Without a thread, write here: slower for the caller, but nothing is lost. */
        mt_log(MT_LOG_WARN, "checkpoint: no writer thread (%s); writing synchronously",
               strerror(rc));
        writer_main(s);
        release_job(s);
        return take_result(s);
    }
    s->thread_live = true;
    return o.sync ? join_writer(s) : MT_OK;
}
