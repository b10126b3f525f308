/* Hang diagnosis from the flight recorder rings (diagnose.h).
 *
 * Per group (a name and its job-wide id, "dp#2", so the dp group of one tp rank is told from
 * another's), sends and receives aside since their sequence numbers count per peer:
 *   - disagreement: the lowest sequence number at which two members recorded different
 *     collectives (operation, then payload). Members whose ring wrapped past it say nothing.
 *   - behind: the highest sequence number any member issued is the front; members that have not
 *     issued it while others wait in it are behind. When every member issued it and all wait,
 *     the member the others' schedules wait on (their awaited peer) is named instead.
 * A rank behind in one group is often only waiting in another (its tp peer stopped, so its dp
 * collective never comes): ranks that are behind and wait in nothing themselves, or whose process
 * is stopped, are the causes and are named first; the others follow as consequences. */
#include "diagnose.h"

#include <meshtrain/dtype.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* In mt_op_kind's order (comm/work.h). */
static const char *const op_names[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast",
                                       "barrier",    "send",           "recv"};
enum { OP_SEND = 5, OP_RECV = 6 };

const char *mtrun_fr_op_name(int op) {
    if (op < 0 || op >= (int)(sizeof op_names / sizeof op_names[0])) return "operation";
    return op_names[op];
}

bool mtrun_fr_op_is_collective(int op) { return op != OP_SEND && op != OP_RECV; }

typedef struct text {
    char *p;
    size_t cap, len;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
    if (t->len + 1 >= t->cap) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    t->len += (size_t)n;
    if (t->len >= t->cap) t->len = t->cap - 1;
}

/* "64 MiB", "512 B" */
static void put_bytes(text *t, uint64_t b) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0) put(t, "%llu B", (unsigned long long)b);
    else put(t, "%.*f %s", v == (double)(uint64_t)v ? 0 : 1, v, units[u]);
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* "rank 3" or "ranks 0-2, 5" for the n ranks in r (sorted here). */
static void put_ranks(text *t, int *r, int n) {
    qsort(r, (size_t)n, sizeof *r, cmp_int);
    put(t, "rank%s ", n == 1 ? "" : "s");
    for (int i = 0; i < n;) {
        int j = i;
        while (j + 1 < n && r[j + 1] == r[j] + 1) j++;
        put(t, "%s", i ? ", " : "");
        if (j == i) put(t, "%d", r[i]);
        else put(t, "%d-%d", r[i], r[j]);
        i = j + 1;
    }
}

/* The entry of rank r for (group, seq), or NULL (never issued, or overwritten since). */
static const mtrun_fr_entry *find(const mtrun_fr_rank *r, const char *group, uint32_t seq) {
    for (int i = r->n - 1; i >= 0; i--)
        if (mtrun_fr_op_is_collective(r->e[i].op) && r->e[i].seq == seq &&
            strcmp(r->e[i].group, group) == 0)
            return &r->e[i];
    return NULL;
}

/* Rank r's latest entry in group, or NULL. */
static const mtrun_fr_entry *last_in(const mtrun_fr_rank *r, const char *group) {
    const mtrun_fr_entry *best = NULL;
    for (int i = 0; i < r->n; i++)
        if (mtrun_fr_op_is_collective(r->e[i].op) && strcmp(r->e[i].group, group) == 0 &&
            (!best || r->e[i].seq > best->seq))
            best = &r->e[i];
    return best;
}

/* Its last successfully completed entry in group, or NULL. */
static const mtrun_fr_entry *last_done_in(const mtrun_fr_rank *r, const char *group) {
    const mtrun_fr_entry *best = NULL;
    for (int i = 0; i < r->n; i++) {
        const mtrun_fr_entry *e = &r->e[i];
        if (mtrun_fr_op_is_collective(e->op) && e->completed > 0 && e->status == 0 &&
            strcmp(e->group, group) == 0 && (!best || e->seq > best->seq))
            best = e;
    }
    return best;
}

static bool in_flight(const mtrun_fr_entry *e) { return e->completed == 0 || e->status != 0; }

