/* libxml2 parsing for topology files: quiet (errors come back as one message, not on stderr),
 * no network, no DTD loading, no entity expansion. */
#include "topo/topo_xml.h"

#include "core/error.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

mt_status mt_topo_xml_parse(const char *path, const char *buf, size_t len, xmlDocPtr *out) {
    *out = NULL;
    if (len > INT_MAX)
        return mt_error(MT_ERR_INVALID_ARG, "topology file %s is too large to parse", path);
    xmlResetLastError();
    xmlDocPtr doc = xmlReadMemory(buf, (int)len, NULL, NULL,
                                  XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
    if (!doc) {
        const xmlError *e = xmlGetLastError();
        char why[160] = "not well-formed XML";
        if (e && e->message) {
            snprintf(why, sizeof(why), "%s", e->message);
            size_t n = strlen(why);
            while (n && (why[n - 1] == '\n' || why[n - 1] == ' ')) why[--n] = '\0';
        }
        return mt_error(MT_ERR_INVALID_ARG, "topology file %s is not valid XML (line %d: %s)",
                        path, e ? e->line : 0, why);
    }
    if (!xmlDocGetRootElement(doc)) {
        xmlFreeDoc(doc);
        return mt_error(MT_ERR_INVALID_ARG, "topology file %s has no root element", path);
    }
    *out = doc;
    return MT_OK;
}

mt_status mt_topo_xml_root(const char *path, const char *buf, size_t len, char *root,
                           size_t root_size) {
    xmlDocPtr doc;
    MT_TRY(mt_topo_xml_parse(path, buf, len, &doc));
    snprintf(root, root_size, "%s", (const char *)xmlDocGetRootElement(doc)->name);
    xmlFreeDoc(doc);
    return MT_OK;
}
