/* MT_DEBUG_POISON_GRADS (core/debug_poison.h). */
#include "core/debug_poison.h"

#include "core/env.h"
#include "core/error.h"

#include <meshtrain/log.h>

#include <pthread.h>

static bool g_poison;
static pthread_once_t g_poison_once = PTHREAD_ONCE_INIT;

static void poison_read(void) {
    long long on = 0;
    if (mt_env_int("MT_DEBUG_POISON_GRADS", 0, 1, 0, "NaN in unwritten gradients", &on) != MT_OK)
        mt_log(MT_LOG_WARN, "%s; not poisoning", mt_last_error());
    g_poison = on == 1;
}

bool mt_debug_poison_grads(void) {
    pthread_once(&g_poison_once, poison_read);
    return g_poison;
}
