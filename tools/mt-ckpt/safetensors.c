/* safetensors: the header's validation, reading tensors as f32, and the crash-safe writer.
 *
 * The header is checked whole before anything trusts it: every offset against the data's real
 * size, every shape against its byte range (with overflow checks), and the tensors against each
 * other (sorted by offset they must tile the data exactly, as the format requires). After that,
 * reading a tensor is a bounded pread. */
#include "safetensors.h"

#include "core/bf16_inline.h"
#include "core/error.h"

#include <jansson.h>

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The format is little-endian; we move F32 data between files and memory without swapping. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

#define METADATA_KEY "__metadata__"
/* Bounded system calls: F32 data moves in pieces of this size; F16/BF16 convert through a buffer
 * of READ_CHUNK bytes. */
#define WRITE_CHUNK ((size_t)8 << 20)
#define READ_CHUNK ((size_t)256 << 10)

static const struct {
    const char *name;
    size_t size;
} dtypes[MT_ST_DTYPE_COUNT] = {
    [MT_ST_BOOL] = {"BOOL", 1},       [MT_ST_U8] = {"U8", 1},     [MT_ST_I8] = {"I8", 1},
    [MT_ST_F8_E5M2] = {"F8_E5M2", 1}, [MT_ST_F8_E4M3] = {"F8_E4M3", 1},
    [MT_ST_F8_E8M0] = {"F8_E8M0", 1}, [MT_ST_I16] = {"I16", 2},   [MT_ST_U16] = {"U16", 2},
    [MT_ST_F16] = {"F16", 2},         [MT_ST_BF16] = {"BF16", 2}, [MT_ST_I32] = {"I32", 4},
    [MT_ST_U32] = {"U32", 4},         [MT_ST_F32] = {"F32", 4},   [MT_ST_F64] = {"F64", 8},
    [MT_ST_I64] = {"I64", 8},         [MT_ST_U64] = {"U64", 8},
};

const char *mt_st_dtype_name(mt_st_dtype dtype) {
    return (unsigned)dtype < MT_ST_DTYPE_COUNT ? dtypes[dtype].name : "invalid";
}

size_t mt_st_dtype_size(mt_st_dtype dtype) {
    return (unsigned)dtype < MT_ST_DTYPE_COUNT ? dtypes[dtype].size : 0;
}

float mt_st_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13); /* infinity, or NaN with its payload */
    } else if (exp != 0) {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        /* A subnormal, man x 2^-24, is a normal f32: shift the leading one into the implicit
         * bit's place, lowering the exponent once per shift. */
        uint32_t e = 127 - 14;
        while (!(man & 0x400u)) {
            man <<= 1;
            e--;
        }
        bits = sign | (e << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* ---- messages -------------------------------------------------------------------------------- */

/* A name from a file, fit for a message: control characters, quotes and bytes that are not
 * UTF-8 escaped, long names cut between characters, so that a hostile name can neither flood a
 * message nor garble a terminal. */
typedef struct shown {
    char s[112];
} shown;

/* The length of the UTF-8 sequence at p (1 to 4), or 0 when it is not one. */
static size_t utf8_len(const unsigned char *p) {
    size_t n = p[0] < 0x80 ? 1 : (p[0] & 0xe0) == 0xc0 ? 2 : (p[0] & 0xf0) == 0xe0 ? 3
             : (p[0] & 0xf8) == 0xf0 ? 4 : 0;
    for (size_t i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80) return 0; /* stops at the terminator too */
    return n;
}

static shown show(const char *name) {
    shown out;
    size_t o = 0;
    const unsigned char *p = (const unsigned char *)name;
    while (*p) {
        size_t n = utf8_len(p);
        bool escape = n == 0 || (n == 1 && (*p < 0x20 || *p == 0x7f || *p == '\'' || *p == '\\'));
        size_t width = escape ? 4 : n;
        if (o + width > sizeof out.s - 4) { /* room for "..." and the terminator */
            memcpy(out.s + o, "...", 4);
            return out;
        }
        if (escape) {
            snprintf(out.s + o, 5, "\\x%02x", *p);
            p++;
        } else {
            memcpy(out.s + o, p, n);
            p += n;
        }
        o += width;
    }
    out.s[o] = '\0';
    return out;
}

static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a value of unknown type";
}

static void format_shape(const int64_t *shape, int ndim, char *buf, size_t cap) {
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* ---- the header ------------------------------------------------------------------------------ */

void mt_st_header_free(mt_st_header *h) {
    if (!h) return;
    for (size_t i = 0; i < h->n_tensors; i++) free(h->tensors[i].name);
    for (size_t i = 0; i < h->n_meta; i++) {
        free(h->meta_keys[i]);
        free(h->meta_values[i]);
    }
    free(h->tensors);
    free(h->meta_keys);
    free(h->meta_values);
    free(h->by_name);
    memset(h, 0, sizeof *h);
}

static mt_status parse_metadata(const json_t *meta, mt_st_header *h) {
    if (!json_is_object(meta))
        return mt_error(MT_ERR_INVALID_ARG, "\"" METADATA_KEY "\" is %s, not an object of strings",
                        json_kind(meta));
    size_t n = json_object_size(meta);
    h->meta_keys = calloc(n ? n : 1, sizeof *h->meta_keys);
    h->meta_values = calloc(n ? n : 1, sizeof *h->meta_values);
    if (!h->meta_keys || !h->meta_values)
        return mt_error(MT_ERR_OUT_OF_MEMORY, "out of memory for %zu metadata entries", n);
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)meta, key, value) {
        if (!json_is_string(value))
            return mt_error(MT_ERR_INVALID_ARG, "metadata '%s' is %s, not a string", show(key).s,
                            json_kind(value));
        h->meta_keys[h->n_meta] = strdup(key);
        h->meta_values[h->n_meta] = strdup(json_string_value(value));
        h->n_meta++; /* counted before the check, so that free releases what was copied */
        if (!h->meta_keys[h->n_meta - 1] || !h->meta_values[h->n_meta - 1])
            return mt_error(MT_ERR_OUT_OF_MEMORY, "out of memory for metadata '%s'", show(key).s);
    }
    return MT_OK;
}

