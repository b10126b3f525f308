/* The offload data path of FSDP units (fsdp/fsdp_offload.h, docs/offload.md).
 *
 * One stager per device, shared by its units (a stager is a UCX context and a thread: one per
 * unit would be dozens), created by the first offloaded unit and destroyed with the last unit
 * that joined it. Host-tier blocks and OPTIMIZER's device shard are registered once at sharding;
 * the buffers that live for one all-gather or one reduce-scatter (FULL's device shard, the
 * reduced gradient) are registered for that copy only.
 *
 * Host arithmetic (bf16 casts, adding the reduced gradient) calls the CPU device's kernels
 * directly: the host tier is host memory on every backend, and these are the very loops the CPU
 * device runs for mt_op_cast and mt_op_accumulate, so offloaded and resident units give the
 * same bits. */
#include "fsdp/fsdp_offload.h"

#include "core/cpu/ops_cpu.h"
#include "core/error.h"
#include "module/module_internal.h"

#include <meshtrain/host_memory.h>
#include <meshtrain/log.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mt_fsdp_offload_ctx {
    mt_device *dev;
    mt_stager *stager; /* created by the first offloaded unit */
    int refs;          /* units joined */
    long units;        /* units of the current model sharded with a policy: k of the ratio rule */
    mt_fsdp_unit *last; /* the unit that took k = units - 1, until the next one joins */
    /* Where reduced gradient shards land on the host before they are added (host tier, comm,
     * registered): one block for every unit, grown to the largest, since each is added before
     * the next starts its copy. */
    void *landing;
    size_t landing_bytes;
    /* The reduced gradient shard on its way to the landing block: the unit, its reduce-scatter
     * output (device, registered, freed once landed) and the copy. Added into the unit's host
     * gradient when the next one starts or the backward ends, so the copy runs meanwhile. */
    mt_fsdp_unit *pending;
    void *pending_recv;
    mt_stage_copy *pending_copy;
    struct mt_fsdp_offload_ctx *next;
};

static mt_status land(struct mt_fsdp_offload_ctx *c, bool add, bool continues);

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct mt_fsdp_offload_ctx *g_ctxs;

static const char *policy_name(mt_offload p) {
    return p == MT_OFFLOAD_FULL ? "full" : p == MT_OFFLOAD_OPTIMIZER ? "optimizer" : "none";
}

/* What fails in a teardown (leave, release) or in the undo on an error path cannot be returned:
 * it is logged once, at error level, naming what failed and where, and the calling thread's last
 * error is put back as it was (release also runs when mt_fsdp_shard fails, which returns its own
 * error). A broken stager is thus reported when the model goes, not only at its next use. */
typedef struct lost_errors {
    char saved[2048];
    bool logged;
} lost_errors;

static void lost_begin(lost_errors *l) {
    snprintf(l->saved, sizeof l->saved, "%s", mt_last_error());
    l->logged = false;
}

static void lost_note(lost_errors *l, mt_status s, const char *what, const char *where) {
    if (s == MT_OK) return;
    mt_log(MT_LOG_ERROR, "fsdp offload: %s (%s) failed, and nothing is left to return the error "
           "to: %s", what, where, mt_last_error());
    l->logged = true;
}

static void lost_end(lost_errors *l) {
    if (!l->logged) return;
    if (l->saved[0]) mt_error_restore(MT_OK, l->saved);
    else mt_error_clear_message();
}

/* Finds or adds the device's context and takes a reference; *k gets u's index in its model. */
static mt_status join(mt_fsdp_unit *u, struct mt_fsdp_offload_ctx **out, long *k) {
    mt_device *dev = u->dev;
    pthread_mutex_lock(&g_lock);
    struct mt_fsdp_offload_ctx *c = g_ctxs;
    while (c && c->dev != dev) c = c->next;
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c) {
            pthread_mutex_unlock(&g_lock);
            return mt_error(MT_ERR_OUT_OF_MEMORY, "fsdp offload: out of host memory");
        }
        c->dev = dev;
        c->next = g_ctxs;
        g_ctxs = c;
    }
    c->refs++;
    *k = c->units++;
    c->last = u;
    /* A module without a parent is a model's outermost unit, sharded after its layers: the
     * next unit starts another model, counted from 0 again (the ratio is per model). */
    if (!u->module->parent) {
        c->units = 0;
        c->last = NULL;
    }
    *out = c;
    pthread_mutex_unlock(&g_lock);
    return MT_OK;
}

