/* Gathering and printing the flight recorder's diagnosis (fr_report.h). The summaries travel as
 * JSON (jansson), the same objects as the JSON lines of the log directory. */
#include "fr_report.h"

#include "diagnose.h"
#include "flightrec.h"
#include "logfiles.h"
#include "msg.h"

#include "core/clock.h"

#include <meshtrain/store.h>

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define GATHER_S 10.0 /* how long node 0 waits for the other nodes' summaries, all together */
#define POLL_S 1.0    /* how often a node looks whether another asked for a diagnosis */
/* What node 0 leaves in the key of a summary that did not come in time: the node that publishes
 * it late finds this instead of an empty key, and removes both. */
#define CLOSED "closed"

static json_t *entry_json(const mtrun_fr_rank *r, const mtrun_fr_entry *e) {
    return json_pack("{s:i, s:i, s:s, s:I, s:s, s:i, s:I, s:i, s:i, s:f, s:f, s:f, s:i, s:i}",
                     "rank", r->rank, "node", r->node, "group", e->group, "seq",
                     (json_int_t)e->seq, "op", mtrun_fr_op_name(e->op), "op_kind", e->op,
                     "bytes", (json_int_t)e->bytes, "dtype", e->dtype, "group_rank",
                     e->group_rank, "queued", e->queued, "started", e->started, "completed",
                     e->completed, "status", e->status, "waiting_peer", e->waiting_peer);
}

static json_t *rank_json(const mtrun_fr_rank *r, int last) {
    char state[2] = {r->state, '\0'};
    json_t *records = json_array();
    int from = last > 0 && r->n > last ? r->n - last : 0;
    for (int i = from; records && i < r->n; i++) {
        json_t *e = entry_json(r, &r->e[i]);
        /* group_size rides along only in summaries, where the analysis needs it */
        if (e) json_object_set_new(e, "group_size", json_integer(r->e[i].group_size));
        if (e) json_array_append_new(records, e);
    }
    return json_pack("{s:i, s:i, s:i, s:s, s:I, s:f, s:o}", "rank", r->rank, "node", r->node,
                     "pid", r->pid, "state", state, "recorded", (json_int_t)r->total, "read_at",
                     r->read_at, "records", records ? records : json_array());
}

static int rank_from_json(json_t *j, mtrun_fr_rank *r) {
    memset(r, 0, sizeof *r);
    json_t *records;
    const char *state;
    json_int_t total;
    if (json_unpack(j, "{s:i, s:i, s:i, s:s, s:I, s:F, s:o}", "rank", &r->rank, "node",
                    &r->node, "pid", &r->pid, "state", &state, "recorded", &total, "read_at",
                    &r->read_at, "records", &records) ||
        !json_is_array(records))
        return -1;
    r->state = state[0] ? state[0] : '-';
    r->total = (uint64_t)total;
    r->e = calloc(json_array_size(records) + 1, sizeof *r->e);
    if (!r->e) return -1;
    size_t i;
    json_t *x;
    json_array_foreach(records, i, x) {
        mtrun_fr_entry *e = &r->e[r->n];
        const char *group;
        json_int_t seq, bytes;
        if (json_unpack(x, "{s:s, s:I, s:i, s:I, s:i, s:i, s:i, s:F, s:F, s:F, s:i, s:i}",
                        "group", &group, "seq", &seq, "op_kind", &e->op, "bytes", &bytes, "dtype",
                        &e->dtype, "group_rank", &e->group_rank, "group_size", &e->group_size,
                        "queued", &e->queued, "started", &e->started, "completed",
                        &e->completed, "status", &e->status, "waiting_peer", &e->waiting_peer))
            continue;
        snprintf(e->group, sizeof e->group, "%s", group);
        e->seq = (uint32_t)seq;
        e->bytes = (uint64_t)bytes;
        r->n++;
    }
    return 0;
}

/* <job dir>/flight_recorder/<id>-node<N>.jsonl: per rank one line of what it is, then one line
 * per recorded collective, oldest first. */
