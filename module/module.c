/* Modules: the tree of named parameters and children (the hooks and the forward/backward entry
 * points are in module_hooks.c). */
#include "module/module_internal.h"

#include "core/error.h"

#include <meshtrain/dtype.h>
#include <meshtrain/log.h>
#include <meshtrain/ops.h>

#include <stdlib.h>
#include <string.h>

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

mt_status mt_module_create(mt_mesh *mesh, const char *name, const mt_module_ops *ops, void *user,
                           mt_module **out) {
    if (!out) return mt_error(MT_ERR_INVALID_ARG, "mt_module_create: out is NULL");
    *out = NULL;
    if (!mesh || !name || !*name)
        return mt_error(MT_ERR_INVALID_ARG, "mt_module_create: a mesh and a non-empty name are "
                                            "required");
    mt_module *m = calloc(1, sizeof *m);
    if (!m || !(m->name = dup_str(name))) {
        free(m);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "module '%s': out of host memory", name);
    }
    m->mesh = mesh;
    m->dev = mt_runtime_device(mt_mesh_runtime(mesh));
    if (!(m->tp_dim = dup_str(MT_TP_DIM_DEFAULT))) {
        free(m->name);
        free(m);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "module '%s': out of host memory", name);
    }
    if (ops) m->ops = *ops;
    m->user = user;
    *out = m;
    return MT_OK;
}

static void param_free(mt_param *p) {
    if (!p) return;
    if (p->own_data) mt_device_free(p->owner->dev, p->data);
    free(p->name);
    free(p);
}

void mt_module_destroy(mt_module *module) {
    if (!module) return;
    /* Its parent, and whatever its hooks' owners recorded (FSDP's execution order), still point
     * at it: destroying it alone would leave them dangling and free it twice with the root. */
    if (module->parent) {
        mt_log(MT_LOG_ERROR, "mt_module_destroy: module '%s' is a child of '%s' and stays; "
               "destroy the root, which destroys its children", module->name,
               module->parent->name);
        return;
    }
    /* The hooks' owners first: FSDP's waits for work that may still read the children's
     * buffers. */
    mt_module_release_hooks(module);
    for (size_t i = 0; i < module->n_children; i++) {
        module->children[i]->parent = NULL;
        mt_module_destroy(module->children[i]);
    }
    for (size_t i = 0; i < module->n_params; i++) param_free(module->params[i]);
    free(module->children);
    free(module->params);
    free(module->name);
    free(module->tp_dim);
    free(module);
}

void mt_module_seal(mt_module *module, const char *by, const char *hint) {
    module->sealed_by = by;
    module->sealed_hint = hint;
}

const mt_module *mt_module_sealed_above(const mt_module *module) {
    for (const mt_module *m = module; m; m = m->parent)
        if (m->sealed_by) return m;
    return NULL;
}

static const mt_module *tree_root(const mt_module *m) {
    while (m->parent) m = m->parent;
    return m;
}

static const mt_module *find_named(const mt_module *tree, const char *name) {
    if (strcmp(tree->name, name) == 0) return tree;
    for (size_t i = 0; i < tree->n_children; i++) {
        const mt_module *hit = find_named(tree->children[i], name);
        if (hit) return hit;
    }
    return NULL;
}

/* The first module of sub (pre-order) whose name tree already has, or NULL. */
static const mt_module *first_clash(const mt_module *tree, const mt_module *sub) {
    if (find_named(tree, sub->name)) return sub;
    for (size_t i = 0; i < sub->n_children; i++) {
        const mt_module *hit = first_clash(tree, sub->children[i]);
        if (hit) return hit;
    }
    return NULL;
}

