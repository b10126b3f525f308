/* Internal: MT_DEBUG_POISON_GRADS=1, for tests. Gradient memory that is handed out without zeroing
 * because its first writer overwrites it (FSDP's unwritten full gradient buffers, the reference
 * models' activation gradients) starts as NaN instead of whatever the allocation held (often
 * zeros, from fresh pages), so that an op that should overwrite but leaves an element unwritten,
 * or adds into it, turns the result into NaN where a run would otherwise pass by luck
 * (tests/tp/tp.cmake runs the dp x tp comparisons with it). */
#ifndef MT_CORE_DEBUG_POISON_H
#define MT_CORE_DEBUG_POISON_H

#include <stdbool.h>

/* Whether MT_DEBUG_POISON_GRADS is 1; read once per process (a value other than 0 or 1 is said
 * once and ignored). */
bool mt_debug_poison_grads(void);

#endif
