/* DeviceMesh: shape, names, coordinates and the groups of each dimension (include/meshtrain/
 * mesh.h). A sub-mesh views some dimensions of its root; every group lives in the root, so that
 * a flattened dimension made through a sub-mesh is found again through the root. */
#include "mesh/agree.h"
#include "mesh/mesh_placement.h"
#include "comm/nccl/nccl_comm.h"
#include "mesh/runtime_device.h"

#include "core/error.h"

#include <meshtrain/log.h>
#include <meshtrain/mesh.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MESH_MAX_GROUPS 32

typedef struct mesh_group {
    char name[MT_MESH_NAME_MAX];
    unsigned dims; /* bit d: root dimension d belongs to it */
    mt_group *group;
    mt_nccl_comm *nccl; /* NULL unless the rank's device is a GPU and the build has NCCL */
} mesh_group;

struct mt_mesh {
    mt_runtime *rt;
    mt_mesh *root; /* itself for a root mesh */
    int ndim;
    int root_dim[MT_MESH_MAX_DIMS]; /* this mesh's dimension i is the root's root_dim[i] */
    int n_children;
    /* root only */
    int shape[MT_MESH_MAX_DIMS];
    char names[MT_MESH_MAX_DIMS][MT_MESH_NAME_MAX];
    int coords[MT_MESH_MAX_DIMS];
    mesh_group groups[MESH_MAX_GROUPS];
    int n_groups;
    int gpu;
};

/* ---- specs and validation -------------------------------------------------------------------- */

/* The spec as text: what every rank must agree on, and what error messages quote. Tolerates
 * arguments that validation will refuse, so that a bad spec on one rank is still compared. */
static void format_spec(int ndim, const int *shape, const char *const *names, char *buf,
                        size_t size) {
    size_t len = 0;
    int shown = ndim < 0 ? 0 : ndim > MT_MESH_MAX_DIMS ? MT_MESH_MAX_DIMS : ndim;
    len += (size_t)snprintf(buf, size, "shape ");
    for (int i = 0; i < shown && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%d", i ? "x" : "", shape ? shape[i] : 0);
    if (shown == 0 && len < size) len += (size_t)snprintf(buf + len, size - len, "(none)");
    if (len < size) len += (size_t)snprintf(buf + len, size - len, " names ");
    for (int i = 0; i < shown && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s'%s'", i ? "," : "",
                                names && names[i] ? names[i] : "(null)");
    if (ndim != shown && len < size) snprintf(buf + len, size - len, " (%d dimensions)", ndim);
}

static mt_status validate_names(const char *what, int ndim, const char *const *names) {
    for (int i = 0; i < ndim; i++) {
        if (!names[i] || !*names[i])
            return mt_error(MT_ERR_INVALID_ARG, "%s: dimension %d has an empty name", what, i);
        if (strlen(names[i]) >= MT_MESH_NAME_MAX)
            return mt_error(MT_ERR_INVALID_ARG, "%s: dimension name '%s' is longer than %d "
                            "characters", what, names[i], MT_MESH_NAME_MAX - 1);
        for (int j = 0; j < i; j++)
            if (strcmp(names[i], names[j]) == 0)
                return mt_error(MT_ERR_INVALID_ARG, "%s: dimension name '%s' appears twice "
                                "(dimensions %d and %d)", what, names[i], j, i);
    }
    return MT_OK;
}

static mt_status validate_spec(mt_runtime *rt, int ndim, const int *shape,
                               const char *const *names, const char *spec) {
    const char *what = "mt_mesh_create";
    if (ndim < 1 || ndim > MT_MESH_MAX_DIMS)
        return mt_error(MT_ERR_INVALID_ARG, "%s: %d dimensions; a mesh has 1 to %d", what, ndim,
                        MT_MESH_MAX_DIMS);
    if (!shape || !names)
        return mt_error(MT_ERR_INVALID_ARG, "%s: shape and names must not be NULL", what);
    long long product = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0)
            return mt_error(MT_ERR_INVALID_ARG, "%s: dimension %d ('%s') has size %d; sizes must "
                            "be positive (%s)", what, i, names[i] ? names[i] : "(null)", shape[i],
                            spec);
        product *= shape[i];
        if (product > (1LL << 31)) break;
    }
    MT_TRY(validate_names(what, ndim, names));
    int world = mt_runtime_world_size(rt);
    if (product != world) {
        char dims[128] = "";
        size_t len = 0;
        for (int i = 0; i < ndim && len < sizeof dims; i++)
            len += (size_t)snprintf(dims + len, sizeof dims - len, "%s%s %d", i ? " x " : "",
                                    names[i], shape[i]);
        return mt_error(MT_ERR_INVALID_ARG, "%s: %s = %lld != world size %d", what, dims, product,
                        world);
    }
    return MT_OK;
}

