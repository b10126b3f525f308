/* Option parsing by hand rather than getopt_long: torchrun accepts both `--nproc_per_node` and
 * `--nproc-per-node`, and options must stop at the program so that its own options are left
 * alone. */
#include "options.h"

#include "endpoint.h"
#include "logfiles.h"
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
    "  --nnodes N            number of nodes (mtrun instances) in the job (default 1); N:N is\n"
    "                        accepted, elastic ranges MIN:MAX with MIN < MAX are not\n"
    "  --nproc_per_node N    ranks started on this node (default 1)\n"
    "  --node_rank R         this node's rank, 0..nnodes-1 (default 0; with --rdzv_backend c10d\n"
    "                        leave it out: nodes take ranks in the order they join)\n"
    "  --master_addr ADDR    address of the node that hosts the rendezvous store (default\n"
    "                        127.0.0.1)\n"
    "  --master_port PORT    port of the rendezvous store (default 29500)\n"
    "  --rdzv_endpoint HOST[:PORT]  the store's address instead of --master_addr/--master_port\n"
    "                        (port default 29400); with c10d the node whose address it is hosts it\n"
    "  --rdzv_backend B      static (node_rank 0 hosts the store; the default) or c10d\n"
    "  --rdzv_id ID          job id; every node of one job passes the same (default none)\n"
    "  --rdzv_conf K=V,...   join_timeout=S (wait for all nodes, default MT_TIMEOUT_S),\n"
    "                        last_call_timeout=S (accepted, no effect), is_host=true|false,\n"
    "                        token_file=PATH (the store token, mode 0600; else MT_STORE_TOKEN)\n"
    "  --local_addr ADDR     this node's address, to decide whether it hosts the store (c10d)\n"
    "  --role NAME           ROLE_NAME for the ranks (default \"default\")\n"
    "  --max_restarts N      after a rank fails, restart every rank up to N times (0)\n"
    "  --monitor_interval S  accepted; mtrun learns of rank exits at once, without polling\n"
    "  --log_dir DIR         also write each rank's output to files: DIR/ID_XXXXXX/attempt_K/\n"
    "                        LOCAL_RANK/stdout.log and stderr.log (ID: --rdzv_id)\n"
    "  --redirects N|LR:N,...  keep streams of local ranks off the console, in the files only:\n"
    "                        N = 0 none, 1 stdout, 2 stderr, 3 both (default 0); without\n"
    "                        --log_dir the files go to a new temporary directory\n"
    "  --tee N|LR:N,...      streams to show on the console as well as in the files (the\n"
    "                        console is the default; tee overrides --redirects)\n"
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
               OPT_LOG_DIR, OPT_STANDALONE, OPT_BIND, OPT_HELP, OPT_ENDPOINT, OPT_BACKEND,
               OPT_CONF, OPT_LOCAL_ADDR, OPT_ROLE, OPT_MAX_RESTARTS, OPT_MONITOR,
               OPT_REDIRECTS, OPT_TEE } option_id;

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
    {"rdzv_endpoint", OPT_ENDPOINT, 1}, {"rdzv_backend", OPT_BACKEND, 1},
    {"rdzv_conf", OPT_CONF, 1},         {"local_addr", OPT_LOCAL_ADDR, 1},
    {"role", OPT_ROLE, 1},              {"max_restarts", OPT_MAX_RESTARTS, 1},
    {"monitor_interval", OPT_MONITOR, 1},
    {"redirects", OPT_REDIRECTS, 1},    {"tee", OPT_TEE, 1},
};

/* What the command line said beyond the values themselves, for the checks made once all
 * options are known. */
typedef struct seen {
    int nnodes, addr, port, endpoint, backend;
} seen_options;

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

/* Parses seconds (a decimal number) in [min, 1e6]; returns 0 on success. */
static int parse_seconds(const char *text, double min, double *out) {
    if (!*text) return -1;
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || *end || !(v >= min) || v > 1e6) return -1;
    *out = v;
    return 0;
}

