/* metadata.json read and validated; chunks read back (checkpoint/ckpt_meta.h). Everything in the
 * file is checked before use: a corrupt or hand-edited checkpoint is an error naming the file
 * and the tensor, never a crash or a read outside a buffer. */


#include "checkpoint/ckpt_meta.h"

#include "checkpoint/ckpt_fs.h"
#include "core/error.h"

#include <meshtrain/checkpoint.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

uint64_t mt_ckpt_hash(const void *data, size_t len) { return XXH3_64bits(data, len); }

const char *mt_ckpt_dims_text(const int64_t *dims, int ndim, char *buf, size_t cap) {
    size_t len = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && len < cap; d++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", d ? ", " : "",
                                (long long)dims[d]);
    if (len < cap) snprintf(buf + len, cap - len, "]");
    return buf;
}

/* xxHash's streaming state, which XXH3_64bits_digest turns into the one-shot value. */
struct mt_ckpt_hasher {
    XXH3_state_t *state;
};

mt_ckpt_hasher *mt_ckpt_hasher_create(void) {
    mt_ckpt_hasher *h = malloc(sizeof *h);
    if (h && !(h->state = XXH3_createState())) {
        free(h);
        return NULL;
    }
    if (h) XXH3_64bits_reset(h->state);
    return h;
}

void mt_ckpt_hasher_free(mt_ckpt_hasher *h) {
    if (!h) return;
    XXH3_freeState(h->state);
    free(h);
}

void mt_ckpt_hasher_reset(mt_ckpt_hasher *h) { XXH3_64bits_reset(h->state); }

void mt_ckpt_hasher_update(mt_ckpt_hasher *h, const void *data, size_t len) {
    XXH3_64bits_update(h->state, data, len);
}

uint64_t mt_ckpt_hasher_digest(const mt_ckpt_hasher *h) { return XXH3_64bits_digest(h->state); }

void mt_ckpt_hash_hex(uint64_t h, char out[17]) { snprintf(out, 17, "%016" PRIx64, h); }

static bool parse_hex64(const char *s, uint64_t *out) {
    if (!s || strlen(s) != 16) return false;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return false;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return true;
}

/* ---- parsing ------------------------------------------------------------------------------- */

typedef struct parse_ctx {
    const char *path; /* metadata.json's path, for messages */
} parse_ctx;

static mt_status bad(const parse_ctx *c, const char *where, const char *why) {
    return mt_error(MT_ERR_IO, "checkpoint '%s': %s: %s", c->path, where, why);
}

/* A non-negative integer member. */
static mt_status get_u64(const parse_ctx *c, json_t *obj, const char *key, const char *where,
                         uint64_t *out) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        char why[128];
        snprintf(why, sizeof why, "\"%s\" must be a non-negative integer", key);
        return bad(c, where, why);
    }
    *out = (uint64_t)json_integer_value(v);
    return MT_OK;
}

static mt_status get_dims(const parse_ctx *c, json_t *arr, const char *key, const char *where,
                          int expect_ndim, int64_t *out, int *ndim) {
    char why[160];
    if (!json_is_array(arr) || json_array_size(arr) > MT_PARAM_MAX_DIMS) {
        snprintf(why, sizeof why, "\"%s\" must be an array of at most %d integers", key,
                 MT_PARAM_MAX_DIMS);
        return bad(c, where, why);
    }
    int n = (int)json_array_size(arr);
    if (expect_ndim >= 0 && n != expect_ndim) {
        snprintf(why, sizeof why, "\"%s\" has %d dimensions, the tensor %d", key, n, expect_ndim);
        return bad(c, where, why);
    }
    for (int i = 0; i < n; i++) {
        json_t *v = json_array_get(arr, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > ((int64_t)1 << 48)) {
            snprintf(why, sizeof why, "\"%s\"[%d] must be an integer in [0, 2^48]", key, i);
            return bad(c, where, why);
        }
        out[i] = json_integer_value(v);
    }
    if (ndim) *ndim = n;
    return MT_OK;
}