static void write_lines(const mtrun_options *o, const mtrun_fr_rank *ranks, int n, const char *id) {
    if (!o->logs) return;
    char dir[PATH_MAX], path[PATH_MAX];
    if (snprintf(dir, sizeof dir, "%s/flight_recorder", o->logs->job_dir) >= (int)sizeof dir ||
        snprintf(path, sizeof path, "%s/%s-node%d.jsonl", dir, id, o->node_rank) >=
            (int)sizeof path) {
        mtrun_msg("cannot write the flight recorder's lines: the path under %s is longer than "
                  "%d bytes", o->logs->job_dir, PATH_MAX - 1);
        return;
    }
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        mtrun_msg("cannot create %s: %s", dir, strerror(errno));
        return;
    }
    int fd = mtrun_logs_open_file(path);
    FILE *fp = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!fp) {
        mtrun_msg("cannot write the flight recorder's lines to %s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return;
    }
    for (int k = 0; k < n; k++) {
        json_t *head = rank_json(&ranks[k], -1);
        if (head) {
            json_object_del(head, "records");
            json_dumpf(head, fp, JSON_COMPACT);
            fputc('\n', fp);
            json_decref(head);
        }
        for (int i = 0; i < ranks[k].n; i++) {
            json_t *e = entry_json(&ranks[k], &ranks[k].e[i]);
            if (!e) continue;
            json_dumpf(e, fp, JSON_COMPACT | JSON_REAL_PRECISION(17));
            fputc('\n', fp);
            json_decref(e);
        }
    }
    /* a full disk shows in the stream's error flag or in the last flush */
    bool failed = ferror(fp) != 0;
    int e = errno;
    if (fclose(fp) != 0) {
        failed = true;
        e = errno;
    }
    if (failed) mtrun_msg("cannot write the flight recorder's lines to %s: %s", path, strerror(e));
}

static int by_rank(const void *a, const void *b) {
    int x = ((const mtrun_fr_rank *)a)->rank, y = ((const mtrun_fr_rank *)b)->rank;
    return (x > y) - (x < y);
}

/* Ranks in order, so that the lines name them alike whatever order the rings came in. */
static void print_diagnosis(mtrun_fr_rank *ranks, int n, const char *why, const char *missing,
                            double min_wait_s) {
    qsort(ranks, (size_t)n, sizeof *ranks, by_rank);
    size_t cap = 1 << 16;
    char *text = malloc(cap);
    if (!text) {
        mtrun_msg("flight recorder diagnosis (%s): out of memory for its text", why);
        return;
    }
    mtrun_diagnose(ranks, n, mtrun_fr_wall_now(), min_wait_s, text, cap);
    mtrun_msg("flight recorder diagnosis (%s)%s:", why, missing);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
        mtrun_msg("  %s", line);
    free(text);
}

static void free_ranks(mtrun_fr_rank *r, int n) {
    for (int i = 0; i < n; i++) mtrun_fr_rank_free(&r[i]);
    free(r);
}

/* Appends the ranks of a summary (a JSON array) to *all. */
static void add_summary(const void *v, size_t len, mtrun_fr_rank **all, int *n) {
    json_error_t err;
    json_t *j = json_loadb(v, len, 0, &err);
    if (!json_is_array(j)) {
        mtrun_msg("a flight recorder summary is not %s: %s", j ? "a JSON array" : "valid JSON",
                  j ? "left out" : err.text);
        json_decref(j);
        return;
    }
    size_t i;
    json_t *x;
    json_array_foreach(j, i, x) {
        mtrun_fr_rank *grown = realloc(*all, (size_t)(*n + 1) * sizeof **all);
        if (!grown) {
            mtrun_msg("out of memory for the flight recorder summaries; the diagnosis goes "
                      "without some ranks");
            break;
        }
        *all = grown;
        if (rank_from_json(x, &grown[*n]) == 0) (*n)++;
        else
            mtrun_msg("a rank's flight recorder summary is malformed (or memory ran out); "
                      "left out");
    }
    json_decref(j);
}

/* A node other than 0: its summary into mtrun/diag/<id>/<node>, unless node 0 stopped waiting for
 * it (it left CLOSED there): then the key goes, so that no diagnosis leaves anything behind. */
static void publish_summary(mt_store *store, const char *key, const char *text) {
    void *current = NULL;
    size_t len = 0;
    size_t tlen = strlen(text);
    if (mt_store_compare_set(store, key, "", 0, text, tlen, &current, &len) != MT_OK) {
        mtrun_msg("cannot publish this node's flight recorder summary: %s", mt_last_error());
        return;
    }
    bool closed = len == strlen(CLOSED) && memcmp(current, CLOSED, len) == 0;
    free(current);
    if (!closed) return;
    mtrun_msg("node 0 stopped waiting for this node's flight recorder summary (%s) before it "
              "came; its diagnosis went without this node", key);
    if (mt_store_delete(store, key, NULL) != MT_OK)
        mtrun_msg("cannot remove %s from the store: %s", key, mt_last_error());
}

/* Node 0: every other node's summary that comes within GATHER_S of the start, all nodes
 * together (a node that never answers costs GATHER_S once, not per node), each key removed once
 * read. Names the nodes it went without in missing. */
