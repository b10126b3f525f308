/* Internal: the store key under which a failing process publishes the job's abort
 * ("<status> <message>", mt_store_abort: the first one wins). mt_init's join, mt_finalize,
 * mt_abort and the comm waits' probe (mesh/runtime.c), and the cross-rank agreement
 * (mesh/agree.c) all watch it, so that no rank waits MT_TIMEOUT_S for one that gave up. */
#ifndef MT_MESH_ABORT_KEY_H
#define MT_MESH_ABORT_KEY_H

#define MT_JOB_ABORT_KEY "mt/abort"

#endif
