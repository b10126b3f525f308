/* Parsing the launch environment. Every rejected value is named with its variable, because a
 * typo in one rank's environment otherwise shows up as a hang or a confusing mismatch later. */
#include "mesh/runtime_env.h"

#include "core/error.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define DEFAULT_MASTER_ADDR "127.0.0.1"
#define DEFAULT_MASTER_PORT 29500
#define DEFAULT_JOB_ID "none"

typedef struct env_ctx {
    mt_env_lookup lookup;
    void *ctx;
} env_ctx;

/* A set variable's value, or NULL when unset or empty (an empty value means "not given"). */
static const char *var(const env_ctx *e, const char *name) {
    const char *v = e->lookup(name, e->ctx);
    return v && *v ? v : NULL;
}

static mt_status parse_int(const char *name, const char *value, long min, long max, int *out) {
    const char *p = value;
    bool neg = *p == '-';
    if (neg) p++;
    if (!*p || strspn(p, "0123456789") != strlen(p))
        return mt_error(MT_ERR_INVALID_ARG, "%s='%s' is not an integer", name, value);
    if (neg && min >= 0)
        return mt_error(MT_ERR_INVALID_ARG, "%s=%s is negative; it must be at least %ld", name,
                        value, min);
    errno = 0;
    long v = strtol(value, NULL, 10);
    if (errno == ERANGE || v < min || v > max)
        return mt_error(MT_ERR_INVALID_ARG, "%s=%s is outside %ld..%ld", name, value, min, max);
    *out = (int)v;
    return MT_OK;
}

/* An optional integer variable: *out stays at its default when unset. */
static mt_status opt_int(const env_ctx *e, const char *name, long min, long max, int *out) {
    const char *v = var(e, name);
    return v ? parse_int(name, v, min, max, out) : MT_OK;
}

static mt_status copy_string(const char *name, const char *value, char *out, size_t cap) {
    if (strlen(value) >= cap)
        return mt_error(MT_ERR_INVALID_ARG, "%s is %zu characters long, more than the %zu allowed",
                        name, strlen(value), cap - 1);
    snprintf(out, cap, "%s", value);
    return MT_OK;
}

static mt_status parse_bool(const char *name, const char *value, bool *out) {
    if (!strcmp(value, "1") || !strcasecmp(value, "true") || !strcasecmp(value, "yes")) {
        *out = true;
    } else if (!strcmp(value, "0") || !strcasecmp(value, "false") || !strcasecmp(value, "no")) {
        *out = false;
    } else {
        return mt_error(MT_ERR_INVALID_ARG, "%s='%s' is not 1 or 0", name, value);
    }
    return MT_OK;
}

const char *mt_env_source_name(mt_env_source source) {
    switch (source) {
    case MT_ENV_SINGLE: return "single process";
    case MT_ENV_TORCHRUN: return "RANK/WORLD_SIZE variables";
    case MT_ENV_SLURM: return "Slurm";
    }
    return "?";
}

/* ---- Slurm node lists ---------------------------------------------------------------------- */

mt_status mt_slurm_first_host(const char *nodelist, char *out, size_t cap) {
    if (!nodelist || !*nodelist)
        return mt_error(MT_ERR_INVALID_ARG, "the Slurm node list is empty");
    size_t used = 0;
    for (const char *p = nodelist; *p && *p != ','; p++) {
        if (*p == ']')
            return mt_error(MT_ERR_INVALID_ARG, "Slurm node list '%s' has a ']' without '['",
                            nodelist);
        if (*p == '[') {
            /* "[003-005,007]": the first host takes the first number as written (zero-padded). */
            const char *close = strchr(p, ']');
            const char *nested = strchr(p + 1, '[');
            if (!close || (nested && nested < close))
                return mt_error(MT_ERR_INVALID_ARG, "Slurm node list '%s' has an unbalanced '['",
                                nodelist);
            size_t digits = strspn(p + 1, "0123456789");
            char after = p[1 + digits];
            if (digits == 0 || (after != '-' && after != ',' && after != ']'))
                return mt_error(MT_ERR_INVALID_ARG, "Slurm node list '%s' has a malformed range "
                                "'%.*s'", nodelist, (int)(close - p + 1), p);
            if (used + digits >= cap)
                return mt_error(MT_ERR_INVALID_ARG, "Slurm node list '%s': first host name is too "
                                "long", nodelist);
            memcpy(out + used, p + 1, digits);
            used += digits;
            p = close;
            continue;
        }
        if (used + 1 >= cap)
            return mt_error(MT_ERR_INVALID_ARG, "Slurm node list '%s': first host name is too long",
                            nodelist);
        out[used++] = *p;
    }
    if (used == 0)
        return mt_error(MT_ERR_INVALID_ARG, "Slurm node list '%s' does not start with a host name",
                        nodelist);
    out[used] = '\0';
    return MT_OK;
}

