/* Fuzzes mt-ckpt's safetensors header parser (tools/mt-ckpt/safetensors.c), the code that reads
 * a header anyone may have written. An input is 8 bytes (the data buffer's length, little-endian)
 * followed by the header JSON.
 *
 * Property: parsing never reads out of bounds or leaks (ASan), a refusal always says why, and
 * whatever is accepted is well-formed: the tensors, in file order, tile the data exactly, each
 * one's bytes are its shape times its dtype's size, every name is found by mt_st_header_find,
 * and the header rebuilt from what was parsed parses to the same thing.
 *
 * With libFuzzer (clang, ASan+UBSan), for as long as you like (docs/fuzzing.md):
 *   scripts/fuzz 600 fuzz_safetensors
 * Without it (ctest), a built-in driver mutates valid headers with a fixed seed;
 * `fuzz_safetensors --write-seeds DIR` writes those headers as a libFuzzer corpus.
 */
#include "numeric.h"
#include "tools/mt-ckpt/safetensors.h"

#include <meshtrain/status.h>

#include <jansson.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(const char *what, const uint8_t *data, size_t size) {
    fprintf(stderr, "fuzz_safetensors: %s (input of %zu bytes: %.*s)\n", what, size,
            size > 8 ? (int)(size - 8 < 400 ? size - 8 : 400) : 0, (const char *)data + 8);
    abort();
}

static json_t *rebuild(const mt_st_header *h) {
    json_t *root = json_object();
    if (h->n_meta) {
        json_t *meta = json_object();
        for (size_t i = 0; i < h->n_meta; i++)
            json_object_set_new(meta, h->meta_keys[i], json_string(h->meta_values[i]));
        json_object_set_new(root, "__metadata__", meta);
    }
    for (size_t i = 0; i < h->n_tensors; i++) {
        const mt_st_tensor *t = &h->tensors[i];
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_object_set_new(root, t->name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", mt_st_dtype_name(t->dtype),
                                      "shape", shape, "data_offsets", (json_int_t)t->begin,
                                      (json_int_t)t->end));
    }
    return root;
}

static bool same_header(const mt_st_header *a, const mt_st_header *b) {
    if (a->n_tensors != b->n_tensors || a->n_meta != b->n_meta) return false;
    for (size_t i = 0; i < a->n_tensors; i++) {
        const mt_st_tensor *x = &a->tensors[i], *y = &b->tensors[i];
        if (strcmp(x->name, y->name) || x->dtype != y->dtype || x->ndim != y->ndim ||
            x->count != y->count || x->begin != y->begin || x->end != y->end ||
            memcmp(x->shape, y->shape, sizeof x->shape[0] * (size_t)x->ndim))
            return false;
    }
    for (size_t i = 0; i < a->n_meta; i++)
        if (strcmp(a->meta_keys[i], b->meta_keys[i]) ||
            strcmp(a->meta_values[i], b->meta_values[i]))
            return false;
    return true;
}