mt_status mt_module_add_child(mt_module *parent, mt_module *child) {
    if (!parent || !child || parent == child)
        return mt_error(MT_ERR_INVALID_ARG, "mt_module_add_child: two distinct modules required");
    if (child->parent)
        return mt_error(MT_ERR_INVALID_ARG, "module '%s' already has a parent ('%s')",
                        child->name, child->parent->name);
    for (const mt_module *a = parent; a; a = a->parent)
        if (a == child)
            return mt_error(MT_ERR_INVALID_ARG, "adding module '%s' under '%s' would make a cycle",
                            child->name, parent->name);
    const mt_module *sealed = mt_module_sealed_above(parent);
    if (sealed)
        return mt_error(MT_ERR_INVALID_ARG, "cannot add module '%s' under '%s': '%s' is already "
                        "inside %s (%s)", child->name, parent->name, parent->name,
                        sealed->sealed_by, sealed->sealed_hint);
    if (parent->mesh != child->mesh)
        return mt_error(MT_ERR_INVALID_ARG, "modules '%s' and '%s' are on different meshes",
                        parent->name, child->name);
    if (strcmp(parent->tp_dim, child->tp_dim) != 0)
        return mt_error(MT_ERR_INVALID_ARG, "modules '%s' and '%s' place their parameters on "
                        "different tp dimensions ('%s', '%s')", parent->name, child->name,
                        parent->tp_dim, child->tp_dim);
    /* Names identify modules (and through them parameters) in messages and, later, in
     * checkpoints: two alike in one tree would be confused. */
    const mt_module *root = tree_root(parent), *clash = first_clash(root, child);
    if (clash)
        return mt_error(MT_ERR_INVALID_ARG, "cannot add module '%s' under '%s': the tree of '%s' "
                        "already has a module named '%s' (module names are unique in a tree)",
                        child->name, parent->name, root->name, clash->name);
    if (parent->n_children == parent->cap_children) {
        size_t cap = parent->cap_children ? parent->cap_children * 2 : 4;
        mt_module **c = realloc(parent->children, cap * sizeof *c);
        if (!c) return mt_error(MT_ERR_OUT_OF_MEMORY, "module '%s': out of host memory",
                                parent->name);
        parent->children = c;
        parent->cap_children = cap;
    }
    parent->children[parent->n_children++] = child;
    child->parent = parent;
    return MT_OK;
}

/* The size of the module's tp dimension, 1 when the mesh has none. */
static int tp_size(const mt_module *m) {
    int d = mt_mesh_dim_index(m->mesh, m->tp_dim);
    return d < 0 ? 1 : mt_mesh_dim_size(m->mesh, d);
}

int mt_module_tp_rank(const mt_module *module) {
    int d = mt_mesh_dim_index(module->mesh, module->tp_dim);
    return d < 0 ? 0 : mt_mesh_coord(module->mesh, d);
}

/* mt_module_add_param and its deferred form: the same checks; only an eager parameter gets
 * (zeroed) storage. */
static mt_status add_param(mt_module *module, const char *name, int ndim,
                           const int64_t *global_shape, mt_tp_placement tp, bool deferred,
                           mt_param **out) {
    if (out) *out = NULL;
    if (!module || !name || !*name || (ndim > 0 && !global_shape))
        return mt_error(MT_ERR_INVALID_ARG, "mt_module_add_param: module, name and shape "
                                            "required");
    if (ndim < 0 || ndim > MT_PARAM_MAX_DIMS)
        return mt_error(MT_ERR_INVALID_ARG, "parameter '%s' of module '%s': %d dimensions "
                        "(0 to %d allowed)", name, module->name, ndim, MT_PARAM_MAX_DIMS);
    const mt_module *sealed = mt_module_sealed_above(module);
    if (sealed)
        return mt_error(MT_ERR_INVALID_ARG, "cannot add parameter '%s' to module '%s': the module "
                        "is already inside %s", name, module->name, sealed->sealed_by);
    for (size_t i = 0; i < module->n_params; i++)
        if (strcmp(module->params[i]->name, name) == 0)
            return mt_error(MT_ERR_INVALID_ARG, "module '%s' already has a parameter '%s'",
                            module->name, name);
    if (tp.kind != MT_TP_REPLICATE && tp.kind != MT_TP_SHARD)
        return mt_error(MT_ERR_INVALID_ARG, "parameter '%s' of module '%s': unknown tp placement "
                        "%d", name, module->name, (int)tp.kind);
    int tps = tp_size(module);
    if (tp.kind == MT_TP_SHARD && (tp.dim < 0 || tp.dim >= ndim))
        return mt_error(MT_ERR_INVALID_ARG, "parameter '%s' of module '%s': Shard(%d) on tp but "
                        "the parameter has %d dimensions", name, module->name, tp.dim, ndim);
    mt_param *p = calloc(1, sizeof *p);
    if (!p || !(p->name = dup_str(name))) {
        free(p);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "parameter '%s': out of host memory", name);
    }
    p->owner = module;
    p->ndim = ndim;
    p->tp = tp;
    p->numel = 1;
    p->dtype = MT_F32;
    for (int d = 0; d < ndim; d++) {
        int64_t g = global_shape[d];
        if (g <= 0) {
            param_free(p);
            return mt_error(MT_ERR_INVALID_ARG, "parameter '%s' of module '%s': dimension %d has "
                            "size %lld (must be positive)", name, module->name, d, (long long)g);
        }
        int64_t l = g;
        if (tp.kind == MT_TP_SHARD && d == tp.dim) {
            if (g % tps != 0) {
                param_free(p);
                return mt_error(MT_ERR_INVALID_ARG, "parameter '%s' of module '%s': dimension %d "
                                "(%lld) is not divisible by the tp size %d", name, module->name,
                                d, (long long)g, tps);
            }
            l = g / tps;
        }
        p->global_shape[d] = g;
        p->local_shape[d] = l;
        p->numel *= (size_t)l;
    }
    p->real_rows = ndim > 0 ? p->global_shape[0] : 1;
    p->deferred = deferred;
    mt_status st = MT_OK;
    if (!deferred) {
        st = mt_device_alloc(module->dev, p->numel * sizeof(float), MT_MEM_PARAMS, &p->data);
        if (st != MT_OK) {
            param_free(p);
            return mt_error_wrap(st, "parameter '%s' of module '%s'", name, module->name);
        }
        p->own_data = true;
        st = mt_device_memset(module->dev, p->data, 0, p->numel * sizeof(float), NULL);
    }
    if (st == MT_OK && module->n_params == module->cap_params) {
        size_t cap = module->cap_params ? module->cap_params * 2 : 4;
        mt_param **ps = realloc(module->params, cap * sizeof *ps);
        if (!ps) st = mt_error(MT_ERR_OUT_OF_MEMORY, "module '%s': out of host memory",
                               module->name);
        else {
            module->params = ps;
            module->cap_params = cap;
        }
    }
    if (st != MT_OK) {
        param_free(p);
        return st;
    }
    module->params[module->n_params++] = p;
    if (out) *out = p;
    return MT_OK;
}

