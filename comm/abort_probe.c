/* The process's abort probe (comm/abort_probe.h). */
#include "comm/abort_probe.h"

#include "core/clock.h"

#include <pthread.h>
#include <stdio.h>

static pthread_mutex_t probe_mu = PTHREAD_MUTEX_INITIALIZER;
static mt_abort_probe_fn probe_fn;
static void *probe_arg;
static double last_probe_s;
/* Once seen, an abort stays: later waits end at once with the same message. */
static bool aborted;
static mt_status abort_status;
static char abort_why[1024];

void mt_comm_set_abort_probe(mt_abort_probe_fn fn, void *arg) {
    pthread_mutex_lock(&probe_mu);
    probe_fn = fn;
    probe_arg = arg;
    last_probe_s = 0.0;
    if (fn) {
        aborted = false;
        abort_why[0] = '\0';
    }
    pthread_mutex_unlock(&probe_mu);
}

bool mt_comm_job_aborted(mt_status *status, char *why, size_t cap) {
    pthread_mutex_lock(&probe_mu);
    double now = mt_clock_now_s();
    if (!aborted && probe_fn && now - last_probe_s >= MT_ABORT_PROBE_INTERVAL_S) {
        last_probe_s = now;
        aborted = probe_fn(probe_arg, &abort_status, abort_why, sizeof abort_why);
    }
    bool result = aborted;
    if (result && status) *status = abort_status;
    if (result && why && cap) snprintf(why, cap, "%s", abort_why);
    pthread_mutex_unlock(&probe_mu);
    return result;
}
