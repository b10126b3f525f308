/* Module hooks (module/module_hooks.c) on one process, no FSDP: the order in which pre/post
 * forward/backward hooks and the modules' own functions run on a small tree, nesting of two
 * owners, release on destroy and on removal, a failing hook's message reaching the caller, and
 * the refusals (duplicate owner, unknown owner, changes while running).
 *
 *   root (two owners A, B; no function of its own: runs its children) -> a (owner X, a function
 *   that runs its child) -> a1;  root -> b
 */
#include "check.h"
#include "core/error.h"

#include <meshtrain/meshtrain.h>

#include <stdio.h>
#include <string.h>

/* Every event appended as "what:module" (hooks: "what/owner:module"), space separated. */
static char trace[2048];

static void log_event(const char *what, const char *owner, const mt_module *m) {
    size_t n = strlen(trace);
    snprintf(trace + n, sizeof trace - n, "%s%s%s%s:%s", n ? " " : "", what, owner ? "/" : "",
             owner ? owner : "", mt_module_name(m));
}

/* A hook owner: its name (the registration's user data) and what it should do. */
typedef struct owner {
    const char *name;
    bool fail_pre_forward;
    mt_status post_seen; /* the status its last post hook received */
} owner;

static mt_status pre_fwd(mt_module *m, void *user) {
    owner *o = user;
    log_event("pre_fwd", o->name, m);
    if (o->fail_pre_forward)
        return mt_error(MT_ERR_INVALID_ARG, "owner %s refuses the forward of '%s'", o->name,
                        mt_module_name(m));
    return MT_OK;
}
static mt_status post_fwd(mt_module *m, void *user, mt_status st) {
    owner *o = user;
    log_event("post_fwd", o->name, m);
    o->post_seen = st;
    return st;
}
static mt_status pre_bwd(mt_module *m, void *user) {
    log_event("pre_bwd", ((owner *)user)->name, m);
    return MT_OK;
}
static mt_status post_bwd(mt_module *m, void *user, mt_status st) {
    log_event("post_bwd", ((owner *)user)->name, m);
    return st;
}
static void release(mt_module *m, void *user) { log_event("release", ((owner *)user)->name, m); }

static const mt_module_hooks all_hooks = {pre_fwd, post_fwd, pre_bwd, post_bwd, release};

static bool fail_fn; /* makes the functions of a and a1 fail */

static mt_status run_child(mt_module *m, bool backward) {
    log_event(backward ? "bwd" : "fwd", NULL, m);
    if (fail_fn) return mt_error(MT_ERR_INVALID_ARG, "'%s' fails on purpose", mt_module_name(m));
    for (size_t i = 0; i < mt_module_child_count(m); i++)
        MT_TRY(backward ? mt_module_backward(mt_module_child(m, i), NULL)
                        : mt_module_forward(mt_module_child(m, i), NULL));
    return MT_OK;
}
static mt_status fwd(mt_module *m, void *ctx) {
    (void)ctx;
    return run_child(m, false);
}
static mt_status bwd(mt_module *m, void *ctx) {
    (void)ctx;
    return run_child(m, true);
}

/* Adds hooks from inside a running module: refused. */
static mt_status add_while_running(mt_module *m, void *user) {
    static const mt_module_hooks none = {0};
    (void)user;
    mt_status st = mt_module_add_hooks(m, &fail_fn, &none, NULL);
    CHECK(st == MT_ERR_INVALID_ARG);
    CHECK(strstr(mt_last_error(), "running") != NULL);
    return MT_OK;
}

/* Hooks written with the public API only: a pre hook that fails without a message, and a post
 * hook that passes a failure on after a call of its own failed. */
static mt_status silent_refusal(mt_module *m, void *user) {
    (void)m, (void)user;
    return MT_ERR_UNSUPPORTED;
}
static mt_status noisy_pass_on(mt_module *m, void *user, mt_status st) {
    (void)user;
    CHECK(mt_module_set_tp_dim(m, "") == MT_ERR_INVALID_ARG); /* overwrites mt_last_error */
    return st;
}

static void check_messages(mt_module *m) {
    static const mt_module_hooks silent = {.pre_forward = silent_refusal};
    static const mt_module_hooks noisy = {.post_forward = noisy_pass_on};
    /* An old message must not pass for the hook's. */
    CHECK(mt_module_add_hooks(NULL, &silent, &silent, NULL) == MT_ERR_INVALID_ARG);
    CHECK_OK(mt_module_add_hooks(m, &noisy, &noisy, NULL));
    CHECK_OK(mt_module_add_hooks(m, &silent, &silent, NULL));
    CHECK(mt_module_forward(m, NULL) == MT_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(mt_last_error(), "a pre-forward hook of module 'b' failed"), "%s",
              mt_last_error());
    CHECK_OK(mt_module_remove_hooks(m, &silent));
    CHECK_OK(mt_module_remove_hooks(m, &noisy));
}

static void expect_trace(const char *want) {
    CHECK_MSG(strcmp(trace, want) == 0, "\n  got:  %s\n  want: %s", trace, want);
    trace[0] = '\0';
}