mt_status mt_module_add_param(mt_module *module, const char *name, int ndim,
                              const int64_t *global_shape, mt_tp_placement tp, mt_param **out) {
    return add_param(module, name, ndim, global_shape, tp, false, out);
}

mt_status mt_module_add_param_deferred(mt_module *module, const char *name, int ndim,
                                       const int64_t *global_shape, mt_tp_placement tp,
                                       mt_param **out) {
    return add_param(module, name, ndim, global_shape, tp, true, out);
}

bool mt_param_needs_init(const mt_param *param) {
    return param && param->deferred && !param->initialised;
}

mt_status mt_param_check_ready(const mt_param *param, const char *what) {
    if (!mt_param_needs_init(param)) return MT_OK;
    return mt_error(MT_ERR_INVALID_ARG, "parameter '%s' of module '%s' was created deferred and "
                    "has no values yet, which %s needs: initialise it (mt_module_init_params, "
                    "mt_param_init) or load a checkpoint first", param->name, param->owner->name,
                    what);
}

void *mt_module_user(const mt_module *module) { return module ? module->user : NULL; }
const char *mt_module_name(const mt_module *module) { return module ? module->name : NULL; }
mt_mesh *mt_module_mesh(const mt_module *module) { return module ? module->mesh : NULL; }
const char *mt_module_tp_dim(const mt_module *module) { return module ? module->tp_dim : NULL; }

mt_status mt_module_set_tp_dim(mt_module *module, const char *dim) {
    if (!module || !dim || !*dim)
        return mt_error(MT_ERR_INVALID_ARG, "mt_module_set_tp_dim: module and a non-empty "
                                            "dimension name required");
    /* Local shapes were computed with the old dimension, and children must agree with it. */
    if (module->n_params > 0 || module->n_children > 0 || module->parent)
        return mt_error(MT_ERR_INVALID_ARG, "mt_module_set_tp_dim: module '%s' already has "
                        "parameters, children or a parent; set the tp dimension right after "
                        "mt_module_create", module->name);
    char *copy = dup_str(dim);
    if (!copy) return mt_error(MT_ERR_OUT_OF_MEMORY, "module '%s': out of host memory",
                               module->name);
    free(module->tp_dim);
    module->tp_dim = copy;
    return MT_OK;
}
size_t mt_module_child_count(const mt_module *module) { return module ? module->n_children : 0; }
mt_module *mt_module_child(const mt_module *module, size_t i) {
    return module && i < module->n_children ? module->children[i] : NULL;
}
size_t mt_module_param_count(const mt_module *module) { return module ? module->n_params : 0; }
mt_param *mt_module_param(const mt_module *module, size_t i) {
    return module && i < module->n_params ? module->params[i] : NULL;
}

