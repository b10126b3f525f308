/* A small training-like loop for the flight recorder's tests (mtrun_flightrec.sh), on a
 * {"dp", "tp"} mesh of world/2 x 2 (or {"dp"} of 1 x world when the world is odd):
 *   loop ITERS SLEEP_MS  each iteration: an all_gather on tp, an all_reduce on dp, then SLEEP_MS
 *                        of "computation"; rank 0 says "iteration N" every 10, and each rank
 *                        writes its pid into $FR_PID_DIR/rank<R>.pid first (to be stopped).
 *   mismatch - SLEEP_MS  10 all_reduces on dp, then the last rank issues a reduce_scatter where
 *                        the others issue an all_gather of the same sizes: the last rank and
 *                        its dp peer wait until their timeout (the host backend's messages
 *                        carry the operation) and exit 1; rank 0's group completes, it says
 *                        "mismatch issued", then the others sleep SLEEP_MS and end.
 * With FR_KEYS_GONE (store keys, space-separated) and FR_KEYS_WHEN (a file): once that file
 * exists, rank 0 of the loop looks the keys up in the job's store and says "keys: all gone" or
 * "keys: KEY is still there" (the test's look at what the diagnoses left in the store).
 * Exits 0 when every collective succeeded, 1 otherwise. */
#include <meshtrain/meshtrain.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* FR_KEYS_GONE, once FR_KEYS_WHEN exists; true once looked. The keys are mtrun's, outside the
 * ranks' "round/N/" prefix: looked up through a connection of its own, which must see
 * mtrun/diag/requests (else the look proves nothing). */
static bool check_keys(void) {
    const char *keys = getenv("FR_KEYS_GONE"), *when = getenv("FR_KEYS_WHEN");
    if (!keys || !when || access(when, F_OK) != 0) return false;
    mt_store *store = NULL;
    const char *port = getenv("MASTER_PORT");
    if (mt_store_connect(getenv("MASTER_ADDR"), port ? atoi(port) : 0, getenv("MT_RDZV_ID"), 10,
                         &store) != MT_OK) {
        printf("keys: cannot connect to the store: %s\n", mt_last_error());
        fflush(stdout);
        return true;
    }
    char list[1024];
    snprintf(list, sizeof list, "mtrun/diag/requests %s", keys);
    int left = 0;
    bool control = true;
    for (char *k = strtok(list, " "); k; k = strtok(NULL, " "), control = false) {
        void *v = NULL;
        size_t len = 0;
        bool found = true;
        if (mt_store_try_get(store, k, &v, &len, &found) != MT_OK)
            printf("keys: cannot look up %s: %s\n", k, mt_last_error());
        else if (control && !found)
            printf("keys: %s is missing: the look sees another namespace\n", k);
        else if (!control && found)
            printf("keys: %s is still there\n", k);
        left += control ? !found : found;
        free(v);
    }
    if (!left) printf("keys: all gone\n");
    fflush(stdout);
    mt_store_close(store);
    return true;
}

static int fail(mt_runtime *rt, const char *what) {
    fprintf(stderr, "prog_fr_loop: %s: %s\n", what, mt_last_error());
    mt_finalize(rt);
    return 1;
}

int main(int argc, char **argv) {
    mt_runtime *rt = NULL;
    if (mt_init(&rt, &argc, &argv) != MT_OK) {
        fprintf(stderr, "prog_fr_loop: mt_init: %s\n", mt_last_error());
        return 1;
    }
    int rank = mt_runtime_rank(rt), world = mt_runtime_world_size(rt);
    bool mismatch = argc > 1 && strcmp(argv[1], "mismatch") == 0;
    int iters = argc > 2 ? atoi(argv[2]) : 100;
    int sleep_ms = argc > 3 ? atoi(argv[3]) : 10;
    const char *pid_dir = getenv("FR_PID_DIR");
    if (pid_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/rank%d.pid", pid_dir, rank);
        FILE *fp = fopen(path, "w");
        if (fp) {
            fprintf(fp, "%ld\n", (long)getpid());
            fclose(fp);
        }
    }
    mt_mesh *mesh = NULL;
    bool two_d = world % 2 == 0 && world > 2;
    mt_status st = two_d ? mt_mesh_create(rt, 2, (int[]){world / 2, 2},
                                          (const char *[]){"dp", "tp"}, &mesh)
                         : mt_mesh_create(rt, 1, (int[]){world}, (const char *[]){"dp"}, &mesh);
    if (st != MT_OK) return fail(rt, "mt_mesh_create");
    mt_group *dp = NULL, *tp = NULL;
    if (mt_mesh_group(mesh, "dp", &dp) != MT_OK) return fail(rt, "the dp group");
    if (two_d && mt_mesh_group(mesh, "tp", &tp) != MT_OK) return fail(rt, "the tp group");
    float buf[1024] = {0}, out[4096];
    if (mismatch) {
        for (int i = 0; i < 10; i++)
            if (mt_all_reduce(dp, buf, buf, 256, MT_F32, MT_REDUCE_SUM, NULL) != MT_OK)
                return fail(rt, "all_reduce");
        /* Same message sizes: only the operation in the messages' tags keeps the two from
         * completing with wrong data. */
        st = rank == world - 1 ? mt_reduce_scatter(dp, out, buf, 64, MT_F32, MT_REDUCE_SUM, NULL)
                               : mt_all_gather(dp, buf, out, 64, MT_F32, NULL);
        if (st != MT_OK) return fail(rt, "the mismatched collective");
        if (rank == 0) {
            printf("mismatch issued\n");
            fflush(stdout);
        }
        sleep((unsigned)(sleep_ms / 1000 + 1)); /* for the test to ask for a diagnosis */
        mt_mesh_destroy(mesh);
        mt_finalize(rt);
        return 0;
    }
    bool keys_checked = false;
    struct timespec nap = {.tv_sec = sleep_ms / 1000, .tv_nsec = (long)(sleep_ms % 1000) * 1000000};
    for (int i = 1; i <= iters; i++) {
        if (tp && mt_all_gather(tp, buf, out, 256, MT_F32, NULL) != MT_OK)
            return fail(rt, "all_gather on tp");
        if (mt_all_reduce(dp, buf, buf, 256, MT_F32, MT_REDUCE_SUM, NULL) != MT_OK)
            return fail(rt, "all_reduce on dp");
        nanosleep(&nap, NULL);
        if (rank == 0 && !keys_checked) keys_checked = check_keys();
        if (rank == 0 && i % 10 == 0) {
            printf("iteration %d\n", i);
            fflush(stdout);
        }
    }
    mt_mesh_destroy(mesh);
    mt_finalize(rt);
    return 0;
}