static void run_tree(mt_mesh *mesh) {
    static const mt_module_ops ops = {.forward = fwd, .backward = bwd};
    mt_module *root = NULL, *a = NULL, *a1 = NULL, *b = NULL;
    CHECK_OK(mt_module_create(mesh, "root", NULL, NULL, &root));
    CHECK_OK(mt_module_create(mesh, "a", &ops, NULL, &a));
    CHECK_OK(mt_module_create(mesh, "a1", &ops, NULL, &a1));
    CHECK_OK(mt_module_create(mesh, "b", NULL, NULL, &b));
    if (!root || !a || !a1 || !b) return;
    CHECK_OK(mt_module_add_child(root, a));
    CHECK_OK(mt_module_add_child(root, b));
    CHECK_OK(mt_module_add_child(a, a1));
    CHECK(strcmp(mt_module_tp_dim(root), MT_TP_DIM_DEFAULT) == 0);

    owner A = {.name = "A"}, B = {.name = "B"}, X = {.name = "X"};
    CHECK_OK(mt_module_add_hooks(root, &A, &all_hooks, &A));
    CHECK_OK(mt_module_add_hooks(root, &B, &all_hooks, &B));
    CHECK_OK(mt_module_add_hooks(a, &X, &all_hooks, &X));
    CHECK(mt_module_hooks_user(root, &B) == &B);
    CHECK(mt_module_hooks_user(root, &X) == NULL);
    CHECK(mt_module_add_hooks(root, &A, &all_hooks, &A) == MT_ERR_INVALID_ARG);
    CHECK(mt_module_remove_hooks(b, &A) == MT_ERR_INVALID_ARG);

    /* Pre hooks in registration order, post hooks in reverse: A wraps B wraps the module. */
    CHECK_OK(mt_module_forward(root, NULL));
    expect_trace("pre_fwd/A:root pre_fwd/B:root pre_fwd/X:a fwd:a fwd:a1 post_fwd/X:a "
                 "post_fwd/B:root post_fwd/A:root");
    CHECK_OK(mt_module_backward(root, NULL));
    expect_trace("pre_bwd/A:root pre_bwd/B:root pre_bwd/X:a bwd:a bwd:a1 post_bwd/X:a "
                 "post_bwd/B:root post_bwd/A:root");

    /* The module's failure reaches the post hooks and the caller with its message. */
    fail_fn = true;
    CHECK(mt_module_forward(root, NULL) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "'a' fails on purpose"), "%s", mt_last_error());
    CHECK(X.post_seen == MT_ERR_INVALID_ARG && A.post_seen == MT_ERR_INVALID_ARG);
    expect_trace("pre_fwd/A:root pre_fwd/B:root pre_fwd/X:a fwd:a post_fwd/X:a post_fwd/B:root "
                 "post_fwd/A:root");
    fail_fn = false;

    /* A failing pre hook: later registrations and the module do not run, the earlier ones' post
     * hooks do, and its message is what the caller gets. */
    B.fail_pre_forward = true;
    A.post_seen = MT_OK;
    CHECK(mt_module_forward(root, NULL) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "owner B refuses the forward of 'root'"), "%s",
              mt_last_error());
    CHECK(A.post_seen == MT_ERR_INVALID_ARG);
    expect_trace("pre_fwd/A:root pre_fwd/B:root post_fwd/A:root");
    B.fail_pre_forward = false;

    /* Messages of hooks that cannot call mt_error (the public API has no setter). */
    check_messages(b);

    /* Removal releases at once and the hooks stop running. */
    CHECK_OK(mt_module_remove_hooks(root, &A));
    expect_trace("release/A:root");
    CHECK(mt_module_hooks_user(root, &A) == NULL);
    CHECK_OK(mt_module_forward(b, NULL));
    CHECK_OK(mt_module_forward(root, NULL));
    expect_trace("pre_fwd/B:root pre_fwd/X:a fwd:a fwd:a1 post_fwd/X:a post_fwd/B:root");

    /* No changes to the hooks of a module while it runs. */
    static const mt_module_hooks adder = {.pre_forward = add_while_running};
    CHECK_OK(mt_module_add_hooks(b, &adder, &adder, NULL));
    CHECK_OK(mt_module_forward(b, NULL));
    CHECK_OK(mt_module_remove_hooks(b, &adder));

    /* A child cannot be destroyed alone: its parent still runs it (nothing released). */
    mt_module_destroy(a1);
    expect_trace("");
    CHECK_OK(mt_module_forward(a, NULL));
    expect_trace("pre_fwd/X:a fwd:a fwd:a1 post_fwd/X:a");

    /* Destroy: a module's registrations (latest first) before its children's. */
    CHECK_OK(mt_module_add_hooks(root, &A, &all_hooks, &A));
    mt_module_destroy(root);
    expect_trace("release/A:root release/B:root release/X:a");
}

int main(void) {
    mt_runtime *rt = NULL;
    CHECK_OK(mt_init(&rt, NULL, NULL));
    if (!rt) return check_report("test_module_hooks");
    mt_mesh *mesh = NULL;
    CHECK_OK(mt_mesh_create(rt, 1, (int[]){1}, (const char *[]){"dp"}, &mesh));
    if (mesh) {
        CHECK(mt_module_add_hooks(NULL, &trace, &all_hooks, NULL) == MT_ERR_INVALID_ARG);
        run_tree(mesh);
        mt_mesh_destroy(mesh);
    }
    mt_finalize(rt);
    return check_report("test_module_hooks");
}