static mt_status parse_dtype(const char *name, const json_t *v, mt_st_dtype *out) {
    if (!json_is_string(v))
        return mt_error(MT_ERR_INVALID_ARG, "tensor '%s': \"dtype\" is %s, not a string",
                        show(name).s, json_kind(v));
    const char *s = json_string_value(v);
    for (int d = 0; d < MT_ST_DTYPE_COUNT; d++) {
        if (strcmp(s, dtypes[d].name) == 0) {
            *out = (mt_st_dtype)d;
            return MT_OK;
        }
    }
    if (strcmp(s, "F4") == 0 || strncmp(s, "F6_", 3) == 0)
        return mt_error(MT_ERR_UNSUPPORTED, "tensor '%s': dtype %s packs elements in less than a "
                        "byte, which this reader does not support", show(name).s, show(s).s);
    return mt_error(MT_ERR_INVALID_ARG, "tensor '%s': unknown dtype '%s' (known: BOOL, U8, I8, "
                    "F8_E5M2, F8_E4M3, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64)",
                    show(name).s, show(s).s);
}

static mt_status parse_shape(const char *name, const json_t *v, mt_st_tensor *t) {
    if (!json_is_array(v))
        return mt_error(MT_ERR_INVALID_ARG, "tensor '%s': \"shape\" is %s, not an array",
                        show(name).s, json_kind(v));
    size_t ndim = json_array_size(v);
    if (ndim > MT_ST_MAX_DIMS)
        return mt_error(MT_ERR_INVALID_ARG, "tensor '%s': shape has %zu dimensions, more than "
                        "the %d supported", show(name).s, ndim, MT_ST_MAX_DIMS);
    t->ndim = (int)ndim;
    for (size_t d = 0; d < ndim; d++) {
        const json_t *e = json_array_get(v, d);
        if (!json_is_integer(e))
            return mt_error(MT_ERR_INVALID_ARG, "tensor '%s': shape dimension %zu is %s, not an "
                            "integer", show(name).s, d, json_kind(e));
        if (json_integer_value(e) < 0)
            return mt_error(MT_ERR_INVALID_ARG, "tensor '%s': shape dimension %zu is negative "
                            "(%lld)", show(name).s, d, (long long)json_integer_value(e));
        t->shape[d] = json_integer_value(e);
    }
    return MT_OK;
}

