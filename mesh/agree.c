/* Agreement through the store: ranks publish under mt/agree/<what>/<n>/<rank>, where n counts the
 * agreements of that kind this rank made (kept in the store, so the library holds no global
 * state). Only rank 0 reads every value; the others wait for its verdict, so the store traffic is
 * linear in the world size. */
#include "mesh/abort_key.h"
#include "mesh/agree.h"

#include "core/clock.h"
#include "core/error.h"
#include "store/store_internal.h"

#include <meshtrain/store.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VERDICT_OK "ok"

/* Waits until key exists, or the job's abort does (a rank that gave up will never publish its
 * part: stop now with its status and message rather than at MT_TIMEOUT_S). waiting_for says,
 * on a timeout, what did not come. *value (may be NULL) gets the key's value; the caller frees
 * it. */
static mt_status wait_key_or_abort(mt_store *store, const char *what, const char *waiting_for,
                                   const char *key, double timeout_s, void **value) {
    const char *keys[2] = {key, MT_JOB_ABORT_KEY};
    int which = 0;
    void *v = NULL;
    mt_status wst = mt_store_wait_any(store, keys, 2, timeout_s, &which, &v, NULL);
    if (wst != MT_OK) return mt_error_wrap(wst, "%s: %s", what, waiting_for);
    if (which == 0) {
        if (value) *value = v;
        else free(v);
        return MT_OK;
    }
    mt_status cause;
    const char *why = mt_store_abort_parse(v, &cause);
    mt_status st = mt_error(cause, "%s: stopped because the job was aborted: %s", what, why);
    free(v);
    return st;
}

void mt_format_rank_list(const int *ranks, int n, char *buf, size_t size) {
    size_t len = 0;
    if (size) buf[0] = '\0';
    for (int i = 0; i < n && len < size;) {
        int j = i;
        while (j + 1 < n && ranks[j + 1] == ranks[j] + 1) j++;
        int k = j == i ? snprintf(buf + len, size - len, "%s%d", i ? "," : "", ranks[i])
                       : snprintf(buf + len, size - len, "%s%d-%d", i ? "," : "", ranks[i], ranks[j]);
        if (k < 0) break;
        len += (size_t)k;
        i = j + 1;
    }
}

void mt_agree_free_extras(char **extras, int world) {
    if (!extras) return;
    for (int r = 0; r < world; r++) free(extras[r]);
    free(extras);
}

/* "ranks 0-1 passed A; ranks 2-3 passed B" over the distinct values. */
static void describe_disagreement(char **values, int world, char *buf, size_t size) {
    int *ranks = malloc((size_t)world * sizeof *ranks);
    char *seen = calloc((size_t)world, 1);
    size_t len = 0;
    buf[0] = '\0';
    if (!ranks || !seen) {
        snprintf(buf, size, "ranks passed different values");
    } else {
        for (int r = 0; r < world && len < size; r++) {
            if (seen[r]) continue;
            int n = 0;
            for (int q = r; q < world; q++) {
                if (!seen[q] && strcmp(values[q], values[r]) == 0) {
                    seen[q] = 1;
                    ranks[n++] = q;
                }
            }
            char list[256];
            mt_format_rank_list(ranks, n, list, sizeof list);
            int k = snprintf(buf + len, size - len, "%s%s %s passed %s", len ? "; " : "",
                             n == 1 ? "rank" : "ranks", list, values[r]);
            if (k < 0) break;
            len += (size_t)k;
        }
    }
    free(ranks);
    free(seen);
}

