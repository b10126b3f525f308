/* Internal: one address range through which a rank reads every member's part of a buffer that
 * is sharded over a group of ranks on one host, without copying (comm/host/shm_view.c).
 *
 * Each member's part must be a whole number of pages at a page-aligned offset of a shared block
 * of the CPU device (core/shm_block.h). Member r's part is mapped at view + r * part_bytes, so the
 * view reads as the concatenation that an all-gather would have produced, and stays current:
 * a member's writes to its part show through every view at once. Keeping readers and writers
 * apart is the caller's business (fsdp/fsdp_unit.c: a barrier where the all-gather was). */
#ifndef MT_COMM_SHM_VIEW_H
#define MT_COMM_SHM_VIEW_H

#include <meshtrain/comm.h>
#include <meshtrain/status.h>

#include <stddef.h>

/* Collective over group: maps every member's part into one view of group size x part_bytes.
 * *view is NULL (and MT_OK returned) when any member cannot take part or cannot map; why then
 * says why for the log (may be NULL). Errors are the exchange's own (a failed collective). */
mt_status mt_shm_view_map(mt_group *group, void *part, size_t part_bytes, void **view,
                          char *why, size_t why_cap);

/* Unmaps a view of total_bytes from mt_shm_view_map (NULL: nothing). */
void mt_shm_view_unmap(void *view, size_t total_bytes);

#endif
