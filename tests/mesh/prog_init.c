/* A rank for the runtime's multi-process tests: mt_init from the environment, print what the
 * runtime derived (one line on stdout), check the world group with one all_reduce, finalize.
 * On failure it prints the error on stderr and exits 2.
 *
 *   prog_init              run as a rank
 *   prog_init --hold S     run as a rank, staying S seconds after the all_reduce (with its store
 *                          connection and UCX endpoints open: tests look at its sockets)
 *   prog_init --free-port  print a TCP port that is free now (for MASTER_PORT) and exit */
#include <meshtrain/comm.h>
#include <meshtrain/runtime.h>
#include <meshtrain/status.h>

#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        perror("prog_init --free-port");
        return 1;
    }
    printf("%d\n", ntohs(a.sin_port));
    close(fd);
    return 0;
}

static int fail(const char *what, mt_status st) {
    fprintf(stderr, "prog_init: %s failed (%s): %s\n", what, mt_status_str(st), mt_last_error());
    return 2;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--free-port")) return free_port();
    unsigned hold = argc > 2 && !strcmp(argv[1], "--hold") ? (unsigned)atoi(argv[2]) : 0;
    mt_runtime *rt;
    mt_status st = mt_init(&rt, &argc, &argv);
    if (st != MT_OK) return fail("mt_init", st);
    int rank = mt_runtime_rank(rt), world = mt_runtime_world_size(rt);
    printf("rank=%d world=%d local_rank=%d local_world=%d node=%d nodes=%d host=%s job=%s\n",
           rank, world, mt_runtime_local_rank(rt), mt_runtime_local_world_size(rt),
           mt_runtime_node_rank(rt), mt_runtime_num_nodes(rt), mt_runtime_host(rt),
           mt_runtime_job_id(rt));
    fflush(stdout);

    float v = (float)(rank + 1);
    st = mt_all_reduce(mt_runtime_world(rt), &v, &v, 1, MT_F32, MT_REDUCE_SUM, NULL);
    if (st != MT_OK) return fail("all_reduce on the world group", st);
    float want = (float)world * (float)(world + 1) / 2.0f;
    if (v != want) {
        fprintf(stderr, "prog_init: all_reduce gave %g, expected %g\n", v, want);
        return 3;
    }
    printf("rank=%d allreduce ok\n", rank);
    fflush(stdout);
    if (hold) sleep(hold);
    mt_finalize(rt);
    return 0;
}
