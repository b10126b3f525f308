/* GPT-2 (the reference model of train_gpt): token and position embeddings, pre-LayerNorm blocks
 * with causal self-attention and a GELU MLP, a final LayerNorm and an LM head tied to the token
 * embedding, over a vocabulary of config.vocab ids (train_gpt's default: 256, bytes).
 * Tensor-parallel over the mesh's "tp" dimension (tp.h): QKV and MLP-up column-parallel,
 * attention and MLP-down row-parallel, heads split across tp, vocabulary-parallel embedding and
 * cross-entropy; LayerNorms replicated, their activations optionally sequence-parallel. Each
 * block is a module (shard them with FSDP, then the root, which owns the embeddings and final
 * LayerNorm), which can recompute its activations in backward (mt_recompute_enable(
 * mt_gpt_block(gpt, l)), recompute.h: it keeps only its output). Initialisation is defined on
 * the global tensors from the seed (GPT-2's: normal(0, 0.02), residual projections scaled by
 * 1/sqrt(2 * layers), biases 0, LayerNorm 1/0), so the same seed gives the same model for any
 * dp x tp. */
#ifndef MESHTRAIN_GPT_H
#define MESHTRAIN_GPT_H

#include <meshtrain/api.h>
#include <meshtrain/dtype.h>
#include <meshtrain/memory.h>
#include <meshtrain/mesh.h>
#include <meshtrain/module.h>
#include <meshtrain/status.h>

#include <stdbool.h>
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
    /* false: mt_gpt_create initialises every parameter (allocating its tp-local part). true: the
     * parameters are created without storage (deferred, module.h) with their initialisers
     * recorded: shard the model with FSDP, then call mt_module_init_params(mt_gpt_root(gpt))
     * (each rank computes only its shards) or load a checkpoint instead. The values are the same
     * either way, bit for bit. */
    bool defer_init;
    /* An mt_gpt_sp_mode: sequence parallelism inside the tp group (tp.h): the LayerNorms,
     * residual adds and embedding output hold batch * seq / tp rows per rank instead of all of
     * them. Needs seq divisible by tp; a no-op at tp 1. The losses and gradients are those
     * without it up to the order of floating-point sums (not bit for bit: the LayerNorm
     * gradients are summed over tp rank by rank). */
    int sequence_parallel;
} mt_gpt_config;

/* How the column-parallel linears (qkv, MLP fc, the LM head) have their gathered input in
 * backward under sequence parallelism (tp.h). */
typedef enum mt_gpt_sp_mode {
    MT_GPT_SP_OFF = 0,
    /* 1 (true): gathered again in backward (Megatron's choice): one more n x C all-gather per
     * column-parallel linear per backward, only n / tp rows kept. */
    MT_GPT_SP_REGATHER = 1,
    /* Kept from the forward: the tp traffic is that without sequence parallelism plus the
     * LayerNorm gradients' all-reduce, at the cost of n x C x (1 - 1/tp) more floats kept per
     * column-parallel linear (two per block and the head's: the gathered input is kept, the
     * LayerNorm output's shard freed). */
    MT_GPT_SP_KEEP_GATHERED = 2
} mt_gpt_sp_mode;

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

/* ---- memory prediction (models/gpt_memory.c) ---------------------------------------------------
 * The per-rank device memory of one training step (forward, backward and optimizer step of every
 * micro-batch), per category and in total, predicted before the first step by replaying the
 * step's allocations and frees in the order the model (models/gpt.c), FSDP (fsdp/), the tp layers
 * (tp/), AdamW and the host transport (comm/) make them. Exact for the code as it is on the CPU
 * device (what train_gpt's --metrics peak_bytes measure), activation checkpointing, both
 * sequence-parallel modes and FSDP CPU offload included (with offload also the host memory
 * tier's peaks, host_peak: what mt_host_mem_stats measures); recompute is modelled enabled after mt_fsdp_shard (FSDP's
 * hooks outside, as train_gpt does: enabled before, a block's backward prefetch is issued after
 * its re-run forward and the peak can be one unit's gathered parameters lower). Every rank of
 * a dp x tp mesh holds the same sizes except the last tp rank's smaller vocabulary slice, so the
 * prediction (tp rank 0's) is also the maximum over ranks. */