static mt_status parse_offsets(const char *name, const json_t *v, uint64_t data_len,
                               mt_st_tensor *t) {
    if (!json_is_array(v) || json_array_size(v) != 2)
        return mt_error(MT_ERR_INVALID_ARG, "tensor '%s': \"data_offsets\" is %s, not an array "
                        "[begin, end]", show(name).s,
                        json_is_array(v) ? "an array of another length" : json_kind(v));
    uint64_t off[2];
    for (size_t i = 0; i < 2; i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            return mt_error(MT_ERR_INVALID_ARG, "tensor '%s': data_offsets[%zu] is %s, not a "
                            "non-negative integer", show(name).s, i,
                            json_is_integer(e) ? "negative" : json_kind(e));
        off[i] = (uint64_t)json_integer_value(e);
    }
    if (off[0] > off[1])
        return mt_error(MT_ERR_INVALID_ARG, "tensor '%s': data_offsets [%llu, %llu] end before "
                        "they begin", show(name).s, (unsigned long long)off[0],
                        (unsigned long long)off[1]);
    if (off[1] > data_len)
        return mt_error(MT_ERR_INVALID_ARG, "tensor '%s': data_offsets [%llu, %llu] run past the "
                        "end of the data (%llu bytes)", show(name).s, (unsigned long long)off[0],
                        (unsigned long long)off[1], (unsigned long long)data_len);
    t->begin = off[0];
    t->end = off[1];
    return MT_OK;
}

/* The element count and byte size the shape implies. A zero dimension makes the tensor empty
 * whatever the others are, so only the product of the nonzero ones has to fit (in elements, and
 * in bytes when there are any). */
static mt_status check_size(const char *name, mt_st_tensor *t) {
    uint64_t count = 1, bytes = 0;
    bool empty = false;
    const char *too_many = NULL;
    for (int d = 0; d < t->ndim && !too_many; d++) {
        if (t->shape[d] == 0) empty = true;
        else if (__builtin_mul_overflow(count, (uint64_t)t->shape[d], &count))
            too_many = "elements";
    }
    if (empty) count = 0;
    if (!too_many && __builtin_mul_overflow(count, (uint64_t)dtypes[t->dtype].size, &bytes))
        too_many = "bytes";
    char s[256];
    format_shape(t->shape, t->ndim, s, sizeof s);
    if (too_many)
        return mt_error(MT_ERR_INVALID_ARG, "tensor '%s': shape %s of %s has more %s than fit "
                        "in 64 bits", show(name).s, s, dtypes[t->dtype].name, too_many);
    if (bytes != t->end - t->begin)
        return mt_error(MT_ERR_INVALID_ARG, "tensor '%s': shape %s of %s is %llu bytes, but "
                        "data_offsets [%llu, %llu] hold %llu", show(name).s, s,
                        dtypes[t->dtype].name, (unsigned long long)bytes,
                        (unsigned long long)t->begin, (unsigned long long)t->end,
                        (unsigned long long)(t->end - t->begin));
    t->count = count;
    return MT_OK;
}

static mt_status parse_tensor(const char *name, const json_t *v, uint64_t data_len,
                              mt_st_tensor *t) {
    if (!json_is_object(v))
        return mt_error(MT_ERR_INVALID_ARG, "tensor '%s' is %s, not an object with dtype, shape "
                        "and data_offsets", show(name).s, json_kind(v));
    /* A field we do not know might change what the bytes mean (a layout, a quantization): refuse
     * rather than misread. */
    const char *key;
    json_t *field;
    json_object_foreach((json_t *)v, key, field) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return mt_error(MT_ERR_INVALID_ARG, "tensor '%s' has an unknown field '%s'",
                            show(name).s, show(key).s);
    }
    static const char *const required[] = {"dtype", "shape", "data_offsets"};
    for (int i = 0; i < 3; i++)
        if (!json_object_get(v, required[i]))
            return mt_error(MT_ERR_INVALID_ARG, "tensor '%s' has no \"%s\"", show(name).s,
                            required[i]);
    MT_TRY(parse_dtype(name, json_object_get(v, "dtype"), &t->dtype));
    MT_TRY(parse_shape(name, json_object_get(v, "shape"), t));
    MT_TRY(parse_offsets(name, json_object_get(v, "data_offsets"), data_len, t));
    return check_size(name, t);
}

/* File order: by offset; an empty tensor sorts before the one that starts where it stands, and
 * equal ranges (empty tensors side by side) by name, so the order is the same every time. */
