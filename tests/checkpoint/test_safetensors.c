/* The safetensors reader and writer (tools/mt-ckpt/safetensors.c): a round trip of every shape
 * kind and special value through a file; every malformed header and file refused with a message
 * that says which tensor and why; the writer's refusals and its crash-safety (a failed write
 * leaves the old file and no temporary); F16 and BF16 widened exactly, all 65536 patterns each. */
#include "check.h"
#include "core/error.h"
#include "numeric.h"
#include "tools/mt-ckpt/safetensors.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[] = "/tmp/mt_safetensors.XXXXXX";

static const char *path_of(const char *name) {
    static char buf[4][512];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", dir, name);
    return p;
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* A file by hand: the header length (header_len, or the JSON's own length when -1), the JSON,
 * then data_len bytes of data. */
static void write_raw(const char *path, const char *json, long long header_len,
                      const void *data, size_t data_len) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    uint64_t n = header_len < 0 ? strlen(json) : (uint64_t)header_len;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(n >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(json, 1, strlen(json), f);
    if (data_len) fwrite(data, 1, data_len, f);
    fclose(f);
}

/* A header that must be refused with a message containing `want` (and status, unless 0). */
static void bad_header(const char *json, uint64_t data_len, mt_status status, const char *want) {
    mt_st_header h;
    mt_status s = mt_st_parse_header(json, strlen(json), data_len, &h);
    CHECK_MSG(s != MT_OK, "accepted: %s", json);
    if (s == MT_OK) {
        mt_st_header_free(&h);
        return;
    }
    CHECK_MSG(status == MT_OK || s == status, "%s: got %s", json, mt_status_str(s));
    CHECK_MSG(strstr(mt_last_error(), want), "%s\n  message: %s\n  wanted: %s", json,
              mt_last_error(), want);
    CHECK(h.n_tensors == 0 && h.tensors == NULL); /* nothing left to free on failure */
    printf("refused as expected: %s\n", mt_last_error());
}

static void test_bad_headers(void) {
    const mt_status INV = MT_ERR_INVALID_ARG;
    /* Not an object, or not JSON. */
    bad_header("[1, 2]", 0, INV, "does not begin with '{'");
    bad_header("", 0, INV, "it is empty");
    bad_header(" {}", 0, INV, "does not begin with '{'");
    bad_header("{\"a\": ", 0, INV, "not valid JSON");
    bad_header("{} trailing", 0, INV, "not valid JSON");
    bad_header("{\"a\": 1\x1b[2J}", 0, INV, "not valid JSON: '}' expected near '?'");
    bad_header("{\"a\": 5}", 0, INV, "tensor 'a' is an integer, not an object");
    /* Fields. */
    bad_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4, INV,
               "tensor 'a' has no \"data_offsets\"");
    bad_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4], "
               "\"layout\": 1}}", 4, INV, "tensor 'a' has an unknown field 'layout'");
    /* dtype. */
    bad_header("{\"w\": {\"dtype\": \"F33\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, INV,
               "tensor 'w': unknown dtype 'F33'");
    bad_header("{\"w\": {\"dtype\": 32, \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, INV,
               "tensor 'w': \"dtype\" is an integer, not a string");
    bad_header("{\"w\": {\"dtype\": \"F4\", \"shape\": [2], \"data_offsets\": [0, 1]}}", 1,
               MT_ERR_UNSUPPORTED, "tensor 'w': dtype F4 packs elements in less than a byte");
    /* shape. */
    bad_header("{\"w\": {\"dtype\": \"F32\", \"shape\": [2, -1], \"data_offsets\": [0, 0]}}", 0,
               INV, "tensor 'w': shape dimension 1 is negative (-1)");
    bad_header("{\"w\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], "
               "\"data_offsets\": [0, 1]}}", 1, INV,
               "tensor 'w': shape has 9 dimensions, more than the 8 supported");
    bad_header("{\"w\": {\"dtype\": \"F32\", \"shape\": [2.0], \"data_offsets\": [0, 8]}}", 8,
               INV, "tensor 'w': shape dimension 0 is a real number, not an integer");
    bad_header("{\"w\": {\"dtype\": \"F32\", \"shape\": 2, \"data_offsets\": [0, 8]}}", 8, INV,
               "tensor 'w': \"shape\" is an integer, not an array");
    /* The product of the shape overflows 64 bits: as elements, and as bytes. */
    bad_header("{\"w\": {\"dtype\": \"U8\", \"shape\": [4294967296, 4294967296], "
               "\"data_offsets\": [0, 0]}}", 0, INV,
               "tensor 'w': shape [4294967296, 4294967296] of U8 has more elements than fit in "
               "64 bits");
    bad_header("{\"w\": {\"dtype\": \"F64\", \"shape\": [1152921504606846976, 4], "
               "\"data_offsets\": [0, 0]}}", 0, INV, "has more bytes than fit in 64 bits");
    /* Size against the shape. */
    bad_header("{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 20]}}", 20,
               INV,
               "tensor 'w': shape [2, 3] of F32 is 24 bytes, but data_offsets [0, 20] hold 20");
    /* Offsets. */
    bad_header("{\"w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 12,
               INV, "tensor 'w': data_offsets [0, 16] run past the end of the data (12 bytes)");
    bad_header("{\"w\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 4]}}", 12, INV,
               "tensor 'w': data_offsets [8, 4] end before they begin");
    bad_header("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", 4, INV,
               "tensor 'w': data_offsets[0] is negative");
    bad_header("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4, 8]}}", 8,
               INV, "tensor 'w': \"data_offsets\" is an array of another length");
    bad_header("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, \"4\"]}}", 4,
               INV, "tensor 'w': data_offsets[1] is a string");
    /* Tensors against each other: overlap, hole in the middle, at the start, at the end. */
    bad_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
               " \"b\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, 24]}}", 24, INV,
               "tensor 'b' (bytes 8 to 24) overlaps tensor 'a' (bytes 0 to 16)");
    bad_header("{\"b\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
               " \"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 16, INV,
               "overlaps tensor");
    bad_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
               " \"z\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 8]}}", 16, INV,
               "tensor 'z' (bytes 8 to 8) overlaps tensor 'a' (bytes 0 to 16)");
    bad_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
               " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [12, 20]}}", 20, INV,
               "bytes 8 to 12 of the data belong to no tensor (a hole before tensor 'b')");
    bad_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}", 12, INV,
               "bytes 0 to 4 of the data belong to no tensor (a hole before tensor 'a')");
    bad_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 12, INV,
               "bytes 8 to 12 at the end of the data belong to no tensor");
    bad_header("{}", 4, INV, "bytes 0 to 4 at the end of the data belong to no tensor");
    /* Names: duplicates (one would shadow the other); a hostile name is escaped in messages. */
    bad_header("{\"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]},"
               " \"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [1, 2]}}", 2, INV,
               "duplicate object key");
    bad_header("{\"x\\ny\\u001b[31m\": {\"dtype\": \"BAD\", \"shape\": [1], "
               "\"data_offsets\": [0, 1]}}", 1, INV, "tensor 'x\\x0ay\\x1b[31m': unknown dtype");
    /* Metadata. */
    bad_header("{\"__metadata__\": [\"a\"]}", 0, INV,
               "\"__metadata__\" is an array, not an object of strings");
    bad_header("{\"__metadata__\": {\"format\": \"pt\", \"epoch\": 3}}", 0, INV,
               "metadata 'epoch' is an integer, not a string");
    bad_header("{\"__metadata__\": {\"x\": null}}", 0, INV, "metadata 'x' is null, not a string");
    /* A very long name is cut in the message, not copied whole. */
    char json[4096];
    char name[2001];
    memset(name, 'n', 2000);
    name[2000] = '\0';
    snprintf(json, sizeof json, "{\"%s\": 1}", name);
    bad_header(json, 0, INV, "nnn...' is an integer");
    CHECK(strlen(mt_last_error()) < 300);
}

