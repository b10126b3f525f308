/* GPT-2 (the reference model of train_gpt): token and position embeddings, pre-LayerNorm blocks
 * with causal self-attention and a GELU MLP, a final LayerNorm and an LM head tied to the token
 * embedding, over a vocabulary of config.vocab ids (train_gpt's default: 256, bytes).
 * Tensor-parallel over the mesh's "tp" dimension (tp.h): QKV and MLP-up column-parallel,
 * attention and MLP-down row-parallel, heads split across tp, vocabulary-parallel embedding and
 * cross-entropy; LayerNorms replicated, their activations optionally sequence-parallel. Each
 * block is a module (shard them with FSDP, then the root, which owns the embeddings and final
 * LayerNorm). Initialisation is defined on the global tensors from the seed (GPT-2's:
 * normal(0, 0.02), residual projections scaled by 1/sqrt(2 * layers), biases 0, LayerNorm 1/0),
 * so the same seed gives the same model for any dp x tp. */
#ifndef MESHTRAIN_GPT_H
#define MESHTRAIN_GPT_H

#include <meshtrain/api.h>
#include <meshtrain/mesh.h>
#include <meshtrain/module.h>
#include <meshtrain/status.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_gpt_config {
    int layers;
    int d_model;
    int heads;   /* divisible by tp; d_model divisible by heads */
    int seq;     /* tokens per sequence = rows of the position embedding */
    int vocab;   /* e.g. 256 (bytes); padded up to a multiple of tp when needed: wte then has
                  * more rows than vocab, the extra ones zero and no id's */
    uint64_t seed;
    const char *tp_dim; /* the mesh dimension of tensor parallelism; NULL: MT_TP_DIM_DEFAULT */
    /* Non-zero: sequence parallelism inside the tp group (tp.h): the LayerNorms, residual adds
     * and embedding output hold batch * seq / tp rows per rank instead of all of them. Needs
     * seq divisible by tp; a no-op at tp 1. The losses and gradients are those without it. */
    int sequence_parallel;
} mt_gpt_config;

typedef struct mt_gpt mt_gpt;

/* Creates the model on the mesh; errors name the values (e.g. "heads 6 not divisible by tp 4"). */
MT_API mt_status mt_gpt_create(mt_mesh *mesh, const mt_gpt_config *config, mt_gpt **out);
MT_API void mt_gpt_destroy(mt_gpt *gpt);

MT_API mt_module *mt_gpt_root(mt_gpt *gpt);
MT_API mt_module *mt_gpt_block(mt_gpt *gpt, int layer);
/* Parameters of the global model (all tp ranks together, each counted once). */
MT_API size_t mt_gpt_param_count(const mt_gpt *gpt);

/* One forward and backward on this rank's batch: tokens holds batch sequences of seq + 1 ids
 * (inputs are the first seq, targets the last seq); *loss gets the mean cross-entropy over the
 * batch's tokens; gradients are scaled by grad_scale (1 / micro-batches under accumulation). */
MT_API
mt_status mt_gpt_forward_backward(mt_gpt *gpt, const int *tokens, int batch, float grad_scale,
                                  float *loss);
/* Forward only (evaluation): the mean cross-entropy. */
MT_API mt_status mt_gpt_forward(mt_gpt *gpt, const int *tokens, int batch, float *loss);

#ifdef __cplusplus
}
#endif
#endif
