/* The flight recorder's writer (comm/flight_rec.h): attaches to the ring file mtrun made, once,
 * on the first collective, and fills one record per collective with the sequence-locked
 * protocol of comm/flight_rec_format.h. */
#include "comm/flight_rec.h"

#include "comm/backend.h"
#include "comm/flight_rec_format.h"
#include "comm/group.h"

#include <meshtrain/log.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

_Static_assert(sizeof(((mt_group *)0)->fr_name) == MT_FR_GROUP_CAP, "group name in a record");

static pthread_once_t attach_once = PTHREAD_ONCE_INIT;
static mt_fr_header *ring_header; /* NULL: off */
static mt_fr_record *ring_records;

static uint64_t now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Any problem leaves the recorder off with one warning: a job must not fail for want of its
 * diagnosis. */
static void attach(void) {
    const char *path = getenv("MT_FLIGHT_RECORDER_FILE");
    if (!path || !*path) return;
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        mt_log(MT_LOG_WARN, "flight recorder off: cannot open MT_FLIGHT_RECORDER_FILE=%s: %s",
               path, strerror(errno));
        return;
    }
    struct stat st = {0};
    void *base = MAP_FAILED;
    int err = 0;
    if (fstat(fd, &st) != 0) err = errno;
    else if ((size_t)st.st_size < sizeof(mt_fr_header)) err = EINVAL;
    else base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (!err && base == MAP_FAILED) err = errno;
    close(fd);
    if (base == MAP_FAILED) {
        mt_log(MT_LOG_WARN, "flight recorder off: cannot map %s (%lld bytes): %s", path,
               (long long)st.st_size,
               err == EINVAL ? "shorter than a ring's header" : strerror(err));
        return;
    }
    mt_fr_header *h = base;
    size_t want = sizeof *h + (size_t)h->capacity * sizeof(mt_fr_record);
    if (h->magic != MT_FR_MAGIC || h->version != MT_FR_VERSION ||
        h->record_size != sizeof(mt_fr_record) || h->capacity == 0 ||
        h->capacity > MT_FR_MAX_CAPACITY || want > (size_t)st.st_size) {
        mt_log(MT_LOG_WARN, "flight recorder off: %s is not a ring of this library's version "
               "(made by another mtrun?)", path);
        munmap(base, (size_t)st.st_size);
        return;
    }
    atomic_store(&h->anchor_mono_ns, now_ns(CLOCK_MONOTONIC));
    atomic_store(&h->anchor_wall_ns, now_ns(CLOCK_REALTIME));
    atomic_store(&h->pid, (int32_t)getpid());
    ring_records = (mt_fr_record *)(h + 1);
    ring_header = h;
}

/* The work's record while it still holds that work (not overwritten by a later one), else NULL. */
static mt_fr_record *record_of(const mt_work *w) {
    if (!ring_header || w->fr_id == 0) return NULL;
    uint64_t id = w->fr_id - 1;
    mt_fr_record *r = &ring_records[id % ring_header->capacity];
    if (atomic_load_explicit(&r->lock, memory_order_acquire) != 2 * id + 2) return NULL;
    return r;
}

void mt_fr_queued(mt_work *w) {
    pthread_once(&attach_once, attach);
    if (!ring_header) return;
    mt_group *g = w->group;
    uint64_t id = atomic_fetch_add_explicit(&ring_header->next, 1, memory_order_relaxed);
    mt_fr_record *r = &ring_records[id % ring_header->capacity];
    atomic_store_explicit(&r->lock, 2 * id + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    /* The NCCL backend numbers the group's collectives apart from the host backend's, so its
     * records name the group apart: "dp#2/nccl". */
    if (w->backend == &mt_host_backend) memcpy(r->group, g->fr_name, sizeof r->group);
    else snprintf(r->group, sizeof r->group, "%.30s/nccl", g->fr_name);
    r->seq = w->seq;
    r->group_size = g->size;
    r->group_rank = g->rank;
    r->op = (uint8_t)w->kind;
    r->dtype = (uint8_t)w->dtype;
    r->bytes = w->payload;
    atomic_store_explicit(&r->queued_ns, now_ns(CLOCK_MONOTONIC), memory_order_relaxed);
    atomic_store_explicit(&r->started_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&r->completed_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&r->status, 0, memory_order_relaxed);
    atomic_store_explicit(&r->waiting_peer, -1, memory_order_relaxed);
    atomic_store_explicit(&r->lock, 2 * id + 2, memory_order_release);
    w->fr_id = id + 1;
}

void mt_fr_started(mt_work *w) {
    mt_fr_record *r = record_of(w);
    if (r) atomic_store_explicit(&r->started_ns, now_ns(CLOCK_MONOTONIC), memory_order_relaxed);
}

void mt_fr_completed(mt_work *w, mt_status status) {
    mt_fr_record *r = record_of(w);
    if (!r || atomic_load_explicit(&r->completed_ns, memory_order_relaxed) != 0) return;
    atomic_store_explicit(&r->status, (int32_t)status, memory_order_relaxed);
    atomic_store_explicit(&r->completed_ns, now_ns(CLOCK_MONOTONIC), memory_order_release);
}

void mt_fr_waiting(mt_work *w, int peer) {
    mt_fr_record *r = record_of(w);
    if (r && atomic_load_explicit(&r->waiting_peer, memory_order_relaxed) != peer)
        atomic_store_explicit(&r->waiting_peer, peer, memory_order_relaxed);
}