static void leave(struct mt_fsdp_offload_ctx *c) {
    if (!c) return;
    pthread_mutex_lock(&g_lock);
    bool last = --c->refs == 0;
    if (last) {
        struct mt_fsdp_offload_ctx **pp = &g_ctxs;
        while (*pp != c) pp = &(*pp)->next;
        *pp = c->next;
    }
    pthread_mutex_unlock(&g_lock);
    if (!last) return;
    lost_errors l;
    lost_begin(&l);
    char where[160];
    snprintf(where, sizeof where, "the offload stager of %s, released with its last unit",
             mt_device_name(c->dev));
    lost_note(&l, land(c, false, false), "waiting for the last reduced-gradient copy", where);
    if (c->landing && c->landing_bytes)
        lost_note(&l, mt_stager_unregister(c->stager, c->landing),
                  "unregistering the gradient landing block", where);
    lost_end(&l);
    mt_host_tier_free(c->dev, c->landing);
    mt_stager_destroy(c->stager);
    free(c);
}

static mt_status need_stager(struct mt_fsdp_offload_ctx *c) {
    pthread_mutex_lock(&g_lock);
    mt_status st = c->stager ? MT_OK : mt_stager_create(c->dev, &c->stager);
    pthread_mutex_unlock(&g_lock);
    return st;
}

mt_status mt_fsdp_offload_setup(mt_fsdp_unit *u, const mt_fsdp_options *o) {
    const char *name = u->module->name;
    if (!(o->offload_ratio >= 0.0f && o->offload_ratio <= 1.0f))
        return mt_error(MT_ERR_INVALID_ARG, "mt_fsdp_shard('%s'): offload_ratio %g is outside "
                        "[0, 1] (it is the fraction of units offloaded: 0 none, 1 all)", name,
                        (double)o->offload_ratio);
    if (o->offload != MT_OFFLOAD_NONE && o->offload != MT_OFFLOAD_OPTIMIZER &&
        o->offload != MT_OFFLOAD_FULL)
        return mt_error(MT_ERR_INVALID_ARG, "mt_fsdp_shard('%s'): offload policy %d is none of "
                        "MT_OFFLOAD_NONE, MT_OFFLOAD_OPTIMIZER, MT_OFFLOAD_FULL", name,
                        (int)o->offload);
    u->offload = MT_OFFLOAD_NONE;
    if (o->offload == MT_OFFLOAD_NONE) return MT_OK;
    long k = 0;
    MT_TRY(join(u, &u->off, &k));
    double r = o->offload_ratio;
    if (floor((double)(k + 1) * r) > floor((double)k * r)) u->offload = o->offload;
    if (u->offload != MT_OFFLOAD_NONE) {
        mt_status st = need_stager(u->off);
        if (st != MT_OK)
            return mt_error_wrap(st, "mt_fsdp_shard('%s'): the staging copies of offload '%s'",
                                 name, policy_name(o->offload));
    }
    mt_log(MT_LOG_DEBUG, "fsdp: unit '%s' (unit %ld with offload '%s', ratio %g): %s", name, k,
           policy_name(o->offload), r, u->offload ? "offloaded" : "resident");
    return MT_OK;
}

static size_t param_bytes(const mt_fsdp_unit *u) { return u->S * mt_dtype_size(u->param_dtype); }

/* The host block the device shard is staged from: the bf16 shard, or the f32 master itself. */
static void *host_send(const mt_fsdp_unit *u) {
    return u->param_dtype == MT_BF16 ? (void *)u->shard_lp : (void *)u->master;
}

static mt_status host_block(mt_fsdp_unit *u, size_t bytes, mt_mem_category cat, bool reg,
                            void **out) {
    MT_TRY(mt_host_tier_alloc(u->dev, bytes, cat, out));
    memset(*out, 0, bytes);
    mt_status st = reg && bytes > 0 ? mt_stager_register(u->off->stager, *out, bytes) : MT_OK;
    if (st != MT_OK) { /* release unregisters only what was registered: not this block */
        mt_host_tier_free(u->dev, *out);
        *out = NULL;
    }
    return st;
}

