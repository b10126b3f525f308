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

/* The sums of squares of a final f32 output, taken as it is written: of its first `count`
 * elements, in chunks of MT_SQ_CHUNK from its start, partial[c] = chunk c's sum with the bits of
 * core/cpu/sum_squares.h's chunk kernel over the values written. Gradient clipping adds these
 * instead of reading the reduce-scatter's output again (fsdp/clip.c). */
typedef struct mt_reduce_squares {
    double *partial;
    size_t count;
} mt_reduce_squares;

/* mt_reduce_pair (final) and mt_reduce_many on f32, also filling sq (NULL: as those). */
void mt_reduce_pair_squares(mt_reduce_op op, int group_size, float *dst, const float *a,
                            const float *b, size_t count, const mt_reduce_squares *sq);
void mt_reduce_many_squares(mt_reduce_op op, int ninputs, const void *const *inputs, float *dst,
                            size_t count, const mt_reduce_squares *sq);

/* Tests: 0 keeps the f32 sums off their AVX-512 kernel, 1 uses it where the CPU has AVX-512F,
 * -1 (the default) likewise. Both give the same bits. */
void mt_reduce_use_avx512(int on);

/* The same sums of x[0..sq->count) read after it was written (where the reductions could not
 * take them). */
void mt_reduce_squares_of(const float *x, const mt_reduce_squares *sq);

#endif