/* Whether the rank waits in any collective (one not completed, or failed: its wait ran out). */
static bool waits_somewhere(const mtrun_fr_rank *r) {
    for (int i = 0; i < r->n; i++)
        if (mtrun_fr_op_is_collective(r->e[i].op) && in_flight(&r->e[i])) return true;
    return false;
}

typedef struct finding {
    int rank;          /* the rank behind */
    bool cause;        /* waits in nothing itself, or its process is stopped */
    char line[1024];
} finding;

/* The distinct collective groups seen in any ring. */
static int list_groups(const mtrun_fr_rank *ranks, int nranks, char (*names)[MTRUN_FR_GROUP_CAP],
                       int max) {
    int n = 0;
    for (int r = 0; r < nranks; r++)
        for (int i = 0; i < ranks[r].n; i++) {
            const mtrun_fr_entry *e = &ranks[r].e[i];
            if (!mtrun_fr_op_is_collective(e->op)) continue;
            int k = 0;
            while (k < n && strcmp(names[k], e->group) != 0) k++;
            if (k == n && n < max) snprintf(names[n++], MTRUN_FR_GROUP_CAP, "%s", e->group);
        }
    return n;
}

/* A rank's entries of one group in seq order (ring order among equal seqs). */
typedef struct seq_list {
    const mtrun_fr_entry **e;
    int n, pos;
} seq_list;

static int by_seq(const void *a, const void *b) {
    const mtrun_fr_entry *x = *(const mtrun_fr_entry *const *)a;
    const mtrun_fr_entry *y = *(const mtrun_fr_entry *const *)b;
    if (x->seq != y->seq) return (x->seq > y->seq) - (x->seq < y->seq);
    return (x > y) - (x < y);
}

static void free_lists(seq_list *l, int n) {
    for (int r = 0; l && r < n; r++) free(l[r].e);
    free(l);
}

/* Each rank's entries of group, sorted by seq; NULL when memory ran out. */
static seq_list *group_lists(const mtrun_fr_rank *ranks, int nranks, const char *group) {
    seq_list *l = calloc((size_t)(nranks > 0 ? nranks : 1), sizeof *l);
    for (int r = 0; l && r < nranks; r++) {
        l[r].e = malloc((size_t)(ranks[r].n > 0 ? ranks[r].n : 1) * sizeof *l[r].e);
        if (!l[r].e) {
            free_lists(l, nranks);
            return NULL;
        }
        for (int i = 0; i < ranks[r].n; i++) {
            const mtrun_fr_entry *e = &ranks[r].e[i];
            if (mtrun_fr_op_is_collective(e->op) && strcmp(e->group, group) == 0)
                l[r].e[l[r].n++] = e;
        }
        qsort(l[r].e, (size_t)l[r].n, sizeof *l[r].e, by_seq);
    }
    return l;
}

/* The lowest seq of group where members recorded different collectives: one line and that seq,
 * or false. The seqs are walked in step through each rank's sorted entries: searching every ring
 * for every seq of the group's range took minutes for rings of 65536 records, with mtrun doing
 * nothing else. */