static mt_status file_index(const parse_ctx *c, const mt_ckpt_meta *m, json_t *obj,
                            const char *where, size_t *out) {
    const char *name = json_string_value(json_object_get(obj, "file"));
    if (!name) return bad(c, where, "\"file\" must be a string");
    for (size_t i = 0; i < m->n_files; i++)
        if (strcmp(m->files[i].name, name) == 0) {
            *out = i;
            return MT_OK;
        }
    char why[PATH_MAX];
    snprintf(why, sizeof why, "file '%s' is not listed in \"files\"", name);
    return bad(c, where, why);
}

/* The fields every chunk has: file, offset, bytes (when bytes_expected is 0), xxh3; the chunk
 * must lie inside its file's recorded size. */
static mt_status parse_chunk_common(const parse_ctx *c, const mt_ckpt_meta *m, json_t *obj,
                                    const char *where, mt_ckpt_chunk *ch) {
    if (!json_is_object(obj)) return bad(c, where, "a chunk must be an object");
    MT_TRY(file_index(c, m, obj, where, &ch->file));
    MT_TRY(get_u64(c, obj, "offset", where, &ch->offset));
    MT_TRY(get_u64(c, obj, "bytes", where, &ch->bytes));
    if (!parse_hex64(json_string_value(json_object_get(obj, "xxh3")), &ch->xxh3))
        return bad(c, where, "\"xxh3\" must be 16 lower-case hex digits");
    const mt_ckpt_file_meta *f = &m->files[ch->file];
    if (ch->offset > f->bytes || ch->bytes > f->bytes - ch->offset) {
        char why[PATH_MAX + 128];
        snprintf(why, sizeof why, "chunk [%" PRIu64 ", +%" PRIu64 ") lies outside file '%s' (%"
                 PRIu64 " bytes)", ch->offset, ch->bytes, f->name, f->bytes);
        return bad(c, where, why);
    }
    return MT_OK;
}

static mt_status parse_tensor(const parse_ctx *c, mt_ckpt_meta *m, const char *name, json_t *obj,
                              mt_ckpt_tensor_meta *t) {
    char where[512];
    snprintf(where, sizeof where, "tensor '%s'", name);
    if (!json_is_object(obj)) return bad(c, where, "must be an object");
    t->name = strdup(name);
    if (!t->name) return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
    const char *dtype = json_string_value(json_object_get(obj, "dtype"));
    if (!dtype || strcmp(dtype, "f32") != 0) {
        char why[160];
        snprintf(why, sizeof why, "dtype '%s' is not supported (this build reads f32)",
                 dtype ? dtype : "(missing)");
        return bad(c, where, why);
    }
    MT_TRY(get_dims(c, json_object_get(obj, "shape"), "shape", where, -1, t->shape, &t->ndim));
    t->numel = 1;
    for (int d = 0; d < t->ndim; d++) t->numel *= (uint64_t)t->shape[d];
    if (t->numel > ((uint64_t)1 << 48)) return bad(c, where, "more than 2^48 elements");
    json_t *tp = json_object_get(obj, "tp");
    const char *pl = json_string_value(json_object_get(tp, "placement"));
    t->tp_dim = -1;
    if (pl && strcmp(pl, "shard") == 0) {
        json_t *d = json_object_get(tp, "dim");
        if (!json_is_integer(d) || json_integer_value(d) < 0 || json_integer_value(d) >= t->ndim)
            return bad(c, where, "\"tp\".\"dim\" must name one of its dimensions");
        t->tp_dim = (int)json_integer_value(d);
    } else if (!pl || strcmp(pl, "replicate") != 0) {
        return bad(c, where, "\"tp\".\"placement\" must be \"shard\" or \"replicate\"");
    }
    json_t *chunks = json_object_get(obj, "chunks");
    if (!json_is_array(chunks)) return bad(c, where, "\"chunks\" must be an array");
    t->n_chunks = json_array_size(chunks);
    t->chunks = calloc(t->n_chunks ? t->n_chunks : 1, sizeof *t->chunks);
    if (!t->chunks) return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
    uint64_t covered = 0;
    for (size_t i = 0; i < t->n_chunks; i++) {
        json_t *co = json_array_get(chunks, i);
        mt_ckpt_chunk *ch = &t->chunks[i];
        ch->rank = -1;
        char cwhere[600];
        snprintf(cwhere, sizeof cwhere, "tensor '%s' chunk %zu", name, i);
        MT_TRY(parse_chunk_common(c, m, co, cwhere, ch));
        MT_TRY(get_dims(c, json_object_get(co, "offsets"), "offsets", cwhere, t->ndim,
                        ch->offsets, NULL));
        MT_TRY(get_dims(c, json_object_get(co, "extents"), "extents", cwhere, t->ndim,
                        ch->extents, NULL));
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (ch->extents[d] < 1 || ch->offsets[d] + ch->extents[d] > t->shape[d])
                return bad(c, cwhere, "its box lies outside the tensor's shape");
            numel *= (uint64_t)ch->extents[d];
        }
        if (ch->bytes != numel * sizeof(float))
            return bad(c, cwhere, "\"bytes\" is not 4 x the elements of its extents");
        covered += numel;
    }
    /* A save writes each element once, so the chunks' sizes add up to the tensor's exactly;
     * anything else is a damaged or foreign metadata file. A sum cannot tell two overlapping
     * chunks beside a hole from a complete tensor; no save writes that, and checking every pair
     * of boxes would cost ranks^2 per tensor, so a hand-made file of that kind is not caught. */
    if (covered != t->numel) {
        char why[200];
        snprintf(why, sizeof why, "its chunks hold %" PRIu64 " elements, its shape %" PRIu64,
                 covered, t->numel);
        return bad(c, where, why);
    }
    return MT_OK;
}

