/* Work handles, whatever backend carries them: allocation, references, submission, the public
 * mt_work_wait/test/free entry points (which dispatch through w->backend, comm/backend.h) and the
 * operation's name and prefix in error messages. */
#include "comm/backend.h"
#include "comm/group.h"

#include "core/error.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *mt_op_name(mt_op_kind kind) {
    switch (kind) {
    case MT_OP_ALL_GATHER: return "all_gather";
    case MT_OP_REDUCE_SCATTER: return "reduce_scatter";
    case MT_OP_ALL_REDUCE: return "all_reduce";
    case MT_OP_BROADCAST: return "broadcast";
    case MT_OP_BARRIER: return "barrier";
    case MT_OP_SEND: return "send";
    case MT_OP_RECV: return "recv";
    }
    return "operation";
}

void mt_work_describe(const mt_work *w, char *out, size_t cap) {
    snprintf(out, cap, "%s on group '%s' (%d ranks)", mt_op_name(w->kind), w->group->name,
             w->group->size);
}

void mt_work_fail(mt_work *w, mt_status status, const char *fmt, ...) {
    if (w->failing) return; /* the first failure is the one worth reporting */
    w->failing = true;
    w->status = status;
    char prefix[160], msg[MT_ERRMSG_CAP];
    mt_work_describe(w, prefix, sizeof prefix);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(w->errmsg, sizeof w->errmsg, "%s: %s", prefix, msg);
}

mt_work *mt_work_new(mt_group *group, mt_op_kind kind, const mt_comm_backend *backend) {
    mt_work *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->kind = kind;
    w->group = group;
    w->tr = group->tr;
    w->backend = backend;
    w->root = -1;
    atomic_init(&w->refs, 1);
    atomic_init(&w->waiting_peer, -1);
    atomic_init(&w->abort_requested, false);
    return w;
}

void mt_work_unref(mt_work *w) {
    if (atomic_fetch_sub(&w->refs, 1) == 1) {
        free(w->tasks);
        free(w);
    }
}

/* MT_TEST_COLL_LAUNCH_FAIL=1: the launch fails as a backend's refusal would. Read once, at the
 * first launch: getenv per launch scans environ and races a concurrent setenv. */
static pthread_once_t launch_fail_once = PTHREAD_ONCE_INIT;
static atomic_bool launch_fail;

static void read_launch_fail(void) {
    const char *fail = getenv("MT_TEST_COLL_LAUNCH_FAIL");
    atomic_store(&launch_fail, fail && strcmp(fail, "1") == 0);
}

void mt_work_inject_launch_failure(bool on) {
    pthread_once(&launch_fail_once, read_launch_fail);
    atomic_store(&launch_fail, on);
}

static mt_status injected_launch_failure(const mt_work *w) {
    pthread_once(&launch_fail_once, read_launch_fail);
    if (!atomic_load(&launch_fail)) return MT_OK;
    char what[160];
    mt_work_describe(w, what, sizeof what);
    return mt_error(MT_ERR_COMM, "%s: cannot launch it on the %s backend (injected by "
                    "MT_TEST_COLL_LAUNCH_FAIL=1)", what, w->backend->name);
}

mt_status mt_work_submit_or_wait(mt_work *w, mt_work **out) {
    if (out) *out = NULL;
    mt_status st = injected_launch_failure(w);
    if (st == MT_OK) st = w->backend->submit(w);
    if (st != MT_OK) {
        mt_work_unref(w);
        return st;
    }
    /* Counted only now: a collective that did not launch moved no bytes. */
    mt_group_count(w->group, (int)w->kind, w->payload);
    if (out) {
        *out = w;
        return MT_OK;
    }
    st = mt_work_wait(w, -1);
    mt_work_free(w);
    return st;
}

mt_status mt_work_wait(mt_work *w, double timeout_s) {
    if (!w) return mt_error(MT_ERR_INVALID_ARG, "mt_work_wait: work is NULL");
    mt_status st = w->backend->wait(w, timeout_s);
    if (st == MT_ERR_TIMEOUT) w->backend->cancel(w);
    return st;
}

mt_status mt_work_test(mt_work *w, bool *done) {
    *done = false;
    if (!w) return mt_error(MT_ERR_INVALID_ARG, "mt_work_test: work is NULL");
    return w->backend->test(w, done);
}

void mt_work_free(mt_work *w) {
    if (!w) return;
    w->backend->release(w);
    mt_work_unref(w);
}
