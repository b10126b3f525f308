/* Internal: the padding rule of FSDP units whose gather is mapped (fsdp/fsdp_unit.c), shared with
 * the memory prediction (models/gpt_memory.c) so that both size the shards alike. */
#ifndef MT_FSDP_FSDP_MAPPED_H
#define MT_FSDP_FSDP_MAPPED_H

#include <stddef.h>

/* The shard elements of an f32 unit of `total` elements over nranks (> 1) ranks when its gather
 * is to be mapped: the plain shard (total / nranks, rounded up) rounded up to whole pages, so
 * that every rank's shard can be mapped next to the others. 0 when the plain shard is under
 * MT_SHM_BLOCK_MIN_BYTES: the CPU device keeps such a block private, with nothing to map. */
size_t mt_fsdp_mapped_shard(size_t total, int nranks);

#endif