/* ---- geometry -------------------------------------------------------------------------------- */

static int root_rank_at(const mt_mesh *root, const int *coords) {
    int rank = 0;
    for (int d = 0; d < root->ndim; d++) {
        if (coords[d] < 0 || coords[d] >= root->shape[d]) return -1;
        rank = rank * root->shape[d] + coords[d];
    }
    return rank;
}

/* The members of the group over the root dimensions in mask, row-major over those dimensions,
 * with this rank's other coordinates fixed. */
static int group_members(const mt_mesh *root, unsigned mask, int *ranks) {
    int dims[MT_MESH_MAX_DIMS], nd = 0, total = 1;
    for (int d = 0; d < root->ndim; d++)
        if (mask >> d & 1u) {
            dims[nd++] = d;
            total *= root->shape[d];
        }
    int c[MT_MESH_MAX_DIMS];
    memcpy(c, root->coords, sizeof c);
    for (int i = 0; i < total; i++) {
        int rest = i;
        for (int k = nd - 1; k >= 0; k--) {
            c[dims[k]] = rest % root->shape[dims[k]];
            rest /= root->shape[dims[k]];
        }
        ranks[i] = root_rank_at(root, c);
    }
    return total;
}

static mesh_group *find_group(const mt_mesh *root, const char *name) {
    for (int i = 0; i < root->n_groups; i++)
        if (strcmp(root->groups[i].name, name) == 0) return (mesh_group *)&root->groups[i];
    return NULL;
}

static mt_status add_group(mt_mesh *root, const char *name, unsigned mask, mt_group **out) {
    if (root->n_groups == MESH_MAX_GROUPS)
        return mt_error(MT_ERR_INVALID_ARG, "mesh: more than %d dimension groups", MESH_MAX_GROUPS);
    int world = mt_runtime_world_size(root->rt);
    int *ranks = malloc((size_t)world * sizeof *ranks);
    if (!ranks) return mt_error(MT_ERR_OUT_OF_MEMORY, "mesh: out of memory");
    int n = group_members(root, mask, ranks);
    mt_group *g = NULL;
    mt_status st = mt_group_create(root->rt, ranks, n, name, &g);
    free(ranks);
    if (st != MT_OK) return mt_error_wrap(st, "mesh: creating the group of dimension '%s'", name);
    mt_nccl_comm *nccl = NULL;
    st = mt_nccl_comm_create(root->rt, g, &nccl);
    if (st != MT_OK) {
        mt_group_destroy(g);
        return mt_error_wrap(st, "mesh: the NCCL communicator of dimension '%s'", name);
    }
    mesh_group *mg = &root->groups[root->n_groups++];
    snprintf(mg->name, sizeof mg->name, "%s", name);
    mg->dims = mask;
    mg->group = g;
    mg->nccl = nccl;
    if (out) *out = g;
    return MT_OK;
}

/* ---- cross-host tp --------------------------------------------------------------------------- */

/* The tp dimension: the one named "tp", else the innermost of a mesh with two or more. */
static int tp_dim(const mt_mesh *root) {
    for (int d = 0; d < root->ndim; d++)
        if (strcmp(root->names[d], "tp") == 0) return d;
    return root->ndim >= 2 ? root->ndim - 1 : -1;
}

