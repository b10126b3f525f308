/* Internal: parsing topology XML with libxml2, shared by format detection and the NCCL loader. */
#ifndef MT_TOPO_TOPO_XML_H
#define MT_TOPO_TOPO_XML_H

#include <meshtrain/status.h>

#include <libxml/parser.h>

#include <stddef.h>

/* Parses buf (len bytes) without network access or entity expansion; on failure the error names
 * path and libxml2's line and reason (MT_ERR_INVALID_ARG). Free the result with xmlFreeDoc. */
mt_status mt_topo_xml_parse(const char *path, const char *buf, size_t len, xmlDocPtr *out);

/* Parses buf and copies the root element's name into root (truncated to root_size - 1). */
mt_status mt_topo_xml_root(const char *path, const char *buf, size_t len, char *root,
                           size_t root_size);

#endif
