/* Internal: the last steps of a save, shared by the distributed save (rank 0's writer) and the
 * offline writer (mt-ckpt import): metadata.json into dir/NAME.tmp/, fsync, rename to dir/NAME/,
 * replace dir/latest; and removing old checkpoints. */
#ifndef MT_CHECKPOINT_CKPT_COMMIT_H
#define MT_CHECKPOINT_CKPT_COMMIT_H

#include <meshtrain/status.h>

#include <jansson.h>

#include <stdint.h>

/* dir/name.tmp/ holds every data file (fsynced); writes meta as metadata.json there, fsyncs it
 * and the folder, renames the folder to dir/name (a folder of that name is moved aside first
 * and removed by the next prune), fsyncs dir and replaces dir/latest with name. step and rank
 * only select the test crash points (ckpt_save.h). */
mt_status mt_ckpt_commit(const char *dir, const char *name, json_t *meta, long step, int rank);

/* metadata.json's frame for step on a world of world ranks (mesh: dimension name -> size, taken
 * over): format, version, meshtrain version, creation time, and empty "files", "tensors" and
 * "extras" for the writers to fill. NULL when out of memory. */
json_t *mt_ckpt_meta_frame(long step, int world, json_t *mesh);

/* A tensor's entry of "tensors", f32 with an empty "chunks" array. */
json_t *mt_ckpt_tensor_entry(int ndim, const int64_t *shape, int tp_dim);

/* Removes leftovers of interrupted saves in dir (step-*.tmp, step-*.replaced) and, with
 * keep > 0, all checkpoints but the newest keep - 1 besides step (the one just committed). */
mt_status mt_ckpt_prune(const char *dir, int keep, long step);

/* Writes a model-only checkpoint of whole tensors from one process (mt-ckpt import): one data
 * file, one chunk per tensor, committed like a distributed save. */
typedef struct mt_ckpt_whole_tensor {
    const char *name; /* "model/<path>" */
    int ndim;
    int64_t shape[4];
    int tp_dim; /* the placement recorded (informational): -1 replicate */
    const float *data;
} mt_ckpt_whole_tensor;

typedef struct mt_ckpt_whole_extra {
    const char *name;
    const void *data;
    size_t bytes;
} mt_ckpt_whole_extra;

mt_status mt_ckpt_write_whole(const char *dir, long step, const mt_ckpt_whole_tensor *tensors,
                              size_t n, const mt_ckpt_whole_extra *extras, size_t n_extras);

#endif
