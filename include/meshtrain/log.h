/* Logging: leveled lines on stderr, each prefixed with the rank when it is known (mt_init sets
 * it).
 *
 * MT_LOG_LEVEL=error|warn|info|debug chooses what is printed (default warn). Logs, warnings and
 * notices go to stderr; a program's own results belong on stdout.
 */
#ifndef MESHTRAIN_LOG_H
#define MESHTRAIN_LOG_H

#include <meshtrain/api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mt_log_level {
    MT_LOG_ERROR = 0,
    MT_LOG_WARN = 1,
    MT_LOG_INFO = 2,
    MT_LOG_DEBUG = 3
} mt_log_level;

/* Prints one line at the given level if MT_LOG_LEVEL lets it through. */
MT_API void mt_log(mt_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* True when a message at this level would be printed. */
MT_API int mt_log_enabled(mt_log_level level);

#ifdef __cplusplus
}
#endif
#endif
