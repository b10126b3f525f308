/* Helpers shared by the reference models (models/model_common.h). */
#include "models/model_common.h"

#include "core/debug_poison.h"
#include "core/error.h"
#include "module/module_internal.h"

mt_status mt_model_act_alloc(mt_device *dev, size_t elems, bool zero, float **out) {
    size_t bytes = (elems ? elems : 1) * sizeof(float);
    MT_TRY(mt_device_alloc(dev, bytes, MT_MEM_ACTIVATIONS, (void **)out));
    /* Unzeroed memory is NaN under MT_DEBUG_POISON_GRADS (all bits set): what reads an element
     * before writing it shows. */
    if (zero || mt_debug_poison_grads()) {
        mt_status st = mt_device_memset(dev, *out, zero ? 0 : 0xff, bytes, NULL);
        if (st != MT_OK) {
            mt_device_free(dev, *out);
            *out = NULL;
            return st;
        }
    }
    return MT_OK;
}

void mt_model_free_all(mt_device *dev, float **bufs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        mt_device_free(dev, bufs[i]);
        bufs[i] = NULL;
    }
}

mt_status mt_model_param_values(mt_device *dev, const char *model, mt_param **params, int n,
                                const bool *matmul, const void **vals, mt_dtype *dtypes,
                                float **scratch) {
    for (int i = 0; i < n; i++) scratch[i] = NULL;
    for (int i = 0; i < n; i++) {
        mt_param *p = params[i];
        void *data = mt_param_data(p);
        if (!data)
            return mt_error(MT_ERR_INVALID_ARG, "%s: parameter '%s' has no values here (its unit "
                            "is sharded)", model, mt_param_name(p));
        dtypes[i] = mt_param_dtype(p);
        if (dtypes[i] == MT_F32 || (matmul && matmul[i])) {
            vals[i] = data;
            continue;
        }
        dtypes[i] = MT_F32;
        MT_TRY(mt_model_act_alloc(dev, mt_param_numel(p), false, &scratch[i]));
        MT_TRY(mt_param_read_f32(p, scratch[i]));
        vals[i] = scratch[i];
    }
    return MT_OK;
}

mt_status mt_model_param_grads_write(const char *model, const mt_module *module,
                                     mt_param **params, int n, float **grads, bool *fresh) {
    for (int i = 0; i < n; i++) {
        mt_status st = mt_param_grad_get(params[i], fresh ? &fresh[i] : NULL, &grads[i]);
        if (st != MT_OK)
            return mt_error_wrap(st, "%s: the backward of '%s'", model, mt_module_name(module));
        if (grads[i]) continue;
        return mt_error(MT_ERR_INVALID_ARG, "%s: '%s' has no gradient buffer for '%s' in its "
                        "backward (shard the model with mt_fsdp_shard before training)",
                        model, mt_module_name(module), mt_param_name(params[i]));
    }
    return MT_OK;
}

mt_status mt_model_param_grads(const char *model, const mt_module *module, mt_param **params,
                               int n, float **grads) {
    return mt_model_param_grads_write(model, module, params, n, grads, NULL);
}

mt_status mt_model_add_child(mt_mesh *mesh, mt_module *parent, const char *name,
                             const mt_module_ops *ops, void *user, mt_module **out) {
    mt_module *m = NULL;
    MT_TRY(mt_module_create(mesh, name, ops, user, &m));
    /* A child places its parameters where its parent does. */
    mt_status st = mt_module_set_tp_dim(m, mt_module_tp_dim(parent));
    if (st == MT_OK) st = mt_module_add_child(parent, m);
    if (st != MT_OK) {
        mt_module_destroy(m);
        return st;
    }
    *out = m;
    return MT_OK;
}
