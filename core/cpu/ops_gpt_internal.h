/* Internal: what the CPU's GPT op files (core/cpu/ops_*.c) share. */
#ifndef MT_CORE_CPU_OPS_GPT_INTERNAL_H
#define MT_CORE_CPU_OPS_GPT_INTERNAL_H

/* Row of the vocabulary slice that id selects, or -1 when id lies outside
 * [vocab_start, vocab_start + vocab_local). */
static inline long mt_cpu_slice_row(int id, int vocab_start, int vocab_local) {
    long r = (long)id - (long)vocab_start;
    return (r >= 0 && r < vocab_local) ? r : -1;
}

#endif
