/* For safetensors_python.sh: `st_convert IN OUT` reads every tensor of IN as f32 with mt-ckpt's
 * reader and writes them, in IN's file order and with IN's metadata, as F32 to OUT with its
 * writer. Python then compares OUT with what it put in IN. Exits 1 with the error on failure. */
#include "tools/mt-ckpt/safetensors.h"

#include <stdio.h>
#include <stdlib.h>

static int convert(const char *in, const char *out) {
    mt_st_file *f;
    if (mt_st_open(in, &f) != MT_OK) return 1;
    const mt_st_header *h = mt_st_file_header(f);
    mt_st_entry *e = calloc(h->n_tensors + 1, sizeof *e);
    const char **meta = calloc(2 * h->n_meta + 1, sizeof *meta);
    int rc = e && meta ? 0 : 1;
    for (size_t i = 0; i < h->n_tensors && rc == 0; i++) {
        const mt_st_tensor *t = &h->tensors[i];
        float *data = malloc(t->count ? t->count * sizeof *data : 1);
        e[i] = (mt_st_entry){.name = t->name, .ndim = t->ndim, .data = data};
        for (int d = 0; d < t->ndim; d++) e[i].shape[d] = t->shape[d];
        if (!data || mt_st_read_f32(f, t, data) != MT_OK) rc = 1;
    }
    for (size_t i = 0; i < h->n_meta && meta; i++) {
        meta[2 * i] = h->meta_keys[i];
        meta[2 * i + 1] = h->meta_values[i];
    }
    if (rc == 0 && mt_st_write(out, e, h->n_tensors, meta, h->n_meta) != MT_OK) rc = 1;
    for (size_t i = 0; e && i < h->n_tensors; i++) free((void *)e[i].data);
    free(e);
    free(meta);
    mt_st_close(f);
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: st_convert IN.safetensors OUT.safetensors\n");
        return 2;
    }
    if (convert(argv[1], argv[2]) != 0) {
        fprintf(stderr, "st_convert: %s\n", mt_last_error());
        return 1;
    }
    return 0;
}
