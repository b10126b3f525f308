/* The safetensors file format, for mt-ckpt's export and import: reading a file someone else wrote
 * (any of the usual dtypes described; F32, F16 and BF16 read as f32) and writing f32 tensors.
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON (the header) and the data
 * buffer. The header is an object: one entry per tensor, "name": {"dtype": "F32", "shape": [2, 3],
 * "data_offsets": [begin, end]} with byte offsets into the data buffer, and an optional
 * "__metadata__": {"key": "value", ...} of strings. The tensors together cover the buffer exactly
 * (no holes, no overlaps). Everything in a file is untrusted: mt_st_parse_header checks all of it
 * before anything uses an offset or a shape.
 */
#ifndef MT_TOOLS_MT_CKPT_SAFETENSORS_H
#define MT_TOOLS_MT_CKPT_SAFETENSORS_H

#include <meshtrain/status.h>

#include <stddef.h>
#include <stdint.h>

#define MT_ST_MAX_DIMS 8
/* The reference implementation refuses larger headers; so do we, so that a hostile length cannot
 * make us allocate gigabytes. */
#define MT_ST_MAX_HEADER_BYTES 100000000u

/* The dtypes the format defines with whole bytes per element. Sub-byte ones (F4, F6) are refused
 * as unsupported. */
typedef enum mt_st_dtype {
    MT_ST_BOOL,
    MT_ST_U8,
    MT_ST_I8,
    MT_ST_F8_E5M2,
    MT_ST_F8_E4M3,
    MT_ST_F8_E8M0,
    MT_ST_I16,
    MT_ST_U16,
    MT_ST_F16,
    MT_ST_BF16,
    MT_ST_I32,
    MT_ST_U32,
    MT_ST_F32,
    MT_ST_F64,
    MT_ST_I64,
    MT_ST_U64,
    MT_ST_DTYPE_COUNT
} mt_st_dtype;

/* The format's name ("BF16") and the size of one element in bytes. */
const char *mt_st_dtype_name(mt_st_dtype dtype);
size_t mt_st_dtype_size(mt_st_dtype dtype);
/* IEEE binary16 to f32, exactly: subnormals become normal f32s, infinities stay, NaNs keep their
 * sign and payload bits. */
float mt_st_f16_to_f32(uint16_t bits);

typedef struct mt_st_tensor {
    char *name;
    mt_st_dtype dtype;
    int ndim; /* 0 to MT_ST_MAX_DIMS; 0 is a scalar (one element) */
    int64_t shape[MT_ST_MAX_DIMS];
    uint64_t count;      /* elements: the product of the shape */
    uint64_t begin, end; /* bytes [begin, end) of the data buffer; end - begin = count x size */
} mt_st_tensor;

/* A parsed, validated header. */
typedef struct mt_st_header {
    mt_st_tensor *tensors; /* in file order: by begin (empty tensors where they stand) */
    size_t n_tensors;
    char **meta_keys, **meta_values; /* "__metadata__", in the order written */
    size_t n_meta;
    const mt_st_tensor **by_name; /* the tensors sorted by name, for mt_st_header_find */
} mt_st_header;

/* Parses and validates the header JSON (json_len bytes, not NUL-terminated) of a file whose data
 * buffer has data_len bytes. Touches nothing but *out and the calling thread's error: on failure
 * *out is empty and the message names the tensor and what is wrong with it. */
mt_status mt_st_parse_header(const void *json, size_t json_len, uint64_t data_len,
                             mt_st_header *out);
void mt_st_header_free(mt_st_header *header);
/* The tensor called name, or NULL. */
const mt_st_tensor *mt_st_header_find(const mt_st_header *header, const char *name);
/* The value of metadata key, or NULL. */
const char *mt_st_header_meta(const mt_st_header *header, const char *key);

/* ---- reading a file -------------------------------------------------------------------------- */

typedef struct mt_st_file mt_st_file;

/* Opens path and validates its header against the file's real size. */
mt_status mt_st_open(const char *path, mt_st_file **out);
/* Its header: iterate header->tensors[0 .. n_tensors) for the file order. */
const mt_st_header *mt_st_file_header(const mt_st_file *file);
/* The tensor called name, or NULL. */
const mt_st_tensor *mt_st_find(const mt_st_file *file, const char *name);
/* Reads tensor (one of file's) into dst, tensor->count floats, converting F16 and BF16 exactly
 * (subnormals, infinities and NaN payloads kept). Other dtypes: MT_ERR_UNSUPPORTED. */
mt_status mt_st_read_f32(mt_st_file *file, const mt_st_tensor *tensor, float *dst);
/* The same for elements [first, first + count) of the tensor (row-major), so that a tensor
 * larger than memory, or the part one shard needs, can be read piece by piece. */
mt_status mt_st_read_f32_range(mt_st_file *file, const mt_st_tensor *tensor, uint64_t first,
                               size_t count, float *dst);
void mt_st_close(mt_st_file *file);

/* ---- writing a file -------------------------------------------------------------------------- */

/* One tensor to write, as F32. data holds the product of the shape floats, row-major. */
typedef struct mt_st_entry {
    const char *name;
    int ndim;
    int64_t shape[MT_ST_MAX_DIMS];
    const float *data;
} mt_st_entry;

/* Writes the n entries, in that order, and n_meta metadata pairs (meta_kv holds 2 x n_meta
 * strings: key, value, key, value, ...) to path. Crash-safe: written to "<path>.tmp", fsynced,
 * renamed over path, and the folder fsynced, so path is either the old file or the whole new
 * one. Names must be unique, non-empty and not "__metadata__". */
mt_status mt_st_write(const char *path, const mt_st_entry *entries, size_t n,
                      const char *const *meta_kv, size_t n_meta);

/* Produces elements [first, first + count) of entry `index` (row-major) into buf. */
typedef mt_status (*mt_st_fill_fn)(void *user, size_t index, uint64_t first, float *buf,
                                   size_t count);
/* mt_st_write for data that is not in memory all at once (an export of a model larger than
 * memory): the entries' data pointers are ignored, and fill is asked for each tensor's values
 * in order, a few MiB at a time. A failure of fill fails the write (the old file stays). */
mt_status mt_st_write_filled(const char *path, const mt_st_entry *entries, size_t n,
                             const char *const *meta_kv, size_t n_meta, mt_st_fill_fn fill,
                             void *user);

#endif