static mt_status check_tp_hosts(const mt_mesh *root) {
    int d = tp_dim(root);
    if (d < 0 || root->shape[d] == 1) return MT_OK;
    const char *allow = getenv("MT_ALLOW_CROSS_HOST_TP");
    if (allow && strcmp(allow, "1") == 0) return MT_OK;
    /* Every tp group, not only this rank's: all ranks then fail alike, nobody waits. */
    int world = mt_runtime_world_size(root->rt), size = root->shape[d];
    int inner = 1;
    for (int k = d + 1; k < root->ndim; k++) inner *= root->shape[k];
    for (int r = 0; r < world; r++) {
        int coord = r / inner % size;
        if (coord == 0) continue;
        int first = r - coord * inner;
        const char *h0 = mt_runtime_host_of(root->rt, first), *h = mt_runtime_host_of(root->rt, r);
        if (strcmp(h0, h) != 0) {
            int members[64];
            int n = size < 64 ? size : 64;
            for (int k = 0; k < n; k++) members[k] = first + k * inner;
            char list[256];
            mt_format_rank_list(members, n, list, sizeof list);
            return mt_error(MT_ERR_INVALID_ARG,
                            "mt_mesh_create: the %s group of ranks %s%s (dimension %d of size %d)"
                            " would span hosts: rank %d is on %s, rank %d on %s; make the tp "
                            "dimension the last one and its size divide the ranks per host, or "
                            "set MT_ALLOW_CROSS_HOST_TP=1 to allow it",
                            root->names[d], list, size > n ? ",..." : "", d, size, first, h0, r, h);
        }
    }
    return MT_OK;
}

/* ---- the table rank 0 prints ----------------------------------------------------------------- */

static void log_table(const mt_mesh *root, const char *spec, char **extras) {
    if (!extras || !mt_log_enabled(MT_LOG_INFO)) return;
    int world = mt_runtime_world_size(root->rt);
    mt_log(MT_LOG_INFO, "device mesh %s:", spec);
    char header[256];
    size_t len = (size_t)snprintf(header, sizeof header, "%6s", "rank");
    for (int d = 0; d < root->ndim && len < sizeof header; d++)
        len += (size_t)snprintf(header + len, sizeof header - len, " %*s",
                                (int)(strlen(root->names[d]) > 4 ? strlen(root->names[d]) : 4),
                                root->names[d]);
    mt_log(MT_LOG_INFO, "  %s  %-24s %s", header, "host", "device");
    for (int r = 0; r < world; r++) {
        char row[256];
        len = (size_t)snprintf(row, sizeof row, "%6d", r);
        int rest = r, c[MT_MESH_MAX_DIMS];
        for (int d = root->ndim - 1; d >= 0; d--) {
            c[d] = rest % root->shape[d];
            rest /= root->shape[d];
        }
        for (int d = 0; d < root->ndim && len < sizeof row; d++)
            len += (size_t)snprintf(row + len, sizeof row - len, " %*d",
                                    (int)(strlen(root->names[d]) > 4 ? strlen(root->names[d]) : 4),
                                    c[d]);
        char *tab = strchr(extras[r], '\t');
        if (tab) *tab = '\0';
        mt_log(MT_LOG_INFO, "  %s  %-24s %s", row, extras[r], tab ? tab + 1 : "");
        if (tab) *tab = '\t';
    }
}

/* ---- create / destroy ------------------------------------------------------------------------ */

void mt_mesh_destroy(mt_mesh *mesh) {
    if (!mesh) return;
    if (mesh->root != mesh) {
        mesh->root->n_children--;
        free(mesh);
        return;
    }
    if (mesh->n_children > 0)
        mt_log(MT_LOG_WARN, "mt_mesh_destroy: %d sub-mesh(es) still exist; they must not be used",
               mesh->n_children);
    for (int i = mesh->n_groups - 1; i >= 0; i--) {
        mt_nccl_comm_destroy(mesh->groups[i].nccl);
        mt_group_destroy(mesh->groups[i].group);
    }
    free(mesh);
}