mt_status mt_fsdp_offload_alloc(mt_fsdp_unit *u) {
    size_t S = u->S;
    bool bf16 = u->param_dtype == MT_BF16;
    mt_mem_category master_cat = bf16 ? MT_MEM_OPTIMIZER : MT_MEM_PARAMS;
    MT_TRY(host_block(u, S * sizeof(float), master_cat, !bf16, (void **)&u->master));
    MT_TRY(host_block(u, S * sizeof(float), MT_MEM_GRADS, false, (void **)&u->grad_shard));
    if (bf16) MT_TRY(host_block(u, S * sizeof(mt_bf16), MT_MEM_PARAMS, true, (void **)&u->shard_lp));
    if (u->offload == MT_OFFLOAD_OPTIMIZER && S > 0) {
        MT_TRY(mt_device_alloc(u->dev, param_bytes(u), MT_MEM_PARAMS, &u->dev_shard));
        mt_status st = mt_stager_register(u->off->stager, u->dev_shard, param_bytes(u));
        if (st != MT_OK) {
            mt_device_free(u->dev, u->dev_shard);
            u->dev_shard = NULL;
        }
        return st;
    }
    return MT_OK;
}

static mt_status wait_param_copy(mt_fsdp_unit *u) {
    if (!u->param_copy) return MT_OK;
    mt_status st = mt_stage_wait(u->param_copy);
    u->param_copy = NULL;
    return st;
}

mt_status mt_fsdp_offload_quiesce(mt_fsdp_unit *u) {
    if (u->offload == MT_OFFLOAD_NONE) return MT_OK;
    u->debug.quiesces++;
    return wait_param_copy(u);
}

mt_status mt_fsdp_offload_refresh(mt_fsdp_unit *u) {
    if (u->offload == MT_OFFLOAD_NONE) return MT_OK;
    /* A copy still in flight reads the host block (shard_lp or master) this refresh is about to
     * write: it finishes before the cast, not after. */
    MT_TRY(wait_param_copy(u));
    if (u->shard_lp) MT_TRY(mt_cpu_op_cast(u->master, MT_F32, u->shard_lp, MT_BF16, u->S));
    if (u->offload != MT_OFFLOAD_OPTIMIZER || u->S == 0) {
        u->dev_stale = false; /* FULL stages the host block at each gather: nothing to refresh */
        return MT_OK;
    }
    /* Fresh only once the copy is under way; a failed start leaves it stale, so the next gather
     * tries again instead of using the old device shard. */
    mt_status st = mt_stage_copy_async(u->off->stager, u->dev_shard, host_send(u),
                                       param_bytes(u), MT_COPY_HOST_TO_DEVICE, &u->param_copy);
    u->dev_stale = st != MT_OK;
    return st;
}

mt_status mt_fsdp_offload_written(mt_fsdp_unit *u, size_t b, size_t e) {
    /* The caller has written master already (ckpt_load, init): see mt_fsdp_offload_quiesce.
     * The cast below writes shard_lp, which a refresh copy may still be reading. */
    MT_TRY(wait_param_copy(u));
    if (u->shard_lp)
        MT_TRY(mt_cpu_op_cast(u->master + b, MT_F32, u->shard_lp + b, MT_BF16, e - b));
    /* One refresh before the next gather, not one copy per initialised parameter. */
    u->dev_stale = true;
    return MT_OK;
}

mt_status mt_fsdp_offload_stage_in(mt_fsdp_unit *u, const void **send) {
    *send = u->dev_shard;
    if (u->S == 0) return MT_OK;
    if (u->offload == MT_OFFLOAD_OPTIMIZER) {
        if (u->dev_stale) MT_TRY(mt_fsdp_offload_refresh(u));
        return wait_param_copy(u);
    }
    mt_status st = mt_fsdp_offload_stage_start(u);
    if (st == MT_OK) st = wait_param_copy(u);
    if (st != MT_OK) return mt_fsdp_offload_gathered_after(u, st);
    *send = u->dev_shard;
    return MT_OK;
}

