/* Shared-memory path between ranks of one host.
 *
 * UCX moves large messages between local processes with cma: the receiver's process_vm_readv
 * pins every page of the sender's buffer on each transfer, and when two ranks copy towards each
 * other at once (every 2-rank ring step) that caps each direction at about a third of what memcpy
 * does (docs/benchmarks.md). Large CPU-device blocks are memfd-backed (core/shm_block.h), so for a
 * send whose bytes lie in one, to a rank on the same host, the sender passes only a descriptor
 * (pid, fd, serial, offset); the receiver maps the block once (pidfd_getfd + mmap, kept in a
 * small cache), copies with memcpy and acks, and the send completes on the ack, so the sender
 * never touches its buffer while a peer reads it. Receives accept either form (the descriptor
 * carries a tag bit they ignore), so nothing else needs to agree in advance.
 *
 * Runs on the progress thread only. MT_COMM_SHM=0 turns the path off (sends go as data). Where
 * the kernel refuses pidfd_getfd between ranks (Yama's ptrace_scope=1, a seccomp filter, a
 * kernel before 5.6) the ranks of the host find out at start and turn it off too, with one
 * warning: everything then goes through UCX.
 */
#include "comm/group.h"
#include "comm/host/shm.h"
#include "comm/host/ucx.h"
#include "comm/schedule.h"
#include "comm/work.h"

#include "core/copy_stream.h"
#include "core/error.h"

#include <meshtrain/log.h>
#include <meshtrain/runtime.h>
#include <meshtrain/store.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Peers' blocks kept mapped; the least recently used is unmapped beyond this. A mapping keeps a
 * freed block's memory alive until it is evicted or the transport closes. */
#define SHM_MAP_SLOTS 64

typedef struct mt_shm_map {
    int peer;
    uint64_t serial;
    void *base;
    size_t size;
    uint64_t used;
} mt_shm_map;

static const uint8_t ACK_OK = 1, ACK_FAILED = 2;

/* Whether this process may take a file descriptor of process pid (pidfd_getfd, with the ptrace
 * permission of UCX's cma): 0, or the errno of the refusal with why. A missing fd (EBADF) comes
 * after the permission check, so it counts as allowed. MT_TEST_PIDFD_GETFD_FAIL=EPERM plays a
 * kernel that refuses (the tests cannot change ptrace_scope or install a seccomp filter). */
static int probe_getfd(pid_t pid, int fd, char *why, size_t cap) {
    const char *inject = getenv("MT_TEST_PIDFD_GETFD_FAIL");
    if (inject && !strcmp(inject, "EPERM")) {
        snprintf(why, cap, "pidfd_getfd(pid %d): %s (MT_TEST_PIDFD_GETFD_FAIL)", (int)pid,
                 strerror(EPERM));
        return EPERM;
    }
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) {
        int e = errno;
        snprintf(why, cap, "pidfd_open(%d): %s", (int)pid, strerror(e));
        return e;
    }
    int got = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
    int e = got < 0 ? errno : 0;
    if (got >= 0) close(got);
    close(pidfd);
    if (e == 0 || e == EBADF) return 0;
    snprintf(why, cap, "pidfd_getfd(pid %d): %s", (int)pid, strerror(e));
    return e;
}

/* Every rank of a host probes the next local rank and publishes the outcome; the path stays on
 * only when every rank of the host may read its peers, since a sender cannot know whether a
 * reader can until it has failed. The host's lowest refused rank warns, once. */
