/* Internal: the checks of a GPT configuration that the model (mt_gpt_create, models/gpt.c) and
 * the memory predictor (mt_gpt_memory_predict, models/gpt_memory.c) share, so that the predictor
 * accepts exactly the configurations the model builds, with the model's messages. */
#ifndef MT_MODELS_GPT_CONFIG_H
#define MT_MODELS_GPT_CONFIG_H

#include <meshtrain/gpt.h>
#include <meshtrain/status.h>

/* c over a tp dimension of tp ranks (>= 1), with sequence parallelism mode sequence_parallel
 * (the model passes c->sequence_parallel, the predictor its plan's). MT_ERR_INVALID_ARG with
 * the reason when the model refuses it. */
mt_status mt_gpt_config_check(const mt_gpt_config *c, int tp, int sequence_parallel);

#endif