static bool disagreement(const mtrun_fr_rank *ranks, int nranks, const char *group, text *t,
                         uint32_t *at) {
    int *who = malloc((size_t)(nranks > 0 ? nranks : 1) * sizeof *who);
    const mtrun_fr_entry **what = malloc((size_t)(nranks > 0 ? nranks : 1) * sizeof *what);
    seq_list *l = group_lists(ranks, nranks, group);
    if (!who || !what || !l) put(t, "(group %s: out of memory looking for disagreements)\n", group);
    bool found = false;
    while (!found && who && what && l) {
        uint64_t s = UINT64_MAX; /* the lowest seq not yet looked at */
        for (int r = 0; r < nranks; r++)
            if (l[r].pos < l[r].n && l[r].e[l[r].pos]->seq < s) s = l[r].e[l[r].pos]->seq;
        if (s == UINT64_MAX) break;
        int n = 0;
        for (int r = 0; r < nranks; r++) {
            const mtrun_fr_entry *e = NULL; /* the latest of the rank's entries of seq s */
            while (l[r].pos < l[r].n && l[r].e[l[r].pos]->seq == s) e = l[r].e[l[r].pos++];
            if (e) {
                who[n] = ranks[r].rank;
                what[n++] = e;
            }
        }
        for (int i = 1; i < n && !found; i++)
            found = what[i]->op != what[0]->op || what[i]->bytes != what[0]->bytes ||
                    what[i]->dtype != what[0]->dtype;
        if (!found) continue;
        *at = (uint32_t)s;
        /* Named by the first of operation, size, dtype that differs. */
        bool by_op = false, by_bytes = false;
        for (int i = 1; i < n; i++) {
            by_op = by_op || what[i]->op != what[0]->op;
            by_bytes = by_bytes || what[i]->bytes != what[0]->bytes;
        }
        put(t, "ranks disagree at group %s seq %llu:", group, (unsigned long long)s);
        /* one clause per distinct collective, in the order the ranks come */
        bool *said = calloc((size_t)n, sizeof *said);
        int *these = malloc((size_t)n * sizeof *these);
        for (int i = 0; i < n && said && these; i++) {
            if (said[i]) continue;
            int m = 0;
            for (int j = i; j < n; j++)
                if (!said[j] && what[j]->op == what[i]->op &&
                    (by_op || (by_bytes ? what[j]->bytes == what[i]->bytes
                                        : what[j]->dtype == what[i]->dtype))) {
                    said[j] = true;
                    these[m++] = who[j];
                }
            put(t, "%s ", i ? "," : "");
            put_ranks(t, these, m);
            put(t, i ? " %s" : " issued %s", mtrun_fr_op_name(what[i]->op));
            if (!by_op && by_bytes) {
                put(t, " of ");
                put_bytes(t, what[i]->bytes);
            } else if (!by_op) {
                put(t, " of %s", mt_dtype_name((mt_dtype)what[i]->dtype));
            }
        }
        put(t, "\n");
        free(said);
        free(these);
    }
    free_lists(l, nranks);
    free(who);
    free(what);
    return found;
}

static void describe_behind(const mtrun_fr_rank *b, const char *group, text *t, double now) {
    const mtrun_fr_entry *done = last_done_in(b, group);
    const mtrun_fr_entry *last = last_in(b, group);
    if (done)
        put(t, "; rank %d's last completed is seq %llu, %.1f s ago", b->rank,
            (unsigned long long)done->seq, now - done->completed);
    else if (b->pid == 0)
        put(t, "; rank %d never recorded a collective (it did not reach its first one?)",
            b->rank);
    else
        put(t, "; rank %d completed none of the group's collectives still in its ring", b->rank);
    if (last && in_flight(last) && (!done || last->seq > done->seq))
        put(t, ", and it is in %s seq %llu", mtrun_fr_op_name(last->op),
            (unsigned long long)last->seq);
    if (b->state == 'T' || b->state == 't') put(t, "; its process is stopped");
    else if (b->state == '-' && b->pid != 0) put(t, "; its process is gone");
}

/* Findings of group: ranks behind its front while others wait there. A front where members
 * disagree (disagree_at, -1: none) has none: they wait because of the disagreement (the host
 * backend's messages carry the operation, so they never match). */
