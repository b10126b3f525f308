/* The flight recorder's analysis (tools/mtrun/diagnose.c) on synthetic rings: a rank behind, a
 * disagreement, all in step, several groups where one stopped rank holds up others, a wrapped
 * ring, and a front every member issued (the awaited peer decides). */
#include "check.h"
#include "diagnose.h"

#include <meshtrain/dtype.h>

#include <stdio.h>
#include <string.h>
#include <time.h>

#define NOW 1000.0
#define MAXE 64

enum { AG = 0, RS = 1, AR = 2 };

static mtrun_fr_entry store_[16][MAXE];
static mtrun_fr_rank ranks_[16];

static void reset(int n, int per_node) {
    memset(store_, 0, sizeof store_);
    for (int r = 0; r < n; r++)
        ranks_[r] = (mtrun_fr_rank){.rank = r, .node = r / per_node, .pid = 100 + r, .state = 'S',
                                    .e = store_[r]};
}

/* Appends a record; done_at 0: in flight. */
static void add(int r, const char *group, int size, int grank, uint32_t seq, int op,
                uint64_t bytes, double queued, double done_at) {
    mtrun_fr_rank *k = &ranks_[r];
    mtrun_fr_entry *e = &k->e[k->n++];
    snprintf(e->group, sizeof e->group, "%s", group);
    e->seq = seq;
    e->group_size = size;
    e->group_rank = grank;
    e->op = op;
    e->bytes = bytes;
    e->queued = queued;
    e->started = queued;
    e->completed = done_at;
    e->waiting_peer = -1;
    k->total++;
}

static char out_[8192];

static int diagnose(int n) {
    int p = mtrun_diagnose(ranks_, n, NOW, 0, out_, sizeof out_);
    printf("---\n%s", out_);
    return p;
}

static void test_behind(void) {
    reset(8, 4);
    for (int r = 0; r < 8; r++) {
        for (uint32_t s = 808; s <= 811; s++) add(r, "dp#2", 8, r, s, AG, 64u << 20, 950, 959.8);
        if (r != 5) add(r, "dp#2", 8, r, 812, AG, 64u << 20, 960, 0);
    }
    int p = diagnose(8);
    CHECK(p == 1);
    CHECK(strstr(out_, "rank 5 (node 1) is behind: 7 ranks of group dp#2 wait in all_gather "
                       "seq 812 (64 MiB, for 40.0 s); rank 5's last completed is seq 811, "
                       "40.2 s ago\n") != NULL);
}

/* Rank 2 of 3 never reached the group's first collective: it has no record of it at all. */
static void test_never_reached(void) {
    reset(3, 1);
    for (int r = 0; r < 2; r++) add(r, "dp#4", 3, r, 0, AR, 64, 990, 0);
    add(2, "tp#5", 1, 0, 0, AR, 64, 980, 981);
    CHECK(diagnose(3) == 1);
    CHECK(strstr(out_, "2 ranks of group dp#4 wait in all_reduce seq 0 (64 B, for 10.0 s) for "
                       "members with no record of the group: group rank 2 (not read, or never "
                       "reached its first collective)\n") != NULL);
}

static void test_mismatch(void) {
    reset(4, 4);
    for (int r = 0; r < 4; r++) {
        add(r, "tp#0", 4, r, 76, AR, 4096, 990, 991);
        add(r, "tp#0", 4, r, 77, r == 3 ? RS : AG, 4096, 992, 0);
    }
    /* Every member waits in seq 77 (the host backend's messages carry the operation, so they
     * never match): the disagreement is the one finding, nobody is called behind. */
    CHECK(diagnose(4) == 1);
    CHECK(strstr(out_, "ranks disagree at group tp#0 seq 77: ranks 0-2 issued all_gather, "
                       "rank 3 reduce_scatter\n") != NULL);
    CHECK(strstr(out_, "behind") == NULL);
    /* the same operation with different payloads is a disagreement too */
    reset(2, 2);
    add(0, "dp#1", 2, 0, 3, AR, 1024, 990, 0);
    add(1, "dp#1", 2, 1, 3, AR, 2048, 990, 0);
    CHECK(diagnose(2) >= 1);
    CHECK(strstr(out_, "ranks disagree at group dp#1 seq 3: rank 0 issued all_reduce of 1 KiB, "
                       "rank 1 all_reduce of 2 KiB") != NULL);
    /* and the same bytes of another dtype */
    reset(2, 2);
    add(0, "dp#1", 2, 0, 3, AR, 2048, 990, 991);
    add(1, "dp#1", 2, 1, 3, AR, 2048, 990, 991);
    ranks_[1].e[0].dtype = MT_BF16;
    CHECK(diagnose(2) == 1);
    CHECK(strstr(out_, "ranks disagree at group dp#1 seq 3: rank 0 issued all_reduce of f32, "
                       "rank 1 all_reduce of bf16\n") != NULL);
}