/* ---- the sources --------------------------------------------------------------------------- */

static mt_status parse_torchrun(const env_ctx *e, mt_runtime_env *env) {
    const char *rank = var(e, "RANK"), *world = var(e, "WORLD_SIZE");
    if (!world)
        return mt_error(MT_ERR_INVALID_ARG, "RANK=%s is set but WORLD_SIZE is not; set both (or "
                        "neither, for a single process)", rank);
    MT_TRY(parse_int("WORLD_SIZE", world, 1, INT_MAX, &env->world_size));
    MT_TRY(parse_int("RANK", rank, 0, INT_MAX, &env->rank));
    if (env->rank >= env->world_size)
        return mt_error(MT_ERR_INVALID_ARG, "RANK=%d is not below WORLD_SIZE=%d", env->rank,
                        env->world_size);
    MT_TRY(opt_int(e, "LOCAL_RANK", 0, INT_MAX, &env->local_rank));
    MT_TRY(opt_int(e, "LOCAL_WORLD_SIZE", 1, INT_MAX, &env->local_world_size));
    MT_TRY(opt_int(e, "GROUP_RANK", 0, INT_MAX, &env->node_rank));
    MT_TRY(opt_int(e, "MT_NNODES", 1, INT_MAX, &env->num_nodes));
    const char *addr = var(e, "MASTER_ADDR");
    MT_TRY(copy_string("MASTER_ADDR", addr ? addr : DEFAULT_MASTER_ADDR, env->master_addr,
                       sizeof env->master_addr));
    env->master_port = DEFAULT_MASTER_PORT;
    MT_TRY(opt_int(e, "MASTER_PORT", 1, 65535, &env->master_port));
    const char *hosted = var(e, "MT_STORE_HOSTED");
    if (hosted) MT_TRY(parse_bool("MT_STORE_HOSTED", hosted, &env->store_hosted));
    const char *prefix = var(e, "MT_STORE_PREFIX");
    if (prefix)
        MT_TRY(copy_string("MT_STORE_PREFIX", prefix, env->store_prefix, sizeof env->store_prefix));
    return MT_OK;
}

static mt_status parse_slurm(const env_ctx *e, mt_runtime_env *env) {
    const char *rank = var(e, "SLURM_PROCID");
    const char *ntasks_name = var(e, "SLURM_NTASKS") ? "SLURM_NTASKS" : "SLURM_NPROCS";
    const char *ntasks = var(e, ntasks_name);
    if (!ntasks)
        return mt_error(MT_ERR_INVALID_ARG, "SLURM_PROCID=%s is set but SLURM_NTASKS is not "
                        "(start the job with srun, or set RANK and WORLD_SIZE)", rank);
    MT_TRY(parse_int(ntasks_name, ntasks, 1, INT_MAX, &env->world_size));
    MT_TRY(parse_int("SLURM_PROCID", rank, 0, INT_MAX, &env->rank));
    if (env->rank >= env->world_size)
        return mt_error(MT_ERR_INVALID_ARG, "SLURM_PROCID=%d is not below %s=%d", env->rank,
                        ntasks_name, env->world_size);
    MT_TRY(opt_int(e, "SLURM_LOCALID", 0, INT_MAX, &env->local_rank));
    MT_TRY(opt_int(e, "SLURM_NODEID", 0, INT_MAX, &env->node_rank));
    const char *nnodes_name = var(e, "SLURM_NNODES") ? "SLURM_NNODES" : "SLURM_JOB_NUM_NODES";
    MT_TRY(opt_int(e, nnodes_name, 1, INT_MAX, &env->num_nodes));
    const char *addr = var(e, "MASTER_ADDR");
    if (addr) {
        MT_TRY(copy_string("MASTER_ADDR", addr, env->master_addr, sizeof env->master_addr));
    } else {
        /* Rank 0 runs on the first node of the step (Slurm's block distribution). */
        static const char *lists[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                      "SLURM_NODELIST"};
        const char *list = NULL, *list_name = NULL;
        for (size_t i = 0; i < 3 && !list; i++) list = var(e, list_name = lists[i]);
        if (list) {
            if (mt_slurm_first_host(list, env->master_addr, sizeof env->master_addr) != MT_OK)
                return mt_error_wrap(MT_ERR_INVALID_ARG, "%s", list_name);
        } else if (env->num_nodes > 1) {
            return mt_error(MT_ERR_INVALID_ARG, "Slurm job on %d nodes without SLURM_JOB_NODELIST "
                            "or MASTER_ADDR: cannot tell where rank 0 hosts the store",
                            env->num_nodes);
        } else {
            snprintf(env->master_addr, sizeof env->master_addr, "%s", DEFAULT_MASTER_ADDR);
        }
    }
    env->master_port = DEFAULT_MASTER_PORT;
    MT_TRY(opt_int(e, "MASTER_PORT", 1, 65535, &env->master_port));
    return MT_OK;
}