static mt_status agree_on_getfd(mt_transport *tr) {
    mt_store *store = mt_runtime_store(tr->rt);
    double timeout = mt_runtime_timeout(tr->rt);
    int next = -1;
    for (int i = 1; i < tr->world && next < 0; i++) {
        int r = (tr->rank + i) % tr->world;
        if (tr->shm.same_host[r]) next = r;
    }
    if (next < 0) return MT_OK; /* alone on the host: nothing to read from */
    char key[64], value[320], why[256] = "";
    snprintf(key, sizeof key, "mt/shm/pid/%d", tr->rank);
    int n = snprintf(value, sizeof value, "%ld", (long)getpid());
    MT_TRY(mt_store_set(store, key, value, (size_t)n));
    snprintf(key, sizeof key, "mt/shm/pid/%d", next);
    void *v = NULL;
    MT_TRY(mt_store_get(store, key, timeout, &v, NULL));
    pid_t pid = (pid_t)strtol(v, NULL, 10);
    free(v);
    int refused = probe_getfd(pid, STDERR_FILENO, why, sizeof why);
    snprintf(key, sizeof key, "mt/shm/ok/%d", tr->rank);
    n = snprintf(value, sizeof value, "%d %s", refused ? 0 : 1, why);
    MT_TRY(mt_store_set(store, key, value, (size_t)n));
    int first_refused = -1;
    for (int r = 0; r < tr->world; r++) {
        if (r != tr->rank && !tr->shm.same_host[r]) continue;
        snprintf(key, sizeof key, "mt/shm/ok/%d", r);
        MT_TRY(mt_store_get(store, key, timeout, &v, NULL));
        bool ok = ((const char *)v)[0] == '1';
        free(v);
        if (!ok && first_refused < 0) first_refused = r;
    }
    if (first_refused < 0) return MT_OK;
    tr->shm.enabled = false;
    if (first_refused == tr->rank)
        mt_log(MT_LOG_WARN, "the kernel refuses to pass file descriptors between the ranks of "
               "this host (%s; Yama ptrace_scope or seccomp?): their large messages go through "
               "UCX instead of shared memory", why);
    return MT_OK;
}

mt_status mt_shm_init(mt_transport *tr) {
    const char *env = getenv("MT_COMM_SHM");
    tr->shm.enabled = !(env && !strcmp(env, "0"));
    /* Read here once, not per message: getenv on the progress thread would race a setenv. */
    const char *inject = getenv("MT_TEST_PIDFD_GETFD_FAIL");
    tr->shm.inject_eperm = inject && !strcmp(inject, "EPERM");
    tr->shm.min_bytes = 64u << 10;
    tr->shm.same_host = calloc((size_t)tr->world, sizeof *tr->shm.same_host);
    tr->shm.pidfds = malloc((size_t)tr->world * sizeof *tr->shm.pidfds);
    tr->shm.maps = calloc(SHM_MAP_SLOTS, sizeof *tr->shm.maps);
    if (!tr->shm.same_host || !tr->shm.pidfds || !tr->shm.maps)
        return mt_error(MT_ERR_OUT_OF_MEMORY, "allocating the shared-memory path's tables");
    const char *mine = mt_runtime_host_of(tr->rt, tr->rank);
    for (int r = 0; r < tr->world; r++) {
        const char *theirs = mt_runtime_host_of(tr->rt, r);
        tr->shm.same_host[r] = mine && theirs && strcmp(mine, theirs) == 0;
        tr->shm.pidfds[r] = -1;
    }
    return tr->shm.enabled ? agree_on_getfd(tr) : MT_OK;
}

void mt_shm_close(mt_transport *tr) {
    for (int i = 0; tr->shm.maps && i < tr->shm.nmaps; i++)
        munmap(tr->shm.maps[i].base, tr->shm.maps[i].size);
    for (int r = 0; tr->shm.pidfds && r < tr->world; r++)
        if (tr->shm.pidfds[r] >= 0) close(tr->shm.pidfds[r]);
    free(tr->shm.maps);
    free(tr->shm.pidfds);
    free(tr->shm.same_host);
    tr->shm.maps = NULL;
    tr->shm.pidfds = NULL;
    tr->shm.same_host = NULL;
}

/* An ack travels from the reader (group rank `reader`) to the sender: the tag the reader's own
 * data would carry, plus the ack bit, which no data or descriptor has. */
static uint64_t ack_tag_of(const mt_work *w, int reader, uint32_t sub) {
    return mt_tag_make(w, reader, sub) | MT_TAG_ACK_BIT;
}

uint64_t mt_shm_recv_mask(const mt_task *task) {
    return task->bytes >= sizeof(mt_shm_ref) ? ~MT_TAG_DESC_BIT : UINT64_MAX;
}