static void check_accepted(const mt_st_header *h, uint64_t data_len, const uint8_t *data,
                           size_t size) {
    uint64_t pos = 0;
    for (size_t i = 0; i < h->n_tensors; i++) {
        const mt_st_tensor *t = &h->tensors[i];
        if ((unsigned)t->dtype >= MT_ST_DTYPE_COUNT || t->ndim < 0 || t->ndim > MT_ST_MAX_DIMS)
            fail("accepted a bad dtype or rank", data, size);
        uint64_t count = 1;
        bool empty = false;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0) fail("accepted a negative dimension", data, size);
            if (t->shape[d] == 0) empty = true;
            else if (__builtin_mul_overflow(count, (uint64_t)t->shape[d], &count))
                fail("accepted a shape whose product overflows", data, size);
        }
        if (empty) count = 0;
        uint64_t bytes;
        if (count != t->count ||
            __builtin_mul_overflow(count, mt_st_dtype_size(t->dtype), &bytes) ||
            bytes != t->end - t->begin)
            fail("accepted a tensor whose bytes differ from its shape", data, size);
        if (t->begin != pos || t->end < t->begin) fail("accepted an overlap or a hole", data, size);
        pos = t->end;
        if (mt_st_header_find(h, t->name) != t) fail("a tensor is not found by name", data, size);
    }
    if (pos != data_len) fail("accepted tensors that do not cover the data", data, size);
    for (size_t i = 1; i < h->n_tensors; i++)
        if (strcmp(h->by_name[i - 1]->name, h->by_name[i]->name) >= 0)
            fail("names are not unique and sorted", data, size);
    for (size_t i = 0; i < h->n_meta; i++)
        if (!h->meta_keys[i] || !h->meta_values[i] ||
            mt_st_header_meta(h, h->meta_keys[i]) != h->meta_values[i])
            fail("a metadata entry is missing", data, size);

    json_t *again = rebuild(h);
    char *text = json_dumps(again, JSON_COMPACT);
    json_decref(again);
    if (!text) fail("the parsed header does not serialize", data, size);
    mt_st_header h2;
    if (mt_st_parse_header(text, strlen(text), data_len, &h2) != MT_OK) {
        fprintf(stderr, "rebuilt: %s\nerror: %s\n", text, mt_last_error());
        fail("the rebuilt header is refused", data, size);
    }
    if (!same_header(h, &h2)) fail("the rebuilt header parses differently", data, size);
    mt_st_header_free(&h2);
    free(text);
}

/* Returns whether the input was accepted. */
static bool check_one(const uint8_t *data, size_t size) {
    if (size < 8) return false;
    uint64_t data_len = 0;
    for (int i = 7; i >= 0; i--) data_len = data_len << 8 | data[i];
    mt_st_header h;
    mt_clear_error();
    if (mt_st_parse_header(data + 8, size - 8, data_len, &h) != MT_OK) {
        if (!mt_last_error()[0]) fail("refused without a reason", data, size);
        if (h.tensors || h.n_tensors || h.meta_keys || h.n_meta)
            fail("a refusal left something behind", data, size);
        return false;
    }
    check_accepted(&h, data_len, data, size);
    mt_st_header_free(&h);
    return true;
}

#ifdef MT_FUZZ_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check_one(data, size);
    return 0;
}
#else

/* The fixed seed: the n-th draw is a hash of n. */
static uint64_t draws;
static uint32_t next(void) { return (uint32_t)(test_mix64(draws++) >> 32); }

/* Valid headers, as starting points for mutation. */
static const struct {
    uint64_t data_len;
    const char *json;
} seeds[] = {
    {0, "{}"},
    {24, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}"},
    {20, "{\"__metadata__\":{\"format\":\"pt\",\"k\":\"v\"},"
         "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[12,20]},"
         "\"e\":{\"dtype\":\"F16\",\"shape\":[0,5],\"data_offsets\":[12,12]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"s\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[8,12]}}        "},
    {33, "{\"x\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]},"
         "\"y\":{\"dtype\":\"F64\",\"shape\":[4],\"data_offsets\":[1,33]}}"},
    {16, "{\"\\u00e9\\n\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]},"
         "\"__metadata__\":{}}"},
    {6, "{\"t\":{\"dtype\":\"BOOL\",\"shape\":[3],\"data_offsets\":[0,3]},"
        "\"u\":{\"dtype\":\"F8_E4M3\",\"shape\":[3,1],\"data_offsets\":[3,6]}}"},
};
#define NSEEDS (sizeof seeds / sizeof *seeds)

/* Pieces a mutation may insert: the format's words and JSON's punctuation and numbers. */
static const char *const tokens[] = {
    "\"dtype\"", "\"shape\"", "\"data_offsets\"", "\"__metadata__\"", "\"F32\"", "\"F16\"",
    "\"BF16\"", "\"U8\"", "\"F4\"", "[", "]", "{", "}", ":", ",", "\"", "0", "-1", "8",
    "4294967296", "9223372036854775807", "18446744073709551616", "1.5", "null", "true",
    "\"\\u0000\"", "\\ud800", "[0,0]", "[]", " ",
};

