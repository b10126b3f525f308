/* The flight recorder's files, on mtrun's side (flightrec.h). */
#include "flightrec.h"

#include "msg.h"

#include "comm/flight_rec_format.h"
#include "core/env.h"
#include "core/utf8.h"

#include <meshtrain/status.h>

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct mtrun_fr {
    int node, nproc;
    uint32_t capacity;
    bool off;           /* a file could not be made: no rank gets one */
    char (*paths)[PATH_MAX];
    int *held;          /* per ring: an open fd with a shared flock while mtrun lives (-1: none) */
};

/* A decimal number of digits only (no sign, no space), at most max, at *p; advances *p. */
static bool parse_number(const char **p, long max, long *out) {
    if (!isdigit((unsigned char)**p)) return false;
    char *end;
    errno = 0;
    long v = strtol(*p, &end, 10);
    if (errno || v > max) return false;
    *p = end;
    *out = v;
    return true;
}

int mtrun_fr_parse_name(const char *name, long *pid, int *local) {
    const char *p = name;
    long l;
    if (strncmp(p, "mt-fr-", 6) != 0) return 0;
    p += 6;
    if (!parse_number(&p, INT_MAX, pid) || *pid <= 0 || *p++ != '-' ||
        !parse_number(&p, INT_MAX, &l))
        return 0;
    *local = (int)l;
    if (*p == '\0') return 1;
    return strcmp(p, MTRUN_FR_NEW_SUFFIX) == 0 ? 2 : 0;
}

/* Whether a ring file is held by a live mtrun (make_ring's shared flock): a pid that looks gone
 * here may live in another pid namespace sharing /dev/shm (containers with the host's IPC), and
 * a flock is seen across namespaces. A lock taken means the file is stale; it is removed while
 * held, so an mtrun that opened it meanwhile cannot be racing a half-removed file. */
static bool remove_if_unheld(int dir, const char *name) {
    int fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return false;
    bool removed = flock(fd, LOCK_EX | LOCK_NB) == 0 && unlinkat(dir, name, 0) == 0;
    close(fd);
    return removed;
}

/* Ring files of mtrun processes that are gone (SIGKILLed, or the machine's OOM killer: nothing
 * removed them) would fill /dev/shm, which is memory, run after run: this user's are removed,
 * with the half-made ones (.new) a killed mtrun may have left. A pid that lives again in another
 * process keeps its files until that one ends. */
static void sweep_stale_rings(void) {
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        long pid;
        int local;
        if (!mtrun_fr_parse_name(de->d_name, &pid, &local) || pid == (long)getpid()) continue;
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
            st.st_uid != geteuid())
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        if (remove_if_unheld(dirfd(d), de->d_name)) removed++;
    }
    closedir(d);
    if (removed)
        mtrun_msg("removed %d flight recorder file%s of mtrun processes that are gone "
                  "(/dev/shm/mt-fr-*)", removed, removed == 1 ? "" : "s");
}

int mtrun_fr_create(int nproc, mtrun_fr **out) {
    *out = NULL;
    long long n;
    if (mt_env_int("MT_FLIGHT_RECORDER", 0, MT_FR_MAX_CAPACITY, MT_FR_DEFAULT_CAPACITY,
                   "collectives each rank's flight recorder keeps (0: off)", &n) != MT_OK) {
        mtrun_msg("%s", mt_last_error());
        return 2;
    }
    if (n == 0) return 0;
    mtrun_fr *f = calloc(1, sizeof *f);
    if (f) f->paths = calloc((size_t)nproc, sizeof *f->paths);
    if (f) f->held = malloc((size_t)nproc * sizeof *f->held);
    if (!f || !f->paths || !f->held) {
        if (f) free(f->paths);
        free(f);
        mtrun_msg("out of memory for the flight recorder; it is off");
        return 0;
    }
    sweep_stale_rings();
    f->nproc = nproc;
    f->capacity = (uint32_t)n;
    for (int i = 0; i < nproc; i++) f->held[i] = -1;
    for (int i = 0; i < nproc; i++)
        snprintf(f->paths[i], sizeof f->paths[i], "/dev/shm/mt-fr-%ld-%d", (long)getpid(), i);
    *out = f;
    return 0;
}