typedef enum mt_gpt_ac_mode {
    MT_GPT_AC_NONE = 0, /* every block keeps its activations until its backward */
    MT_GPT_AC_FULL,     /* every block keeps only its output and recomputes in backward */
    MT_GPT_AC_EVERY     /* blocks 0, K, 2K, ... (K = ac_every) do, the others keep all */
} mt_gpt_ac_mode;

typedef struct mt_gpt_memory_plan {
    int dp;         /* ranks of the FSDP shard group (>= 1) */
    int replicate;  /* HSDP: ranks of the replicate group (1: plain FSDP) */
    int tp;         /* tensor-parallel size (>= 1) */
    int batch;      /* sequences per rank per micro-batch */
    int grad_accum; /* micro-batches per step; gradients are reduced after the last only */
    mt_dtype param_dtype, reduce_dtype;   /* as mt_fsdp_options */
    int reshard_after_forward;            /* as mt_fsdp_options: 1, 0 or -1 (default) */
    bool prefetch;                        /* mt_fsdp_set_prefetch */
    mt_gpt_ac_mode activation_checkpointing;
    int ac_every;                         /* K of MT_GPT_AC_EVERY */
    int sequence_parallel;                /* an mt_gpt_sp_mode, as mt_gpt_config's */
    /* The CPU device: bf16 products widen their operands into activations scratch, and the host
     * transport's scratch (per group, kept between collectives) is device memory charged to comm.
     * false (CUDA): neither; NCCL's own buffers (charged to comm when a communicator is made)
     * are not predicted. */
    bool cpu_device;
    size_t comm_small_bytes; /* the transport's MT_COMM_SMALL_BYTES; 0: its default, 64 KiB */
    /* FSDP CPU offload, as mt_fsdp_options: an mt_offload (fsdp.h; 0 = MT_OFFLOAD_NONE) and the
     * fraction of units offloaded (the same rule as fsdp/fsdp_offload.c: counting the blocks,
     * then the root, from k = 0, unit k is offloaded when floor((k + 1) R) > floor(k R)). */
    int offload;
    float offload_ratio;
    /* mt_fsdp_options.mapped_gather (default true): on the CPU device, f32 units whose shard is
     * at least 1 MiB are padded to whole pages and gathered without a full buffer. Predicted
     * as if every rank of the shard group can map (one host, shared memory on); where the
     * engine falls back to copies, the parameters peak higher by the gathered units' buffers. */
    bool mapped_gather;
} mt_gpt_memory_plan;

/* One rank, tp 1, dp 1, batch 8, f32, default resharding, prefetch on, no AC or SP, CPU, no
 * offload (ratio 1), mapped gathers. */
MT_API mt_gpt_memory_plan mt_gpt_memory_plan_defaults(void);

typedef struct mt_gpt_memory_prediction {
    size_t peak[MT_MEM_CATEGORY_COUNT]; /* the highest bytes of each category during a step */
    size_t total_peak;                  /* the highest sum: categories peak at other moments */
    size_t at_total_peak[MT_MEM_CATEGORY_COUNT]; /* each category at that moment */
    size_t persistent;                  /* held between steps: shards, optimizer, comm scratch,
                                           sequence-parallel tp scratch */
    char total_peak_at[64];             /* where the total peaks, e.g. "backward of block 1" */
    size_t setup_peak; /* the highest total before step 0: the model built (whole tp-local
                        * parameters, unless cfg->defer_init), then sharded */
    /* The host memory tier (host_memory.h, mt_host_mem_stats) under plan->offload: offloaded
     * units' shards and AdamW state (held from sharding on) and the landing block of reduced
     * gradients (comm, grown to the largest offloaded shard in the first backward). All zero
     * without offload. */
    size_t host_peak[MT_MEM_CATEGORY_COUNT];
    size_t host_total_peak;
} mt_gpt_memory_prediction;

/* Predicts the per-rank peaks of one training step of the model cfg under plan (cfg->tp_dim is
 * ignored: plan->tp is the size). MT_ERR_INVALID_ARG naming the value for a configuration the
 * model or the plan refuses (heads not divisible by tp, batch 0, ...). */
MT_API mt_status mt_gpt_memory_predict(const mt_gpt_config *cfg, const mt_gpt_memory_plan *plan,
                                       mt_gpt_memory_prediction *out);

#ifdef __cplusplus
}
#endif
#endif