static void test_good_headers(void) {
    /* JSON order differs from file order; empty tensors, a scalar, metadata, padding spaces. */
    const char *json =
        "{\"__metadata__\": {\"format\": \"mt\", \"note\": \"\\u00e9t\\u00e9\"},"
        " \"late\": {\"dtype\": \"BF16\", \"shape\": [2, 2], \"data_offsets\": [12, 20]},"
        " \"e1\": {\"dtype\": \"F32\", \"shape\": [0, 7], \"data_offsets\": [12, 12]},"
        " \"big0\": {\"dtype\": \"F64\", \"shape\": [9223372036854775807, 0], "
        "\"data_offsets\": [20, 20]},"
        " \"early\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
        " \"scalar\": {\"dtype\": \"I32\", \"shape\": [], \"data_offsets\": [8, 12]}}     ";
    mt_st_header h;
    CHECK_OK(mt_st_parse_header(json, strlen(json), 20, &h));
    CHECK(h.n_tensors == 5 && h.n_meta == 2);
    const char *order[] = {"early", "scalar", "e1", "late", "big0"};
    for (size_t i = 0; i < 5 && i < h.n_tensors; i++)
        CHECK_MSG(strcmp(h.tensors[i].name, order[i]) == 0, "file order %zu: %s", i,
                  h.tensors[i].name);
    const mt_st_tensor *t = mt_st_header_find(&h, "late");
    CHECK(t && t->dtype == MT_ST_BF16 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 2 &&
          t->count == 4 && t->begin == 12 && t->end == 20);
    t = mt_st_header_find(&h, "scalar");
    CHECK(t && t->ndim == 0 && t->count == 1 && t->dtype == MT_ST_I32);
    t = mt_st_header_find(&h, "e1");
    CHECK(t && t->count == 0 && t->ndim == 2 && t->shape[1] == 7);
    CHECK(mt_st_header_find(&h, "big0")->count == 0);
    CHECK(mt_st_header_find(&h, "missing") == NULL);
    CHECK(mt_st_header_find(&h, "__metadata__") == NULL);
    CHECK(strcmp(mt_st_header_meta(&h, "format"), "mt") == 0);
    CHECK(strcmp(mt_st_header_meta(&h, "note"), "\xc3\xa9t\xc3\xa9") == 0);
    CHECK(mt_st_header_meta(&h, "other") == NULL);
    mt_st_header_free(&h);
    CHECK(h.tensors == NULL && h.n_tensors == 0);
    mt_st_header_free(&h); /* twice is harmless */

    CHECK_OK(mt_st_parse_header("{}", 2, 0, &h));
    CHECK(h.n_tensors == 0 && h.n_meta == 0);
    mt_st_header_free(&h);
    /* Every byte-sized dtype the format names. */
    static const char *names[] = {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16",
                                  "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64"};
    CHECK(sizeof names / sizeof *names == MT_ST_DTYPE_COUNT);
    for (int d = 0; d < MT_ST_DTYPE_COUNT; d++) {
        char j[256];
        size_t sz = mt_st_dtype_size((mt_st_dtype)d);
        snprintf(j, sizeof j, "{\"t\":{\"dtype\":\"%s\",\"shape\":[3],\"data_offsets\":[0,%zu]}}",
                 names[d], 3 * sz);
        mt_status s = mt_st_parse_header(j, strlen(j), 3 * sz, &h);
        CHECK_MSG(s == MT_OK && h.tensors[0].dtype == (mt_st_dtype)d, "%s: %s", names[d],
                  mt_last_error());
        CHECK(strcmp(mt_st_dtype_name((mt_st_dtype)d), names[d]) == 0);
        if (s == MT_OK) mt_st_header_free(&h);
    }
}