static mt_status parse_extra(const parse_ctx *c, mt_ckpt_meta *m, const char *name, json_t *obj,
                             mt_ckpt_extra_meta *e) {
    char where[512];
    snprintf(where, sizeof where, "extra '%s'", name);
    if (!json_is_object(obj)) return bad(c, where, "must be an object");
    e->name = strdup(name);
    if (!e->name) return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
    MT_TRY(get_u64(c, obj, "bytes", where, &e->bytes));
    json_t *pr = json_object_get(obj, "per_rank");
    if (!json_is_boolean(pr)) return bad(c, where, "\"per_rank\" must be true or false");
    e->per_rank = json_is_true(pr);
    json_t *chunks = json_object_get(obj, "chunks");
    if (!json_is_array(chunks) || json_array_size(chunks) < 1)
        return bad(c, where, "\"chunks\" must be a non-empty array");
    e->n_chunks = json_array_size(chunks);
    if (!e->per_rank && e->n_chunks != 1) return bad(c, where, "one chunk expected");
    e->chunks = calloc(e->n_chunks, sizeof *e->chunks);
    if (!e->chunks) return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
    for (size_t i = 0; i < e->n_chunks; i++) {
        json_t *co = json_array_get(chunks, i);
        mt_ckpt_chunk *ch = &e->chunks[i];
        MT_TRY(parse_chunk_common(c, m, co, where, ch));
        uint64_t rank;
        MT_TRY(get_u64(c, co, "rank", where, &rank));
        if (rank >= (uint64_t)m->world_size) return bad(c, where, "\"rank\" outside the world");
        ch->rank = (int)rank;
        if (ch->bytes != e->bytes) return bad(c, where, "a chunk's size differs from \"bytes\"");
    }
    return MT_OK;
}

static int tensor_cmp(const void *a, const void *b) {
    return strcmp(((const mt_ckpt_tensor_meta *)a)->name, ((const mt_ckpt_tensor_meta *)b)->name);
}

