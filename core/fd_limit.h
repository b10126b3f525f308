/* Internal: the open-file limit (RLIMIT_NOFILE). A job's store host holds a connection per rank
 * and per node, and a common soft limit (1024) is reached by about a thousand ranks, which then
 * fail with a misleading handshake error; so mtrun and every rank raise the soft limit to the
 * hard one at start, and a store host that needs more than the hard limit says so up front. */
#ifndef MT_CORE_FD_LIMIT_H
#define MT_CORE_FD_LIMIT_H

#include <meshtrain/status.h>

#include <stdint.h>

/* Raises the soft RLIMIT_NOFILE to the hard limit; *now (may be NULL) is the soft limit after.
 * When need > 0 and the hard limit is below need, an MT_ERR_INVALID_ARG error that names what
 * needs them (for), both numbers and how to raise the limit. A failed raise with a hard limit
 * that suffices is no error (the soft one may already suffice). */
mt_status mt_fd_limit_raise(uint64_t need, const char *for_what, uint64_t *now);

#endif
