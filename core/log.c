/* Leveled logging to stderr. The level is read once from MT_LOG_LEVEL; the rank is process
 * identity set by mt_init, kept here because every module's log line shows it. */
#include "core/log_internal.h"

#include <meshtrain/log.h>

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static atomic_int log_rank = -1;
static atomic_int log_level = -1; /* -1: not read from the environment yet */

static int read_level(void) {
    const char *env = getenv("MT_LOG_LEVEL");
    if (!env || !*env) return MT_LOG_WARN;
    if (!strcasecmp(env, "error")) return MT_LOG_ERROR;
    if (!strcasecmp(env, "warn") || !strcasecmp(env, "warning")) return MT_LOG_WARN;
    if (!strcasecmp(env, "info")) return MT_LOG_INFO;
    if (!strcasecmp(env, "debug")) return MT_LOG_DEBUG;
    fprintf(stderr, "meshtrain: warn: MT_LOG_LEVEL=%s is not one of error|warn|info|debug; "
                    "using warn\n", env);
    return MT_LOG_WARN;
}

int mt_log_enabled(mt_log_level level) {
    int current = atomic_load(&log_level);
    if (current < 0) {
        current = read_level();
        atomic_store(&log_level, current);
    }
    return (int)level <= current;
}

void mt_log_set_rank(int rank) { atomic_store(&log_rank, rank); }

int mt_log_rank(void) { return atomic_load(&log_rank); }

void mt_log(mt_log_level level, const char *fmt, ...) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    if (!mt_log_enabled(level)) return;
    char line[4096];
    int rank = mt_log_rank();
    int n = rank >= 0 ? snprintf(line, sizeof line, "meshtrain[rank %d] %s: ", rank, names[level])
                      : snprintf(line, sizeof line, "meshtrain %s: ", names[level]);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line) vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    /* One write per line so that lines of concurrent threads do not interleave. */
    size_t len = strnlen(line, sizeof line - 2);
    line[len] = '\n';
    fwrite(line, 1, len + 1, stderr);
}
