/* A reference model: a deep MLP (Linear -> ReLU -> ... -> Linear) with a mean-squared-error loss,
 * built from modules (one module per layer, children of a root), used by the FSDP example, tests
 * and benchmarks. Parameters are initialised from the seed on the global tensors, so the same
 * seed gives the same model on any number of ranks. */
#ifndef MESHTRAIN_MLP_H
#define MESHTRAIN_MLP_H

#include <meshtrain/api.h>
#include <meshtrain/mesh.h>
#include <meshtrain/module.h>
#include <meshtrain/status.h>

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_mlp_config {
    int layers;   /* linear layers (>= 1) */
    int in_dim;   /* input features */
    int width;    /* hidden features */
    int out_dim;  /* outputs */
    uint64_t seed;
    /* true: the parameters are created without storage (deferred, module.h); shard, then call
     * mt_module_init_params(mt_mlp_root(mlp)) or load a checkpoint. false: mt_mlp_create
     * initialises them. The same values either way. */
    bool defer_init;
} mt_mlp_config;

typedef struct mt_mlp mt_mlp;

MT_API mt_status mt_mlp_create(mt_mesh *mesh, const mt_mlp_config *config, mt_mlp **out);
MT_API void mt_mlp_destroy(mt_mlp *mlp);

MT_API mt_module *mt_mlp_root(mt_mlp *mlp);
/* Layer l (0-based) as a module, to shard it. */
MT_API mt_module *mt_mlp_layer(mt_mlp *mlp, int l);
/* Number of parameters (weights and biases, all layers). */
MT_API size_t mt_mlp_param_count(const mt_mlp *mlp);

/* Forward and backward on this rank's batch: x is batch x in_dim, y batch x out_dim (host
 * memory); *loss gets the mean squared error over the batch. Gradients are scaled by
 * grad_scale (e.g. 1 / micro-batches under accumulation). */
MT_API mt_status mt_mlp_forward_backward(mt_mlp *mlp, const float *x, const float *y, int batch,
                                         float grad_scale, float *loss);
/* Forward only (evaluation). */
MT_API
mt_status mt_mlp_forward(mt_mlp *mlp, const float *x, const float *y, int batch, float *loss);

#ifdef __cplusplus
}
#endif
#endif
