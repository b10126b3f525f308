/* Internal: the asynchronous save's state on a root module (checkpoint/ckpt_save.c), shared with
 * load (which waits for a save in flight first). */
#ifndef MT_CHECKPOINT_CKPT_SAVE_H
#define MT_CHECKPOINT_CKPT_SAVE_H

#include <meshtrain/checkpoint.h>
#include <meshtrain/module.h>
#include <meshtrain/runtime.h>
#include <meshtrain/status.h>

#include <stdbool.h>

/* Waits for root's save in flight, if any; returns its outcome (MT_OK when none). */
mt_status mt_ckpt_save_wait(mt_module *root);

/* Test hook: MT_TEST_CKPT_CRASH="<point>:<rank>:<step>" kills this process (SIGKILL) at point
 * while saving step on rank. Points, in the order a save passes them: after-file (this rank's
 * data file written and fsynced, not yet reported), before-metadata, before-rename,
 * before-latest (rank 0's commit). */
void mt_ckpt_crash_point(const char *point, int rank, long step);

/* msg without its leading "rank R: " (a message of rank R quoted by another rank, which
 * says whose it is itself). */
const char *mt_ckpt_without_rank(const char *msg, int rank);

/* Every rank's outcome mine, over rt's world (collective: every rank calls it, seq counting the
 * calls for what alike everywhere): MT_OK when all succeeded, else on every rank the lowest
 * failing rank's status and message ("checkpoint <what> failed on rank R: ..."). */
mt_status mt_ckpt_agree(mt_runtime *rt, mt_status mine, const char *what, long seq);

/* Test hook: MT_TEST_CKPT_FAIL="<point>:<rank>:<step>" makes point fail (an I/O error) instead:
 * "stage" (this rank's copy to host memory) or "write" (its data file). True when it applies. */
bool mt_ckpt_fail_point(const char *point, int rank, long step);

#endif
