/* mtrun's reading of flight recorder rings (tools/mtrun/flightrec.c), on ring files this test
 * writes by the protocol of comm/flight_rec_format.h: records read back oldest first after the
 * ring wrapped; a slot being written (odd lock) or holding an older id is left out; headers of
 * another version, of a capacity past the file's end or above the maximum are refused with why;
 * group names that are not UTF-8 (cut inside a character) come back as valid UTF-8; the names of
 * ring files are parsed strictly; and a reader never sees a half-made ring while mtrun makes the
 * rings of a new round (they used to be truncated in place: empty headers, SIGBUS). */
#include "check.h"
#include "flightrec.h"

#include "comm/flight_rec_format.h"
#include "core/utf8.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char path_[128];

/* A ring of capacity records with header fields as given; records written by put(). */
static void make_file(uint32_t capacity, uint32_t file_records, uint32_t version) {
    int fd = open(path_, O_RDWR | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0);
    mt_fr_header h = {.magic = MT_FR_MAGIC, .version = version,
                      .record_size = sizeof(mt_fr_record), .capacity = capacity, .rank = 5,
                      .node = 2};
    atomic_store(&h.pid, 0);
    atomic_store(&h.anchor_mono_ns, 1000000000u);
    atomic_store(&h.anchor_wall_ns, 5000000000u);
    CHECK(ftruncate(fd, (off_t)(sizeof h + (size_t)file_records * sizeof(mt_fr_record))) == 0);
    CHECK(pwrite(fd, &h, sizeof h, 0) == (ssize_t)sizeof h);
    close(fd);
}

static void set_next(uint64_t next) {
    int fd = open(path_, O_RDWR);
    mt_fr_header h;
    CHECK(pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h);
    atomic_store(&h.next, next);
    CHECK(pwrite(fd, &h, sizeof h, 0) == (ssize_t)sizeof h);
    close(fd);
}

/* Record id into its slot; lock as given (2*id+2: whole). */
static void put(uint32_t capacity, uint64_t id, uint64_t lock, const char *group, uint32_t seq) {
    mt_fr_record r;
    memset(&r, 0, sizeof r);
    atomic_store(&r.lock, lock);
    memcpy(r.group, group, strlen(group) + 1);
    r.seq = seq;
    r.group_size = 2;
    atomic_store(&r.queued_ns, 2000000000u); /* 1 s after the anchor: wall 6 s */
    atomic_store(&r.waiting_peer, -1);
    int fd = open(path_, O_RDWR);
    off_t at = (off_t)(sizeof(mt_fr_header) + (id % capacity) * sizeof r);
    CHECK(pwrite(fd, &r, sizeof r, at) == (ssize_t)sizeof r);
    close(fd);
}

static int read_ring(mtrun_fr_rank *r, char *why, size_t cap) {
    return mtrun_fr_read(path_, -1, -1, 0, r, why, cap);
}

static void test_wrapped_and_torn(void) {
    /* capacity 4, ids 0..5 written: slots hold 4, 5, 2, 3; id 3 is being written (odd lock),
     * slot of id 2 still holds id 2; the reader returns 2, 4, 5 in that order */
    make_file(4, 4, MT_FR_VERSION);
    for (uint64_t id = 2; id < 6; id++) put(4, id, 2 * id + 2, "dp#1", (uint32_t)id);
    put(4, 3, 2 * 3 + 1, "dp#1", 3);
    set_next(6);
    mtrun_fr_rank r;
    char why[512] = "";
    CHECK_MSG(read_ring(&r, why, sizeof why) == 0, "%s", why);
    CHECK(r.rank == 5 && r.node == 2 && r.total == 6);
    CHECK_MSG(r.n == 3, "%d records", r.n);
    if (r.n == 3) {
        CHECK(r.e[0].seq == 2 && r.e[1].seq == 4 && r.e[2].seq == 5);
        CHECK(strcmp(r.e[0].group, "dp#1") == 0);
        CHECK(r.e[0].queued > 5.999 && r.e[0].queued < 6.001 && r.e[0].completed == 0);
    }
    mtrun_fr_rank_free(&r);
    /* a slot holding an id from before the window (the writer has not reached it) is left out */
    put(4, 5, 2 * 1 + 2, "dp#1", 1);
    CHECK(read_ring(&r, why, sizeof why) == 0 && r.n == 2);
    mtrun_fr_rank_free(&r);
}

static void test_bad_headers(void) {
    mtrun_fr_rank r;
    char why[512];
    make_file(4, 4, MT_FR_VERSION + 1);
    CHECK(read_ring(&r, why, sizeof why) == -1);
    CHECK_MSG(strstr(why, "not a flight recorder ring of this version (version 2") != NULL, "%s",
              why);
    /* the header promises more records than the file holds: mapping them would raise SIGBUS */
    make_file(64, 8, MT_FR_VERSION);
    set_next(64);
    CHECK(read_ring(&r, why, sizeof why) == -1);
    CHECK_MSG(strstr(why, "is damaged: its header says 64 records (8320 bytes), the file has "
                          "1152 bytes") != NULL, "%s", why);
    /* the largest capacity a uint32 holds: its size in bytes must not wrap */
    make_file(UINT32_MAX, 1, MT_FR_VERSION);
    CHECK(read_ring(&r, why, sizeof why) == -1 && strstr(why, "is damaged") != NULL);
    make_file(MT_FR_MAX_CAPACITY + 1u, 1, MT_FR_VERSION);
    CHECK(read_ring(&r, why, sizeof why) == -1 && strstr(why, "is damaged") != NULL);
    make_file(0, 0, MT_FR_VERSION);
    CHECK(read_ring(&r, why, sizeof why) == -1 && strstr(why, "is damaged") != NULL);
    /* shorter than a header */
    int fd = open(path_, O_RDWR | O_TRUNC);
    CHECK(fd >= 0 && write(fd, "MDTM", 4) == 4);
    close(fd);
    CHECK(read_ring(&r, why, sizeof why) == -1);
    CHECK_MSG(strstr(why, "4 bytes, less than its 128-byte header") != NULL, "%s", why);
    unlink(path_);
    CHECK(read_ring(&r, why, sizeof why) == -1 && strstr(why, "cannot open") != NULL);
}