static mt_status parse_optimizer(const parse_ctx *c, json_t *o, mt_ckpt_meta *m) {
    if (!o || json_is_null(o)) return MT_OK;
    const char *type = json_string_value(json_object_get(o, "type"));
    if (!type || strcmp(type, "adamw") != 0)
        return bad(c, "\"optimizer\"", "\"type\" must be \"adamw\"");
    uint64_t step;
    MT_TRY(get_u64(c, o, "step", "\"optimizer\"", &step));
    m->has_optimizer = true;
    m->optim_step = (long)step;
    const char *keys[] = {"lr", "beta1", "beta2", "eps", "weight_decay"};
    float *vals[] = {&m->optim.lr, &m->optim.beta1, &m->optim.beta2, &m->optim.eps,
                     &m->optim.weight_decay};
    for (int i = 0; i < 5; i++) {
        json_t *v = json_object_get(o, keys[i]);
        if (!json_is_number(v)) {
            char why[64];
            snprintf(why, sizeof why, "\"%s\" must be a number", keys[i]);
            return bad(c, "\"optimizer\"", why);
        }
        *vals[i] = (float)json_number_value(v);
    }
    return MT_OK;
}

static mt_status parse_root(const parse_ctx *c, json_t *root, mt_ckpt_meta *m) {
    if (!json_is_object(root)) return bad(c, "top level", "must be an object");
    const char *fmt = json_string_value(json_object_get(root, "format"));
    if (!fmt || strcmp(fmt, MT_CKPT_FORMAT_NAME) != 0)
        return bad(c, "\"format\"", "is not \"" MT_CKPT_FORMAT_NAME "\" (not a meshtrain "
                   "checkpoint)");
    uint64_t version, step, world;
    MT_TRY(get_u64(c, root, "version", "top level", &version));
    const char *built = json_string_value(json_object_get(root, "meshtrain_version"));
    snprintf(m->meshtrain_version, sizeof m->meshtrain_version, "%s", built ? built : "?");
    if (version > MT_CHECKPOINT_FORMAT_VERSION)
        return mt_error(MT_ERR_UNSUPPORTED, "checkpoint '%s': format version %" PRIu64 " (written "
                        "by meshtrain %s) is newer than this build reads (%d): use a newer "
                        "meshtrain", c->path, version, m->meshtrain_version,
                        MT_CHECKPOINT_FORMAT_VERSION);
    if (version < 1) return bad(c, "\"version\"", "must be at least 1");
    m->version = (int)version;
    MT_TRY(get_u64(c, root, "step", "top level", &step));
    MT_TRY(get_u64(c, root, "world_size", "top level", &world));
    if (world < 1 || world > (1u << 24)) return bad(c, "\"world_size\"", "out of range");
    m->step = (long)step;
    m->world_size = (int)world;
    json_t *mesh = json_object_get(root, "mesh");
    const char *k;
    json_t *v;
    size_t len = 0;
    json_object_foreach(mesh, k, v) {
        if (len < sizeof m->mesh)
            len += (size_t)snprintf(m->mesh + len, sizeof m->mesh - len, "%s%s=%lld",
                                    len ? " " : "", k, (long long)json_integer_value(v));
    }
    MT_TRY(parse_optimizer(c, json_object_get(root, "optimizer"), m));

    json_t *files = json_object_get(root, "files");
    if (!json_is_object(files)) return bad(c, "\"files\"", "must be an object");
    m->files = calloc(json_object_size(files) + 1, sizeof *m->files);
    if (!m->files) return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
    json_object_foreach(files, k, v) {
        char where[512];
        snprintf(where, sizeof where, "file '%s'", k);
        if (!*k || strchr(k, '/') || strcmp(k, ".") == 0 || strcmp(k, "..") == 0)
            return bad(c, where, "a data file's name must be a plain file name");
        mt_ckpt_file_meta *f = &m->files[m->n_files++];
        f->name = strdup(k);
        if (!f->name) return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
        MT_TRY(get_u64(c, v, "bytes", where, &f->bytes));
    }

    json_t *tensors = json_object_get(root, "tensors");
    if (!json_is_object(tensors)) return bad(c, "\"tensors\"", "must be an object");
    m->tensors = calloc(json_object_size(tensors) + 1, sizeof *m->tensors);
    if (!m->tensors) return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
    json_object_foreach(tensors, k, v) {
        /* Counted first: a failing entry's name and chunks are freed with the rest. */
        MT_TRY(parse_tensor(c, m, k, v, &m->tensors[m->n_tensors++]));
    }
    qsort(m->tensors, m->n_tensors, sizeof *m->tensors, tensor_cmp);

    json_t *extras = json_object_get(root, "extras");
    if (extras && !json_is_object(extras)) return bad(c, "\"extras\"", "must be an object");
    m->extras = calloc(json_object_size(extras) + 1, sizeof *m->extras);
    if (!m->extras) return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
    json_object_foreach(extras, k, v) {
        MT_TRY(parse_extra(c, m, k, v, &m->extras[m->n_extras++]));
    }
    return MT_OK;
}