/* --nnodes N or MIN:MAX. Fixed membership only: MIN:MAX is accepted when MIN == MAX. */
static int parse_nnodes(const char *name, const char *value, mtrun_options *o) {
    const char *colon = strchr(value, ':');
    if (!colon) {
        if (parse_int(value, 1, 1000000, &o->nnodes))
            return bad_value(name, value, "a positive number of nodes or MIN:MAX");
        return MTRUN_PARSE_RUN;
    }
    char min_text[32];
    size_t len = (size_t)(colon - value);
    int min, max;
    if (len >= sizeof min_text) return bad_value(name, value, "a positive number of nodes or MIN:MAX");
    memcpy(min_text, value, len);
    min_text[len] = '\0';
    if (parse_int(min_text, 1, 1000000, &min) || parse_int(colon + 1, 1, 1000000, &max) ||
        min > max)
        return bad_value(name, value, "a positive number of nodes or MIN:MAX with MIN <= MAX");
    if (min < max) {
        mtrun_msg("--nnodes %s asks for elastic membership (between %d and %d nodes), which mtrun "
                  "does not support: give a fixed number of nodes, e.g. --nnodes %d", value, min,
                  max, max);
        return 2;
    }
    o->nnodes = min;
    return MTRUN_PARSE_RUN;
}

/* --rdzv_conf key=value,...: join_timeout, last_call_timeout, is_host, token_file. */
static int parse_conf(const char *name, const char *value, mtrun_options *o) {
    const char *p = value;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[256];
        if (len == 0 || len >= sizeof item) {
            mtrun_msg("invalid --%s '%s': expected key=value pairs separated by commas", name,
                      value);
            return 2;
        }
        memcpy(item, p, len);
        item[len] = '\0';
        char *eq = strchr(item, '=');
        if (!eq) {
            mtrun_msg("invalid --%s item '%s': expected key=value", name, item);
            return 2;
        }
        *eq = '\0';
        const char *key = item, *v = eq + 1;
        if (!strcmp(key, "join_timeout")) {
            if (parse_seconds(v, 0.001, &o->join_timeout))
                return bad_value("rdzv_conf join_timeout", v, "a positive number of seconds");
        } else if (!strcmp(key, "last_call_timeout")) {
            if (parse_seconds(v, 0, &o->last_call_timeout))
                return bad_value("rdzv_conf last_call_timeout", v, "a number of seconds >= 0");
        } else if (!strcmp(key, "is_host")) {
            if (!strcmp(v, "true") || !strcmp(v, "1")) o->is_host = 1;
            else if (!strcmp(v, "false") || !strcmp(v, "0")) o->is_host = 0;
            else return bad_value("rdzv_conf is_host", v, "true, false, 1 or 0");
        } else if (!strcmp(key, "token_file")) {
            if (!*v) return bad_value("rdzv_conf token_file", v, "a file name");
            snprintf(o->token_file, sizeof o->token_file, "%s", v);
        } else {
            mtrun_msg("unknown --%s key '%s' (known: join_timeout, last_call_timeout, is_host, "
                      "token_file)", name, key);
            return 2;
        }
        p += len + (comma ? 1 : 0);
        if (comma && !*p) {
            mtrun_msg("invalid --%s '%s': it ends with a comma", name, value);
            return 2;
        }
    }
    return MTRUN_PARSE_RUN;
}