/* Every F16 pattern against arithmetic: (1024 + m) x 2^(e - 25), or m x 2^-24 when subnormal;
 * NaNs keep sign and payload. */
static uint32_t f16_expected(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31u, m = h & 1023u;
    if (e == 31) return sign | 0x7f800000u | (m << 13);
    double v = e ? ldexp(1024.0 + m, (int)e - 25) : ldexp((double)m, -24);
    return sign | test_f32_bits((float)v);
}

static void test_conversions(void) {
    int wrong = 0;
    for (uint32_t p = 0; p < 65536; p++)
        if (test_f32_bits(mt_st_f16_to_f32((uint16_t)p)) != f16_expected((uint16_t)p)) wrong++;
    CHECK_MSG(wrong == 0, "%d F16 patterns convert wrongly", wrong);
    CHECK(mt_st_f16_to_f32(0x3c00) == 1.0f);
    CHECK(mt_st_f16_to_f32(0xc000) == -2.0f);
    CHECK(mt_st_f16_to_f32(0x7bff) == 65504.0f);
    CHECK(mt_st_f16_to_f32(0x0400) == 0x1p-14f);         /* smallest normal */
    CHECK(mt_st_f16_to_f32(0x03ff) == 0x3ffp-24f);       /* largest subnormal */
    CHECK(mt_st_f16_to_f32(0x0001) == 0x1p-24f);         /* smallest subnormal */
    CHECK(mt_st_f16_to_f32(0x8001) == -0x1p-24f);
    CHECK(mt_st_f16_to_f32(0x3555) == 0x1.554p-2f);      /* 0.333251953125 */
    CHECK(test_f32_bits(mt_st_f16_to_f32(0x8000)) == 0x80000000u); /* -0 */
    CHECK(isinf(mt_st_f16_to_f32(0x7c00)) && mt_st_f16_to_f32(0x7c00) > 0);
    CHECK(isinf(mt_st_f16_to_f32(0xfc00)) && mt_st_f16_to_f32(0xfc00) < 0);
    CHECK(test_f32_bits(mt_st_f16_to_f32(0x7e00)) == 0x7fc00000u); /* the quiet NaN */
    /* A signalling NaN: the payload is kept, nothing quiets it. */
    CHECK(test_f32_bits(mt_st_f16_to_f32(0xfd01)) == 0xffa02000u);
}