/* A live job's snapshot: rank 1's ring was read (on its node) before rank 0 issued seq 5, and
 * rank 2 is only 0.2 s late: nobody is behind with a 1 s threshold. */
static void test_live_skew(void) {
    reset(3, 1);
    for (int r = 0; r < 3; r++) add(r, "dp#0", 3, r, 4, AR, 64, 990, 990.1);
    add(0, "dp#0", 3, 0, 5, AR, 64, 999.8, 0);
    ranks_[1].read_at = 999.0;
    ranks_[2].read_at = 999.9;
    CHECK(mtrun_diagnose(ranks_, 3, NOW, 1.0, out_, sizeof out_) == 0);
    printf("---\n%s", out_);
    CHECK(strstr(out_, "no rank is behind") != NULL);
    /* waited long enough, rank 2 (read after seq 5 was issued) is behind; rank 1 unknown */
    CHECK(mtrun_diagnose(ranks_, 3, NOW + 5, 1.0, out_, sizeof out_) == 1);
    printf("---\n%s", out_);
    CHECK(strncmp(out_, "rank 2 (node 2) is behind", 25) == 0);
    CHECK(strstr(out_, "rank 1 ") == NULL);
}

static void test_all_fine(void) {
    reset(4, 2);
    for (int r = 0; r < 4; r++)
        for (uint32_t s = 0; s < 10; s++) add(r, "world#0", 4, r, s, AR, 8, 900 + s, 900.5 + s);
    CHECK(diagnose(4) == 0);
    CHECK(strstr(out_, "no rank is behind") != NULL);
    CHECK(strstr(out_, "nothing in flight") != NULL);
    /* in flight on every rank but young, and nobody waits on anyone in particular: in step */
    for (int r = 0; r < 4; r++) add(r, "world#0", 4, r, 10, AR, 8, 999.5, 0);
    CHECK(diagnose(4) == 0);
    CHECK(strstr(out_, "4 in flight, the oldest all_reduce seq 10 of group world#0") != NULL);
}

/* tp groups {0,1} {2,3}, dp groups {0,2} {1,3}. Rank 1 stopped in its computation: rank 0
 * waits for it in tp#1, rank 3 waits for it in dp#4, and rank 2 waits in dp#3 for rank 0, which
 * is itself stuck in tp#1: rank 1 is the cause, rank 0's lag a consequence. */
static void test_several_groups(void) {
    reset(4, 2);
    const char *tp[4] = {"tp#1", "tp#1", "tp#2", "tp#2"};
    const char *dp[4] = {"dp#3", "dp#4", "dp#3", "dp#4"};
    for (int r = 0; r < 4; r++) {
        for (uint32_t s = 0; s < 10; s++) add(r, tp[r], 2, r % 2, s, AG, 1024, 900 + s, 900.1 + s);
        for (uint32_t s = 0; s < 5; s++) add(r, dp[r], 2, r / 2, s, RS, 2048, 910 + s, 910.1 + s);
    }
    ranks_[1].state = 'T';
    add(0, "tp#1", 2, 0, 10, AG, 1024, 950, 0);
    add(2, "tp#2", 2, 0, 10, AG, 1024, 950, 951);
    add(3, "tp#2", 2, 1, 10, AG, 1024, 950, 951);
    add(2, "dp#3", 2, 1, 5, RS, 2048, 952, 0);
    add(3, "dp#4", 2, 1, 5, RS, 2048, 952, 0);
    int p = diagnose(4);
    CHECK(p >= 2);
    const char *first = "rank 1 (node 0) is behind: 1 rank of group tp#1 waits in all_gather seq 10";
    CHECK(strncmp(out_, first, strlen(first)) == 0);
    CHECK(strstr(out_, "its process is stopped") != NULL);
    /* rank 1 named once as a cause; rank 0 only as what it holds up */
    const char *second = strchr(out_, '\n') + 1;
    const char *then = "  which holds up: rank 0 (node 0) is behind: 1 rank of group dp#3";
    CHECK(strncmp(second, then, strlen(then)) == 0);
    CHECK(strstr(out_, "rank 0 (node 0) is behind") > second - 1);
}

