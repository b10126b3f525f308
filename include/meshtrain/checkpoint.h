/* Distributed checkpoints: sharded, crash-safe, asynchronous save and load with resharding of an
 * FSDP model (FSDP + TP over a mesh), its AdamW state and named extra state of the program.
 *
 *   mt_checkpoint_extra ex[] = {{"step", &step, sizeof step}, {"lr_sched", &sched, sizeof sched}};
 *   mt_checkpoint_options o = mt_checkpoint_defaults();
 *   o.extras = ex; o.n_extras = 2; o.keep = 3;
 *   mt_checkpoint_save(root, opt, "ckpt", &o);        // returns once the shards are on the host
 *   ...
 *   mt_checkpoint_load(root, opt, "ckpt", ex, 2, &info);  // "ckpt/latest" or one step-N folder
 *
 * Both are collective over every rank of the root's mesh. A checkpoint is a folder
 * step-NNNNNNNN/ below the directory given to save, holding one data file per rank that saved
 * something (rank-NNNNN.bin) and metadata.json, written last: every tensor's global shape, dtype
 * and TP placement, and every chunk (a box of a global tensor: offsets and extents per dimension)
 * with its file, byte offset and XXH3-64 checksum. Chunks are in global coordinates, so a load
 * maps them onto any dp x tp (and HSDP) whose parameters have the same global shapes.
 * docs/checkpoint.md describes the format, the guarantees and the tools (mt-ckpt).
 *
 * Crash safety: a save writes into step-N.tmp/, fsyncs every file and the folder, renames it to
 * step-N/, then replaces the file `latest` (written beside, fsynced, renamed). A crash at any
 * instant leaves the previous checkpoint complete and named by `latest`.
 *
 * Tensors saved: "model/<path>" (the f32 master values; a bf16 param_dtype's copies are derived
 * from them on load), "optim/exp_avg/<path>" and "optim/exp_avg_sq/<path>" (AdamW's m and v)
 * where <path> is the parameter's module path below the root and its name, e.g.
 * "block0.attn.qkv.weight". TP-replicated values are written by tp rank 0 only and HSDP
 * replicas by replicate rank 0 only.
 */
#ifndef MESHTRAIN_CHECKPOINT_H
#define MESHTRAIN_CHECKPOINT_H

#include <meshtrain/api.h>
#include <meshtrain/module.h>
#include <meshtrain/optim.h>
#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The metadata format this build writes; a load refuses a newer one. */
#define MT_CHECKPOINT_FORMAT_VERSION 1

/* Named state of the program saved beside the model: the step, the data position, RNG state, a
 * learning-rate schedule, the model's configuration. Save copies `bytes` bytes from data when it
 * is called; load writes them back into data (the saved size must equal bytes). */
typedef struct mt_checkpoint_extra {
    const char *name; /* unique; letters, digits, '_', '-' and '.' */
    void *data;
    size_t bytes;
    bool per_rank; /* false: rank 0's value is saved and every rank loads it; true: each rank's
                      own (a load then needs the same world size) */
} mt_checkpoint_extra;

typedef struct mt_checkpoint_options {
    long step;  /* names the folder step-%08ld; -1 (default): the optimizer's steps, else 0 */
    int keep;   /* after committing, remove all but the newest `keep` checkpoints (0: keep all);
                   a failure to remove is logged and retried by the next save, not returned */
    bool sync;  /* true: return once the checkpoint is committed (default false: asynchronous) */
    const mt_checkpoint_extra *extras;
    int n_extras;
} mt_checkpoint_options;

MT_API mt_checkpoint_options mt_checkpoint_defaults(void);

/* Saves root's model (every FSDP unit at or below root), opt's state (may be NULL: a model-only
 * checkpoint) and the extras into dir/step-N/ (dir is created when missing). Waits for root's
 * previous save first and returns its failure, if it failed. The shards are copied to host
 * memory before this returns (that copy is the training stall); a background thread writes and
 * checksums them, and the checkpoint is committed when every rank has written its file. */
MT_API mt_status mt_checkpoint_save(mt_module *root, mt_adamw *opt, const char *dir,
                                    const mt_checkpoint_options *options);

/* Waits until root's save in flight (if any) is committed or failed, and returns its outcome.
 * Call it before mt_finalize; mt_module_destroy on root also waits. */
MT_API mt_status mt_checkpoint_wait(mt_module *root);

/* Figures of root's last save on this rank (waits for it first; returns its failure). */
typedef struct mt_checkpoint_stats {
    long step;
    unsigned long long bytes; /* this rank's data file */
    double stall_s;  /* inside mt_checkpoint_save: planning and the copy to host memory */
    double write_s;  /* the writer thread: checksums, write and fsync of the data file */
    double commit_s; /* from the call to the checkpoint being committed (or failing) */
} mt_checkpoint_stats;

MT_API mt_status mt_checkpoint_stats_get(mt_module *root, mt_checkpoint_stats *out);

/* What a load found. */
typedef struct mt_checkpoint_info {
    long step;          /* the step the checkpoint was saved at */
    bool has_optimizer; /* false: a model-only checkpoint; the optimizer was left as it was */
    char path[4096];    /* the step-N folder loaded */
} mt_checkpoint_info;

/* Loads path (a step-N folder, or a directory given to save: then the checkpoint its `latest`
 * names) into root's shards, opt's state (may be NULL) and the extras (may be NULL with
 * n_extras 0; every extra given must be in the checkpoint), resharding to the live dp x tp.
 * Everything is read and verified (shapes, dtypes, checksums, file sizes, the format version,
 * missing and extra tensors) before anything is written: on failure every rank returns the same
 * error naming the file and the tensor, and the model, optimizer and extras are untouched. info
 * may be NULL. */
MT_API mt_status mt_checkpoint_load(mt_module *root, mt_adamw *opt, const char *path,
                                    const mt_checkpoint_extra *extras, int n_extras,
                                    mt_checkpoint_info *info);

/* The checkpoint path refers to, without loading it: path itself when it holds metadata.json,
 * else the folder named by path/latest. *found false (MT_OK) when path holds neither (a run
 * resumed with "auto" that starts fresh); an error when `latest` names a missing folder. */
MT_API mt_status mt_checkpoint_resolve(const char *path, char *out, size_t cap, bool *found);

/* Reads one non-per-rank extra of a checkpoint without a model (e.g. the model configuration a
 * program needs before it builds the model): *data is malloc'd (caller frees), checksum
 * verified. MT_ERR_NOT_FOUND when the checkpoint has no such extra. */
MT_API mt_status mt_checkpoint_read_extra(const char *path, const char *name, void **data,
                                          size_t *bytes);

#ifdef __cplusplus
}
#endif
#endif