static mt_st_entry entry(const char *name, int ndim, const int64_t *shape, const float *data) {
    mt_st_entry e = {.name = name, .ndim = ndim, .data = data};
    for (int d = 0; d < ndim; d++) e.shape[d] = shape[d];
    return e;
}

static void test_round_trip(void) {
    /* Special values, a tensor larger than a write chunk (8 MiB), every shape kind. */
    static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
                                       0x7fc00000u, 0xffa00001u, 0x00000001u, 0x807fffffu,
                                       0x7f7fffffu, 0x3f800000u};
    float specials[10];
    for (int i = 0; i < 10; i++) specials[i] = test_f32_from_bits(special[i]);
    uint64_t rng = 42;
    size_t big_n = 3u << 20; /* 12 MiB */
    float *big = test_lcg_floats(&rng, big_n, 100.0);
    float *small = test_lcg_floats(&rng, 2 * 3 * 4, 1.0);
    float one = 3.5f;
    int64_t s_special[] = {10}, s_big[] = {3, 1 << 20}, s_small[] = {2, 3, 4}, s_empty[] = {4, 0},
            s_eight[] = {1, 2, 1, 3, 1, 2, 1, 2};
    float *eight = test_lcg_floats(&rng, 24, 1.0);
    mt_st_entry e[] = {entry("special", 1, s_special, specials),
                       entry("layer.0.weight", 2, s_big, big),
                       entry("small", 3, s_small, small),
                       entry("empty", 2, s_empty, NULL),
                       entry("scalar", 0, NULL, &one),
                       entry("eight", 8, s_eight, eight),
                       entry("\xe5\x90\x8d\xe5\x89\x8d", 1, s_special, specials)};
    size_t n = sizeof e / sizeof *e;
    const char *meta[] = {"format", "pt", "step", "1200"};
    const char *path = path_of("model.safetensors");
    CHECK_OK(mt_st_write(path, e, n, meta, 2));
    CHECK(!exists(path_of("model.safetensors.tmp")));

    /* The layout other readers rely on: header length a multiple of 8, space padding. */
    FILE *f = fopen(path, "rb");
    unsigned char len8[8];
    CHECK(f && fread(len8, 1, 8, f) == 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
    CHECK_MSG(hlen % 8 == 0, "header length %llu", (unsigned long long)hlen);
    char *hdr = malloc(hlen + 1);
    CHECK(fread(hdr, 1, hlen, f) == hlen);
    hdr[hlen] = '\0';
    fclose(f);
    CHECK(hdr[0] == '{');
    size_t end = strlen(hdr);
    while (end && hdr[end - 1] == ' ') end--;
    CHECK(hdr[end - 1] == '}' && hlen - end < 8);
    CHECK(strncmp(hdr, "{\"__metadata__\":{\"format\":\"pt\",\"step\":\"1200\"}", 44) == 0);
    free(hdr);

    mt_st_file *sf = NULL;
    CHECK_OK(mt_st_open(path, &sf));
    if (!sf) return;
    const mt_st_header *h = mt_st_file_header(sf);
    CHECK(h->n_tensors == n && h->n_meta == 2);
    CHECK(strcmp(mt_st_header_meta(h, "step"), "1200") == 0);
    for (size_t i = 0; i < n && i < h->n_tensors; i++) {
        const mt_st_tensor *t = &h->tensors[i];
        /* The given order is the file order (the empty one sits where it was written). */
        CHECK_MSG(strcmp(t->name, e[i].name) == 0, "order %zu: %s", i, t->name);
        CHECK(mt_st_find(sf, e[i].name) == t);
        CHECK(t->dtype == MT_ST_F32 && t->ndim == e[i].ndim);
        size_t count = 1;
        for (int d = 0; d < t->ndim; d++) {
            CHECK(t->shape[d] == e[i].shape[d]);
            count *= (size_t)e[i].shape[d];
        }
        CHECK(t->count == count);
        float *back = malloc((count ? count : 1) * sizeof *back);
        CHECK_OK(mt_st_read_f32(sf, t, back));
        CHECK_MSG(count == 0 || memcmp(back, e[i].data, count * sizeof *back) == 0,
                  "tensor %s differs after the round trip", t->name);
        free(back);
    }
    mt_st_close(sf);

    /* Writing again replaces the file whole. */
    CHECK_OK(mt_st_write(path, &e[2], 1, NULL, 0));
    CHECK_OK(mt_st_open(path, &sf));
    if (sf) {
        CHECK(mt_st_file_header(sf)->n_tensors == 1 && mt_st_file_header(sf)->n_meta == 0);
        CHECK(mt_st_find(sf, "small") && !mt_st_find(sf, "special"));
        mt_st_close(sf);
    }
    /* No tensors at all is a valid file too. */
    CHECK_OK(mt_st_write(path_of("none.safetensors"), NULL, 0, NULL, 0));
    CHECK_OK(mt_st_open(path_of("none.safetensors"), &sf));
    if (sf) {
        CHECK(mt_st_file_header(sf)->n_tensors == 0);
        mt_st_close(sf);
    }
    free(big);
    free(small);
    free(eight);
}