mt_status mt_ckpt_meta_parse(const char *dir, const char *text, size_t len, mt_ckpt_meta *out) {
    memset(out, 0, sizeof *out);
    char path[PATH_MAX];
    MT_TRY(mt_ckpt_join(path, sizeof path, dir, MT_CKPT_META_FILE));
    out->dir = strdup(dir);
    if (!out->dir) return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    mt_status st;
    if (!root) {
        st = mt_error(MT_ERR_IO, "checkpoint '%s': not valid JSON at line %d column %d: %s", path,
                      jerr.line, jerr.column, jerr.text);
    } else {
        parse_ctx c = {path};
        st = parse_root(&c, root, out);
        json_decref(root);
    }
    if (st != MT_OK) mt_ckpt_meta_free(out);
    return st;
}

mt_status mt_ckpt_meta_read(const char *dir, mt_ckpt_meta *out) {
    memset(out, 0, sizeof *out);
    char path[PATH_MAX];
    MT_TRY(mt_ckpt_join(path, sizeof path, dir, MT_CKPT_META_FILE));
    char *text = NULL;
    size_t len = 0;
    mt_status st = mt_ckpt_read_file(path, MT_CKPT_META_MAX, &text, &len);
    if (st == MT_ERR_NOT_FOUND)
        return mt_error(MT_ERR_NOT_FOUND, "checkpoint '%s' has no %s (an incomplete save, or not "
                        "a checkpoint folder)", dir, MT_CKPT_META_FILE);
    MT_TRY(st);
    st = mt_ckpt_meta_parse(dir, text, len, out);
    free(text);
    return st;
}

void mt_ckpt_meta_free(mt_ckpt_meta *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n_files; i++) free(m->files[i].name);
    for (size_t i = 0; i < m->n_tensors; i++) {
        free(m->tensors[i].name);
        free(m->tensors[i].chunks);
    }
    for (size_t i = 0; i < m->n_extras; i++) {
        free(m->extras[i].name);
        free(m->extras[i].chunks);
    }
    free(m->files);
    free(m->tensors);
    free(m->extras);
    free(m->dir);
    memset(m, 0, sizeof *m);
}

const mt_ckpt_tensor_meta *mt_ckpt_meta_tensor(const mt_ckpt_meta *m, const char *name) {
    mt_ckpt_tensor_meta key = {.name = (char *)name};
    return bsearch(&key, m->tensors, m->n_tensors, sizeof key, tensor_cmp);
}

const mt_ckpt_extra_meta *mt_ckpt_meta_extra(const mt_ckpt_meta *m, const char *name) {
    for (size_t i = 0; i < m->n_extras; i++)
        if (strcmp(m->extras[i].name, name) == 0) return &m->extras[i];
    return NULL;
}

/* ---- reading chunks ------------------------------------------------------------------------ */

struct mt_ckpt_reader {
    const mt_ckpt_meta *meta;
    int *fds; /* per file; -1 until opened */
};

mt_status mt_ckpt_reader_open(const mt_ckpt_meta *meta, mt_ckpt_reader **out) {
    mt_ckpt_reader *r = calloc(1, sizeof *r);
    if (r) r->fds = malloc((meta->n_files + 1) * sizeof *r->fds);
    if (!r || !r->fds) {
        free(r);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
    }
    for (size_t i = 0; i < meta->n_files; i++) r->fds[i] = -1;
    r->meta = meta;
    *out = r;
    return MT_OK;
}

