/* Internal: what `mt-topo` prints about a loaded topology (topo/topology.h): a text report laid
 * out like `nvidia-smi topo -m`, the same facts as JSON, and an NCCL topology XML export. Every
 * code, island, nearest NIC and TP group comes from topo/classify.h. See docs/mt-topo.md. */
#ifndef MT_TOPO_REPORT_H
#define MT_TOPO_REPORT_H

#include "topo/classify.h"
#include "topo/topology.h"

#include <meshtrain/status.h>

#include <stdint.h>
#include <stdio.h>

/* The text report: machine section, GPU/NIC matrix with legends, summary. MT_ERR_IO when writing
 * fails. */
mt_status mt_topo_report_text(const mt_topo *t, FILE *out);

/* The report as one JSON object (fields in docs/mt-topo.md). MT_ERR_IO when writing fails. */
mt_status mt_topo_report_json(const mt_topo *t, FILE *out);

/* Writes t as an NCCL topology XML (NCCL_TOPO_FILE format) that mt_topo_load_file reads back
 * into the same report. MT_ERR_INVALID_ARG when a value exceeds what NCCL's parser accepts,
 * MT_ERR_IO when writing fails. */
mt_status mt_topo_export_nccl(const mt_topo *t, FILE *out);

/* The same into a file ("-" = out_stdout); the file is written whole or not at all (through a
 * temporary file renamed into place). */
mt_status mt_topo_export_nccl_file(const mt_topo *t, const char *path, FILE *out_stdout);

/* The connection between entries a and b of the matrix (GPUs in gpus[] order, then NICs). */
mt_topo_conn mt_topo_matrix_conn(const mt_topo *t, size_t a, size_t b);

/* Why NVLink is unknown for some GPU of t (a sentence fragment), or NULL when every GPU's NVLink
 * is known or there is no GPU. */
const char *mt_topo_nvlink_unknown_reason(const mt_topo *t);

#endif
