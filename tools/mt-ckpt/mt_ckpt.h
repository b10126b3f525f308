/* mt-ckpt: what its commands share (tools/mt-ckpt). */
#ifndef MT_TOOLS_MT_CKPT_H
#define MT_TOOLS_MT_CKPT_H

#include "checkpoint/ckpt_meta.h"

#include <stdio.h>

/* Exit codes: 0 done, 1 the checkpoint or file is bad (or an operation failed), 2 usage. */
enum { MT_CKPT_EXIT_OK = 0, MT_CKPT_EXIT_FAIL = 1, MT_CKPT_EXIT_USAGE = 2 };

/* Resolves path (a step-N folder or a checkpoint directory with `latest`) and reads its
 * metadata; prints the error and returns non-zero on failure. */
int mt_ckpt_tool_open(const char *path, mt_ckpt_meta *meta);

/* Prints "mt-ckpt: <last error>" to stderr. */
void mt_ckpt_tool_error(void);

int mt_ckpt_cmd_export(int argc, char **argv);
int mt_ckpt_cmd_import(int argc, char **argv);

#endif