void mt_ckpt_reader_close(mt_ckpt_reader *r) {
    if (!r) return;
    for (size_t i = 0; i < r->meta->n_files; i++)
        if (r->fds[i] >= 0) close(r->fds[i]);
    free(r->fds);
    free(r);
}

static mt_status open_file(mt_ckpt_reader *r, size_t i, char *path, size_t cap) {
    const mt_ckpt_file_meta *f = &r->meta->files[i];
    MT_TRY(mt_ckpt_join(path, cap, r->meta->dir, f->name));
    if (r->fds[i] >= 0) return MT_OK;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return mt_error_errno(errno == ENOENT ? MT_ERR_NOT_FOUND : MT_ERR_IO, errno,
                              "checkpoint: cannot open data file '%s'", path);
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return mt_error_errno(MT_ERR_IO, e, "checkpoint: stat '%s'", path);
    }
    if ((uint64_t)sb.st_size != f->bytes) {
        close(fd);
        return mt_error(MT_ERR_IO, "checkpoint: data file '%s' has %lld bytes, its metadata "
                        "says %" PRIu64 " (%s)", path, (long long)sb.st_size, f->bytes,
                        (uint64_t)sb.st_size < f->bytes ? "truncated" : "not the file saved");
    }
    /* A load reads a file mostly from start to end: a larger read-ahead window. */
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    r->fds[i] = fd;
    return MT_OK;
}

mt_status mt_ckpt_read_chunk(mt_ckpt_reader *r, const mt_ckpt_chunk *c, const char *what,
                             void *dst) {
    char path[PATH_MAX];
    mt_status st = open_file(r, c->file, path, sizeof path);
    if (st != MT_OK) return mt_error_wrap(st, "reading %s", what);
    st = mt_ckpt_pread_all(r->fds[c->file], dst, c->bytes, c->offset, path);
    if (st != MT_OK) return mt_error_wrap(st, "reading %s", what);
    uint64_t h = mt_ckpt_hash(dst, c->bytes);
    if (h != c->xxh3) {
        char want[17], got[17];
        mt_ckpt_hash_hex(c->xxh3, want);
        mt_ckpt_hash_hex(h, got);
        return mt_error(MT_ERR_IO, "checkpoint: checksum mismatch in data file '%s' for %s "
                        "(%" PRIu64 " bytes at offset %" PRIu64 "): xxh3 %s, metadata says %s "
                        "(the file is damaged)", path, what, c->bytes, c->offset, got, want);
    }
    return MT_OK;
}

uint64_t mt_ckpt_copy_intersection(int ndim, const mt_ckpt_chunk *c, const float *data,
                                   const int64_t *dst_off, const int64_t *dst_ext, float *dst) {
    int64_t lo[MT_PARAM_MAX_DIMS], ext[MT_PARAM_MAX_DIMS];
    for (int d = 0; d < ndim; d++) {
        int64_t a = c->offsets[d] > dst_off[d] ? c->offsets[d] : dst_off[d];
        int64_t b1 = c->offsets[d] + c->extents[d], b2 = dst_off[d] + dst_ext[d];
        int64_t b = b1 < b2 ? b1 : b2;
        if (a >= b) return 0;
        lo[d] = a;
        ext[d] = b - a;
    }
    if (ndim == 0) { /* a scalar */
        dst[0] = data[0];
        return 1;
    }
    /* Row-major strides of both boxes; the innermost run is contiguous in both. */
    int64_t sstride[MT_PARAM_MAX_DIMS], dstride[MT_PARAM_MAX_DIMS];
    sstride[ndim - 1] = dstride[ndim - 1] = 1;
    for (int d = ndim - 2; d >= 0; d--) {
        sstride[d] = sstride[d + 1] * c->extents[d + 1];
        dstride[d] = dstride[d + 1] * dst_ext[d + 1];
    }
    int64_t idx[MT_PARAM_MAX_DIMS] = {0};
    uint64_t rows = 1;
    for (int d = 0; d < ndim - 1; d++) rows *= (uint64_t)ext[d];
    size_t run = (size_t)ext[ndim - 1] * sizeof(float);
    for (uint64_t r = 0; r < rows; r++) {
        int64_t so = 0, doff = 0;
        for (int d = 0; d < ndim; d++) {
            int64_t g = lo[d] + idx[d];
            so += (g - c->offsets[d]) * sstride[d];
            doff += (g - dst_off[d]) * dstride[d];
        }
        memcpy(dst + doff, data + so, run);
        for (int d = ndim - 2; d >= 0; d--) {
            if (++idx[d] < ext[d]) break;
            idx[d] = 0;
        }
    }
    return rows * (uint64_t)ext[ndim - 1];
}

