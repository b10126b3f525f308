/* Parameter initialisers: values defined on the global tensor, computed on whatever part of it
 * this rank holds.
 *
 * A parameter created with mt_module_add_param_deferred has no values until an initialiser runs
 * (or a checkpoint is loaded into it). An initialiser runs on what this rank holds at that
 * moment: the FSDP shard when the parameter's unit was sharded first (nothing is ever allocated
 * for the whole parameter), else its tp-local part, which running the initialiser allocates
 * (category params). Each element's value depends only on (the initialiser, the element's global
 * multi-index), never on the rank or the mesh, so a parameter is bitwise the same for any
 * dp x tp, and the same as when the whole tensor is initialised on one rank.
 *
 * normal and uniform draw from a counter-based hash of (seed, stream, global element index):
 * give each parameter its own stream (models use a per-parameter id). Padding rows (global rows
 * >= mt_param_real_rows) stay 0 under every initialiser, and FSDP's flat-buffer padding stays 0.
 *
 * On a CUDA device the values are computed on the host in a bounded staging buffer (at most
 * MT_INIT_STAGING_ELEMS floats, host memory) and copied; on the CPU they are written in place. */
#ifndef MESHTRAIN_INIT_H
#define MESHTRAIN_INIT_H

#include <meshtrain/api.h>
#include <meshtrain/module.h>
#include <meshtrain/status.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Host elements computed per copy to a CUDA device. */
#define MT_INIT_STAGING_ELEMS ((size_t)1 << 16)

typedef enum mt_init_kind {
    MT_INIT_ZEROS = 0,
    MT_INIT_ONES,
    MT_INIT_NORMAL,  /* mean a, standard deviation b (>= 0) */
    MT_INIT_UNIFORM, /* in [a, b) with a <= b */
    MT_INIT_FN       /* the user's function */
} mt_init_kind;

/* A user initialiser: called once per contiguous run of elements along the last dimension that
 * this rank holds (never for padding rows). global_index holds mt_param_ndim(param) entries: the
 * global multi-index of the run's first element (the run continues along the last dimension);
 * out receives count f32 values in host memory. A failure stops the initialisation and is
 * returned (set a message with mt_error_set). */
typedef mt_status (*mt_init_fn)(void *user, const mt_param *param, const int64_t *global_index,
                                size_t count, float *out);

typedef struct mt_initialiser {
    mt_init_kind kind;
    double a, b;     /* normal: mean, std; uniform: low, high */
    uint64_t seed;   /* normal, uniform */
    uint64_t stream; /* normal, uniform: the parameter's stream (distinct per parameter) */
    mt_init_fn fn;   /* MT_INIT_FN */
    void *user;      /* MT_INIT_FN: passed to fn; must outlive a recorded initialiser */
} mt_initialiser;

MT_API mt_initialiser mt_init_zeros(void);
MT_API mt_initialiser mt_init_ones(void);
MT_API mt_initialiser mt_init_normal(double mean, double std, uint64_t seed, uint64_t stream);
MT_API mt_initialiser mt_init_uniform(double low, double high, uint64_t seed, uint64_t stream);
MT_API mt_initialiser mt_init_function(mt_init_fn fn, void *user);

/* Initialises param now, on what this rank holds (see above). Only a deferred parameter that
 * holds no values yet: MT_ERR_INVALID_ARG naming it for a parameter created with values
 * (mt_module_add_param), for one already initialised or loaded from a checkpoint, and for bad
 * arguments (std < 0, low > high, a NULL function; NaN included). Collective-free: ranks may
 * initialise at different times. */
MT_API mt_status mt_param_init(mt_param *param, const mt_initialiser *init);

/* Records init as param's initialiser, run later by mt_module_init_params (models record one
 * per parameter at creation). Checked like mt_param_init's; replaces an earlier record. */
MT_API mt_status mt_param_set_init(mt_param *param, const mt_initialiser *init);

/* Runs the recorded initialiser of every parameter of module's subtree that still needs values
 * (deferred, neither initialised nor loaded); parameters that hold values are left as they are,
 * so calling it after loading a checkpoint changes nothing. MT_ERR_INVALID_ARG naming the first
 * parameter that needs values but has no recorded initialiser. Call it after mt_fsdp_shard to
 * initialise shard by shard, or before (or without) sharding to allocate and fill each
 * parameter's tp-local part. */
MT_API mt_status mt_module_init_params(mt_module *module);

#ifdef __cplusplus
}
#endif
#endif