/* The library keeps 30 bytes of a group's name: a name of 2-byte characters is cut inside one. */
static void test_group_names(void) {
    char cut[MT_FR_GROUP_CAP];
    memset(cut, 0, sizeof cut);
    for (int i = 0; i < 15; i++) memcpy(cut + 2 * i, "\xc3\xa9", 2); /* 15 x 'é' */
    cut[30] = '\xc3';                                                /* and half of one */
    memcpy(cut + 31, "#7", 3);
    make_file(4, 4, MT_FR_VERSION);
    put(4, 0, 2, cut, 0);
    put(4, 1, 4, "tp\x1b[2J#3", 1); /* a terminal escape */
    put(4, 2, 6, "\xff\xfe#1", 2);
    set_next(3);
    mtrun_fr_rank r;
    char why[512];
    CHECK(read_ring(&r, why, sizeof why) == 0 && r.n == 3);
    for (int i = 0; i < r.n; i++) {
        const unsigned char *p = (const unsigned char *)r.e[i].group;
        bool valid = true;
        while (*p && valid) {
            int n = *p < 0x20 ? 0 : mt_utf8_len(p);
            valid = n > 0;
            p += n;
        }
        CHECK_MSG(valid, "record %d: group '%s' is not clean UTF-8", i, r.e[i].group);
    }
    if (r.n == 3) {
        CHECK_MSG(strncmp(r.e[0].group, cut, 30) == 0 && strcmp(r.e[0].group + 30, "?#7") == 0,
                  "'%s'", r.e[0].group);
        CHECK_MSG(strcmp(r.e[1].group, "tp?[2J#3") == 0, "'%s'", r.e[1].group);
        CHECK_MSG(strcmp(r.e[2].group, "??#1") == 0, "'%s'", r.e[2].group);
    }
    mtrun_fr_rank_free(&r);
    unlink(path_);
}

static void test_names(void) {
    long pid;
    int local;
    CHECK(mtrun_fr_parse_name("mt-fr-123-4", &pid, &local) == 1 && pid == 123 && local == 4);
    CHECK(mtrun_fr_parse_name("mt-fr-123-4.new", &pid, &local) == 2);
    const char *bad[] = {"mt-fr-123-4.tmp", "mt-fr--1-0", "mt-fr-0-0", "mt-fr- 12-0",
                         "mt-fr-+12-0", "mt-fr-12--3", "mt-fr-12-", "mt-fr-12", "xmt-fr-1-1",
                         "mt-fr-99999999999999999999-0", "mt-fr-12-4x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_MSG(mtrun_fr_parse_name(bad[i], &pid, &local) == 0, "%s", bad[i]);
}

/* A child makes the rings of round after round (mtrun_fr_prepare) while this process reads them,
 * as mtrun --diagnose may at any time: every read must find a whole ring. */
static void test_read_during_new_rounds(void) {
    setenv("MT_FLIGHT_RECORDER", "4096", 1);
    mtrun_fr *f = NULL;
    CHECK(mtrun_fr_create(1, &f) == 0 && f);
    if (!f) return;
    mtrun_fr_prepare(f, 0);
    const char *ring = mtrun_fr_file(f, 0);
    CHECK(ring != NULL);
    if (!ring) return;
    pid_t child = fork();
    if (child == 0) {
        /* not left running when this process dies (of SIGBUS, as it did) */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() == 1) _exit(1);
        for (;;) mtrun_fr_prepare(f, 0);
    }
    int failed = 0, reads = 0;
    char why[512] = "";
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        mtrun_fr_rank r;
        if (mtrun_fr_read(ring, 0, 0, 0, &r, why, sizeof why) != 0) failed++;
        else mtrun_fr_rank_free(&r);
        reads++;
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while (t.tv_sec - t0.tv_sec < 2 && failed == 0);
    kill(child, SIGKILL);
    int status;
    waitpid(child, &status, 0);
    CHECK_MSG(failed == 0, "%d of %d reads failed while the rings were made again: %s", failed,
              reads, why);
    printf("%d reads while the ring was made again and again\n", reads);
    char kept[128];
    snprintf(kept, sizeof kept, "%s", ring);
    mtrun_fr_destroy(f);
    CHECK(access(kept, F_OK) != 0);
}

int main(void) {
    snprintf(path_, sizeof path_, "/dev/shm/mt-test-fr-read-%ld", (long)getpid());
    test_wrapped_and_torn();
    test_bad_headers();
    test_group_names();
    test_names();
    test_read_during_new_rounds();
    unlink(path_);
    return check_report("test_fr_read");
}