mt_status mt_fsdp_offload_stage_start(mt_fsdp_unit *u) {
    if (u->offload != MT_OFFLOAD_FULL || u->S == 0 || u->dev_shard ||
        u->state != MT_UNIT_SHARDED)
        return MT_OK;
    size_t bytes = param_bytes(u);
    MT_TRY(mt_device_alloc(u->dev, bytes, MT_MEM_PARAMS, &u->dev_shard));
    mt_status st = mt_stager_register(u->off->stager, u->dev_shard, bytes);
    if (st != MT_OK) {
        mt_device_free(u->dev, u->dev_shard);
        u->dev_shard = NULL;
        return st;
    }
    st = mt_stage_copy_async(u->off->stager, u->dev_shard, host_send(u), bytes,
                             MT_COPY_HOST_TO_DEVICE, &u->param_copy);
    return st == MT_OK ? MT_OK : mt_fsdp_offload_gathered_after(u, st);
}

mt_status mt_fsdp_offload_gathered(mt_fsdp_unit *u) {
    if (u->offload != MT_OFFLOAD_FULL || !u->dev_shard) return MT_OK;
    /* A staging copy that was never waited for (a pass ended before its gather) ends first; its
     * failure is this unit's, even though no gather used the shard. */
    mt_status st = wait_param_copy(u);
    if (st != MT_OK)
        st = mt_error_wrap(st, "unit '%s': the staging copy of its shard", u->module->name);
    mt_status un = mt_stager_unregister(u->off->stager, u->dev_shard);
    if (st == MT_OK && un != MT_OK)
        st = mt_error_wrap(un, "unit '%s': releasing its staged shard", u->module->name);
    mt_device_free(u->dev, u->dev_shard);
    u->dev_shard = NULL;
    return st;
}

mt_status mt_fsdp_offload_gathered_after(mt_fsdp_unit *u, mt_status st) {
    lost_errors l;
    lost_begin(&l);
    char where[160];
    snprintf(where, sizeof where, "unit '%s' on %s", u->module->name, mt_device_name(u->dev));
    lost_note(&l, mt_fsdp_offload_gathered(u), "releasing the staged shard after an earlier "
              "failure", where);
    lost_end(&l);
    return st;
}

/* The landing block, at least bytes long. */
static mt_status landing(struct mt_fsdp_offload_ctx *c, size_t bytes) {
    if (c->landing_bytes >= bytes) return MT_OK;
    if (c->landing) {
        MT_TRY(mt_stager_unregister(c->stager, c->landing));
        mt_host_tier_free(c->dev, c->landing);
        c->landing = NULL;
        c->landing_bytes = 0;
    }
    MT_TRY(mt_host_tier_alloc(c->dev, bytes, MT_MEM_COMM, &c->landing));
    mt_status st = mt_stager_register(c->stager, c->landing, bytes);
    if (st != MT_OK) {
        mt_host_tier_free(c->dev, c->landing);
        c->landing = NULL;
        return st;
    }
    c->landing_bytes = bytes;
    return MT_OK;
}

/* Tells the root's grad_landed hook that u's gradient is complete: with u's own kept view, after
 * waiting for u's parameter copy only (the hook's optimizer step writes u's master, which that
 * copy reads); the other units' copies, staged ahead of the backward, keep running. */
static mt_status tell_landed(mt_fsdp_unit *u, bool continues) {
    if (!u->root || !u->root->grad_landed) return MT_OK;
    const mt_fsdp_shard_view *view;
    size_t index, count;
    MT_TRY(mt_fsdp_offload_quiesce(u));
    MT_TRY(mt_fsdp_unit_view(u, &view, &index, &count));
    return u->root->grad_landed(u->root->grad_landed_arg, view, index, count, continues);
}

/* Lands the pending gradient copy: waits for it, releases its device buffer and, when add,
 * adds it into its unit's host gradient and tells the root's grad_landed hook (continues: the
 * backward goes on; false at its end). */
static mt_status land(struct mt_fsdp_offload_ctx *c, bool add, bool continues) {
    mt_fsdp_unit *u = c->pending;
    if (!u) return MT_OK;
    mt_status st = mt_stage_wait(c->pending_copy);
    mt_status un = mt_stager_unregister(c->stager, c->pending_recv);
    if (st == MT_OK) st = un;
    mt_device_free(c->dev, c->pending_recv);
    c->pending = NULL;
    c->pending_recv = NULL;
    c->pending_copy = NULL;
    if (st == MT_OK && add)
        st = mt_cpu_op_accumulate(u->grad_shard, c->landing, u->reduce_dtype, u->S);
    if (st == MT_OK && add) st = tell_landed(u, continues);
    return st;
}