static mt_status check_local(const mt_runtime_env *env) {
    if (env->local_world_size > env->world_size)
        return mt_error(MT_ERR_INVALID_ARG, "LOCAL_WORLD_SIZE=%d is larger than WORLD_SIZE=%d",
                        env->local_world_size, env->world_size);
    if (env->local_rank >= 0 && env->local_world_size > 0 &&
        env->local_rank >= env->local_world_size)
        return mt_error(MT_ERR_INVALID_ARG, "LOCAL_RANK=%d is not below LOCAL_WORLD_SIZE=%d",
                        env->local_rank, env->local_world_size);
    if (env->local_rank >= env->world_size)
        return mt_error(MT_ERR_INVALID_ARG, "LOCAL_RANK=%d is not below WORLD_SIZE=%d",
                        env->local_rank, env->world_size);
    if (env->node_rank >= 0 && env->num_nodes > 0 && env->node_rank >= env->num_nodes)
        return mt_error(MT_ERR_INVALID_ARG, "node rank %d (GROUP_RANK or SLURM_NODEID) is not "
                        "below the number of nodes %d", env->node_rank, env->num_nodes);
    return MT_OK;
}

static mt_status parse_job_id(const env_ctx *e, mt_runtime_env *env) {
    static const char *names[] = {"MT_RDZV_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"};
    for (size_t i = 0; i < 3; i++) {
        if (i == 2 && env->source != MT_ENV_SLURM) break;
        const char *v = var(e, names[i]);
        if (v) return copy_string(names[i], v, env->job_id, sizeof env->job_id);
    }
    snprintf(env->job_id, sizeof env->job_id, "%s", DEFAULT_JOB_ID);
    return MT_OK;
}

mt_status mt_runtime_env_parse(mt_env_lookup lookup, void *ctx, mt_runtime_env *out) {
    env_ctx e = {lookup, ctx};
    mt_runtime_env env = {.source = MT_ENV_SINGLE, .rank = 0, .world_size = 1,
                          .local_rank = -1, .local_world_size = -1, .node_rank = -1,
                          .num_nodes = -1};
    if (var(&e, "RANK")) {
        env.source = MT_ENV_TORCHRUN;
        MT_TRY(parse_torchrun(&e, &env));
    } else if (var(&e, "SLURM_PROCID")) {
        env.source = MT_ENV_SLURM;
        MT_TRY(parse_slurm(&e, &env));
    } else if (var(&e, "WORLD_SIZE")) {
        return mt_error(MT_ERR_INVALID_ARG, "WORLD_SIZE=%s is set but RANK is not; set both (or "
                        "neither, for a single process)", var(&e, "WORLD_SIZE"));
    } else {
        /* A single process hosts its own store; a free port avoids clashing with a real job. */
        snprintf(env.master_addr, sizeof env.master_addr, "%s", DEFAULT_MASTER_ADDR);
        env.master_port = 0;
        MT_TRY(opt_int(&e, "MASTER_PORT", 1, 65535, &env.master_port));
    }
    MT_TRY(check_local(&env));
    MT_TRY(parse_job_id(&e, &env));
    *out = env;
    return MT_OK;
}

static const char *process_lookup(const char *name, void *ctx) {
    (void)ctx;
    return getenv(name);
}

mt_status mt_runtime_env_from_process(mt_runtime_env *out) {
    return mt_runtime_env_parse(process_lookup, NULL, out);
}
