/* Raising RLIMIT_NOFILE (core/fd_limit.h). */
#include "core/fd_limit.h"

#include "core/error.h"

#include <meshtrain/log.h>

#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <sys/resource.h>

mt_status mt_fd_limit_raise(uint64_t need, const char *for_what, uint64_t *now) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return mt_error_errno(MT_ERR_SYSTEM, errno, "reading the open-file limit (RLIMIT_NOFILE)");
    if (rl.rlim_cur != rl.rlim_max) {
        struct rlimit raised = {rl.rlim_max, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &raised) == 0)
            rl.rlim_cur = rl.rlim_max;
        else
            mt_log(MT_LOG_DEBUG, "cannot raise the open-file limit from %" PRIu64 " to %" PRIu64
                   ": %s", (uint64_t)rl.rlim_cur, (uint64_t)rl.rlim_max, strerror(errno));
    }
    if (now) *now = (uint64_t)rl.rlim_cur;
    if (need > 0 && rl.rlim_max != RLIM_INFINITY && (uint64_t)rl.rlim_max < need)
        return mt_error(MT_ERR_INVALID_ARG, "%s needs about %" PRIu64 " open files, but the hard "
                        "open-file limit (RLIMIT_NOFILE) of this process is %" PRIu64 ": raise it "
                        "(`ulimit -Hn`, /etc/security/limits.conf, LimitNOFILE= of a systemd "
                        "unit, or the container's --ulimit nofile=)", for_what, need,
                        (uint64_t)rl.rlim_max);
    return MT_OK;
}