mt_status mt_fsdp_offload_grad_in(mt_fsdp_unit *u, void *rs_recv) {
    if (u->S == 0) {
        mt_device_free(u->dev, rs_recv);
        return MT_OK;
    }
    struct mt_fsdp_offload_ctx *c = u->off;
    mt_status st = land(c, true, true); /* the landing block is free again */
    size_t bytes = u->S * mt_dtype_size(u->reduce_dtype);
    if (st == MT_OK) st = landing(c, bytes);
    if (st == MT_OK) st = mt_stager_register(c->stager, rs_recv, bytes);
    if (st != MT_OK) {
        mt_device_free(u->dev, rs_recv);
        return st;
    }
    st = mt_stage_copy_async(c->stager, c->landing, rs_recv, bytes, MT_COPY_DEVICE_TO_HOST,
                             &c->pending_copy);
    if (st != MT_OK) {
        lost_errors l;
        lost_begin(&l);
        char where[160];
        snprintf(where, sizeof where, "unit '%s' on %s", u->module->name, mt_device_name(u->dev));
        lost_note(&l, mt_stager_unregister(c->stager, rs_recv), "unregistering the reduced "
                  "gradient after its copy failed to start", where);
        lost_end(&l);
        mt_device_free(u->dev, rs_recv);
        return st;
    }
    c->pending = u;
    c->pending_recv = rs_recv;
    return MT_OK;
}

mt_status mt_fsdp_offload_grads_landed(mt_fsdp_unit *u) {
    if (!u) return MT_OK;
    /* The pending copy belongs to the device, not to u: a root without an offload policy (no
     * u->off) over offloaded layers still has the last layer's gradient in flight. */
    struct mt_fsdp_offload_ctx *c = u->off;
    if (!c) {
        pthread_mutex_lock(&g_lock);
        for (c = g_ctxs; c && c->dev != u->dev; c = c->next) {}
        pthread_mutex_unlock(&g_lock);
    }
    return c ? land(c, true, false) : MT_OK;
}

static void free_host(mt_fsdp_unit *u, void *p, bool registered, lost_errors *l,
                      const char *what, const char *where) {
    if (!p) return;
    if (registered && u->S > 0)
        lost_note(l, mt_stager_unregister(u->off->stager, p), what, where);
    mt_host_tier_free(u->dev, p);
}

void mt_fsdp_offload_release(mt_fsdp_unit *u) {
    /* The latest unit released (a failed mt_fsdp_shard, or its undo) gives its k back, so that
     * failed shards do not shift which of the next units are offloaded. */
    if (u->off) {
        pthread_mutex_lock(&g_lock);
        if (u->off->last == u) {
            u->off->units--;
            u->off->last = NULL;
        }
        pthread_mutex_unlock(&g_lock);
    }
    lost_errors l;
    lost_begin(&l);
    char name[160];
    snprintf(name, sizeof name, "unit '%s' on %s, released", u->module->name, mt_device_name(u->dev));
    /* A copy of this unit's gradient still in flight: it lands nowhere (the unit goes). */
    if (u->off && u->off->pending == u)
        lost_note(&l, land(u->off, false, false), "waiting for its reduced-gradient copy", name);
    if (u->offload != MT_OFFLOAD_NONE) {
        lost_note(&l, wait_param_copy(u), "waiting for its parameter staging copy", name);
        if (u->dev_shard)
            lost_note(&l, mt_stager_unregister(u->off->stager, u->dev_shard),
                      "unregistering its device shard", name);
        mt_device_free(u->dev, u->dev_shard);
        free_host(u, u->master, u->param_dtype != MT_BF16, &l, "unregistering its master shard",
                  name);
        free_host(u, u->shard_lp, true, &l, "unregistering its bf16 shard", name);
        free_host(u, u->grad_shard, false, &l, "", name);
        u->dev_shard = NULL;
        u->master = NULL;
        u->shard_lp = NULL;
        u->grad_shard = NULL;
    }
    lost_end(&l);
    leave(u->off);
    u->off = NULL;
}

struct mt_stager *mt_fsdp_offload_stager(const mt_fsdp_unit *u) {
    return u && u->off ? u->off->stager : NULL;
}