static void write_fails(const char *name, const mt_st_entry *e, size_t n, const char *const *meta,
                        size_t n_meta, const char *want) {
    const char *path = path_of(name);
    mt_status s = mt_st_write(path, e, n, meta, n_meta);
    CHECK_MSG(s != MT_OK, "%s: written", name);
    CHECK_MSG(strstr(mt_last_error(), want) && strstr(mt_last_error(), name), "%s\n  message: %s",
              name, mt_last_error());
    CHECK(!exists(path));
    printf("refused as expected: %s\n", mt_last_error());
}

static void test_writer_refuses(void) {
    float v[4] = {1, 2, 3, 4};
    int64_t s4[] = {4}, sneg[] = {2, -2}, shuge[] = {INT64_MAX, INT64_MAX};
    mt_st_entry dup[] = {entry("a", 1, s4, v), entry("b", 1, s4, v), entry("a", 1, s4, v)};
    write_fails("w1.safetensors", dup, 3, NULL, 0, "tensor name 'a' is given twice");
    mt_st_entry empty_name[] = {entry("", 1, s4, v)};
    write_fails("w2.safetensors", empty_name, 1, NULL, 0, "entry 0's name is empty");
    mt_st_entry reserved[] = {entry("__metadata__", 1, s4, v)};
    write_fails("w3.safetensors", reserved, 1, NULL, 0, "reserved");
    mt_st_entry nine = entry("t", 0, NULL, v);
    nine.ndim = 9;
    write_fails("w4.safetensors", &nine, 1, NULL, 0, "tensor 't' has 9 dimensions");
    mt_st_entry neg[] = {entry("t", 2, sneg, v)};
    write_fails("w5.safetensors", neg, 1, NULL, 0, "negative dimension 1");
    mt_st_entry nodata[] = {entry("t", 1, s4, NULL)};
    write_fails("w6.safetensors", nodata, 1, NULL, 0, "tensor 't' has no data");
    mt_st_entry huge[] = {entry("t", 2, shuge, v)};
    write_fails("w7.safetensors", huge, 1, NULL, 0, "more elements than fit in 64 bits");
    const char *meta_dup[] = {"k", "1", "k", "2"};
    write_fails("w8.safetensors", dup, 2, meta_dup, 2, "metadata key 'k' is given twice");
    mt_st_entry bad_utf8[] = {entry("\xff\xfe", 1, s4, v)};
    write_fails("w9.safetensors", bad_utf8, 1, NULL, 0,
                "tensor name '\\xff\\xfe' is not valid UTF-8");
    write_fails("no/such/folder.safetensors", dup, 1, NULL, 0, "cannot create");
}

