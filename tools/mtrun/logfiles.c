/* The job directory gets a unique suffix (mkdtemp) rather than being the bare job id: several
 * nodes of one job may share a machine and a --log_dir, and a rerun with the same id must not
 * overwrite the earlier run's files. torchrun names it the same way. */
#include "logfiles.h"

#include "msg.h"
#include "options.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char std_values[] = "0 (none), 1 (stdout), 2 (stderr) or 3 (both)";

/* One stream value: a single digit 0..3. */
static int std_value(const char *text, size_t len) {
    return len == 1 && text[0] >= '0' && text[0] <= '3' ? text[0] - '0' : -1;
}

int mtrun_std_spec_parse(const char *option, const char *value, int nproc, unsigned char *out) {
    int all = std_value(value, strlen(value));
    if (all >= 0) {
        if (out) memset(out, all, (size_t)nproc);
        return 0;
    }
    if (!strchr(value, ':')) {
        mtrun_msg("invalid value '%s' for --%s: expected %s for every local rank, or "
                  "LOCAL_RANK:N,... per local rank", value, option, std_values);
        return 2;
    }
    /* Which local ranks were named, to refuse one given twice. */
    unsigned char *named = calloc((size_t)nproc, 1);
    if (!named) {
        mtrun_msg("out of memory checking --%s", option);
        return 1;
    }
    if (out) memset(out, 0, (size_t)nproc); /* local ranks left out: none, as in torchrun */
    int rc = 0;
    const char *p = value;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        const char *colon = memchr(p, ':', len);
        char *end;
        errno = 0;
        long lr = colon && colon > p && p[0] >= '0' && p[0] <= '9' ? strtol(p, &end, 10) : -1;
        int v = colon ? std_value(colon + 1, len - (size_t)(colon + 1 - p)) : -1;
        if (lr < 0 || errno || end != colon || v < 0) {
            mtrun_msg("invalid value '%s' for --%s: item '%.*s' is not LOCAL_RANK:N with N %s",
                      value, option, (int)len, p, std_values);
            rc = 2;
            break;
        }
        if (lr >= nproc) {
            mtrun_msg("invalid value '%s' for --%s: local rank %ld does not exist with "
                      "--nproc_per_node %d (local ranks 0..%d)", value, option, lr, nproc,
                      nproc - 1);
            rc = 2;
            break;
        }
        if (named[lr]) {
            mtrun_msg("invalid value '%s' for --%s: local rank %ld is given twice", value,
                      option, lr);
            rc = 2;
            break;
        }
        named[lr] = 1;
        if (out) out[lr] = (unsigned char)v;
        if (!comma) break;
        p = comma + 1;
    }
    free(named);
    return rc;
}

/* The job id as one path component: '/' would make it a path. */
static void id_component(const char *id, char *out, size_t cap) {
    size_t n = 0;
    for (; id[n] && n + 1 < cap; n++) out[n] = id[n] == '/' ? '_' : id[n];
    out[n] = '\0';
}

int mtrun_logs_prepare(const mtrun_options *o, mtrun_logs **logs) {
    *logs = NULL;
    if (!o->log_dir && !o->redirects && !o->tee) return 0;
    mtrun_logs *l = calloc(1, sizeof *l);
    unsigned char *bits = calloc(2 * (size_t)o->nproc_per_node, 1);
    if (!l || !bits) {
        free(l);
        free(bits);
        mtrun_msg("out of memory preparing the log files");
        return 1;
    }
    l->nproc = o->nproc_per_node;
    l->redirect = bits;
    l->tee = bits + o->nproc_per_node;
    int r = 0;
    if (o->redirects) r = mtrun_std_spec_parse("redirects", o->redirects, l->nproc, l->redirect);
    if (!r && o->tee) r = mtrun_std_spec_parse("tee", o->tee, l->nproc, l->tee);
    if (r) {
        mtrun_logs_free(l);
        return r;
    }
    char base[2048], id[256];
    if (o->log_dir) {
        snprintf(base, sizeof base, "%s", o->log_dir);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(base, sizeof base, "%s/mtrun_XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(base)) {
            mtrun_msg("cannot create a temporary log directory %s: %s", base, strerror(errno));
            mtrun_logs_free(l);
            return 1;
        }
    }
    id_component(o->rdzv_id, id, sizeof id);
    snprintf(l->job_dir, sizeof l->job_dir, "%s/%s_XXXXXX", base, id);
    if (!mkdtemp(l->job_dir)) {
        mtrun_msg("cannot create the log directory %s: %s", l->job_dir, strerror(errno));
        mtrun_logs_free(l);
        return 1;
    }
    mtrun_msg("%slog files of the ranks: %s/attempt_0/LOCAL_RANK/{stdout,stderr}.log",
              o->log_dir ? "" : "no --log_dir given, ", l->job_dir);
    *logs = l;
    return 0;
}

int mtrun_logs_rank_paths(const mtrun_logs *logs, int attempt, int local_rank, char *out_path,
                          char *err_path, size_t cap) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/attempt_%d", logs->job_dir, attempt);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return -1;
    size_t len = strlen(dir);
    snprintf(dir + len, sizeof dir - len, "/%d", local_rank);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return -1;
    if (snprintf(out_path, cap, "%s/stdout.log", dir) >= (int)cap ||
        snprintf(err_path, cap, "%s/stderr.log", dir) >= (int)cap) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return 0;
}

int mtrun_logs_open_file(const char *path) {
    return open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
}

int mtrun_logs_on_console(const mtrun_logs *logs, int local_rank, int stream) {
    /* A stream both redirected and teed is shown: tee's copy to the console wins. */
    return !logs || !(logs->redirect[local_rank] & stream) || (logs->tee[local_rank] & stream);
}

void mtrun_logs_free(mtrun_logs *logs) {
    if (!logs) return;
    free(logs->redirect); /* tee shares the allocation */
    free(logs);
}