/* Rank 0: reads every rank's value, splits "mine\nextra", compares, publishes the verdict. */
static mt_status judge(mt_runtime *rt, mt_store *store, const char *prefix, const char *what,
                       char ***extras_out, char *verdict, size_t verdict_size) {
    int world = mt_runtime_world_size(rt);
    char **keys = calloc((size_t)world, sizeof *keys);
    char **values = calloc((size_t)world, sizeof *values);
    char **extras = calloc((size_t)world, sizeof *extras);
    mt_status st = MT_OK;
    if (!keys || !values || !extras)
        st = mt_error(MT_ERR_OUT_OF_MEMORY, "%s: out of memory checking the ranks agree", what);
    for (int r = 0; r < world && st == MT_OK; r++) {
        size_t n = strlen(prefix) + 16;
        if (!(keys[r] = malloc(n))) {
            st = mt_error(MT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
            break;
        }
        snprintf(keys[r], n, "%s/%d", prefix, r);
    }
    /* One key at a time, each wait also ended by the job's abort, within one deadline. */
    double deadline = mt_clock_now_s() + mt_runtime_timeout(rt);
    for (int r = 0; r < world && st == MT_OK; r++) {
        double left = deadline - mt_clock_now_s();
        st = wait_key_or_abort(store, what, "not every rank called it", keys[r],
                               left > 0 ? left : 0.001, NULL);
    }
    for (int r = 0; r < world && st == MT_OK; r++) {
        void *v = NULL;
        size_t len = 0;
        st = mt_store_get(store, keys[r], mt_runtime_timeout(rt), &v, &len);
        if (st != MT_OK) break;
        char *nl = strchr(v, '\n');
        if (nl) *nl = '\0';
        values[r] = v;
        extras[r] = strdup(nl ? nl + 1 : "");
        if (!extras[r]) st = mt_error(MT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
        mt_store_delete(store, keys[r], NULL); /* read once, by this rank only */
    }
    if (st == MT_OK) {
        int same = 1;
        for (int r = 1; r < world && same; r++) same = strcmp(values[r], values[0]) == 0;
        if (same)
            snprintf(verdict, verdict_size, VERDICT_OK);
        else
            describe_disagreement(values, world, verdict, verdict_size);
    } else {
        snprintf(verdict, verdict_size, "rank 0 could not check: %s", mt_last_error());
    }
    for (int r = 0; r < world; r++) {
        if (keys) free(keys[r]);
        if (values) free(values[r]);
    }
    free(keys);
    free(values);
    if (st == MT_OK && extras_out)
        *extras_out = extras;
    else
        mt_agree_free_extras(extras, world);
    return st;
}

mt_status mt_agree(mt_runtime *rt, const char *what, const char *mine, const char *extra,
                   char ***extras) {
    if (extras) *extras = NULL;
    mt_store *store = mt_runtime_store(rt);
    int rank = mt_runtime_rank(rt);
    char counter[160], prefix[192];
    snprintf(counter, sizeof counter, "mt/agree/%s/count/%d", what, rank);
    int64_t n = 0;
    MT_TRY(mt_store_add(store, counter, 1, &n));
    snprintf(prefix, sizeof prefix, "mt/agree/%s/%lld", what, (long long)n);

    size_t len = strlen(mine) + strlen(extra ? extra : "") + 2;
    char *value = malloc(len);
    if (!value) return mt_error(MT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
    snprintf(value, len, "%s\n%s", mine, extra ? extra : "");
    char key[224];
    snprintf(key, sizeof key, "%s/%d", prefix, rank);
    mt_status st = mt_store_set(store, key, value, strlen(value));
    free(value);
    MT_TRY(st);

    char verdict_key[224];
    snprintf(verdict_key, sizeof verdict_key, "%s/verdict", prefix);
    char verdict[2048];
    if (rank == 0) {
        mt_status jst = judge(rt, store, prefix, what, extras, verdict, sizeof verdict);
        /* Published even when judging failed, so that the others stop now rather than at the
         * timeout. */
        mt_status pst = mt_store_set(store, verdict_key, verdict, strlen(verdict));
        MT_TRY(jst);
        MT_TRY(pst);
    } else {
        void *v = NULL;
        MT_TRY(wait_key_or_abort(store, what,
                                 "waiting for rank 0 to compare the ranks' arguments",
                                 verdict_key, mt_runtime_timeout(rt), &v));
        snprintf(verdict, sizeof verdict, "%s", (char *)v);
        free(v);
    }
    if (strcmp(verdict, VERDICT_OK) != 0) {
        if (extras && *extras) {
            mt_agree_free_extras(*extras, mt_runtime_world_size(rt));
            *extras = NULL;
        }
        return mt_error(MT_ERR_MISMATCH, "%s: the ranks disagree: %s", what, verdict);
    }
    return MT_OK;
}