/* A write that fails half-way (the file size limit stands in for a full disk) reports the file,
 * leaves the previous file as it was and removes its temporary. */
static void test_write_failure_keeps_old_file(void) {
    const char *path = path_of("keep.safetensors");
    float old[2] = {7, 8};
    int64_t s2[] = {2};
    mt_st_entry e_old = entry("old", 1, s2, old);
    CHECK_OK(mt_st_write(path, &e_old, 1, NULL, 0));

    size_t n = 1u << 20;
    float *big = calloc(n, sizeof *big);
    int64_t sn[] = {(int64_t)n};
    mt_st_entry e_big = entry("big", 1, sn, big);
    struct rlimit saved, small;
    CHECK(getrlimit(RLIMIT_FSIZE, &saved) == 0);
    small = saved;
    small.rlim_cur = 64 * 1024;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0);
    mt_status s = mt_st_write(path, &e_big, 1, NULL, 0);
    CHECK(setrlimit(RLIMIT_FSIZE, &saved) == 0);
    signal(SIGXFSZ, prev);
    CHECK(s == MT_ERR_IO);
    CHECK_MSG(strstr(mt_last_error(), "writing ") &&
                  strstr(mt_last_error(), "keep.safetensors.tmp"), "%s", mt_last_error());
    printf("refused as expected: %s\n", mt_last_error());
    CHECK(!exists(path_of("keep.safetensors.tmp")));
    mt_st_file *f = NULL;
    CHECK_OK(mt_st_open(path, &f));
    if (f) {
        float back[2];
        const mt_st_tensor *t = mt_st_find(f, "old");
        CHECK(t && mt_st_read_f32(f, t, back) == MT_OK && back[0] == 7 && back[1] == 8);
        mt_st_close(f);
    }
    free(big);
}

static void bad_file(const char *name, mt_status status, const char *want) {
    mt_st_file *f = (mt_st_file *)1;
    mt_status s = mt_st_open(path_of(name), &f);
    CHECK_MSG(s == status, "%s: got %s (%s)", name, mt_status_str(s), mt_last_error());
    CHECK(f == NULL);
    CHECK_MSG(strstr(mt_last_error(), want) && strstr(mt_last_error(), name),
              "%s\n  message: %s\n  wanted: %s", name, mt_last_error(), want);
    printf("refused as expected: %s\n", mt_last_error());
}

static void test_bad_files(void) {
    const char *one = "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    float data[4] = {1, 2, 3, 4};
    bad_file("absent.safetensors", MT_ERR_NOT_FOUND, "cannot open safetensors file");
    FILE *f = fopen(path_of("short.safetensors"), "wb");
    fwrite("\x10\0\0\0", 1, 4, f);
    fclose(f);
    bad_file("short.safetensors", MT_ERR_INVALID_ARG, "is 4 bytes, too short");
    write_raw(path_of("beyond.safetensors"), one, 4096, data, 16);
    char want[128];
    snprintf(want, sizeof want, "header length 4096 runs past the end of the file (%zu bytes)",
             8 + strlen(one) + 16);
    bad_file("beyond.safetensors", MT_ERR_INVALID_ARG, want);
    write_raw(path_of("huge.safetensors"), one, 200000000, data, 16);
    bad_file("huge.safetensors", MT_ERR_INVALID_ARG, "header length 200000000 is over the limit");
    /* Truncated: the data ends before the last tensor does. */
    write_raw(path_of("truncated.safetensors"), one, -1, data, 12);
    bad_file("truncated.safetensors", MT_ERR_INVALID_ARG,
             "tensor 'w': data_offsets [0, 16] run past the end of the data (12 bytes)");
    write_raw(path_of("badjson.safetensors"), "{\"w\":", -1, NULL, 0);
    bad_file("badjson.safetensors", MT_ERR_INVALID_ARG, "the header is not valid JSON");
    mkdir(path_of("adir"), 0755);
    bad_file("adir", MT_ERR_INVALID_ARG, "is not a regular file");

    /* A non-float dtype is described but not read as f32. */
    write_raw(path_of("ints.safetensors"),
              "{\"i\":{\"dtype\":\"I32\",\"shape\":[4],\"data_offsets\":[0,16]}}", -1, data, 16);
    mt_st_file *sf = NULL, *other = NULL;
    CHECK_OK(mt_st_open(path_of("ints.safetensors"), &sf));
    write_raw(path_of("good.safetensors"), one, -1, data, 16);
    CHECK_OK(mt_st_open(path_of("good.safetensors"), &other));
    if (sf && other) {
        float out[4];
        CHECK(mt_st_read_f32(sf, mt_st_find(sf, "i"), out) == MT_ERR_UNSUPPORTED);
        CHECK(strstr(mt_last_error(), "tensor 'i' is I32; only F32, F16 and BF16 read as f32"));
        CHECK(mt_st_read_f32(sf, mt_st_find(other, "w"), out) == MT_ERR_INVALID_ARG);
        /* Truncated after it was opened: the read says where the file ended. */
        CHECK(truncate(path_of("good.safetensors"), 8 + (off_t)strlen(one) + 8) == 0);
        CHECK(mt_st_read_f32(other, mt_st_find(other, "w"), out) == MT_ERR_IO);
        CHECK_MSG(strstr(mt_last_error(), "ends at byte") &&
                      strstr(mt_last_error(), "in the middle of tensor 'w'"),
                  "%s", mt_last_error());
    }
    mt_st_close(sf);
    mt_st_close(other);
}