const char *mt_param_name(const mt_param *param) { return param ? param->name : NULL; }
int mt_param_ndim(const mt_param *param) { return param ? param->ndim : 0; }
int64_t mt_param_global_dim(const mt_param *param, int d) {
    return param && d >= 0 && d < param->ndim ? param->global_shape[d] : 0;
}
int64_t mt_param_local_dim(const mt_param *param, int d) {
    return param && d >= 0 && d < param->ndim ? param->local_shape[d] : 0;
}
size_t mt_param_numel(const mt_param *param) { return param ? param->numel : 0; }
mt_status mt_param_set_padding(mt_param *param, int64_t real_rows) {
    if (!param) return mt_error(MT_ERR_INVALID_ARG, "mt_param_set_padding: NULL parameter");
    if (param->ndim < 1 || real_rows < 1 || real_rows > param->global_shape[0])
        return mt_error(MT_ERR_INVALID_ARG, "parameter '%s' of module '%s': %lld real rows of "
                        "%lld", param->name, param->owner->name, (long long)real_rows,
                        (long long)(param->ndim > 0 ? param->global_shape[0] : 0));
    const mt_module *sealed = mt_module_sealed_above(param->owner);
    if (sealed)
        return mt_error(MT_ERR_INVALID_ARG, "parameter '%s' of module '%s': padding is set before "
                        "the module is sharded (it is inside %s)", param->name,
                        param->owner->name, sealed->sealed_by);
    param->real_rows = real_rows;
    return MT_OK;
}

int64_t mt_param_real_rows(const mt_param *param) { return param ? param->real_rows : 0; }

mt_tp_placement mt_param_tp(const mt_param *param) {
    mt_tp_placement none = {MT_TP_REPLICATE, 0};
    return param ? param->tp : none;
}
void *mt_param_data(mt_param *param) { return param ? param->data : NULL; }
mt_dtype mt_param_dtype(const mt_param *param) { return param ? param->dtype : MT_F32; }

/* The values exist: not sharded at the moment. */
static mt_status check_values_present(const mt_param *param) {
    if (param->data) return MT_OK;
    MT_TRY(mt_param_check_ready(param, "reading its values"));
    return mt_error(MT_ERR_INVALID_ARG, "parameter '%s' of module '%s' is sharded: its values exist "
                    "only inside its unit's forward or backward", param->name, param->owner->name);
}

float *mt_param_f32(mt_param *param) {
    if (!param) {
        mt_error(MT_ERR_INVALID_ARG, "mt_param_f32: param is NULL");
        return NULL;
    }
    if (check_values_present(param) != MT_OK) return NULL;
    if (param->dtype != MT_F32) {
        mt_error(MT_ERR_INVALID_ARG, "parameter '%s' of module '%s' holds %s values (the unit's "
                 "param_dtype), not f32: use mt_param_data with mt_param_dtype, or copy with "
                 "mt_param_read_f32", param->name, param->owner->name,
                 mt_dtype_name(param->dtype));
        return NULL;
    }
    return param->data;
}

mt_status mt_param_read_f32(mt_param *param, float *dst) {
    if (!param || !dst) return mt_error(MT_ERR_INVALID_ARG, "mt_param_read_f32: NULL argument");
    MT_TRY(check_values_present(param));
    return mt_op_cast(param->owner->dev, param->data, mt_param_dtype(param), dst, MT_F32,
                      param->numel);
}

/* Zeroes a gradient view nothing has written yet (grad_unwritten), for a caller that adds. */
static mt_status grad_zero_unwritten(mt_param *param) {
    if (!param->grad || !param->grad_unwritten) return MT_OK;
    mt_status st = mt_device_memset(param->owner->dev, param->grad, 0,
                                    param->numel * sizeof(float), NULL);
    if (st != MT_OK)
        return mt_error_wrap(st, "zeroing the gradient of parameter '%s' of module '%s'",
                             param->name, param->owner->name);
    param->grad_unwritten = false;
    return MT_OK;
}

mt_status mt_param_grad_get(mt_param *param, bool *overwrite, float **grad) {
    *grad = NULL;
    if (overwrite) {
        *overwrite = param->grad && param->grad_unwritten;
        param->grad_unwritten = false;
    } else {
        MT_TRY(grad_zero_unwritten(param));
    }
    *grad = param->grad;
    return MT_OK;
}

float *mt_param_grad(mt_param *param) { return mt_param_grad_write(param, NULL); }

float *mt_param_grad_write(mt_param *param, bool *overwrite) {
    float *grad = NULL;
    if (overwrite) *overwrite = false;
    if (!param) {
        mt_error(MT_ERR_INVALID_ARG, "mt_param_grad: param is NULL");
        return NULL;
    }
    mt_param_grad_get(param, overwrite, &grad); /* NULL with the error when failed */
    return grad;
}