static int behind_in(const mtrun_fr_rank *ranks, int nranks, const char *group, double now,
                     double min_wait_s, int64_t disagree_at, finding *out, int max) {
    /* the front: the highest seq issued, with its collective */
    const mtrun_fr_entry *front = NULL;
    int size = 0;
    /* each rank's latest entry of the group, looked up once (the votes below ask for them per
     * waiter) */
    const mtrun_fr_entry **last = malloc((size_t)(nranks > 0 ? nranks : 1) * sizeof *last);
    if (!last) return 0;
    for (int r = 0; r < nranks; r++) {
        const mtrun_fr_entry *e = last[r] = last_in(&ranks[r], group);
        if (!e) continue;
        if (!front || e->seq > front->seq) front = e;
        if (e->group_size > size) size = e->group_size;
    }
    if (!front || (int64_t)front->seq == disagree_at) {
        free(last);
        return 0;
    }
    int *waiters = malloc((size_t)nranks * sizeof *waiters);
    int *behind = malloc((size_t)nranks * sizeof *behind);
    int *votes = calloc((size_t)nranks, sizeof *votes);
    int nw = 0, nb = 0, members = 0;
    double oldest = now;
    for (int r = 0; r < nranks && waiters && behind && votes; r++) {
        const mtrun_fr_entry *l = last[r];
        if (!l) continue;
        members++;
        const mtrun_fr_entry *e = find(&ranks[r], group, front->seq);
        if (!e) {
            behind[nb++] = r;
        } else if (in_flight(e)) {
            waiters[nw++] = r;
            if (e->queued > 0 && e->queued < oldest) oldest = e->queued;
            /* whom it waits on, by group rank: the member that has that group rank */
            for (int q = 0; e->waiting_peer >= 0 && q < nranks; q++) {
                const mtrun_fr_entry *m = last[q];
                if (m && m->group_rank == e->waiting_peer) votes[q]++;
            }
        }
    }
    int found = 0;
    /* read before the others issued the front: it may have issued it since */
    int kept = 0;
    for (int k = 0; k < nb; k++)
        if (ranks[behind[k]].read_at <= 0 || ranks[behind[k]].read_at >= oldest)
            behind[kept++] = behind[k];
    nb = kept;
    if (now - oldest < min_wait_s) nw = 0; /* nobody has waited long: no finding */
    if (nw > 0 && nb == 0 && nw == members && members == size) {
        /* All issued the front and wait: the most awaited member is the one behind, when
         * the schedules say whom they wait on. */
        int best = -1;
        for (int r = 0; r < nranks; r++)
            if (votes[r] > 0 && (best < 0 || votes[r] > votes[best])) best = r;
        if (best >= 0) behind[nb++] = best;
    }
    if (nw > 0 && nb == 0 && members < size && found < max) {
        /* The lagging members recorded nothing of the group (they never reached its first
         * collective, or their rings wrapped past it): named by their place in the group. */
        bool *seen = calloc((size_t)size, sizeof *seen);
        int *absent = malloc((size_t)size * sizeof *absent);
        int na = 0;
        for (int r = 0; seen && r < nranks; r++) {
            const mtrun_fr_entry *l = last[r];
            if (l && l->group_rank >= 0 && l->group_rank < size) seen[l->group_rank] = true;
        }
        for (int g = 0; seen && absent && g < size; g++)
            if (!seen[g]) absent[na++] = g;
        finding *f = &out[found++];
        text t = {f->line, sizeof f->line, 0};
        f->rank = -1;
        f->cause = true;
        put(&t, "%d rank%s of group %s wait%s in %s seq %llu (", nw, nw == 1 ? "" : "s", group,
            nw == 1 ? "s" : "", mtrun_fr_op_name(front->op), (unsigned long long)front->seq);
        put_bytes(&t, front->bytes);
        put(&t, ", for %.1f s) for members with no record of the group: group ", now - oldest);
        if (absent && na > 0) put_ranks(&t, absent, na);
        else put(&t, "ranks unknown");
        put(&t, " (not read, or never reached its first collective)\n");
        free(seen);
        free(absent);
    }
    for (int k = 0; k < nb && nw > 0 && found < max; k++) {
        const mtrun_fr_rank *b = &ranks[behind[k]];
        finding *f = &out[found++];
        text t = {f->line, sizeof f->line, 0};
        int others = 0;
        for (int i = 0; i < nw; i++) others += waiters[i] != behind[k];
        f->rank = b->rank;
        put(&t, "rank %d (node %d) is behind: %d rank%s of group %s wait%s in %s seq %llu (",
            b->rank, b->node, others, others == 1 ? "" : "s", group, others == 1 ? "s" : "",
            mtrun_fr_op_name(front->op), (unsigned long long)front->seq);
        put_bytes(&t, front->bytes);
        put(&t, ", for %.1f s)", now - oldest);
        describe_behind(b, group, &t, now);
        if (members < size)
            put(&t, " (%d of the group's %d members have no record of it)", size - members,
                size);
        put(&t, "\n");
        bool stopped = b->state == 'T' || b->state == 't';
        f->cause = stopped || !waits_somewhere(b) || find(b, group, front->seq) != NULL;
    }
    free(waiters);
    free(behind);
    free(votes);
    free(last);
    return found;
}