static int by_offset(const void *a, const void *b) {
    const mt_st_tensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int by_name(const void *a, const void *b) {
    return strcmp((*(const mt_st_tensor *const *)a)->name, (*(const mt_st_tensor *const *)b)->name);
}

/* Sorted by offset, each tensor must start where the previous one ended, and the last end where
 * the data does: no overlap, no hole. */
static mt_status check_tiling(const mt_st_header *h, uint64_t data_len) {
    uint64_t pos = 0;
    const mt_st_tensor *last = NULL; /* the tensor that ends at pos */
    for (size_t i = 0; i < h->n_tensors; i++) {
        const mt_st_tensor *t = &h->tensors[i];
        if (t->begin < pos)
            return mt_error(MT_ERR_INVALID_ARG, "tensor '%s' (bytes %llu to %llu) overlaps "
                            "tensor '%s' (bytes %llu to %llu)", show(t->name).s,
                            (unsigned long long)t->begin, (unsigned long long)t->end,
                            show(last->name).s, (unsigned long long)last->begin,
                            (unsigned long long)last->end);
        if (t->begin > pos)
            return mt_error(MT_ERR_INVALID_ARG, "bytes %llu to %llu of the data belong to no "
                            "tensor (a hole before tensor '%s')", (unsigned long long)pos,
                            (unsigned long long)t->begin, show(t->name).s);
        if (t->end > pos || !last) last = t;
        pos = t->end;
    }
    if (pos != data_len)
        return mt_error(MT_ERR_INVALID_ARG, "bytes %llu to %llu at the end of the data belong to "
                        "no tensor", (unsigned long long)pos, (unsigned long long)data_len);
    return MT_OK;
}

static mt_status parse_root(const json_t *root, uint64_t data_len, mt_st_header *h) {
    if (!json_is_object(root))
        return mt_error(MT_ERR_INVALID_ARG, "the header is %s, not an object", json_kind(root));
    size_t n = json_object_size(root);
    h->tensors = calloc(n ? n : 1, sizeof *h->tensors);
    h->by_name = calloc(n ? n : 1, sizeof *h->by_name);
    if (!h->tensors || !h->by_name)
        return mt_error(MT_ERR_OUT_OF_MEMORY, "out of memory for %zu tensors", n);
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)root, key, value) {
        if (strcmp(key, METADATA_KEY) == 0) {
            MT_TRY(parse_metadata(value, h));
            continue;
        }
        mt_st_tensor *t = &h->tensors[h->n_tensors];
        if (!(t->name = strdup(key)))
            return mt_error(MT_ERR_OUT_OF_MEMORY, "out of memory for tensor '%s'", show(key).s);
        h->n_tensors++;
        MT_TRY(parse_tensor(key, value, data_len, t));
    }
    qsort(h->tensors, h->n_tensors, sizeof *h->tensors, by_offset);
    MT_TRY(check_tiling(h, data_len));
    for (size_t i = 0; i < h->n_tensors; i++) h->by_name[i] = &h->tensors[i];
    qsort(h->by_name, h->n_tensors, sizeof *h->by_name, by_name);
    return MT_OK;
}

