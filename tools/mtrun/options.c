/* Option parsing by hand rather than getopt_long: torchrun accepts both `--nproc_per_node` and
 * `--nproc-per-node`, and options must stop at the program so that its own options are left
 * alone. */
#include "options.h"

#include "msg.h"

#include "topo/bind.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MTRUN_MAX_JOB_ID 255 /* the store's limit */

static const char usage_text[] =
    "usage: mtrun [options] PROGRAM [ARGS...]\n"
    "\n"
    "Starts nproc_per_node ranks of PROGRAM on this node, prefixes their output with [rankN]:,\n"
    "and stops the whole job (every node) when one rank fails. Run one mtrun per node.\n"
    "\n"
    "options (dash or underscore spelling; --opt value or --opt=value):\n"
    "  --nnodes N            number of nodes (mtrun instances) in the job (default 1)\n"
    "  --nproc_per_node N    ranks started on this node (default 1)\n"
    "  --node_rank R         this node's rank, 0..nnodes-1 (default 0)\n"
    "  --master_addr ADDR    address of node 0, which hosts the rendezvous store\n"
    "                        (default 127.0.0.1)\n"
    "  --master_port PORT    port of the rendezvous store (default 29500)\n"
    "  --rdzv_id ID          job id; every node of one job passes the same (default none)\n"
    "  --log_dir DIR         also write each rank's output to DIR/rankN.stdout and rankN.stderr\n"
    "  --standalone          one node, the store on a free port\n"
    "  --bind MODE           bind each rank's CPUs and memory: none, numa (the NUMA node of its\n"
    "                        GPU) or core (a disjoint set of that node's cores); default MT_BIND,\n"
    "                        else numa when the machine has GPUs and none otherwise\n"
    "  -h, --help            print this help\n"
    "  --                    end of options\n"
    "\n"
    "environment: MT_TIMEOUT_S (rendezvous and heartbeat timeout, default 300),\n"
    "MT_KILL_GRACE_S (seconds between SIGTERM and SIGKILL when stopping ranks, default 3),\n"
    "MT_BIND (default --bind), MT_TOPO_FILE (plan the binding for the machine that file\n"
    "describes, and report it without applying it).\n"
    "See docs/mtrun.md.\n";

typedef enum { OPT_NNODES, OPT_NPROC, OPT_NODE_RANK, OPT_ADDR, OPT_PORT, OPT_RDZV_ID,
               OPT_LOG_DIR, OPT_STANDALONE, OPT_BIND, OPT_HELP } option_id;

static const struct {
    const char *name; /* underscore spelling, without the leading "--" */
    option_id id;
    int takes_value;
} known[] = {
    {"nnodes", OPT_NNODES, 1},          {"nproc_per_node", OPT_NPROC, 1},
    {"node_rank", OPT_NODE_RANK, 1},    {"master_addr", OPT_ADDR, 1},
    {"master_port", OPT_PORT, 1},       {"rdzv_id", OPT_RDZV_ID, 1},
    {"log_dir", OPT_LOG_DIR, 1},        {"standalone", OPT_STANDALONE, 0},
    {"bind", OPT_BIND, 1},              {"help", OPT_HELP, 0},
};

/* Compares an option name as typed (dashes or underscores, up to len bytes) with a known one. */
static int name_matches(const char *typed, size_t len, const char *name) {
    if (strlen(name) != len) return 0;
    for (size_t i = 0; i < len; i++) {
        char c = typed[i] == '-' ? '_' : typed[i];
        if (c != name[i]) return 0;
    }
    return 1;
}

/* Parses a decimal integer in [min, max]; returns 0 on success. */
static int parse_int(const char *text, long min, long max, int *out) {
    if (!*text) return -1;
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || v < min || v > max) return -1;
    *out = (int)v;
    return 0;
}

static int bad_value(const char *option, const char *value, const char *expected) {
    mtrun_msg("invalid value '%s' for --%s: expected %s", value, option, expected);
    return 2;
}