static size_t encode(uint8_t *buf, uint64_t data_len, const char *json) {
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(data_len >> (8 * i));
    size_t n = strlen(json);
    memcpy(buf + 8, json, n);
    return 8 + n;
}

static int write_seeds(const char *dir) {
    uint8_t buf[1024];
    for (size_t i = 0; i < NSEEDS; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/seed-%zu", dir, i);
        FILE *f = fopen(path, "wb");
        if (!f) {
            perror(path);
            return 1;
        }
        fwrite(buf, 1, encode(buf, seeds[i].data_len, seeds[i].json), f);
        fclose(f);
    }
    return 0;
}

static void mutate(uint8_t *buf, size_t *len, size_t cap) {
    int edits = 1 + (int)(next() % 4);
    for (int e = 0; e < edits; e++) {
        size_t n = *len;
        switch (next() % 7) {
        case 0: /* flip a bit of the JSON */
            if (n > 8) buf[8 + next() % (n - 8)] ^= (uint8_t)(1u << (next() % 8));
            break;
        case 1: /* a random byte */
            if (n > 8) buf[8 + next() % (n - 8)] = (uint8_t)next();
            break;
        case 2: /* truncate */
            if (n > 8) *len = 8 + next() % (n - 8);
            break;
        case 3: { /* insert a token */
            const char *t = tokens[next() % (sizeof tokens / sizeof *tokens)];
            size_t tl = strlen(t), at = 8 + (n > 8 ? next() % (n - 8 + 1) : 0);
            if (n + tl > cap) break;
            memmove(buf + at + tl, buf + at, n - at);
            memcpy(buf + at, t, tl);
            *len = n + tl;
            break;
        }
        case 4: /* delete a run */
            if (n > 9) {
                size_t at = 8 + next() % (n - 8), k = 1 + next() % 8;
                if (at + k > n) k = n - at;
                memmove(buf + at, buf + at + k, n - at - k);
                *len = n - k;
            }
            break;
        case 5: { /* the data length: a little off, or anything */
            uint64_t d = 0;
            for (int i = 7; i >= 0; i--) d = d << 8 | buf[i];
            if (next() % 4) d += (uint64_t)(int)(next() % 17) - 8;
            else d = (uint64_t)next() << (next() % 40);
            for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(d >> (8 * i));
            break;
        }
        case 6: /* a digit changed */
            for (size_t k = 0; k < 16 && n > 8; k++) {
                size_t at = 8 + next() % (n - 8);
                if (buf[at] >= '0' && buf[at] <= '9') {
                    buf[at] = (uint8_t)('0' + next() % 10);
                    break;
                }
            }
            break;
        }
    }
}

int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "--write-seeds") == 0) return write_seeds(argv[2]);
    long iterations = argc > 1 ? atol(argv[1]) : 100000;
    uint8_t buf[2048];
    long accepted = 0;
    for (size_t i = 0; i < NSEEDS; i++) {
        size_t len = encode(buf, seeds[i].data_len, seeds[i].json);
        if (!check_one(buf, len)) {
            fprintf(stderr, "fuzz_safetensors: seed %zu refused: %s\n", i, mt_last_error());
            return 1;
        }
    }
    for (long it = 0; it < iterations; it++) {
        size_t s = next() % NSEEDS;
        size_t len = encode(buf, seeds[s].data_len, seeds[s].json);
        mutate(buf, &len, sizeof buf);
        if (check_one(buf, len)) accepted++;
    }
    printf("fuzz_safetensors: %ld mutated headers, %ld accepted, every check held\n", iterations,
           accepted);
    return accepted > 0 ? 0 : 1; /* no accepted input at all would mean the mutator is broken */
}
#endif