/* F16 and BF16 tensors in a file: every bit pattern, three times over (so the conversion crosses
 * its buffer), read back as f32 exactly. */
static void test_half_files(void) {
    size_t n = 3 * 65536;
    uint16_t *raw = malloc(n * 2);
    for (size_t i = 0; i < n; i++) raw[i] = (uint16_t)(i * 40503u); /* odd: a permutation */
    char json[256];
    snprintf(json, sizeof json,
             "{\"h\":{\"dtype\":\"F16\",\"shape\":[3,65536],\"data_offsets\":[0,%zu]},"
             "\"b\":{\"dtype\":\"BF16\",\"shape\":[65536,3],\"data_offsets\":[%zu,%zu]}}",
             n * 2, n * 2, n * 4);
    FILE *f = fopen(path_of("half.safetensors"), "wb");
    uint64_t hl = strlen(json);
    fwrite(&hl, 8, 1, f); /* the host is little-endian, as the format */
    fwrite(json, 1, hl, f);
    fwrite(raw, 2, n, f);
    fwrite(raw, 2, n, f);
    fclose(f);
    mt_st_file *sf = NULL;
    CHECK_OK(mt_st_open(path_of("half.safetensors"), &sf));
    if (!sf) return;
    float *out = malloc(n * sizeof *out);
    CHECK_OK(mt_st_read_f32(sf, mt_st_find(sf, "h"), out));
    int wrong = 0;
    for (size_t i = 0; i < n; i++) wrong += test_f32_bits(out[i]) != f16_expected(raw[i]);
    CHECK_MSG(wrong == 0, "%d F16 values read wrongly", wrong);
    CHECK_OK(mt_st_read_f32(sf, mt_st_find(sf, "b"), out));
    wrong = 0;
    for (size_t i = 0; i < n; i++) wrong += test_f32_bits(out[i]) != (uint32_t)raw[i] << 16;
    CHECK_MSG(wrong == 0, "%d BF16 values read wrongly", wrong);
    /* A part of the F16 tensor that starts off a buffer boundary and crosses two. */
    size_t first = 1000, count = n - first - 7;
    CHECK_OK(mt_st_read_f32_range(sf, mt_st_find(sf, "h"), first, count, out));
    wrong = 0;
    for (size_t i = 0; i < count; i++)
        wrong += test_f32_bits(out[i]) != f16_expected(raw[first + i]);
    CHECK_MSG(wrong == 0, "%d F16 values of a range read wrongly", wrong);
    mt_st_close(sf);
    free(out);
    free(raw);
}

/* The values a fill callback gives: exact in f32, defined by (entry, element). */
static float filled_value(size_t index, uint64_t element) {
    return (float)(int32_t)(test_mix64((uint64_t)index << 40 | element) % 16777216u) - 8388608.0f;
}