mt_status mt_st_parse_header(const void *json, size_t json_len, uint64_t data_len,
                             mt_st_header *out) {
    if (!out || (!json && json_len))
        return mt_error(MT_ERR_INVALID_ARG, "mt_st_parse_header: NULL argument");
    memset(out, 0, sizeof *out);
    const char *text = json;
    /* The format says the header begins with '{'; a leading byte of anything else (whitespace,
     * a BOM) is refused as the reference reader refuses it. */
    if (json_len == 0 || text[0] != '{')
        return mt_error(MT_ERR_INVALID_ARG, "the header does not begin with '{' (%s)",
                        json_len ? "not a JSON object" : "it is empty");
    json_error_t jerr;
    /* Duplicate names would make one tensor shadow another: refuse them. Trailing spaces (the
     * padding) are whitespace to jansson. */
    json_t *root = json_loadb(text, json_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        /* jansson quotes the offending token, which is the file's bytes: no control characters
         * from it reach a terminal. */
        for (char *c = jerr.text; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
        return mt_error(MT_ERR_INVALID_ARG, "the header is not valid JSON: %s (line %d, column "
                        "%d)", jerr.text, jerr.line, jerr.column);
    }
    mt_status s = parse_root(root, data_len, out);
    json_decref(root);
    if (s != MT_OK) mt_st_header_free(out);
    return s;
}

const mt_st_tensor *mt_st_header_find(const mt_st_header *h, const char *name) {
    size_t lo = 0, hi = h->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const mt_st_tensor *t = h->by_name[mid];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}

const char *mt_st_header_meta(const mt_st_header *h, const char *key) {
    for (size_t i = 0; i < h->n_meta; i++)
        if (strcmp(h->meta_keys[i], key) == 0) return h->meta_values[i];
    return NULL;
}

/* ---- reading --------------------------------------------------------------------------------- */

struct mt_st_file {
    int fd;
    char *path;
    uint64_t data_start; /* 8 + the header length */
    mt_st_header header;
};

/* Reads exactly len bytes at offset; a short file is an error naming where it ended. */
static mt_status read_at(int fd, const char *path, void *buf, size_t len, uint64_t offset,
                         const char *what) {
    char *p = buf;
    while (len) {
        size_t piece = len < ((size_t)1 << 30) ? len : ((size_t)1 << 30);
        ssize_t r = pread(fd, p, piece, (off_t)offset);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return mt_error_errno(MT_ERR_IO, errno, "reading %s of %s", what, path);
        if (r == 0)
            return mt_error(MT_ERR_IO, "%s ends at byte %llu, in the middle of %s (was it "
                            "truncated while open?)", path, (unsigned long long)offset, what);
        p += r;
        len -= (size_t)r;
        offset += (uint64_t)r;
    }
    return MT_OK;
}

static mt_status open_checked(mt_st_file *f) {
    struct stat st;
    if (fstat(f->fd, &st) != 0) return mt_error_errno(MT_ERR_IO, errno, "stat of %s", f->path);
    if (!S_ISREG(st.st_mode))
        return mt_error(MT_ERR_INVALID_ARG, "%s is not a regular file", f->path);
    uint64_t size = (uint64_t)st.st_size;
    if (size < 8)
        return mt_error(MT_ERR_INVALID_ARG, "%s is %llu bytes, too short for a safetensors file "
                        "(its first 8 bytes are the header length)", f->path,
                        (unsigned long long)size);
    unsigned char len8[8];
    MT_TRY(read_at(f->fd, f->path, len8, 8, 0, "the header length"));
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
    if (n > MT_ST_MAX_HEADER_BYTES)
        return mt_error(MT_ERR_INVALID_ARG, "%s: header length %llu is over the limit of %u "
                        "bytes (not a safetensors file, or damaged)", f->path,
                        (unsigned long long)n, MT_ST_MAX_HEADER_BYTES);
    if (n > size - 8)
        return mt_error(MT_ERR_INVALID_ARG, "%s: header length %llu runs past the end of the "
                        "file (%llu bytes)", f->path, (unsigned long long)n,
                        (unsigned long long)size);
    char *json = malloc(n ? n : 1);
    if (!json)
        return mt_error(MT_ERR_OUT_OF_MEMORY, "%s: out of memory for a header of %llu bytes",
                        f->path, (unsigned long long)n);
    mt_status s = read_at(f->fd, f->path, json, n, 8, "the header");
    if (s == MT_OK) {
        s = mt_st_parse_header(json, n, size - 8 - n, &f->header);
        if (s != MT_OK) mt_error_wrap(s, "safetensors file %s", f->path);
    }
    free(json);
    f->data_start = 8 + n;
    return s;
}

mt_status mt_st_open(const char *path, mt_st_file **out) {
    if (!path || !out) return mt_error(MT_ERR_INVALID_ARG, "mt_st_open: NULL argument");
    *out = NULL;
    mt_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "out of memory opening %s", path);
    }
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        int e = errno;
        mt_st_close(f);
        return mt_error_errno(e == ENOENT ? MT_ERR_NOT_FOUND : MT_ERR_IO, e,
                              "cannot open safetensors file %s", path);
    }
    mt_status s = open_checked(f);
    if (s != MT_OK) {
        mt_st_close(f);
        return s;
    }
    *out = f;
    return MT_OK;
}

const mt_st_header *mt_st_file_header(const mt_st_file *f) { return &f->header; }

const mt_st_tensor *mt_st_find(const mt_st_file *f, const char *name) {
    return mt_st_header_find(&f->header, name);
}