static void gather_summaries(mt_store *store, const char *id, int nnodes, mtrun_fr_rank **all,
                             int *n, char *missing, size_t cap) {
    double deadline = mt_clock_now_s() + GATHER_S;
    size_t used = 0;
    missing[0] = '\0';
    for (int node = 1; node < nnodes; node++) {
        char key[128];
        snprintf(key, sizeof key, "mtrun/diag/%s/%d", id, node);
        void *v = NULL;
        size_t len = 0;
        bool got = false;
        double left = deadline - mt_clock_now_s();
        if (store && left > 0) got = mt_store_get(store, key, left, &v, &len) == MT_OK;
        if (store && !got) {
            /* Too late: close the key, unless the summary came in meanwhile. */
            free(v);
            v = NULL;
            got = mt_store_compare_set(store, key, "", 0, CLOSED, strlen(CLOSED), &v, &len) ==
                      MT_OK && !(len == strlen(CLOSED) && memcmp(v, CLOSED, len) == 0);
        }
        if (got) {
            add_summary(v, len, all, n);
            if (mt_store_delete(store, key, NULL) != MT_OK)
                mtrun_msg("cannot remove %s from the store: %s", key, mt_last_error());
        } else if (used + 16 < cap) {
            int w = snprintf(missing + used, cap - used, "%s%d", used ? ", " : " without node ",
                             node);
            if (w > 0) used += (size_t)w;
        }
        free(v);
    }
}

void mtrun_fr_report(const mtrun_options *o, mtrun_cluster *cluster, const pid_t *pids,
                     const char *id, const char *why) {
    /* a failure stopped the job: every wait counts; a live job's ranks are always a bit apart */
    double min_wait_s = id[0] == 'f' ? 0 : MTRUN_FR_LIVE_WAIT_S;
    if (!o->fr || !mtrun_fr_file(o->fr, 0)) return;
    mtrun_fr_rank *mine = NULL;
    int n = mtrun_fr_collect(o->fr, pids, &mine);
    write_lines(o, mine, n, id);
    if (!cluster) {
        print_diagnosis(mine, n, why, "", min_wait_s);
        free_ranks(mine, n);
        return;
    }
    mt_store *store = mtrun_cluster_store(cluster);
    char key[128];
    if (o->node_rank != 0) {
        json_t *summary = json_array();
        for (int k = 0; summary && k < n; k++)
            json_array_append_new(summary, rank_json(&mine[k], MTRUN_FR_SUMMARY));
        char *text = summary ? json_dumps(summary, JSON_COMPACT | JSON_REAL_PRECISION(17))
                             : NULL;
        json_decref(summary);
        snprintf(key, sizeof key, "mtrun/diag/%s/%d", id, o->node_rank);
        if (!text)
            mtrun_msg("out of memory for this node's flight recorder summary; node 0's "
                      "diagnosis goes without it");
        else if (store)
            publish_summary(store, key, text);
        free(text);
        free_ranks(mine, n);
        return;
    }
    char missing[512];
    gather_summaries(store, id, mtrun_cluster_nnodes(cluster), &mine, &n, missing,
                     sizeof missing);
    /* the requester's node, for the message: read (poll_requests) before the gathering, and
     * set before the requester published its summary */
    snprintf(key, sizeof key, "mtrun/diag/%s/from", id);
    if (store && id[0] == 'u' && mt_store_delete(store, key, NULL) != MT_OK)
        mtrun_msg("cannot remove %s from the store: %s", key, mt_last_error());
    print_diagnosis(mine, n, why, missing, min_wait_s);
    free_ranks(mine, n);
}

/* Diagnoses asked for so far that this node took part in (or asked for): u1 .. u<requests_seen>. */
static int requests_seen;

/* Takes part in diagnosis u<req>, which another node asked for. */
static void answer_request(const mtrun_options *o, mtrun_cluster *cluster, const pid_t *pids,
                           int req) {
    mt_store *store = mtrun_cluster_store(cluster);
    char id[32], key[64], why[64] = "asked for with SIGUSR1 on another node";
    snprintf(id, sizeof id, "u%d", req);
    void *v = NULL;
    size_t len = 0;
    bool found = false;
    snprintf(key, sizeof key, "mtrun/diag/%s/from", id);
    if (o->node_rank == 0 && store && mt_store_try_get(store, key, &v, &len, &found) == MT_OK &&
        found && len < 16)
        snprintf(why, sizeof why, "asked for with SIGUSR1 on node %.*s", (int)len,
                 (const char *)v);
    free(v);
    mtrun_fr_report(o, cluster, pids, id, why);
}

