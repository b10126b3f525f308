/* Every rank's unit must hold the same parameters: FSDP flattens them into one buffer and every
 * collective on it assumes the same layout. A rank whose model differs (an extra parameter, a
 * shape from another config) would otherwise fail later as "message truncated" in an all-gather,
 * or silently mix values. mt_fsdp_shard compares the lists through the store first and names the
 * first difference. */
#include "fsdp/fsdp_internal.h"
#include "mesh/agree.h"
#include "module/module_internal.h"

#include "core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ITEM_SEP "; "

/* "owner.name [d0xd1] S0" per parameter, ITEM_SEP between: global shapes, so that tp ranks
 * (which hold different slices of the same parameters) describe alike. */
static char *describe_params(const mt_fsdp_unit *u) {
    size_t cap = 64 + u->n_params * 64, len = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    s[0] = '\0';
    for (size_t i = 0; i < u->n_params; i++) {
        const mt_param *p = u->params[i];
        char item[512], dims[160] = "";
        size_t dl = 0;
        for (int d = 0; d < p->ndim && dl < sizeof dims; d++)
            dl += (size_t)snprintf(dims + dl, sizeof dims - dl, "%s%lld", d ? "x" : "",
                                   (long long)p->global_shape[d]);
        int n = snprintf(item, sizeof item, "%s%s.%s [%s]%s", i ? ITEM_SEP : "", p->owner->name,
                         p->name, dims, p->tp.kind == MT_TP_SHARD ? " tp-sharded" : "");
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
        memcpy(s + len, item, (size_t)n + 1);
        len += (size_t)n;
    }
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

/* Which ranks differ from rank 0, and the first parameter where the first of them does. */
static void describe_difference(char *const *values, int world, char *buf, size_t size) {
    int *ranks = calloc((size_t)world, sizeof *ranks), n = 0;
    if (!ranks) {
        snprintf(buf, size, "their parameter lists differ");
        return;
    }
    for (int r = 1; r < world; r++)
        if (strcmp(values[r], values[0]) != 0) ranks[n++] = r;
    char list[256];
    mt_format_rank_list(ranks, n, list, sizeof list);
    int first = n ? ranks[0] : 0;
    free(ranks);
    char a[512], b[512];
    size_t i = 0;
    bool has_a, has_b;
    for (;; i++) {
        has_a = nth_item(values[0], i, a, sizeof a);
        has_b = nth_item(values[first], i, b, sizeof b);
        if (!has_a || !has_b || strcmp(a, b) != 0) break;
    }
    snprintf(buf, size, "the unit's parameters differ on %s %s from rank 0's: at parameter %zu, "
             "rank 0 has %s, rank %d has %s", n == 1 ? "rank" : "ranks", list, i + 1,
             has_a ? a : "none (its list ends)", first, has_b ? b : "none (its list ends)");
}

mt_status mt_fsdp_check_ranks_agree(mt_fsdp_unit *u) {
    char *mine = describe_params(u);
    if (!mine) return mt_error(MT_ERR_OUT_OF_MEMORY, "out of host memory");
    mt_status st = mt_agree_with(mt_mesh_runtime(u->module->mesh), "mt_fsdp_shard", mine, NULL,
                                 describe_difference, NULL);
    free(mine);
    if (st == MT_ERR_MISMATCH) {
        /* mt_agree names the call generically; mt_fsdp_shard puts the unit in front. */
        const char *msg = strstr(mt_last_error(), "the ranks disagree: ");
        char saved[2048];
        snprintf(saved, sizeof saved, "%s", msg ? msg : mt_last_error());
        return mt_error(st, "%s", saved);
    }
    return st;
}