/* One ring file, empty (zero records), header written. It is made whole under another name and
 * renamed over the ring of the round before: a reader that has that one mapped (mtrun
 * --diagnose, at any time) keeps reading the old file, never one truncated under it (SIGBUS) or
 * one with its header not yet written. */
static int make_ring(mtrun_fr *f, int i) {
    char tmp[PATH_MAX + sizeof MTRUN_FR_NEW_SUFFIX];
    snprintf(tmp, sizeof tmp, "%s%s", f->paths[i], MTRUN_FR_NEW_SUFFIX);
    /* O_EXCL: never write through a file someone else put there; ours (from a make_ring that
     * failed half-way) is removed first. */
    unlink(tmp);
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    size_t bytes = sizeof(mt_fr_header) + (size_t)f->capacity * sizeof(mt_fr_record);
    mt_fr_header h = {.magic = MT_FR_MAGIC, .version = MT_FR_VERSION,
                      .record_size = sizeof(mt_fr_record), .capacity = f->capacity,
                      .rank = f->node * f->nproc + i, .node = f->node};
    /* ftruncate zeroes every record: lock 0 means never written. */
    int ok = ftruncate(fd, (off_t)bytes) == 0 && pwrite(fd, &h, sizeof h, 0) == (ssize_t)sizeof h;
    /* Held (shared lock, fd kept) until mtrun ends or remakes it: another mtrun's sweep leaves
     * it alone even when it cannot see this pid (remove_if_unheld). */
    ok = ok && flock(fd, LOCK_SH | LOCK_NB) == 0;
    int e = errno;
    if (ok && rename(tmp, f->paths[i]) == 0) {
        if (f->held[i] >= 0) close(f->held[i]);
        f->held[i] = fd;
        return 0;
    }
    if (ok) e = errno;
    close(fd);
    unlink(tmp);
    errno = e;
    return -1;
}

void mtrun_fr_prepare(mtrun_fr *f, int node) {
    if (!f || f->off) return;
    f->node = node;
    for (int i = 0; i < f->nproc; i++)
        if (make_ring(f, i) != 0) {
            mtrun_msg("cannot make the flight recorder file %s: %s; the flight recorder is off "
                      "(MT_FLIGHT_RECORDER=0 says so without this message)", f->paths[i],
                      strerror(errno));
            f->off = true;
            for (int k = 0; k <= i; k++) unlink(f->paths[k]);
            return;
        }
}

const char *mtrun_fr_file(const mtrun_fr *f, int local) {
    if (!f || f->off || local < 0 || local >= f->nproc) return NULL;
    return f->paths[local];
}

void mtrun_fr_destroy(mtrun_fr *f) {
    if (!f) return;
    if (!f->off)
        for (int i = 0; i < f->nproc; i++) unlink(f->paths[i]);
    for (int i = 0; i < f->nproc; i++)
        if (f->held[i] >= 0) close(f->held[i]);
    free(f->held);
    free(f->paths);
    free(f);
}

double mtrun_fr_wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The state letter of /proc/PID/stat ('R', 'S', 'D', 'T' stopped, 'Z'), '-' when gone. */
static char process_state(pid_t pid) {
    if (pid <= 0) return '-';
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    FILE *fp = fopen(path, "r");
    if (!fp) return '-';
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    const char *close_paren = strrchr(buf, ')'); /* the command name may hold anything */
    if (!close_paren || close_paren[1] != ' ' || !close_paren[2]) return '-';
    return close_paren[2] == 'Z' || close_paren[2] == 'X' ? '-' : close_paren[2];
}

