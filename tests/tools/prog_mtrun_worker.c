/* A rank for mtrun's tests: prints its environment, fails, gets killed or sleeps on request.
 *
 *   --env                print the launcher's variables ("env NAME=value") and a line on stderr
 *   --long N             print one stdout line of N characters
 *   --fail R:CODE:MS     rank R exits with CODE after MS milliseconds
 *   --signal R:SIG:MS    rank R kills itself with SIG after MS milliseconds
 *   --sleep S            sleep S seconds before exiting 0
 *   --child              fork a child (same command line, so the test finds it by marker) that
 *                        sleeps as long as the rank
 *   --ignore-term        ignore SIGTERM (rank and child), so only SIGKILL stops them
 *   --marker TEXT        ignored; lets the test find every process of the job with pgrep -f
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void sleep_ms(long ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static void print_env(int rank) {
    static const char *names[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                  "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "MT_RDZV_ID",
                                  "TORCHELASTIC_RUN_ID", "MT_NNODES", "MT_STORE_HOSTED",
                                  "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GROUP_WORLD_SIZE",
                                  "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
                                  "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = getenv(names[i]);
        printf("env %s=%s\n", names[i], v ? v : "<unset>");
    }
    fprintf(stderr, "to-stderr rank=%d\n", rank);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *rank_env = getenv("RANK");
    int rank = rank_env ? atoi(rank_env) : -1;
    int fail_rank = -1, fail_code = 0, sig_rank = -1, sig = 0, child = 0;
    long fail_ms = 0, sig_ms = 0, sleep_s = 0, long_len = 0;
    int env = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--env")) {
            env = 1;
        } else if (!strcmp(a, "--long")) {
            long_len = atol(next);
            i++;
        } else if (!strcmp(a, "--fail")) {
            sscanf(next, "%d:%d:%ld", &fail_rank, &fail_code, &fail_ms);
            i++;
        } else if (!strcmp(a, "--signal")) {
            sscanf(next, "%d:%d:%ld", &sig_rank, &sig, &sig_ms);
            i++;
        } else if (!strcmp(a, "--sleep")) {
            sleep_s = atol(next);
            i++;
        } else if (!strcmp(a, "--child")) {
            child = 1;
        } else if (!strcmp(a, "--ignore-term")) {
            signal(SIGTERM, SIG_IGN);
        } else if (!strcmp(a, "--marker")) {
            i++;
        } else {
            fprintf(stderr, "prog_mtrun_worker: unknown argument %s\n", a);
            return 64;
        }
    }
    if (child && fork() == 0) {
        sleep_ms(sleep_s * 1000 + 60000); /* outlives the rank unless someone kills it */
        _exit(0);
    }
    printf("started rank=%d\n", rank);
    if (env) print_env(rank);
    if (long_len > 0) {
        char *line = malloc((size_t)long_len + 1);
        if (!line) return 65;
        for (long i = 0; i < long_len; i++) line[i] = (char)('a' + (rank + i) % 26);
        line[long_len] = '\0';
        printf("long:%s\n", line);
        free(line);
    }
    if (rank == fail_rank) {
        sleep_ms(fail_ms);
        printf("failing rank=%d code=%d\n", rank, fail_code);
        return fail_code;
    }
    if (rank == sig_rank) {
        sleep_ms(sig_ms);
        signal(sig, SIG_DFL); /* sanitizers and UCX install their own handlers */
        raise(sig);
    }
    sleep_ms(sleep_s * 1000);
    if (env) {
        printf("tail rank=%d", rank); /* a last line without a newline */
        fflush(stdout);
    }
    return 0;
}