mt_status mt_ckpt_read_tensor(mt_ckpt_reader *r, const mt_ckpt_tensor_meta *t, float *dst) {
    int64_t zero[MT_PARAM_MAX_DIMS] = {0};
    uint64_t covered = 0;
    for (size_t i = 0; i < t->n_chunks; i++) {
        const mt_ckpt_chunk *c = &t->chunks[i];
        float *buf = malloc(c->bytes ? c->bytes : 1);
        if (!buf)
            return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: no memory for a chunk of %" PRIu64
                            " bytes of tensor '%s'", c->bytes, t->name);
        char what[600];
        snprintf(what, sizeof what, "tensor '%s'", t->name);
        mt_status st = mt_ckpt_read_chunk(r, c, what, buf);
        if (st == MT_OK) covered += mt_ckpt_copy_intersection(t->ndim, c, buf, zero, t->shape, dst);
        free(buf);
        MT_TRY(st);
    }
    if (covered != t->numel)
        return mt_error(MT_ERR_IO, "checkpoint '%s': tensor '%s': its chunks cover %" PRIu64
                        " of its %" PRIu64 " elements", r->meta->dir, t->name, covered, t->numel);
    return MT_OK;
}

mt_status mt_ckpt_resolve(const char *path, char *out, size_t cap, bool *found) {
    *found = false;
    if (!path || !*path) return mt_error(MT_ERR_INVALID_ARG, "checkpoint: empty path");
    char meta[PATH_MAX], latest[PATH_MAX];
    MT_TRY(mt_ckpt_join(meta, sizeof meta, path, MT_CKPT_META_FILE));
    if (mt_ckpt_is_file(meta)) {
        if (strlen(path) >= cap)
            return mt_error(MT_ERR_INVALID_ARG, "checkpoint: path '%s' too long", path);
        snprintf(out, cap, "%s", path);
        *found = true;
        return MT_OK;
    }
    MT_TRY(mt_ckpt_join(latest, sizeof latest, path, MT_CKPT_LATEST_FILE));
    char *text = NULL;
    size_t len = 0;
    mt_status st = mt_ckpt_read_file(latest, 4096, &text, &len);
    if (st == MT_ERR_NOT_FOUND) {
        mt_error_clear_message();
        if (mt_ckpt_is_dir(path) || !mt_ckpt_is_file(path)) return MT_OK; /* nothing saved yet */
    }
    MT_TRY(st);
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == ' ')) text[--len] = '\0';
    st = MT_OK;
    if (len == 0 || strchr(text, '/'))
        st = mt_error(MT_ERR_IO, "checkpoint: '%s' must hold the name of a checkpoint folder "
                      "beside it, not '%s'", latest, text);
    else if (mt_ckpt_join(out, cap, path, text) != MT_OK)
        st = MT_ERR_INVALID_ARG;
    else if (mt_ckpt_join(meta, sizeof meta, out, MT_CKPT_META_FILE) == MT_OK &&
             !mt_ckpt_is_file(meta))
        st = mt_error(MT_ERR_NOT_FOUND, "checkpoint: '%s' names '%s', which has no %s (removed "
                      "by hand?)", latest, out, MT_CKPT_META_FILE);
    free(text);
    if (st == MT_OK) *found = true;
    return st;
}
