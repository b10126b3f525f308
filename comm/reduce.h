/* Internal: element-wise reduction kernels used by the host collectives.
 *
 * Inputs and outputs are in the wire dtype (f32 or bf16). bf16 values are widened to f32, combined
 * in f32 and rounded back to bf16 (nearest, ties to even) once per call: one call is one hop of
 * a ring, so a ring rounds once per hop. avg divides the f32 sum by the group size in the final
 * step, before its single rounding.
 */
#ifndef MT_COMM_REDUCE_H
#define MT_COMM_REDUCE_H

#include <meshtrain/comm.h>
#include <meshtrain/dtype.h>

#include <stdbool.h>
#include <stddef.h>

/* dst[i] = a[i] (op) b[i]; when final and op is avg, divided by group_size. dst may alias a or
 * b. */
void mt_reduce_pair(mt_dtype dtype, mt_reduce_op op, bool final, int group_size, void *dst,
                    const void *a, const void *b, size_t count);

/* dst[i] = the reduction of inputs[0][i], inputs[1][i], ... in that order, accumulated in f32 and
 * (for avg) divided by ninputs, rounded once. dst may alias an input. */
void mt_reduce_many(mt_dtype dtype, mt_reduce_op op, int ninputs, const void *const *inputs,
                    void *dst, size_t count);

#endif