mt_status mt_st_read_f32_range(mt_st_file *f, const mt_st_tensor *t, uint64_t first,
                               size_t count, float *dst) {
    if (!f || !t || (!dst && count))
        return mt_error(MT_ERR_INVALID_ARG, "mt_st_read_f32: NULL argument");
    if (t < f->header.tensors || t >= f->header.tensors + f->header.n_tensors)
        return mt_error(MT_ERR_INVALID_ARG, "mt_st_read_f32: tensor '%s' is not one of %s's",
                        show(t->name).s, f->path);
    if (t->dtype != MT_ST_F32 && t->dtype != MT_ST_F16 && t->dtype != MT_ST_BF16)
        return mt_error(MT_ERR_UNSUPPORTED, "%s: tensor '%s' is %s; only F32, F16 and BF16 read "
                        "as f32", f->path, show(t->name).s, dtypes[t->dtype].name);
    if (first > t->count || count > t->count - first)
        return mt_error(MT_ERR_INVALID_ARG, "%s: elements %llu to %llu of tensor '%s' are asked "
                        "for, but it has %llu", f->path, (unsigned long long)first,
                        (unsigned long long)first + count, show(t->name).s,
                        (unsigned long long)t->count);
    if (count > SIZE_MAX / sizeof(float))
        return mt_error(MT_ERR_UNSUPPORTED, "%s: %zu elements of tensor '%s' are more than this "
                        "host's memory can address", f->path, count, show(t->name).s);
    char what[160];
    snprintf(what, sizeof what, "tensor '%s'", show(t->name).s);
    size_t size = dtypes[t->dtype].size;
    /* No overflow: the range lies inside the tensor, whose bytes lie inside the file. */
    uint64_t at = f->data_start + t->begin + first * size;
    if (t->dtype == MT_ST_F32) return read_at(f->fd, f->path, dst, count * size, at, what);

    uint16_t *buf = malloc(READ_CHUNK);
    if (!buf) return mt_error(MT_ERR_OUT_OF_MEMORY, "%s: out of memory reading %s", f->path, what);
    mt_status s = MT_OK;
    for (size_t done = 0; done < count;) {
        size_t k = count - done < READ_CHUNK / 2 ? count - done : READ_CHUNK / 2;
        s = read_at(f->fd, f->path, buf, k * 2, at + done * 2, what);
        if (s != MT_OK) break;
        float *o = dst + done;
        if (t->dtype == MT_ST_F16)
            for (size_t i = 0; i < k; i++) o[i] = mt_st_f16_to_f32(buf[i]);
        else
            for (size_t i = 0; i < k; i++) o[i] = mt_bf16_widen(buf[i]);
        done += k;
    }
    free(buf);
    return s;
}

mt_status mt_st_read_f32(mt_st_file *f, const mt_st_tensor *t, float *dst) {
    /* A count that does not fit size_t (32-bit hosts) is refused by the range check. */
    size_t count = t && t->count <= SIZE_MAX ? (size_t)t->count : SIZE_MAX;
    return mt_st_read_f32_range(f, t, 0, count, dst);
}

void mt_st_close(mt_st_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    mt_st_header_free(&f->header);
    free(f->path);
    free(f);
}

/* ---- writing --------------------------------------------------------------------------------- */

static mt_status write_all(int fd, const char *path, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        size_t piece = len < WRITE_CHUNK ? len : WRITE_CHUNK;
        ssize_t w = write(fd, p, piece);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return mt_error_errno(MT_ERR_IO, errno, "writing %s", path);
        p += w;
        len -= (size_t)w;
    }
    return MT_OK;
}

static int by_entry_name(const void *a, const void *b) {
    return strcmp((*(const mt_st_entry *const *)a)->name, (*(const mt_st_entry *const *)b)->name);
}

/* Every entry is well-formed and the names are unique; sizes[i] is entry i's bytes. */
static mt_status check_entries(const char *path, const mt_st_entry *e, size_t n, bool filled,
                               uint64_t *sizes) {
    for (size_t i = 0; i < n; i++) {
        if (!e[i].name || !e[i].name[0] || strcmp(e[i].name, METADATA_KEY) == 0)
            return mt_error(MT_ERR_INVALID_ARG, "writing %s: entry %zu's name is %s", path, i,
                            !e[i].name ? "NULL" : e[i].name[0] ? "reserved (" METADATA_KEY ")"
                                                                : "empty");
        if (e[i].ndim < 0 || e[i].ndim > MT_ST_MAX_DIMS)
            return mt_error(MT_ERR_INVALID_ARG, "writing %s: tensor '%s' has %d dimensions (0 to "
                            "%d allowed)", path, show(e[i].name).s, e[i].ndim, MT_ST_MAX_DIMS);
        uint64_t count = 1;
        for (int d = 0; d < e[i].ndim; d++) {
            if (e[i].shape[d] < 0)
                return mt_error(MT_ERR_INVALID_ARG, "writing %s: tensor '%s' has a negative "
                                "dimension %d", path, show(e[i].name).s, d);
            if (__builtin_mul_overflow(count, (uint64_t)e[i].shape[d], &count))
                return mt_error(MT_ERR_INVALID_ARG, "writing %s: tensor '%s' has more elements "
                                "than fit in 64 bits", path, show(e[i].name).s);
        }
        if (count > SIZE_MAX / sizeof(float) || count > INT64_MAX / sizeof(float))
            return mt_error(MT_ERR_INVALID_ARG, "writing %s: tensor '%s' is too large", path,
                            show(e[i].name).s);
        if (count && !e[i].data && !filled)
            return mt_error(MT_ERR_INVALID_ARG, "writing %s: tensor '%s' has no data", path,
                            show(e[i].name).s);
        sizes[i] = count * sizeof(float);
    }
    const mt_st_entry **sorted = malloc((n ? n : 1) * sizeof *sorted);
    if (!sorted) return mt_error(MT_ERR_OUT_OF_MEMORY, "writing %s: out of memory", path);
    for (size_t i = 0; i < n; i++) sorted[i] = &e[i];
    qsort(sorted, n, sizeof *sorted, by_entry_name);
    mt_status s = MT_OK;
    for (size_t i = 1; i < n && s == MT_OK; i++)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0)
            s = mt_error(MT_ERR_INVALID_ARG, "writing %s: tensor name '%s' is given twice", path,
                         show(sorted[i]->name).s);
    free(sorted);
    return s;
}

