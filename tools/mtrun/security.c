/* The store token, the store's address and the open-file limit, for mtrun (security.h). The
 * token is handed to the ranks in their environment: /proc/PID/environ is readable only by the
 * job's user (mode 0400, and ptrace access), as the docs say. */
#include "security.h"

#include "msg.h"

#include "core/fd_limit.h"
#include "mesh/netif.h"
#include "store/auth.h"
#include "store/store_internal.h"

#include <meshtrain/status.h>

#include <openssl/crypto.h>

#include <stdio.h>
#include <stdlib.h>

int mtrun_security_max_clients(const mtrun_options *o) {
    long world = (long)o->nnodes * o->nproc_per_node;
    return mt_store_default_max_clients(world > 0x7fffffff ? 0x7fffffff : (int)world, o->nnodes);
}

int mtrun_security_prepare(const mtrun_options *o) {
    /* The store host also keeps two pipes per local rank and a few files of its own. */
    uint64_t need = o->hosts_store ? (uint64_t)mtrun_security_max_clients(o) + 64 +
                                         4 * (uint64_t)o->nproc_per_node : 0;
    if (mt_fd_limit_raise(need, "the rendezvous store this mtrun hosts", NULL) != MT_OK) {
        mtrun_msg("%s", mt_last_error());
        return 1;
    }
    char text[MT_STORE_TOKEN_MAX + 2];
    mt_store_token check;
    if (o->token_file[0]) {
        if (mt_store_token_read_file(o->token_file, text, sizeof text) != MT_OK ||
            mt_store_token_resolve(text, &check) != MT_OK) {
            mtrun_msg("--rdzv_conf token_file: %s", mt_last_error());
            OPENSSL_cleanse(text, sizeof text);
            return 2;
        }
        setenv("MT_STORE_TOKEN", text, 1);
        OPENSSL_cleanse(text, sizeof text);
    } else if (mt_store_token_resolve(NULL, &check) != MT_OK) {
        mtrun_msg("%s", mt_last_error());
        return 2;
    } else if (check.len == 0 && o->nnodes == 1) {
        /* Nobody outside this node takes part: a fresh secret only this job's ranks learn. */
        if (mt_store_token_generate(text) != MT_OK) {
            mtrun_msg("%s", mt_last_error());
            return 1;
        }
        setenv("MT_STORE_TOKEN", text, 1);
        OPENSSL_cleanse(text, sizeof text);
    } else if (check.len == 0 && o->hosts_store) {
        mtrun_msg("warning: no store token (MT_STORE_TOKEN or --rdzv_conf token_file=PATH): the "
                  "rendezvous store on port %d is open to anyone who can reach it, who could "
                  "then read or stop this job (docs/security.md)", o->master_port);
    } else if (check.len == 0) {
        mtrun_msg("warning: no store token (MT_STORE_TOKEN or --rdzv_conf token_file=PATH): this "
                  "node joins a store that anyone who reaches %s:%d could join too "
                  "(docs/security.md)", o->master_addr, o->master_port);
    }
    OPENSSL_cleanse(&check, sizeof check);
    return -1;
}

int mtrun_security_store_bind(mtrun_options *o) {
    if (mt_netif_store_bind(o->master_addr, o->nnodes == 1, o->store_listen, o->store_bind,
                            sizeof o->store_bind) != MT_OK) {
        mtrun_msg("cannot choose where the rendezvous store listens: %s", mt_last_error());
        return 2;
    }
    return -1;
}