/* Applies one option with its value (NULL for flags). Returns MTRUN_PARSE_RUN or an exit code. */
static int apply(option_id id, const char *name, const char *value, mtrun_options *o,
                 seen_options *seen) {
    switch (id) {
    case OPT_NNODES:
        seen->nnodes = 1;
        return parse_nnodes(name, value, o);
    case OPT_NPROC:
        if (parse_int(value, 1, 100000, &o->nproc_per_node))
            return bad_value(name, value, "a positive number of processes");
        break;
    case OPT_NODE_RANK:
        if (parse_int(value, 0, 1000000, &o->node_rank))
            return bad_value(name, value, "a node rank >= 0");
        o->node_rank_given = true;
        break;
    case OPT_ADDR:
        if (!*value) return bad_value(name, value, "a host name or address");
        o->master_addr = value;
        seen->addr = 1;
        break;
    case OPT_PORT:
        if (parse_int(value, 1, 65535, &o->master_port))
            return bad_value(name, value, "a port number 1..65535 (--standalone picks a free one)");
        seen->port = 1;
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
    case OPT_ENDPOINT:
        o->master_port = 29400; /* torchrun's default port for an endpoint without one */
        if (mtrun_endpoint_parse(value, o->endpoint_host, sizeof o->endpoint_host,
                                 &o->master_port))
            return bad_value(name, value, "HOST, HOST:PORT or [IPV6]:PORT with a port 1..65535");
        o->master_addr = o->endpoint_host;
        seen->endpoint = 1;
        break;
    case OPT_BACKEND:
        if (!strcmp(value, "static")) o->rdzv_backend = MTRUN_RDZV_STATIC;
        else if (!strcmp(value, "c10d")) o->rdzv_backend = MTRUN_RDZV_C10D;
        else return bad_value(name, value, "static or c10d (etcd backends are not supported)");
        seen->backend = 1;
        break;
    case OPT_CONF: return parse_conf(name, value, o);
    case OPT_LOCAL_ADDR:
        if (!*value) return bad_value(name, value, "a host name or address");
        o->local_addr = value;
        break;
    case OPT_ROLE:
        if (!*value) return bad_value(name, value, "a non-empty role name");
        o->role = value;
        break;
    case OPT_MAX_RESTARTS: {
        int n;
        if (parse_int(value, 0, 1000000, &n)) return bad_value(name, value, "a number >= 0");
        o->max_restarts = n;
        break;
    }
    case OPT_MONITOR:
        if (parse_seconds(value, 0.001, &o->monitor_interval))
            return bad_value(name, value, "a positive number of seconds");
        break;
    case OPT_REDIRECTS: o->redirects = value; break; /* checked once nproc is known */
    case OPT_TEE: o->tee = value; break;
    }
    return MTRUN_PARSE_RUN;
}

int mtrun_parse_options(int argc, char **argv, mtrun_options *o) {
    *o = (mtrun_options){.nnodes = 1, .nproc_per_node = 1, .node_rank = 0,
                         .master_addr = "127.0.0.1", .master_port = 29500, .rdzv_id = "none",
                         .join_timeout = -1, .last_call_timeout = 1, .is_host = -1,
                         .role = "default", .monitor_interval = 0.1};
    seen_options seen = {0};
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
        int r = apply(known[k].id, known[k].name, value, o, &seen);
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
    if (seen.endpoint && (seen.addr || seen.port)) {
        mtrun_msg("--rdzv_endpoint and --master_addr/--master_port both give the store's "
                  "address; give one of them");
        return 2;
    }
    if (o->standalone && seen.endpoint) {
        mtrun_msg("--standalone hosts the store on a free local port; it cannot be combined "
                  "with --rdzv_endpoint %s", o->master_addr);
        return 2;
    }
    if (o->rdzv_backend == MTRUN_RDZV_C10D && o->node_rank_given) {
        mtrun_msg("--rdzv_backend c10d assigns node ranks in the order nodes join; leave out "
                  "--node_rank %d, or use --rdzv_backend static", o->node_rank);
        return 2;
    }
    if (o->rdzv_backend == MTRUN_RDZV_STATIC && seen.backend && o->nnodes > 1 &&
        !o->node_rank_given) {
        mtrun_msg("--rdzv_backend static needs --node_rank on each of the %d nodes (or use "
                  "--rdzv_backend c10d)", o->nnodes);
        return 2;
    }
    if (o->rdzv_backend == MTRUN_RDZV_STATIC && o->is_host >= 0) {
        mtrun_msg("--rdzv_conf is_host applies to --rdzv_backend c10d; with static, node rank 0 "
                  "hosts the store");
        return 2;
    }
    if (o->standalone) {
        if (seen.nnodes && o->nnodes != 1) {
            mtrun_msg("--standalone runs a single node; it cannot be combined with --nnodes %d",
                      o->nnodes);
            return 2;
        }
        o->nnodes = 1;
        o->master_port = 0; /* a given --master_port is replaced by a free one, as torchrun does */
    }
    /* c10d: the store assigns it in mtrun_cluster_join. */
    if (o->rdzv_backend == MTRUN_RDZV_C10D && o->nnodes > 1) o->node_rank = -1;
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
    if (o->redirects && mtrun_std_spec_parse("redirects", o->redirects, o->nproc_per_node, NULL))
        return 2;
    if (o->tee && mtrun_std_spec_parse("tee", o->tee, o->nproc_per_node, NULL)) return 2;
    return MTRUN_PARSE_RUN;
}
