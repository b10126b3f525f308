/* --bind: where each local rank runs. The plan is made once from the topology this node should
 * use (MT_TOPO_FILE, else this machine); each rank's startup line states its binding. */
#ifndef MTRUN_BINDING_H
#define MTRUN_BINDING_H

#include "options.h"

#include <stddef.h>

typedef struct mtrun_binding mtrun_binding;

/* Decides the mode and plans the binding of o->nproc_per_node ranks. Returns 0 with *out set,
 * or mtrun's exit code after printing one line saying why (a bad MT_TOPO_FILE, or a topology
 * that cannot be discovered when --bind asked for binding). */
int mtrun_binding_prepare(const mtrun_options *o, mtrun_binding **out);

/* Binds the calling thread (CPUs and memory) as local rank `local` must run, so that the child
 * it forks next inherits the binding through exec; a no-op when nothing is applied. Returns 0,
 * or -1 with why written into err. Call mtrun_binding_leave after the fork either way. */
int mtrun_binding_enter(mtrun_binding *b, int local, char *err, size_t cap);

/* How many local ranks are bound to exactly local rank `local`'s cpus (itself included: 1 when
 * it has them alone), or 0 when the rank is not bound (no plan, or a plan not applied). */
int mtrun_binding_sharers(const mtrun_binding *b, int local);

/* Gives the calling thread back the binding it had before mtrun_binding_enter. */
void mtrun_binding_leave(mtrun_binding *b);

/* The startup line of the rank last entered, without the [rankN]: prefix: "bound to ...",
 * "would bind to ... (MT_TOPO_FILE=...: not applied)" or "not bound (...)". */
const char *mtrun_binding_line(const mtrun_binding *b);

/* Frees everything; NULL is ignored. */
void mtrun_binding_close(mtrun_binding *b);

#endif