/* Applies one option with its value (NULL for flags). Returns MTRUN_PARSE_RUN or an exit code. */
static int apply(option_id id, const char *name, const char *value, mtrun_options *o,
                 int *seen_nnodes) {
    switch (id) {
    case OPT_NNODES:
        if (parse_int(value, 1, 1000000, &o->nnodes))
            return bad_value(name, value, "a positive number of nodes (elastic ranges such as "
                                          "1:4 are not supported)");
        *seen_nnodes = 1;
        break;
    case OPT_NPROC:
        if (parse_int(value, 1, 100000, &o->nproc_per_node))
            return bad_value(name, value, "a positive number of processes");
        break;
    case OPT_NODE_RANK:
        if (parse_int(value, 0, 1000000, &o->node_rank))
            return bad_value(name, value, "a node rank >= 0");
        break;
    case OPT_ADDR:
        if (!*value) return bad_value(name, value, "a host name or address");
        o->master_addr = value;
        break;
    case OPT_PORT:
        if (parse_int(value, 1, 65535, &o->master_port))
            return bad_value(name, value, "a port number 1..65535 (--standalone picks a free one)");
        break;
    case OPT_RDZV_ID:
        if (!*value || strlen(value) > MTRUN_MAX_JOB_ID)
            return bad_value(name, value, "a non-empty job id of at most 255 bytes");
        o->rdzv_id = value;
        break;
    case OPT_LOG_DIR:
        if (!*value) return bad_value(name, value, "a directory");
        o->log_dir = value;
        break;
    case OPT_STANDALONE: o->standalone = true; break;
    case OPT_BIND:
        if (mt_bind_mode_parse(value, &o->bind) != MT_OK)
            return bad_value(name, value, "none, numa or core");
        o->bind_from = "--bind";
        break;
    case OPT_HELP: fputs(usage_text, stdout); return 0;
    }
    return MTRUN_PARSE_RUN;
}

int mtrun_parse_options(int argc, char **argv, mtrun_options *o) {
    *o = (mtrun_options){.nnodes = 1, .nproc_per_node = 1, .node_rank = 0,
                         .master_addr = "127.0.0.1", .master_port = 29500, .rdzv_id = "none"};
    int seen_nnodes = 0;
    int i = 1;
    for (; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--")) {
            i++;
            break;
        }
        if (!strcmp(arg, "-h")) {
            fputs(usage_text, stdout);
            return 0;
        }
        if (strncmp(arg, "--", 2) != 0) {
            if (arg[0] == '-' && arg[1]) {
                mtrun_msg("unknown option '%s' (see mtrun --help)", arg);
                return 2;
            }
            break; /* the program */
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        int k = -1;
        for (size_t j = 0; j < sizeof known / sizeof known[0]; j++)
            if (name_matches(name, len, known[j].name)) k = (int)j;
        if (k < 0) {
            mtrun_msg("unknown option '%.*s' (see mtrun --help)", (int)(len + 2), arg);
            return 2;
        }
        const char *value = NULL;
        if (known[k].takes_value) {
            if (eq) {
                value = eq + 1;
            } else if (i + 1 < argc) {
                value = argv[++i];
            } else {
                mtrun_msg("option --%s needs a value", known[k].name);
                return 2;
            }
        } else if (eq) {
            mtrun_msg("option --%s takes no value", known[k].name);
            return 2;
        }
        int r = apply(known[k].id, known[k].name, value, o, &seen_nnodes);
        if (r != MTRUN_PARSE_RUN) return r;
    }
    if (i >= argc || !argv[i][0]) {
        mtrun_msg("missing PROGRAM to run (usage: mtrun [options] PROGRAM [ARGS...])");
        return 2;
    }
    o->program_argv = argv + i;
    const char *env_bind = getenv("MT_BIND");
    if (!o->bind_from && env_bind && *env_bind) {
        if (mt_bind_mode_parse(env_bind, &o->bind) != MT_OK) {
            mtrun_msg("invalid MT_BIND='%s': expected none, numa or core", env_bind);
            return 2;
        }
        o->bind_from = "MT_BIND";
    }
    if (o->standalone) {
        if (seen_nnodes && o->nnodes != 1) {
            mtrun_msg("--standalone runs a single node; it cannot be combined with --nnodes %d",
                      o->nnodes);
            return 2;
        }
        o->nnodes = 1;
        o->master_port = 0; /* a given --master_port is replaced by a free one, as torchrun does */
    }
    if (o->node_rank >= o->nnodes) {
        mtrun_msg("--node_rank %d is out of range: it must be below --nnodes %d", o->node_rank,
                  o->nnodes);
        return 2;
    }
    if ((long)o->nnodes * o->nproc_per_node > INT_MAX / 2) {
        mtrun_msg("--nnodes %d x --nproc_per_node %d ranks is too many", o->nnodes,
                  o->nproc_per_node);
        return 2;
    }
    return MTRUN_PARSE_RUN;
}