mt_status mt_mesh_create(mt_runtime *rt, int ndim, const int *shape, const char *const *names,
                         mt_mesh **out) {
    if (!out) return mt_error(MT_ERR_INVALID_ARG, "mt_mesh_create: out must not be NULL");
    *out = NULL;
    if (!rt) return mt_error(MT_ERR_INVALID_ARG, "mt_mesh_create: no runtime");
    char spec[512];
    format_spec(ndim, shape, names, spec, sizeof spec);
    MT_TRY(mt_agree(rt, "mt_mesh_create", spec, NULL, NULL));
    int world = mt_runtime_world_size(rt);
    char **extras = NULL;
    mt_status st = validate_spec(rt, ndim, shape, names, spec);
    mt_mesh *m = NULL;
    if (st == MT_OK && !(m = calloc(1, sizeof *m)))
        st = mt_error(MT_ERR_OUT_OF_MEMORY, "mt_mesh_create: out of memory");
    if (st == MT_OK) {
        m->rt = rt;
        m->root = m;
        m->ndim = ndim;
        m->gpu = -1;
        int rest = mt_runtime_rank(rt);
        for (int d = ndim - 1; d >= 0; d--) {
            m->root_dim[d] = d;
            m->shape[d] = shape[d];
            snprintf(m->names[d], sizeof m->names[d], "%s", names[d]);
            m->coords[d] = rest % shape[d];
            rest /= shape[d];
        }
        st = check_tp_hosts(m);
    }
    if (st == MT_OK) {
        int d = tp_dim(m);
        st = mt_mesh_place(rt, d >= 0 ? m->shape[d] : 1, &m->gpu);
        /* Before the communicators: they belong to the GPU the rank ends up on. */
        if (st == MT_OK) st = mt_runtime_use_gpu(rt, m->gpu);
    }
    if (m) {
        /* Where every rank ended up, for the table rank 0 prints. A rank whose placement failed
         * says so here, so that the others stop with its reason instead of waiting for it. */
        char extra[512], mine[640] = "placed";
        mt_device *dev = mt_runtime_device(rt);
        snprintf(extra, sizeof extra, "%s\t%s", mt_runtime_host(rt),
                 dev ? mt_device_name(dev) : "?");
        if (st != MT_OK) snprintf(mine, sizeof mine, "a failure: %s", mt_last_error());
        char saved[1024];
        snprintf(saved, sizeof saved, "%s", mt_last_error());
        mt_status ast = mt_agree(rt, "mt_mesh_create/placement", mine, extra, &extras);
        if (st == MT_OK) st = ast;
        else mt_error_restore(st, saved);
    }
    for (int d = 0; st == MT_OK && d < ndim; d++) st = add_group(m, m->names[d], 1u << d, NULL);
    if (st == MT_OK) log_table(m, spec, extras);
    mt_agree_free_extras(extras, world);
    if (st != MT_OK) {
        mt_mesh_destroy(m);
        return st;
    }
    *out = m;
    return MT_OK;
}

/* ---- accessors ------------------------------------------------------------------------------- */

int mt_mesh_ndim(const mt_mesh *mesh) { return mesh ? mesh->ndim : 0; }

const char *mt_mesh_dim_name(const mt_mesh *mesh, int dim) {
    if (!mesh || dim < 0 || dim >= mesh->ndim) return NULL;
    return mesh->root->names[mesh->root_dim[dim]];
}

int mt_mesh_dim_size(const mt_mesh *mesh, int dim) {
    if (!mesh || dim < 0 || dim >= mesh->ndim) return 0;
    return mesh->root->shape[mesh->root_dim[dim]];
}

int mt_mesh_dim_index(const mt_mesh *mesh, const char *name) {
    if (!mesh || !name) return -1;
    for (int d = 0; d < mesh->ndim; d++)
        if (strcmp(mt_mesh_dim_name(mesh, d), name) == 0) return d;
    return -1;
}

int mt_mesh_coord(const mt_mesh *mesh, int dim) {
    if (!mesh || dim < 0 || dim >= mesh->ndim) return -1;
    return mesh->root->coords[mesh->root_dim[dim]];
}

int mt_mesh_rank_at(const mt_mesh *mesh, const int *coords) {
    if (!mesh || !coords) return -1;
    int c[MT_MESH_MAX_DIMS];
    memcpy(c, mesh->root->coords, sizeof c);
    for (int d = 0; d < mesh->ndim; d++) c[mesh->root_dim[d]] = coords[d];
    return root_rank_at(mesh->root, c);
}

mt_runtime *mt_mesh_runtime(const mt_mesh *mesh) { return mesh ? mesh->rt : NULL; }

int mt_mesh_gpu(const mt_mesh *mesh) { return mesh ? mesh->root->gpu : -1; }

static void list_names(const mt_mesh *mesh, char *buf, size_t size) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < mesh->root->n_groups && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s'%s'", i ? ", " : "",
                                mesh->root->groups[i].name);
}

mt_status mt_mesh_group(const mt_mesh *mesh, const char *name, mt_group **out) {
    if (!out) return mt_error(MT_ERR_INVALID_ARG, "mt_mesh_group: out must not be NULL");
    *out = NULL;
    if (!mesh || !name) return mt_error(MT_ERR_INVALID_ARG, "mt_mesh_group: no mesh or name");
    mesh_group *g = find_group(mesh->root, name);
    if (!g) {
        char known[512];
        list_names(mesh, known, sizeof known);
        return mt_error(MT_ERR_NOT_FOUND, "mt_mesh_group: the mesh has no dimension '%s' (it has "
                        "%s)", name, known);
    }
    *out = g->group;
    return MT_OK;
}