/* ---- sender ---------------------------------------------------------------------------------- */

static void shm_part_done(mt_task *task, ucs_status_t status) {
    if (status != UCS_OK && task->shm.status == UCS_OK) task->shm.status = status;
    if (--task->shm.parts > 0) return;
    ucs_status_t st = task->shm.status;
    if (st == UCS_OK && task->shm.ack_byte != ACK_OK) {
        char who[160];
        mt_work *w = task->work;
        mt_describe_rank(w->tr, mt_group_global_rank(w->group, task->peer), who, sizeof who);
        mt_work_fail(w, MT_ERR_COMM, "%s could not map this rank's shared memory to read %zu "
                     "bytes (see its log; MT_COMM_SHM=0 sends the data through UCX instead)", who,
                     task->bytes);
        st = UCS_ERR_IO_ERROR;
    }
    mt_task_done(task, st);
}

static void desc_sent_cb(void *request, ucs_status_t status, void *user_data) {
    shm_part_done(user_data, status);
    ucp_request_free(request);
}

static void ack_cb(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                   void *user_data) {
    mt_task *task = user_data;
    task->shm.ack_req = NULL;
    shm_part_done(task, status);
    ucp_request_free(request);
}

/* Handles what ucp_*_nbx returned for one part of a shared-memory send. */
static void part_posted(mt_task *task, void *req, void **slot) {
    if (req == NULL) shm_part_done(task, UCS_OK);
    else if (UCS_PTR_IS_ERR(req)) shm_part_done(task, UCS_PTR_STATUS(req));
    else if (slot) *slot = req;
}

bool mt_shm_try_send(mt_transport *tr, mt_task *task, uint64_t tag, int peer_global) {
    if (!tr->shm.enabled || !tr->shm.same_host[peer_global] || peer_global == tr->rank ||
        task->bytes < tr->shm.min_bytes)
        return false;
    if (!mt_device_shared_range(mt_runtime_device(tr->rt), task->src, task->bytes,
                                &task->shm.desc))
        return false;
    task->shm.parts = 2;
    task->shm.status = UCS_OK;
    task->shm.ack_byte = 0;
    ucp_request_param_t param;
    memset(&param, 0, sizeof param);
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                         UCP_OP_ATTR_FIELD_DATATYPE;
    param.datatype = ucp_dt_make_contig(1);
    param.user_data = task;
    uint64_t ack_tag = ack_tag_of(task->work, task->peer, task->sub);
    param.cb.recv = ack_cb;
    part_posted(task, ucp_tag_recv_nbx(tr->worker, &task->shm.ack_byte, 1, ack_tag, UINT64_MAX,
                                       &param),
                &task->shm.ack_req);
    param.cb.send = desc_sent_cb;
    part_posted(task, ucp_tag_send_nbx(tr->eps[peer_global], &task->shm.desc,
                                       sizeof task->shm.desc, tag | MT_TAG_DESC_BIT, &param),
                &task->req);
    return true;
}

/* ---- receiver -------------------------------------------------------------------------------- */

