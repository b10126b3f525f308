/* Process groups. A group's id (16 bits of every message tag) is agreed through the store: the
 * members build one key from the rank list, the name and how many groups with that membership and
 * name this process created before; the lowest member allocates the id with mt_store_add and
 * publishes it under that key, the others wait for it. The world group has id 0. */
#include "comm/group.h"
#include "comm/host/ucx.h"
#include "comm/schedule.h"

#include "core/clock.h"
#include "core/error.h"

#include <meshtrain/log.h>
#include <meshtrain/runtime.h>
#include <meshtrain/store.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mt_group *mt_group_alloc(mt_transport *tr, const int *ranks, int nranks, const char *name) {
    mt_group *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->tr = tr;
    g->rt = tr->rt;
    g->size = nranks;
    g->rank = -1;
    snprintf(g->name, sizeof g->name, "%s", name && *name ? name : "unnamed");
    g->ranks = malloc((size_t)nranks * sizeof *g->ranks);
    g->p2p_send_seq = calloc((size_t)nranks, sizeof *g->p2p_send_seq);
    g->p2p_recv_seq = calloc((size_t)nranks, sizeof *g->p2p_recv_seq);
    if (!g->ranks || !g->p2p_send_seq || !g->p2p_recv_seq) {
        mt_group_free(g);
        return NULL;
    }
    for (int i = 0; i < nranks; i++) {
        g->ranks[i] = ranks[i];
        if (ranks[i] == tr->rank) g->rank = i;
    }
    atomic_init(&g->failed, false);
    return g;
}

void mt_group_free(mt_group *g) {
    if (!g) return;
    free(g->ranks);
    mt_group_free_scratch(g);
    free(g->p2p_send_seq);
    free(g->p2p_recv_seq);
    free(g);
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t len) {
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= UINT64_C(1099511628211);
    }
    return h;
}

/* How many groups with this membership and name this process created before (then counts this
 * one). Members create the same groups in the same order, so they agree on it. */
static int next_membership_index(mt_transport *tr, uint64_t hash, const char *name) {
    pthread_mutex_lock(&tr->mu);
    mt_membership_count *m = tr->memberships;
    while (m && !(m->hash == hash && strcmp(m->name, name) == 0)) m = m->next;
    if (!m && (m = calloc(1, sizeof *m))) {
        m->hash = hash;
        snprintf(m->name, sizeof m->name, "%s", name);
        m->next = tr->memberships;
        tr->memberships = m;
    }
    int index = m ? m->count++ : -1;
    pthread_mutex_unlock(&tr->mu);
    return index;
}

static mt_status validate(mt_transport *tr, const int *ranks, int nranks, const char *name) {
    if (!ranks || nranks <= 0)
        return mt_error(MT_ERR_INVALID_ARG, "mt_group_create('%s'): needs at least one rank", name);
    if (nranks > tr->world || nranks > MT_GROUP_MAX_RANKS)
        return mt_error(MT_ERR_INVALID_ARG,
                        "mt_group_create('%s'): %d ranks, but the job has %d (at most %d per "
                        "group)", name, nranks, tr->world, MT_GROUP_MAX_RANKS);
    bool member = false;
    for (int i = 0; i < nranks; i++) {
        if (ranks[i] < 0 || ranks[i] >= tr->world)
            return mt_error(MT_ERR_INVALID_ARG,
                            "mt_group_create('%s'): rank %d is outside the job's 0..%d", name,
                            ranks[i], tr->world - 1);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return mt_error(MT_ERR_INVALID_ARG, "mt_group_create('%s'): rank %d is listed twice",
                                name, ranks[i]);
        if (ranks[i] == tr->rank) member = true;
    }
    if (!member)
        return mt_error(MT_ERR_INVALID_ARG,
                        "mt_group_create('%s'): this process (rank %d) is not in the rank list",
                        name, tr->rank);
    return MT_OK;
}