typedef struct fill_log {
    size_t index;
    uint64_t next;   /* the element the next call must start at */
    bool in_order;
    size_t calls;
    uint64_t fail_at; /* fail the call that reaches this element (0: never) */
} fill_log;

static mt_status fill(void *user, size_t index, uint64_t first, float *buf, size_t count) {
    fill_log *log = user;
    if (index != log->index) {
        log->in_order = log->in_order && index == log->index + 1 && log->next > 0;
        log->index = index;
        log->next = 0;
    }
    log->in_order = log->in_order && first == log->next && count > 0;
    log->next = first + count;
    log->calls++;
    if (log->fail_at && first + count > log->fail_at)
        return mt_error(MT_ERR_IO, "the source shard went away");
    for (size_t i = 0; i < count; i++) buf[i] = filled_value(index, first + i);
    return MT_OK;
}

/* Data that is never in memory whole: written through fill, read back in pieces. */
static void test_filled_and_ranges(void) {
    int64_t s_a[] = {3, 1 << 20}, s_b[] = {5};
    mt_st_entry e[] = {entry("a", 2, s_a, NULL), entry("b", 1, s_b, NULL)};
    const char *path = path_of("filled.safetensors");
    fill_log log = {.in_order = true};
    CHECK_OK(mt_st_write_filled(path, e, 2, NULL, 0, fill, &log));
    CHECK_MSG(log.in_order && log.index == 1 && log.next == 5 && log.calls == 3,
              "fill asked out of order (%zu calls)", log.calls);
    mt_st_file *f = NULL;
    CHECK_OK(mt_st_open(path, &f));
    if (!f) return;
    const mt_st_tensor *a = mt_st_find(f, "a");
    size_t piece = 1000003;
    float *buf = malloc(piece * sizeof *buf);
    int wrong = 0;
    for (uint64_t first = 0; a && first < a->count; first += piece) {
        size_t k = a->count - first < piece ? (size_t)(a->count - first) : piece;
        CHECK_OK(mt_st_read_f32_range(f, a, first, k, buf));
        for (size_t i = 0; i < k; i++) wrong += buf[i] != filled_value(0, first + i);
    }
    CHECK_MSG(wrong == 0, "%d values of 'a' read back wrongly", wrong);
    float b[5];
    CHECK_OK(mt_st_read_f32(f, mt_st_find(f, "b"), b));
    CHECK(b[0] == filled_value(1, 0) && b[4] == filled_value(1, 4));
    CHECK_OK(mt_st_read_f32_range(f, a, a->count, 0, NULL)); /* an empty range at the end */
    CHECK(mt_st_read_f32_range(f, a, a->count - 2, 3, buf) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "elements 3145726 to 3145729 of tensor 'a' are asked for, "
                                      "but it has 3145728"), "%s", mt_last_error());
    mt_st_close(f);
    free(buf);

    /* A failing fill fails the write: the previous file stays, no temporary is left. */
    log = (fill_log){.in_order = true, .fail_at = (uint64_t)3 << 20};
    mt_status st = mt_st_write_filled(path, e + 1, 1, NULL, 0, fill, &log);
    CHECK(st == MT_OK); /* 'b' alone: 5 elements, below fail_at */
    log = (fill_log){.in_order = true, .fail_at = (uint64_t)5 << 19};
    st = mt_st_write_filled(path, e, 2, NULL, 0, fill, &log);
    CHECK(st == MT_ERR_IO);
    CHECK_MSG(strstr(mt_last_error(), "filled.safetensors.tmp: the data of tensor 'a' (elements "
                                      "2097152 to 3145728): the source shard went away"),
              "%s", mt_last_error());
    CHECK(!exists(path_of("filled.safetensors.tmp")));
    CHECK_OK(mt_st_open(path, &f));
    if (f) {
        CHECK(mt_st_file_header(f)->n_tensors == 1 && mt_st_find(f, "b"));
        mt_st_close(f);
    }
}

static void remove_dir(void) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

int main(void) {
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_bad_headers();
    test_good_headers();
    test_conversions();
    test_round_trip();
    test_writer_refuses();
    test_write_failure_keeps_old_file();
    test_bad_files();
    test_half_files();
    test_filled_and_ranges();
    remove_dir();
    return check_report("test_safetensors");
}