/* Copies slot s if it holds a whole record (the protocol of flight_rec_format.h). */
static bool read_slot(const mt_fr_record *s, mt_fr_record *copy) {
    for (int attempt = 0; attempt < 100; attempt++) {
        uint64_t v1 = atomic_load_explicit(&s->lock, memory_order_acquire);
        if (v1 == 0) return false;
        if (v1 & 1) {
            /* being written: let the writer finish (it may share our core); a stopped writer
             * never does, and 100 tries give up on that record */
            sched_yield();
            continue;
        }
        memcpy(copy->group, s->group, sizeof copy->group);
        copy->seq = s->seq;
        copy->group_size = s->group_size;
        copy->group_rank = s->group_rank;
        copy->op = s->op;
        copy->dtype = s->dtype;
        copy->bytes = s->bytes;
        atomic_store(&copy->queued_ns, atomic_load_explicit(&s->queued_ns, memory_order_relaxed));
        atomic_store(&copy->started_ns,
                     atomic_load_explicit(&s->started_ns, memory_order_relaxed));
        atomic_store(&copy->completed_ns,
                     atomic_load_explicit(&s->completed_ns, memory_order_relaxed));
        atomic_store(&copy->status, atomic_load_explicit(&s->status, memory_order_relaxed));
        atomic_store(&copy->waiting_peer,
                     atomic_load_explicit(&s->waiting_peer, memory_order_relaxed));
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&s->lock, memory_order_relaxed) == v1) {
            atomic_store(&copy->lock, v1);
            copy->group[sizeof copy->group - 1] = '\0';
            return true;
        }
    }
    return false;
}

/* A group name from a ring, fit for JSON and a terminal: a name cut inside a character (the
 * library keeps 30 bytes of it), a byte that is not UTF-8 or a control character becomes '?'.
 * jansson refuses strings that are not UTF-8, and the record would be lost from the JSON lines
 * and from the summary node 0 analyses. */
static void clean_group(char *dst, size_t cap, const char *src, size_t len) {
    size_t o = 0;
    const unsigned char *p = (const unsigned char *)src, *end = p + strnlen(src, len);
    while (p < end && o + 1 < cap) {
        int n = *p < 0x20 || *p == 0x7f ? 0 : mt_utf8_len(p);
        if (n == 0 || p + n > end || o + (size_t)n >= cap) {
            dst[o++] = '?';
            p++;
            continue;
        }
        memcpy(dst + o, p, (size_t)n);
        o += (size_t)n;
        p += n;
    }
    dst[o] = '\0';
}

/* A header field the rank could still change (its mapping is writable): read once, so that what
 * was checked is what is used. */
#define READ_ONCE(x) (*(const volatile __typeof__(x) *)&(x))

