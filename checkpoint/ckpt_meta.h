/* Internal: a checkpoint's metadata.json, read and validated (load, mt-ckpt), and its chunks read
 * back with their checksums verified.
 *
 * metadata.json (docs/checkpoint.md has the full description):
 *   {"format": "meshtrain-checkpoint", "version": 1, "meshtrain_version": "0.2.0", "step": 12,
 *    "world_size": 4, "mesh": {"dp": 2, "tp": 2},
 *    "optimizer": {"type": "adamw", "step": 12, "lr": ..., ...},        (absent: model only)
 *    "files": {"rank-00000.bin": {"bytes": N}, ...},
 *    "tensors": {"model/wte.weight": {"dtype": "f32", "shape": [256, 64],
 *                                     "tp": {"placement": "shard", "dim": 0},
 *                                     "chunks": [{"file": "rank-00000.bin", "offset": 0,
 *                                                 "bytes": 32768, "offsets": [0, 0],
 *                                                 "extents": [128, 64], "xxh3": "<16 hex>"}]}},
 *    "extras": {"step": {"bytes": 8, "per_rank": false,
 *                        "chunks": [{"rank": 0, "file": ..., "offset": ..., "xxh3": ...}]}}}
 * A chunk's bytes are its box of the global tensor, f32 little-endian, row-major.
 */
#ifndef MT_CHECKPOINT_CKPT_META_H
#define MT_CHECKPOINT_CKPT_META_H

#include <meshtrain/module.h>
#include <meshtrain/optim.h>
#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MT_CKPT_META_FILE "metadata.json"
#define MT_CKPT_FORMAT_NAME "meshtrain-checkpoint"
#define MT_CKPT_LATEST_FILE "latest"
/* metadata.json larger than this is refused (a corrupt or hostile file). */
#define MT_CKPT_META_MAX ((size_t)1 << 31)

typedef struct mt_ckpt_file_meta {
    char *name;
    uint64_t bytes;
} mt_ckpt_file_meta;

typedef struct mt_ckpt_chunk {
    size_t file; /* index into meta->files */
    uint64_t offset, bytes;
    int64_t offsets[MT_PARAM_MAX_DIMS], extents[MT_PARAM_MAX_DIMS];
    uint64_t xxh3;
    int rank; /* extras' chunks: the rank whose value it is; -1 for tensors */
} mt_ckpt_chunk;

typedef struct mt_ckpt_tensor_meta {
    char *name; /* "model/block0.ln_1.weight" */
    int ndim;
    int64_t shape[MT_PARAM_MAX_DIMS];
    int tp_dim; /* -1: replicated on tp */
    mt_ckpt_chunk *chunks;
    size_t n_chunks;
    uint64_t numel;
} mt_ckpt_tensor_meta;

typedef struct mt_ckpt_extra_meta {
    char *name;
    uint64_t bytes;
    bool per_rank;
    mt_ckpt_chunk *chunks; /* one per rank that saved it (one only when not per rank) */
    size_t n_chunks;
} mt_ckpt_extra_meta;

typedef struct mt_ckpt_meta {
    char *dir; /* the step-N folder */
    int version;
    long step;
    int world_size;
    char mesh[256]; /* "dp=2 tp=2", for messages */
    char meshtrain_version[32];
    bool has_optimizer;
    long optim_step;
    mt_adamw_options optim;
    mt_ckpt_file_meta *files;
    size_t n_files;
    mt_ckpt_tensor_meta *tensors; /* sorted by name */
    size_t n_tensors;
    mt_ckpt_extra_meta *extras;
    size_t n_extras;
} mt_ckpt_meta;

/* Reads and validates dir/metadata.json: the format and version, every field's type, chunks
 * inside their tensors with bytes equal to their extents, inside their files' recorded sizes.
 * Errors name the file and the tensor. */
mt_status mt_ckpt_meta_read(const char *dir, mt_ckpt_meta *out);
/* The same from text already in memory (dir only names it in messages). */
mt_status mt_ckpt_meta_parse(const char *dir, const char *text, size_t len, mt_ckpt_meta *out);
void mt_ckpt_meta_free(mt_ckpt_meta *meta);

const mt_ckpt_tensor_meta *mt_ckpt_meta_tensor(const mt_ckpt_meta *meta, const char *name);
const mt_ckpt_extra_meta *mt_ckpt_meta_extra(const mt_ckpt_meta *meta, const char *name);

/* Reading chunks: data files opened on first use, their sizes checked against the metadata. */
typedef struct mt_ckpt_reader mt_ckpt_reader;
mt_status mt_ckpt_reader_open(const mt_ckpt_meta *meta, mt_ckpt_reader **out);
void mt_ckpt_reader_close(mt_ckpt_reader *r);
/* Reads a chunk's bytes into dst (chunk->bytes) and verifies its checksum; what names the
 * tensor or extra for messages. */
mt_status mt_ckpt_read_chunk(mt_ckpt_reader *r, const mt_ckpt_chunk *c, const char *what,
                             void *dst);

/* Copies the part of a chunk's box (its f32 data) that lies in the box dst_off/dst_ext into dst
 * (that box's elements, row-major). Returns the elements copied. */
uint64_t mt_ckpt_copy_intersection(int ndim, const mt_ckpt_chunk *c, const float *data,
                                   const int64_t *dst_off, const int64_t *dst_ext, float *dst);

/* Reads a whole tensor (numel f32, row-major) from its chunks; an element no chunk holds is an
 * error. */
mt_status mt_ckpt_read_tensor(mt_ckpt_reader *r, const mt_ckpt_tensor_meta *t, float *dst);

/* "[d0, d1, ...]" into buf, for messages and tables. */
const char *mt_ckpt_dims_text(const int64_t *dims, int ndim, char *buf, size_t cap);

/* The XXH3-64 of a buffer, and its 16-hex-digit form. */
uint64_t mt_ckpt_hash(const void *data, size_t len);
void mt_ckpt_hash_hex(uint64_t h, char out[17]);

/* The same hash of bytes given in several calls (a chunk that spans the blocks a save writes):
 * after reset, updates with consecutive pieces give in digest what mt_ckpt_hash gives for the
 * whole. create returns NULL when out of memory. */
typedef struct mt_ckpt_hasher mt_ckpt_hasher;
mt_ckpt_hasher *mt_ckpt_hasher_create(void);
void mt_ckpt_hasher_free(mt_ckpt_hasher *h);
void mt_ckpt_hasher_reset(mt_ckpt_hasher *h);
void mt_ckpt_hasher_update(mt_ckpt_hasher *h, const void *data, size_t len);
uint64_t mt_ckpt_hasher_digest(const mt_ckpt_hasher *h);

/* The folder a path names: path itself when it holds metadata.json, else the one path/latest
 * names (*found false when neither exists). */
mt_status mt_ckpt_resolve(const char *path, char *out, size_t cap, bool *found);

#endif