static json_t *shape_json(const mt_st_entry *e) {
    json_t *a = json_array();
    for (int d = 0; a && d < e->ndim; d++)
        if (json_array_append_new(a, json_integer(e->shape[d])) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* The header JSON: metadata first, then the tensors in the given order, packed back to back. */
static mt_status build_header(const char *path, const mt_st_entry *e, size_t n,
                              const uint64_t *sizes, const char *const *meta_kv, size_t n_meta,
                              json_t **out) {
    json_t *root = json_object();
    if (!root) return mt_error(MT_ERR_OUT_OF_MEMORY, "writing %s: out of memory", path);
    if (n_meta) {
        json_t *meta = json_object();
        if (!meta || json_object_set_new(root, METADATA_KEY, meta) != 0) goto oom;
        for (size_t i = 0; i < n_meta; i++) {
            const char *k = meta_kv[2 * i], *v = meta_kv[2 * i + 1];
            if (!k || !v) {
                json_decref(root);
                return mt_error(MT_ERR_INVALID_ARG, "writing %s: metadata pair %zu has a NULL "
                                "%s", path, i, k ? "value" : "key");
            }
            if (json_object_get(meta, k)) {
                json_decref(root);
                return mt_error(MT_ERR_INVALID_ARG, "writing %s: metadata key '%s' is given "
                                "twice", path, show(k).s);
            }
            json_t *jv = json_string(v);
            if (!jv || json_object_set_new(meta, k, jv) != 0) {
                json_decref(root);
                return mt_error(MT_ERR_INVALID_ARG, "writing %s: metadata '%s' is not valid "
                                "UTF-8 (or memory ran out)", path, show(k).s);
            }
        }
    }
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t end;
        if (__builtin_add_overflow(at, sizes[i], &end) || end > INT64_MAX) {
            json_decref(root);
            return mt_error(MT_ERR_INVALID_ARG, "writing %s: the tensors together are larger "
                            "than a file can be", path);
        }
        json_t *t = json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", shape_json(&e[i]),
                              "data_offsets", (json_int_t)at, (json_int_t)end);
        if (!t) goto oom;
        if (json_object_set_new(root, e[i].name, t) != 0) {
            json_decref(root);
            return mt_error(MT_ERR_INVALID_ARG, "writing %s: tensor name '%s' is not valid "
                            "UTF-8 (or memory ran out)", path, show(e[i].name).s);
        }
        at = end;
    }
    *out = root;
    return MT_OK;
oom:
    json_decref(root);
    return mt_error(MT_ERR_OUT_OF_MEMORY, "writing %s: out of memory building the header", path);
}

/* Makes the rename itself durable: the folder's entry must reach the disk too. */
static mt_status sync_parent(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir) return mt_error(MT_ERR_OUT_OF_MEMORY, "syncing the folder of %s", path);
    mt_status s = MT_OK;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0)
        s = mt_error_errno(MT_ERR_IO, errno, "syncing folder %s after writing %s", dir, path);
    if (fd >= 0) close(fd);
    free(dir);
    return s;
}