/* Maps names of this mesh's dimensions (in mesh order, no repeats) to a mask of root dimensions
 * and fills root_dims in order. */
static mt_status names_to_dims(const mt_mesh *mesh, const char *what, const char *const *names,
                               int n, unsigned *mask, int *root_dims) {
    if (!names || n < 1 || n > mesh->ndim)
        return mt_error(MT_ERR_INVALID_ARG, "%s: %d dimension names for a mesh of %d", what, n,
                        mesh->ndim);
    *mask = 0;
    int last = -1;
    for (int i = 0; i < n; i++) {
        int d = names[i] ? mt_mesh_dim_index(mesh, names[i]) : -1;
        if (d < 0)
            return mt_error(MT_ERR_INVALID_ARG, "%s: the mesh has no dimension '%s'", what,
                            names[i] ? names[i] : "(null)");
        if (d <= last)
            return mt_error(MT_ERR_INVALID_ARG, "%s: dimension '%s' is repeated or out of mesh "
                            "order", what, names[i]);
        last = d;
        root_dims[i] = mesh->root_dim[d];
        *mask |= 1u << mesh->root_dim[d];
    }
    return MT_OK;
}

mt_status mt_mesh_flatten(mt_mesh *mesh, const char *const *names, int n, const char *flat_name,
                          mt_group **out) {
    const char *what = "mt_mesh_flatten";
    if (out) *out = NULL;
    if (!mesh) return mt_error(MT_ERR_INVALID_ARG, "%s: no mesh", what);
    mt_mesh *root = mesh->root;
    /* Compared before it is validated (and tolerating what validation refuses), as in
     * mt_mesh_create: a rank with other arguments fails every rank now, not at the timeout. */
    char spec[512];
    int shown = n < 0 ? 0 : n > MT_MESH_MAX_DIMS ? MT_MESH_MAX_DIMS : n;
    size_t len = (size_t)snprintf(spec, sizeof spec, "'%s' =",
                                  flat_name ? flat_name : "(null)");
    for (int i = 0; i < shown && len < sizeof spec; i++)
        len += (size_t)snprintf(spec + len, sizeof spec - len, " %s'%s'", i ? "x " : "",
                                names && names[i] ? names[i] : "(null)");
    if (shown != n && len < sizeof spec) snprintf(spec + len, sizeof spec - len, " (%d)", n);
    MT_TRY(mt_agree(root->rt, what, spec, NULL, NULL));
    unsigned mask;
    int dims[MT_MESH_MAX_DIMS];
    MT_TRY(names_to_dims(mesh, what, names, n, &mask, dims));
    const char *one[1] = {flat_name};
    MT_TRY(validate_names(what, 1, one));
    mesh_group *g = find_group(root, flat_name);
    if (g) {
        if (g->dims != mask)
            return mt_error(MT_ERR_INVALID_ARG, "%s: '%s' already names another dimension or "
                            "flattening", what, flat_name);
        if (out) *out = g->group;
        return MT_OK;
    }
    return add_group(root, flat_name, mask, out);
}

mt_status mt_mesh_submesh(mt_mesh *mesh, const char *const *names, int n, mt_mesh **out) {
    if (!out) return mt_error(MT_ERR_INVALID_ARG, "mt_mesh_submesh: out must not be NULL");
    *out = NULL;
    if (!mesh) return mt_error(MT_ERR_INVALID_ARG, "mt_mesh_submesh: no mesh");
    unsigned mask;
    int dims[MT_MESH_MAX_DIMS];
    MT_TRY(names_to_dims(mesh, "mt_mesh_submesh", names, n, &mask, dims));
    mt_mesh *s = calloc(1, sizeof *s);
    if (!s) return mt_error(MT_ERR_OUT_OF_MEMORY, "mt_mesh_submesh: out of memory");
    s->rt = mesh->rt;
    s->root = mesh->root;
    s->ndim = n;
    memcpy(s->root_dim, dims, (size_t)n * sizeof *dims);
    mesh->root->n_children++;
    *out = s;
    return MT_OK;
}
