/* Internal: checking that every rank passed the same arguments to a collective call (a mesh
 * spec, a flatten) through the rendezvous store, so that a disagreement is an error naming the
 * ranks on every rank instead of a hang in the first collective. */
#ifndef MT_MESH_AGREE_H
#define MT_MESH_AGREE_H

#include <meshtrain/runtime.h>
#include <meshtrain/status.h>

/* Every rank publishes `mine` (what must agree) and `extra` (free text, e.g. host and device);
 * rank 0 compares and publishes a verdict. On disagreement every rank returns MT_ERR_MISMATCH
 * with a message grouping the ranks by what they passed ("ranks 0-1 passed A; ranks 2-3 passed
 * B"). what names the call in messages ("mt_mesh_create"). On rank 0, *extras (may be NULL)
 * receives world malloc'd strings (free with mt_agree_free_extras); elsewhere NULL. */
mt_status mt_agree(mt_runtime *rt, const char *what, const char *mine, const char *extra,
                   char ***extras);

void mt_agree_free_extras(char **extras, int world);

/* Writes ranks as ranges ("0-3,6,8-9") into buf; ranks ascending. */
void mt_format_rank_list(const int *ranks, int n, char *buf, size_t size);

#endif