/* The data of entry i, from memory or from fill through a buffer of WRITE_CHUNK bytes. */
static mt_status write_entry(int fd, const char *tmp, const mt_st_entry *e, size_t i,
                             uint64_t bytes, mt_st_fill_fn fill, void *user, float *buf) {
    if (!fill) return write_all(fd, tmp, e[i].data, bytes);
    uint64_t count = bytes / sizeof(float);
    for (uint64_t done = 0; done < count;) {
        size_t k = count - done < WRITE_CHUNK / sizeof(float) ? (size_t)(count - done)
                                                              : WRITE_CHUNK / sizeof(float);
        mt_status s = fill(user, i, done, buf, k);
        if (s != MT_OK)
            return mt_error_wrap(s, "writing %s: the data of tensor '%s' (elements %llu to %llu)",
                                 tmp, show(e[i].name).s, (unsigned long long)done,
                                 (unsigned long long)(done + k));
        MT_TRY(write_all(fd, tmp, buf, k * sizeof(float)));
        done += k;
    }
    return MT_OK;
}

static mt_status write_file(const char *tmp, const char *text, size_t text_len, size_t padded,
                            const mt_st_entry *e, size_t n, const uint64_t *sizes,
                            mt_st_fill_fn fill, void *user) {
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return mt_error_errno(MT_ERR_IO, errno, "cannot create %s", tmp);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    char *pad = malloc(padded - text_len + 1);
    float *buf = fill ? malloc(WRITE_CHUNK) : NULL;
    mt_status s = MT_OK;
    if (!pad || (fill && !buf))
        s = mt_error(MT_ERR_OUT_OF_MEMORY, "writing %s: out of memory", tmp);
    if (pad) memset(pad, ' ', padded - text_len);
    if (s == MT_OK) s = write_all(fd, tmp, len8, 8);
    if (s == MT_OK) s = write_all(fd, tmp, text, text_len);
    if (s == MT_OK) s = write_all(fd, tmp, pad, padded - text_len);
    for (size_t i = 0; i < n && s == MT_OK; i++)
        s = write_entry(fd, tmp, e, i, sizes[i], fill, user, buf);
    if (s == MT_OK && fsync(fd) != 0) s = mt_error_errno(MT_ERR_IO, errno, "syncing %s", tmp);
    if (close(fd) != 0 && s == MT_OK) s = mt_error_errno(MT_ERR_IO, errno, "closing %s", tmp);
    free(pad);
    free(buf);
    return s;
}

mt_status mt_st_write(const char *path, const mt_st_entry *entries, size_t n,
                      const char *const *meta_kv, size_t n_meta) {
    return mt_st_write_filled(path, entries, n, meta_kv, n_meta, NULL, NULL);
}

mt_status mt_st_write_filled(const char *path, const mt_st_entry *entries, size_t n,
                             const char *const *meta_kv, size_t n_meta, mt_st_fill_fn fill,
                             void *user) {
    if (!path || (n && !entries) || (n_meta && !meta_kv))
        return mt_error(MT_ERR_INVALID_ARG, "mt_st_write: NULL argument");
    uint64_t *sizes = malloc((n ? n : 1) * sizeof *sizes);
    size_t tmp_len = strlen(path) + 5;
    char *tmp = malloc(tmp_len);
    json_t *root = NULL;
    char *text = NULL;
    mt_status s = MT_OK;
    if (!sizes || !tmp) s = mt_error(MT_ERR_OUT_OF_MEMORY, "writing %s: out of memory", path);
    if (s == MT_OK) s = check_entries(path, entries, n, fill != NULL, sizes);
    if (s == MT_OK) s = build_header(path, entries, n, sizes, meta_kv, n_meta, &root);
    if (s == MT_OK && !(text = json_dumps(root, JSON_COMPACT)))
        s = mt_error(MT_ERR_OUT_OF_MEMORY, "writing %s: out of memory for the header", path);
    if (s == MT_OK) {
        /* Spaces pad the header so that the data starts 8-byte aligned, as other writers do. */
        size_t text_len = strlen(text), padded = (text_len + 7) & ~(size_t)7;
        if (padded > MT_ST_MAX_HEADER_BYTES)
            s = mt_error(MT_ERR_INVALID_ARG, "writing %s: the header would be %zu bytes, over "
                         "the %u that readers accept (too many tensors or too much metadata)",
                         path, padded, MT_ST_MAX_HEADER_BYTES);
        if (s == MT_OK) {
            snprintf(tmp, tmp_len, "%s.tmp", path);
            s = write_file(tmp, text, text_len, padded, entries, n, sizes, fill, user);
            if (s == MT_OK && rename(tmp, path) != 0)
                s = mt_error_errno(MT_ERR_IO, errno, "renaming %s to %s", tmp, path);
            if (s != MT_OK) unlink(tmp);
            else s = sync_parent(path);
        }
    }
    free(text);
    json_decref(root);
    free(tmp);
    free(sizes);
    return s;
}
