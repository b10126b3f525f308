/* mt-bench-flight-rec: what the flight recorder (comm/flight_rec.c) costs one collective, in
 * nanoseconds, alone: a ring file like mtrun's, and the three calls a host collective makes
 * (queued, started, completed) on a work of a fake group, timed over many iterations; the same
 * loop without a ring (the recorder off) for the floor. Single process, no peers; the thread's
 * CPU time, so that other load on the machine does not count.
 *
 *   mt-bench-flight-rec [ITERATIONS]   (default 2000000)
 */
#include "comm/backend.h"
#include "comm/flight_rec.h"
#include "comm/flight_rec_format.h"
#include "comm/group.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* CPU time of this thread: the machine's other load does not count (it is shared here). */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double run(mt_work *w, long iters) {
    double t0 = now_s();
    for (long i = 0; i < iters; i++) {
        w->seq = (uint32_t)i;
        w->fr_id = 0;
        mt_fr_queued(w);
        mt_fr_started(w);
        mt_fr_completed(w, MT_OK);
    }
    return (now_s() - t0) / (double)iters * 1e9;
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 2000000;
    if (iters <= 0) {
        fprintf(stderr, "usage: mt-bench-flight-rec [ITERATIONS > 0]\n");
        return 2;
    }
    char path[64];
    snprintf(path, sizeof path, "/dev/shm/mt-fr-bench-%ld", (long)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    mt_fr_header h = {.magic = MT_FR_MAGIC, .version = MT_FR_VERSION,
                      .record_size = sizeof(mt_fr_record), .capacity = MT_FR_DEFAULT_CAPACITY};
    if (fd < 0 || ftruncate(fd, (off_t)(sizeof h + MT_FR_DEFAULT_CAPACITY * sizeof(mt_fr_record))) ||
        pwrite(fd, &h, sizeof h, 0) != (ssize_t)sizeof h) {
        perror(path);
        return 1;
    }
    close(fd);
    mt_group g = {.size = 8, .rank = 3, .id = 2};
    snprintf(g.name, sizeof g.name, "dp");
    mt_group_set_id(&g, 2);
    mt_work w = {.kind = MT_OP_ALL_REDUCE, .group = &g, .payload = 4096, .dtype = MT_F32,
                 .backend = &mt_host_backend};
    setenv("MT_FLIGHT_RECORDER_FILE", path, 1);
    run(&w, iters / 10); /* warm-up, attaches */
    double on = run(&w, iters);
    /* the calls' floor when the recorder is off: started/completed find no record */
    double t0 = now_s();
    for (long i = 0; i < iters; i++) {
        w.fr_id = 0;
        mt_fr_started(&w);
        mt_fr_completed(&w, MT_OK);
    }
    double off = (now_s() - t0) / (double)iters * 1e9;
    unlink(path);
    printf("flight recorder: %.1f ns per collective (queued + started + completed, ring of %d), "
           "%.1f ns for the calls without a record; %ld iterations\n", on,
           MT_FR_DEFAULT_CAPACITY, off, iters);
    return 0;
}