int mtrun_fr_read(const char *path, int rank, int node, pid_t pid, mtrun_fr_rank *r, char *why,
                  size_t cap) {
    *r = (mtrun_fr_rank){.rank = rank, .node = node, .state = '-'};
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, cap, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(why, cap, "cannot stat %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size < sizeof(mt_fr_header)) {
        snprintf(why, cap, "%s is not a flight recorder ring: %lld bytes, less than its %zu-byte "
                 "header", path, (long long)st.st_size, sizeof(mt_fr_header));
        close(fd);
        return -1;
    }
    /* The header first, then the ring as long as the header says, once that fits the file: a
     * mapping past the file's end would raise SIGBUS when read. */
    mt_fr_header *h = mmap(NULL, sizeof *h, PROT_READ, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED) {
        snprintf(why, cap, "cannot map %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    uint64_t magic = READ_ONCE(h->magic);
    uint32_t version = READ_ONCE(h->version), record_size = READ_ONCE(h->record_size);
    uint32_t capacity = READ_ONCE(h->capacity);
    int32_t ring_rank = READ_ONCE(h->rank), ring_node = READ_ONCE(h->node);
    munmap(h, sizeof *h);
    uint64_t bytes = sizeof *h + (uint64_t)capacity * sizeof(mt_fr_record);
    if (magic != MT_FR_MAGIC || version != MT_FR_VERSION || record_size != sizeof(mt_fr_record)) {
        snprintf(why, cap, "%s is not a flight recorder ring of this version (version %u, "
                 "records of %u bytes; this mtrun reads version %d, %zu bytes)", path,
                 magic == MT_FR_MAGIC ? version : 0, magic == MT_FR_MAGIC ? record_size : 0,
                 MT_FR_VERSION, sizeof(mt_fr_record));
        close(fd);
        return -1;
    }
    if (capacity == 0 || capacity > MT_FR_MAX_CAPACITY || bytes > (uint64_t)st.st_size) {
        snprintf(why, cap, "%s is damaged: its header says %u records (%llu bytes), the file "
                 "has %lld bytes", path, capacity, (unsigned long long)bytes,
                 (long long)st.st_size);
        close(fd);
        return -1;
    }
    mt_fr_header *base = mmap(NULL, (size_t)bytes, PROT_READ, MAP_SHARED, fd, 0);
    int map_errno = errno;
    close(fd);
    if (base == MAP_FAILED) {
        snprintf(why, cap, "cannot map %s (%llu bytes): %s", path, (unsigned long long)bytes,
                 strerror(map_errno));
        return -1;
    }
    r->pid = atomic_load(&base->pid);
    if (node < 0) r->node = ring_node;
    if (rank < 0) r->rank = ring_rank;
    r->state = process_state(pid < 0 ? r->pid : pid);
    uint64_t next = atomic_load(&base->next);
    double mono0 = (double)atomic_load(&base->anchor_mono_ns) * 1e-9;
    double wall0 = (double)atomic_load(&base->anchor_wall_ns) * 1e-9;
    uint64_t first = next > capacity ? next - capacity : 0;
    r->total = next;
    r->e = calloc((size_t)(next - first) + 1, sizeof *r->e);
    if (!r->e) {
        munmap(base, (size_t)bytes);
        snprintf(why, cap, "out of memory for the %llu records of %s",
                 (unsigned long long)(next - first), path);
        return -1;
    }
    const mt_fr_record *slots = (const mt_fr_record *)(base + 1);
    for (uint64_t id = first; id < next; id++) {
        mt_fr_record c;
        if (!read_slot(&slots[id % capacity], &c)) continue;
        if (atomic_load(&c.lock) != 2 * id + 2) continue; /* overwritten meanwhile */
        mtrun_fr_entry *e = &r->e[r->n++];
        clean_group(e->group, sizeof e->group, c.group, sizeof c.group);
        e->seq = c.seq;
        e->group_size = c.group_size;
        e->group_rank = c.group_rank;
        e->op = c.op;
        e->dtype = c.dtype;
        e->bytes = c.bytes;
        uint64_t t[3] = {atomic_load(&c.queued_ns), atomic_load(&c.started_ns),
                         atomic_load(&c.completed_ns)};
        double *w[3] = {&e->queued, &e->started, &e->completed};
        for (int k = 0; k < 3; k++) *w[k] = t[k] ? wall0 + ((double)t[k] * 1e-9 - mono0) : 0;
        e->status = atomic_load(&c.status);
        e->waiting_peer = atomic_load(&c.waiting_peer);
    }
    munmap(base, (size_t)bytes);
    r->read_at = mtrun_fr_wall_now();
    return 0;
}

void mtrun_fr_rank_free(mtrun_fr_rank *r) {
    free(r->e);
    r->e = NULL;
    r->n = 0;
}

int mtrun_fr_collect(const mtrun_fr *f, const pid_t *pids, mtrun_fr_rank **out) {
    *out = NULL;
    if (!f || f->off) return 0;
    mtrun_fr_rank *all = calloc((size_t)f->nproc, sizeof *all);
    if (!all) {
        mtrun_msg("out of memory for the flight recorders of %d ranks: no diagnosis", f->nproc);
        return 0;
    }
    int n = 0;
    for (int i = 0; i < f->nproc; i++) {
        char why[PATH_MAX + 128];
        if (mtrun_fr_read(f->paths[i], f->node * f->nproc + i, f->node, pids ? pids[i] : 0,
                          &all[n], why, sizeof why) == 0)
            n++;
        else
            mtrun_msg("flight recorder of rank %d: %s", f->node * f->nproc + i, why);
    }
    *out = all;
    return n;
}