/* Rank 1's ring kept only seq 100-103 (104 collectives recorded); rank 0's 90-104. */
static void test_wrapped(void) {
    reset(2, 1);
    for (uint32_t s = 90; s < 104; s++) add(0, "dp#0", 2, 0, s, AG, 512, 800 + s, 800.5 + s);
    add(0, "dp#0", 2, 0, 104, AG, 512, 990, 0);
    for (uint32_t s = 100; s < 104; s++) add(1, "dp#0", 2, 1, s, s == 101 ? RS : AG, 512, 800 + s,
                                             800.5 + s);
    ranks_[1].total = 104;
    /* seq 101 really differs; the seqs only rank 0 kept are not compared */
    int p = diagnose(2);
    CHECK(p == 2);
    CHECK(strstr(out_, "ranks disagree at group dp#0 seq 101: rank 0 issued all_gather, rank 1 "
                       "reduce_scatter") != NULL);
    CHECK(strstr(out_, "rank 1 (node 1) is behind: 1 rank of group dp#0 waits in all_gather seq "
                       "104 (512 B, for 10.0 s); rank 1's last completed is seq 103, 96.5 s ago")
          != NULL);
    CHECK(strstr(out_, "seq 90") == NULL);
}

/* Both issued seq 5 and wait; rank 0's schedule waits on group rank 1 (rank 1, stopped). */
static void test_awaited_peer(void) {
    reset(2, 1);
    for (int r = 0; r < 2; r++) {
        add(r, "dp#7", 2, r, 4, AR, 256, 900, 901);
        add(r, "dp#7", 2, r, 5, AR, 256, 902, 0);
    }
    ranks_[0].e[1].waiting_peer = 1;
    ranks_[1].state = 'T';
    CHECK(diagnose(2) == 1);
    CHECK(strstr(out_, "rank 1 (node 1) is behind: 1 rank of group dp#7 waits in all_reduce seq "
                       "5 (256 B, for 98.0 s); rank 1's last completed is seq 4, 99.0 s ago, and "
                       "it is in all_reduce seq 5; its process is stopped\n") != NULL);
}

/* Rings of 32768 records on 8 ranks, 4 groups, all in step, with a disagreement at the end of
 * one group and a rank's two entries recorded out of seq order (two threads queued collectives
 * of the group at once): diagnosed in well under a second. Searching every ring for every seq of
 * a group's range took 16 s here (and hours for rings of MT_FLIGHT_RECORDER's maximum). */
static void test_big_rings(void) {
    enum { N = 8, PER = 32768 };
    static mtrun_fr_entry big[N][PER];
    mtrun_fr_rank r[N];
    for (int k = 0; k < N; k++) {
        r[k] = (mtrun_fr_rank){.rank = k, .node = 0, .pid = 100 + k, .state = 'S', .e = big[k],
                               .n = PER, .total = PER};
        for (int i = 0; i < PER; i++) {
            mtrun_fr_entry *e = &big[k][i];
            *e = (mtrun_fr_entry){.seq = 70000u + (uint32_t)(i / 4), .group_size = N,
                                  .group_rank = k, .op = AR, .bytes = 256, .queued = 900,
                                  .started = 900, .completed = 901, .waiting_peer = -1};
            snprintf(e->group, sizeof e->group, "g#%d", i % 4);
        }
        /* rank 3 recorded g#1's seqs 70010 and 70011 the other way round */
        uint32_t tmp = big[3][4 * 10 + 1].seq;
        big[3][4 * 10 + 1].seq = big[3][4 * 11 + 1].seq;
        big[3][4 * 11 + 1].seq = tmp;
    }
    big[6][PER - 2].op = AG; /* g#2's last collective: rank 6 issued an all_gather */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int p = mtrun_diagnose(r, N, NOW, 0, out_, sizeof out_);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    printf("--- %d ranks x %d records: %.3f s\n%s", N, PER, s, out_);
    CHECK_MSG(s < 2.0, "%.1f s", s);
    CHECK(p == 1);
    CHECK(strstr(out_, "ranks disagree at group g#2 seq 78191: ranks 0-5, 7 issued all_reduce, "
                       "rank 6 all_gather\n") != NULL);
}

int main(void) {
    test_behind();
    test_mismatch();
    test_never_reached();
    test_all_fine();
    test_live_skew();
    test_several_groups();
    test_wrapped();
    test_awaited_peer();
    test_big_rings();
    return check_report("test_diagnose");
}