mt_status mt_group_create(mt_runtime *rt, const int *ranks, int nranks, const char *name,
                          mt_group **out) {
    if (!out) return mt_error(MT_ERR_INVALID_ARG, "mt_group_create: out is NULL");
    *out = NULL;
    if (!rt) return mt_error(MT_ERR_INVALID_ARG, "mt_group_create: runtime is NULL");
    mt_transport *tr = mt_runtime_transport(rt);
    if (!tr) return mt_error(MT_ERR_INVALID_ARG, "mt_group_create: the runtime has no transport");
    if (!name || !*name) name = "unnamed";
    MT_TRY(validate(tr, ranks, nranks, name));

    uint64_t hash = fnv1a(UINT64_C(14695981039346656037), &nranks, sizeof nranks);
    hash = fnv1a(hash, ranks, (size_t)nranks * sizeof *ranks);
    int index = next_membership_index(tr, hash, name);
    if (index < 0) return mt_error(MT_ERR_OUT_OF_MEMORY, "mt_group_create('%s')", name);
    char key[MT_STORE_MAX_KEY];
    snprintf(key, sizeof key, "mt/group/%016llx/%d/%.200s/%d", (unsigned long long)hash, nranks,
             name, index);
    int lowest = ranks[0];
    for (int i = 1; i < nranks; i++)
        if (ranks[i] < lowest) lowest = ranks[i];

    mt_store *store = mt_runtime_store(rt);
    int64_t id;
    if (tr->rank == lowest) {
        MT_TRY(mt_store_add(store, "mt/group/next_id", 1, &id));
        char value[32];
        int len = snprintf(value, sizeof value, "%lld", (long long)id);
        mt_status st = mt_store_set(store, key, value, (size_t)len);
        if (st != MT_OK)
            return mt_error_wrap(st, "creating group '%s' of %d ranks: publishing its id", name,
                                 nranks);
    } else {
        void *value;
        size_t len;
        mt_status st = mt_store_get(store, key, mt_runtime_timeout(rt), &value, &len);
        if (st != MT_OK) {
            char who[160];
            mt_describe_rank(tr, lowest, who, sizeof who);
            return mt_error_wrap(st, "creating group '%s' of %d ranks: waiting for its lowest "
                                     "member, %s, to publish the group id", name, nranks, who);
        }
        id = strtoll(value, NULL, 10);
        free(value);
    }
    mt_group *g = mt_group_alloc(tr, ranks, nranks, name);
    if (!g) return mt_error(MT_ERR_OUT_OF_MEMORY, "mt_group_create('%s')", name);
    /* 0 is the world group's. */
    g->id = (uint32_t)(1 + (id - 1) % 0xffff);
    *out = g;
    return MT_OK;
}

void mt_group_destroy(mt_group *g) {
    if (!g || g->is_world) return;
    mt_transport *tr = g->tr;
    /* Works end by their own deadlines (an abandoned one once its receives are cancelled):
     * MT_TIMEOUT_S more is generous. A group still in use then is left allocated rather than
     * freed under the progress thread. */
    double timeout = mt_runtime_timeout(tr->rt), end_s = mt_clock_now_s() + timeout;
    pthread_mutex_lock(&tr->mu);
    while (g->pending > 0 && mt_clock_now_s() < end_s) {
        struct timespec until = mt_clock_deadline(end_s - mt_clock_now_s());
        pthread_cond_timedwait(&tr->done_cv, &tr->mu, &until);
    }
    int pending = g->pending;
    pthread_mutex_unlock(&tr->mu);
    if (pending > 0) {
        mt_log(MT_LOG_ERROR, "destroying group '%s': %d operation%s still unfinished after %g s "
               "(MT_TIMEOUT_S); the group is left allocated", g->name, pending,
               pending == 1 ? "" : "s", timeout);
        return;
    }
    mt_group_free(g);
}

int mt_group_size(const mt_group *g) { return g ? g->size : 0; }
int mt_group_rank(const mt_group *g) { return g ? g->rank : -1; }
int mt_group_global_rank(const mt_group *g, int i) {
    return g && i >= 0 && i < g->size ? g->ranks[i] : -1;
}
const char *mt_group_name(const mt_group *g) { return g ? g->name : "(null)"; }

mt_status mt_group_check_usable(mt_group *g, const char *op) {
    if (!g) return mt_error(MT_ERR_INVALID_ARG, "%s: group is NULL", op);
    if (atomic_load(&g->failed)) {
        pthread_mutex_lock(&g->tr->mu);
        mt_status st = mt_error(MT_ERR_COMM, "%s on group '%s' (%d ranks): the group is unusable "
                                             "after an earlier failure: %s",
                                op, g->name, g->size, g->fail_msg);
        pthread_mutex_unlock(&g->tr->mu);
        return st;
    }
    return MT_OK;
}

void mt_group_mark_failed(mt_group *g, const char *msg) {
    pthread_mutex_lock(&g->tr->mu);
    if (!atomic_load(&g->failed)) {
        snprintf(g->fail_msg, sizeof g->fail_msg, "%s", msg);
        atomic_store(&g->failed, true);
    }
    pthread_mutex_unlock(&g->tr->mu);
}