/* What is in flight when nothing is wrong: the oldest collective still running, if any. */
static void all_fine(const mtrun_fr_rank *ranks, int nranks, int ngroups, double now, text *t) {
    const mtrun_fr_entry *oldest = NULL;
    int inflight = 0, silent = 0;
    uint64_t total = 0;
    for (int r = 0; r < nranks; r++) {
        total += ranks[r].total;
        if (ranks[r].pid == 0) silent++;
        for (int i = 0; i < ranks[r].n; i++) {
            const mtrun_fr_entry *e = &ranks[r].e[i];
            if (!in_flight(e)) continue;
            inflight++;
            if (!oldest || e->queued < oldest->queued) oldest = e;
        }
    }
    put(t, "no rank is behind and no ranks disagree: %d rank%s, %d group%s, %llu collectives "
        "recorded", nranks, nranks == 1 ? "" : "s", ngroups, ngroups == 1 ? "" : "s",
        (unsigned long long)total);
    if (oldest)
        put(t, "; %d in flight, the oldest %s seq %llu of group %s, queued %.1f s ago", inflight,
            mtrun_fr_op_name(oldest->op), (unsigned long long)oldest->seq, oldest->group,
            now - oldest->queued);
    else
        put(t, "; nothing in flight");
    if (silent) put(t, "; %d rank%s recorded nothing yet", silent, silent == 1 ? "" : "s");
    put(t, "\n");
}

#define MAX_GROUPS 256
#define MAX_FINDINGS 64
#define MAX_LINES 8

int mtrun_diagnose(const mtrun_fr_rank *ranks, int nranks, double now, double min_wait_s,
                   char *out, size_t cap) {
    text t = {out, cap, 0};
    if (cap) out[0] = '\0';
    char(*groups)[MTRUN_FR_GROUP_CAP] = malloc(MAX_GROUPS * sizeof *groups);
    finding *f = malloc(MAX_FINDINGS * sizeof *f);
    if (!groups || !f) {
        put(&t, "out of memory for the diagnosis\n");
        free(groups);
        free(f);
        return 0;
    }
    int ng = list_groups(ranks, nranks, groups, MAX_GROUPS);
    int problems = 0, lines = 0;
    int64_t *disagree_at = malloc((size_t)(ng > 0 ? ng : 1) * sizeof *disagree_at);
    for (int g = 0; g < ng; g++) {
        uint32_t at = 0;
        bool found = disagreement(ranks, nranks, groups[g], &t, &at);
        problems += found;
        if (disagree_at) disagree_at[g] = found ? (int64_t)at : -1;
    }
    int nf = 0;
    for (int g = 0; g < ng && nf < MAX_FINDINGS; g++)
        nf += behind_in(ranks, nranks, groups[g], now, min_wait_s,
                        disagree_at ? disagree_at[g] : -1, f + nf, MAX_FINDINGS - nf);
    free(disagree_at);
    lines = problems;
    /* Causes first, one line per rank; then what follows from them. */
    bool any_cause = false;
    for (int i = 0; i < nf; i++) any_cause = any_cause || f[i].cause;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < nf; i++) {
            if (f[i].cause != (pass == 0) && any_cause) continue;
            if (!any_cause && pass == 1) continue;
            bool repeat = false;
            for (int k = 0; k < i && pass == 0 && f[i].rank >= 0; k++)
                repeat = repeat || (f[k].cause && f[k].rank == f[i].rank);
            if (repeat) continue;
            if (lines == MAX_LINES) {
                put(&t, "(more findings left out)\n");
                lines++;
            }
            if (lines > MAX_LINES) continue;
            if (pass == 1) put(&t, "  which holds up: ");
            put(&t, "%s", f[i].line);
            lines++;
        }
    problems += nf;
    if (problems == 0) all_fine(ranks, nranks, ng, now, &t);
    free(groups);
    free(f);
    return problems;
}