void mtrun_fr_request(const mtrun_options *o, mtrun_cluster *cluster, const pid_t *pids) {
    char id[32];
    mt_store *store = cluster ? mtrun_cluster_store(cluster) : NULL;
    int64_t count = requests_seen + 1;
    if (store && mt_store_add(store, "mtrun/diag/requests", 1, &count) != MT_OK) {
        mtrun_msg("cannot ask the other nodes for their flight recorders: %s", mt_last_error());
        count = requests_seen + 1;
    }
    /* Other nodes may have asked since this one last looked (SIGUSR1s to two nodes at once):
     * their diagnoses come first, else node 0 would wait for this node's part in them. */
    while (cluster && requests_seen + 1 < count) answer_request(o, cluster, pids, ++requests_seen);
    requests_seen = (int)count;
    snprintf(id, sizeof id, "u%lld", (long long)count);
    if (store && o->node_rank != 0) {
        /* only words node 0's message; node 0 removes it */
        char key[64], node[16];
        snprintf(key, sizeof key, "mtrun/diag/%s/from", id);
        int len = snprintf(node, sizeof node, "%d", o->node_rank);
        (void)mt_store_set(store, key, node, (size_t)len);
    }
    char why[64];
    snprintf(why, sizeof why, "asked for with SIGUSR1 on node %d", o->node_rank);
    mtrun_fr_report(o, cluster, pids, id, why);
}

void mtrun_fr_poll_requests(const mtrun_options *o, mtrun_cluster *cluster, const pid_t *pids) {
    /* The loop wakes for every line of output too: the store is asked once a second at most. */
    static double last_poll;
    double now = mt_clock_now_s();
    if (now - last_poll < POLL_S) return;
    last_poll = now;
    mt_store *store = mtrun_cluster_store(cluster);
    int64_t count;
    if (!o->fr || !store || mt_store_add(store, "mtrun/diag/requests", 0, &count) != MT_OK) return;
    while (requests_seen < count) answer_request(o, cluster, pids, ++requests_seen);
}

/* The rings of mtrun PID on this machine: /dev/shm/mt-fr-PID-LOCALRANK. */
int mtrun_fr_diagnose_local(long pid) {
    DIR *d = opendir("/dev/shm");
    if (!d) {
        mtrun_msg("--diagnose: cannot list /dev/shm: %s", strerror(errno));
        return 1;
    }
    long found = 0;
    bool several = false;
    mtrun_fr_rank *all = NULL;
    int n = 0;
    struct dirent *de;
    /* first pass: which mtrun, when none was named */
    while (pid == 0 && (de = readdir(d))) {
        long p;
        int local;
        if (mtrun_fr_parse_name(de->d_name, &p, &local) != 1 || kill((pid_t)p, 0) != 0)
            continue;
        if (found && p != found) several = true;
        found = p;
    }
    if (pid == 0 && several) {
        closedir(d);
        mtrun_msg("--diagnose: several jobs run on this machine; name one: mtrun --diagnose=PID "
                  "(the pids are in the names of /dev/shm/mt-fr-PID-LOCALRANK)");
        return 2;
    }
    if (pid == 0) pid = found;
    if (pid == 0) {
        closedir(d);
        mtrun_msg("--diagnose: no job with a flight recorder runs on this machine (no "
                  "/dev/shm/mt-fr-* of a live mtrun)");
        return 1;
    }
    rewinddir(d);
    while ((de = readdir(d))) {
        long p;
        int local;
        if (mtrun_fr_parse_name(de->d_name, &p, &local) != 1 || p != pid) continue;
        char path[PATH_MAX], why[PATH_MAX + 128];
        snprintf(path, sizeof path, "/dev/shm/%s", de->d_name);
        mtrun_fr_rank *grown = realloc(all, (size_t)(n + 1) * sizeof *all);
        if (!grown) {
            mtrun_msg("--diagnose: out of memory after %d rings; diagnosing those", n);
            break;
        }
        all = grown;
        /* the rank's own pid (from its ring) tells its process state */
        if (mtrun_fr_read(path, -1, -1, -1, &all[n], why, sizeof why) == 0) n++;
        else mtrun_msg("--diagnose: %s", why);
    }
    closedir(d);
    if (n == 0) {
        mtrun_msg("--diagnose: no flight recorder of mtrun %ld could be read", pid);
        free(all);
        return 1;
    }
    char why[96];
    snprintf(why, sizeof why, "%d rank%s of mtrun %ld on this machine", n, n == 1 ? "" : "s",
             pid);
    print_diagnosis(all, n, why, "", MTRUN_FR_LIVE_WAIT_S);
    free_ranks(all, n);
    return 0;
}