static void *map_block(mt_transport *tr, int peer, const mt_shm_ref *ref, char *why, size_t cap) {
    mt_shm_map *maps = tr->shm.maps;
    int victim = 0;
    for (int i = 0; i < tr->shm.nmaps; i++) {
        if (maps[i].peer == peer && maps[i].serial == ref->serial) {
            maps[i].used = ++tr->shm.clock;
            return maps[i].base;
        }
        if (maps[i].used < maps[victim].used) victim = i;
    }
    if (tr->shm.pidfds[peer] < 0) {
        int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)ref->pid, 0);
        if (pidfd < 0) {
            snprintf(why, cap, "pidfd_open(%d): %s", (int)ref->pid, strerror(errno));
            return NULL;
        }
        tr->shm.pidfds[peer] = pidfd;
    }
    /* The test hook refuses here too, so that a path left on by mistake fails the test. */
    int fd = tr->shm.inject_eperm
                 ? (errno = EPERM, -1)
                 : (int)syscall(SYS_pidfd_getfd, tr->shm.pidfds[peer], ref->fd, 0);
    if (fd < 0) {
        snprintf(why, cap, "pidfd_getfd(pid %d, fd %d): %s (ptrace permission is needed, as for "
                 "UCX's cma)", (int)ref->pid, (int)ref->fd, strerror(errno));
        return NULL;
    }
    void *base = mmap(NULL, ref->block_size, PROT_READ, MAP_SHARED, fd, 0);
    int saved = errno;
    close(fd);
    if (base == MAP_FAILED) {
        snprintf(why, cap, "mmap of %llu bytes: %s", (unsigned long long)ref->block_size,
                 strerror(saved));
        return NULL;
    }
    int slot;
    if (tr->shm.nmaps < SHM_MAP_SLOTS) {
        slot = tr->shm.nmaps++;
    } else {
        slot = victim; /* copies are synchronous: nothing reads it now */
        munmap(maps[slot].base, maps[slot].size);
    }
    maps[slot] = (mt_shm_map){.peer = peer, .serial = ref->serial, .base = base,
                              .size = ref->block_size, .used = ++tr->shm.clock};
    return base;
}

static void ack_sent_cb(void *request, ucs_status_t status, void *user_data) {
    ucp_request_free(request);
}

/* Tells the sender of a descriptor that its bytes were read (or could not be). */
static void send_ack(mt_transport *tr, mt_task *task, bool ok) {
    mt_work *w = task->work;
    int peer = mt_group_global_rank(w->group, task->peer);
    ucp_request_param_t param;
    memset(&param, 0, sizeof param);
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_DATATYPE;
    param.datatype = ucp_dt_make_contig(1);
    param.cb.send = ack_sent_cb;
    uint64_t ack_tag = ack_tag_of(w, w->group->rank, task->sub);
    void *req = ucp_tag_send_nbx(tr->eps[peer], ok ? &ACK_OK : &ACK_FAILED, 1, ack_tag, &param);
    if (UCS_PTR_IS_ERR(req))
        mt_log(MT_LOG_WARN, "acknowledging a shared-memory read to rank %d failed: %s", peer,
               ucs_status_string(UCS_PTR_STATUS(req)));
}

void mt_shm_release(mt_transport *tr, mt_task *recv_task) {
    recv_task->shm.src = NULL;
    send_ack(tr, recv_task, true);
}

ucs_status_t mt_shm_receive(mt_transport *tr, mt_task *task, size_t length) {
    mt_work *w = task->work;
    int peer = mt_group_global_rank(w->group, task->peer);
    char who[160], why[256] = "";
    mt_shm_ref ref;
    const char *base = NULL;
    if (length != sizeof ref) {
        snprintf(why, sizeof why, "a descriptor of %zu bytes (expected %zu)", length, sizeof ref);
    } else {
        memcpy(&ref, task->dst, sizeof ref);
        if (ref.offset > ref.block_size || task->bytes > ref.block_size - ref.offset)
            snprintf(why, sizeof why, "%zu bytes at offset %llu do not fit its block of %llu",
                     task->bytes, (unsigned long long)ref.offset,
                     (unsigned long long)ref.block_size);
        else
            base = map_block(tr, peer, &ref, why, sizeof why);
    }
    if (base && task->consumer >= 0 && !w->failing) {
        /* The reduction reads the peer's bytes where they are; it acks when it ran. */
        task->shm.src = base + ref.offset;
        return UCS_OK;
    }
    if (base && task->feeds_reduce) memcpy(task->dst, base + ref.offset, task->bytes);
    else if (base) mt_copy_stream(task->dst, base + ref.offset, task->bytes);
    /* Ack either way, so that the sender never waits for a reader that gave up. */
    send_ack(tr, task, base != NULL);
    if (base) return UCS_OK;
    mt_describe_rank(tr, peer, who, sizeof who);
    mt_work_fail(w, MT_ERR_COMM, "reading %zu bytes from the shared memory of %s failed: %s "
                 "(MT_COMM_SHM=0 sends the data through UCX instead)", task->bytes, who, why);
    return UCS_ERR_IO_ERROR;
}
