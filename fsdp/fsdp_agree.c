/* Every rank's unit must hold the same parameters: FSDP flattens them into one buffer and every
 * collective on it assumes the same layout. A rank whose model differs (an extra parameter, a
 * shape from another config) would otherwise fail later as "message truncated" in an all-gather,
 * or silently mix values. mt_fsdp_shard first compares the lists within the unit's own groups
 * (shard, replicate, tp: ranks of other groups may hold other models, e.g. pipeline stages) and
 * names the first difference. */
#include "fsdp/fsdp_internal.h"
#include "mesh/agree.h" /* mt_format_rank_list */
#include "module/module_internal.h"

#include "core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ITEM_SEP "; "

/* "owner.name [d0xd1] tp-sharded" per parameter, ITEM_SEP between: global shapes, so that tp
 * ranks (which hold different slices of the same parameters) describe alike. */
static char *describe_params(const mt_fsdp_unit *u, size_t *len_out) {
    size_t cap = 64 + u->n_params * 64, len = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    s[0] = '\0';
    for (size_t i = 0; i < u->n_params; i++) {
        const mt_param *p = u->params[i];
        char dims[160] = "";
        size_t dl = 0;
        for (int d = 0; d < p->ndim && dl < sizeof dims; d++)
            dl += (size_t)snprintf(dims + dl, sizeof dims - dl, "%s%lld", d ? "x" : "",
                                   (long long)p->global_shape[d]);
        const char *fmt = "%s%s.%s [%s]%s";
        const char *sep = i ? ITEM_SEP : "";
        const char *split = p->tp.kind == MT_TP_SHARD ? " tp-sharded" : "";
        int n = snprintf(NULL, 0, fmt, sep, p->owner->name, p->name, dims, split);
        if (n < 0) continue;
        if (len + (size_t)n + 1 > cap) {
            cap = 2 * (len + (size_t)n + 1);
            char *grown = realloc(s, cap);
            if (!grown) {
                free(s);
                return NULL;
            }
            s = grown;
        }
        /* Written in place: names have no length limit. */
        snprintf(s + len, cap - len, fmt, sep, p->owner->name, p->name, dims, split);
        len += (size_t)n;
    }
    *len_out = len;
    return s;
}

/* The i-th item of a list (0-based) into out; false past the end. */
static bool nth_item(const char *list, size_t i, char *out, size_t cap) {
    const char *p = list;
    if (!*p) return false;
    for (size_t k = 0; k < i; k++) {
        p = strstr(p, ITEM_SEP);
        if (!p) return false;
        p += strlen(ITEM_SEP);
    }
    const char *end = strstr(p, ITEM_SEP);
    size_t n = end ? (size_t)(end - p) : strlen(p);
    snprintf(out, cap, "%.*s", (int)n, p);
    return true;
}

/* Which members differ from the group's first, and the first parameter where the first of them
 * does (ranks named globally). */
static void describe_difference(mt_group *g, char *const *values, char *buf, size_t size) {
    int n = mt_group_size(g), *ranks = calloc((size_t)n, sizeof *ranks), k = 0, first = 0;
    if (!ranks) {
        snprintf(buf, size, "their parameter lists differ");
        return;
    }
    for (int r = 1; r < n; r++)
        if (strcmp(values[r], values[0]) != 0) {
            if (k == 0) first = r;
            ranks[k++] = mt_group_global_rank(g, r);
        }
    char list[256];
    mt_format_rank_list(ranks, k, list, sizeof list);
    free(ranks);
    char a[512], b[512];
    size_t i = 0;
    bool has_a, has_b;
    for (;; i++) {
        has_a = nth_item(values[0], i, a, sizeof a);
        has_b = nth_item(values[first], i, b, sizeof b);
        if (!has_a || !has_b || strcmp(a, b) != 0) break;
    }
    int r0 = mt_group_global_rank(g, 0), rf = mt_group_global_rank(g, first);
    snprintf(buf, size, "the unit's parameters differ on %s %s of group '%s' from rank %d's: at "
             "parameter %zu, rank %d has %s, rank %d has %s", k == 1 ? "rank" : "ranks", list,
             mt_group_name(g), r0, i + 1, r0, has_a ? a : "none (its list ends)", rf,
             has_b ? b : "none (its list ends)");
}

/* Every member's description, through two all-gathers on host memory (lengths, then the bytes
 * padded to the longest, carried as f32 words: an all-gather copies them untouched). */
static mt_status gather_descriptions(mt_group *g, const char *mine, size_t len, char ***out) {
    int n = mt_group_size(g);
    float my_len = (float)len; /* exact below 2^24 characters */
    float *lens = malloc((size_t)n * sizeof *lens);
    char **values = calloc((size_t)n, sizeof *values);
    char *all = NULL, *padded = NULL;
    mt_status st = lens && values ? MT_OK
                                  : mt_error(MT_ERR_OUT_OF_MEMORY, "out of host memory");
    if (st == MT_OK) st = mt_all_gather(g, &my_len, lens, 1, MT_F32, NULL);
    size_t longest = 0;
    for (int r = 0; st == MT_OK && r < n; r++)
        if ((size_t)lens[r] > longest) longest = (size_t)lens[r];
    size_t words = (longest + 3) / 4 + 1;
    if (st == MT_OK) {
        padded = calloc(words, 4);
        all = malloc((size_t)n * words * 4);
        if (!padded || !all) st = mt_error(MT_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    if (st == MT_OK) {
        memcpy(padded, mine, len);
        st = mt_all_gather(g, padded, all, words, MT_F32, NULL);
    }
    for (int r = 0; st == MT_OK && r < n; r++) {
        size_t l = (size_t)lens[r];
        if (!(values[r] = malloc(l + 1))) {
            st = mt_error(MT_ERR_OUT_OF_MEMORY, "out of host memory");
            break;
        }
        memcpy(values[r], all + (size_t)r * words * 4, l);
        values[r][l] = '\0';
    }
    free(lens);
    free(padded);
    free(all);
    if (st != MT_OK) {
        for (int r = 0; values && r < n; r++) free(values[r]);
        free(values);
        return st;
    }
    *out = values;
    return MT_OK;
}

/* The members of g must describe the unit alike. Collective over g. */
static mt_status agree_over(mt_group *g, const char *mine, size_t len) {
    if (!g || mt_group_size(g) < 2) return MT_OK;
    char **values = NULL;
    MT_TRY(gather_descriptions(g, mine, len, &values));
    int n = mt_group_size(g);
    bool same = true;
    for (int r = 1; r < n && same; r++) same = strcmp(values[r], values[0]) == 0;
    char msg[1536];
    if (!same) describe_difference(g, values, msg, sizeof msg);
    for (int r = 0; r < n; r++) free(values[r]);
    free(values);
    return same ? MT_OK : mt_error(MT_ERR_MISMATCH, "the ranks disagree: %s", msg);
}

mt_status mt_fsdp_check_ranks_agree(mt_fsdp_unit *u) {
    size_t len = 0;
    char *mine = describe_params(u, &len);
    if (!mine) return mt_error(MT_ERR_OUT_OF_MEMORY, "out of host memory");
    /* The groups whose collectives assume one layout: the shard group's all-gathers and
     * reduce-scatters, HSDP's replicate all-reduce, and TP's (global shapes compare alike). */
    mt_status st = agree_over(u->shard, mine, len);
    if (st == MT_OK) st = agree_over(u->replicate, mine, len);
    if (st == MT_OK) st = agree_over(u->tp, mine, len);
    free(mine);
    return st;
}
