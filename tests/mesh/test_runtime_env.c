/* The launch-environment parser: mtrun/torchrun, Slurm (with compressed node lists), variables
 * set by hand, nothing set, and the invalid values that must be named in the error. */
#include "check.h"

#include "mesh/runtime_env.h"

#include <stdarg.h>
#include <string.h>

/* A fake environment: "NAME=value" strings, NULL-terminated. */
static const char *lookup(const char *name, void *ctx) {
    const char *const *vars = ctx;
    size_t n = strlen(name);
    for (; *vars; vars++)
        if (strncmp(*vars, name, n) == 0 && (*vars)[n] == '=') return *vars + n + 1;
    return NULL;
}

static mt_status parse(mt_runtime_env *env, const char *const *vars) {
    memset(env, 0x5a, sizeof *env);
    return mt_runtime_env_parse(lookup, (void *)vars, env);
}

#define ENV(...) ((const char *const[]){__VA_ARGS__, NULL})

/* The parse fails with INVALID_ARG and the message contains every word. */
static void expect_error(const char *const *vars, ...) {
    mt_runtime_env env;
    mt_status s = parse(&env, vars);
    CHECK_MSG(s == MT_ERR_INVALID_ARG, "%s (%s) for %s", mt_status_str(s), mt_last_error(),
              vars[0]);
    va_list ap;
    va_start(ap, vars);
    for (const char *w; (w = va_arg(ap, const char *));)
        CHECK_MSG(strstr(mt_last_error(), w), "'%s' not in: %s", w, mt_last_error());
    va_end(ap);
}

static void test_nothing_set(void) {
    mt_runtime_env env;
    CHECK_OK(parse(&env, ENV("HOME=/root", "PATH=/bin")));
    CHECK(env.source == MT_ENV_SINGLE);
    CHECK(env.rank == 0 && env.world_size == 1);
    CHECK(env.master_port == 0); /* a free port */
    CHECK(strcmp(env.master_addr, "127.0.0.1") == 0);
    CHECK(!env.store_hosted);
    CHECK(env.store_prefix[0] == '\0');
    CHECK(strcmp(env.job_id, "none") == 0);
    CHECK(env.local_rank == -1 && env.node_rank == -1);
    /* Empty values count as unset. */
    CHECK_OK(parse(&env, ENV("RANK=", "WORLD_SIZE=")));
    CHECK(env.source == MT_ENV_SINGLE);
}

static void test_mtrun(void) {
    mt_runtime_env env;
    CHECK_OK(parse(&env, ENV("RANK=5", "LOCAL_RANK=1", "WORLD_SIZE=8", "LOCAL_WORLD_SIZE=4",
                             "GROUP_RANK=1", "MASTER_ADDR=node0", "MASTER_PORT=29600",
                             "MT_RDZV_ID=job42", "TORCHELASTIC_RUN_ID=job42", "MT_NNODES=2",
                             "MT_STORE_HOSTED=1", "MT_STORE_PREFIX=round/2/")));
    CHECK(env.source == MT_ENV_TORCHRUN);
    CHECK(strcmp(env.store_prefix, "round/2/") == 0);
    CHECK(env.rank == 5 && env.world_size == 8);
    CHECK(env.local_rank == 1 && env.local_world_size == 4);
    CHECK(env.node_rank == 1 && env.num_nodes == 2);
    CHECK(strcmp(env.master_addr, "node0") == 0 && env.master_port == 29600);
    CHECK(strcmp(env.job_id, "job42") == 0);
    CHECK(env.store_hosted);

    /* torchrun sets only TORCHELASTIC_RUN_ID. */
    CHECK_OK(parse(&env, ENV("RANK=0", "WORLD_SIZE=2", "TORCHELASTIC_RUN_ID=tr")));
    CHECK(strcmp(env.job_id, "tr") == 0);
}

static void test_by_hand(void) {
    mt_runtime_env env;
    CHECK_OK(parse(&env, ENV("RANK=2", "WORLD_SIZE=3")));
    CHECK(env.source == MT_ENV_TORCHRUN);
    CHECK(env.rank == 2 && env.world_size == 3);
    CHECK(strcmp(env.master_addr, "127.0.0.1") == 0 && env.master_port == 29500);
    CHECK(env.local_rank == -1 && env.local_world_size == -1);
    CHECK(!env.store_hosted);
    CHECK(strcmp(env.job_id, "none") == 0);
    CHECK_OK(parse(&env, ENV("RANK=0", "WORLD_SIZE=1", "MT_STORE_HOSTED=0")));
    CHECK(!env.store_hosted);
}

static void test_invalid(void) {
    expect_error(ENV("RANK=abc", "WORLD_SIZE=2"), "RANK", "abc", NULL);
    expect_error(ENV("RANK=1", "WORLD_SIZE=2x"), "WORLD_SIZE", "2x", NULL);
    expect_error(ENV("RANK=-1", "WORLD_SIZE=2"), "RANK=-1", "negative", NULL);
    expect_error(ENV("RANK=+1", "WORLD_SIZE=2"), "RANK", "+1", NULL);
    expect_error(ENV("RANK=2", "WORLD_SIZE=2"), "RANK=2", "WORLD_SIZE=2", NULL);
    expect_error(ENV("RANK=0", "WORLD_SIZE=0"), "WORLD_SIZE=0", NULL);
    expect_error(ENV("RANK=1"), "RANK=1", "WORLD_SIZE is not", NULL);
    expect_error(ENV("WORLD_SIZE=4"), "WORLD_SIZE=4", "RANK is not", NULL);
    expect_error(ENV("RANK=0", "WORLD_SIZE=2", "MASTER_PORT=70000"), "MASTER_PORT=70000", NULL);
    expect_error(ENV("RANK=0", "WORLD_SIZE=2", "MASTER_PORT=http"), "MASTER_PORT", "http", NULL);
    expect_error(ENV("RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"),
                 "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2", NULL);
    expect_error(ENV("RANK=0", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=3"), "LOCAL_WORLD_SIZE=3", NULL);
    expect_error(ENV("RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=x"), "LOCAL_RANK", "'x'", NULL);
    expect_error(ENV("RANK=0", "WORLD_SIZE=2", "GROUP_RANK=2", "MT_NNODES=2"), "node rank 2",
                 NULL);
    expect_error(ENV("RANK=0", "WORLD_SIZE=2", "MT_STORE_HOSTED=maybe"), "MT_STORE_HOSTED",
                 "maybe", NULL);
    expect_error(ENV("RANK=99999999999999999999", "WORLD_SIZE=2"), "RANK", NULL);
    char long_job[400] = "MT_RDZV_ID=";
    memset(long_job + 11, 'j', 300);
    expect_error(ENV("RANK=0", "WORLD_SIZE=2", long_job), "MT_RDZV_ID", NULL);
    char long_prefix[200] = "MT_STORE_PREFIX=";
    memset(long_prefix + 16, 'p', 100);
    expect_error(ENV("RANK=0", "WORLD_SIZE=2", long_prefix), "MT_STORE_PREFIX", "100 characters",
                 NULL);
}

static void test_slurm(void) {
    mt_runtime_env env;
    CHECK_OK(parse(&env, ENV("SLURM_PROCID=6", "SLURM_NTASKS=8", "SLURM_LOCALID=2",
                             "SLURM_NODEID=1", "SLURM_NNODES=2", "SLURM_JOB_ID=123456",
                             "SLURM_JOB_NODELIST=gpu[003-005,007],cpu1")));
    CHECK(env.source == MT_ENV_SLURM);
    CHECK(env.rank == 6 && env.world_size == 8 && env.local_rank == 2);
    CHECK(env.node_rank == 1 && env.num_nodes == 2);
    CHECK(strcmp(env.master_addr, "gpu003") == 0);
    CHECK(env.master_port == 29500);
    CHECK(strcmp(env.job_id, "123456") == 0);
    CHECK(!env.store_hosted);

    /* MASTER_ADDR/PORT and MT_RDZV_ID win over Slurm's; SLURM_NODELIST is the older name. */
    CHECK_OK(parse(&env, ENV("SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_NODELIST=a[1-2]",
                             "MASTER_ADDR=10.0.0.1", "MASTER_PORT=1234", "MT_RDZV_ID=mine",
                             "SLURM_JOB_ID=9")));
    CHECK(strcmp(env.master_addr, "10.0.0.1") == 0 && env.master_port == 1234);
    CHECK(strcmp(env.job_id, "mine") == 0);
    CHECK_OK(parse(&env, ENV("SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_NODELIST=n[08-09]")));
    CHECK(strcmp(env.master_addr, "n08") == 0);
    /* RANK (mtrun or torchrun inside an allocation) takes precedence over Slurm. */
    CHECK_OK(parse(&env, ENV("RANK=1", "WORLD_SIZE=4", "SLURM_PROCID=0", "SLURM_NTASKS=1")));
    CHECK(env.source == MT_ENV_TORCHRUN && env.rank == 1 && env.world_size == 4);
    /* A single node without a node list: the store is local. */
    CHECK_OK(parse(&env, ENV("SLURM_PROCID=0", "SLURM_NTASKS=1")));
    CHECK(strcmp(env.master_addr, "127.0.0.1") == 0);
    CHECK(strcmp(env.job_id, "none") == 0);

    expect_error(ENV("SLURM_PROCID=0"), "SLURM_PROCID", "SLURM_NTASKS", NULL);
    expect_error(ENV("SLURM_PROCID=4", "SLURM_NTASKS=4"), "SLURM_PROCID=4", "SLURM_NTASKS=4",
                 NULL);
    expect_error(ENV("SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_NNODES=2"), "SLURM_JOB_NODELIST",
                 NULL);
    expect_error(ENV("SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_JOB_NODELIST=gpu[1-"),
                 "SLURM_JOB_NODELIST", "gpu[1-", NULL);
    expect_error(ENV("SLURM_PROCID=x", "SLURM_NTASKS=4"), "SLURM_PROCID", "'x'", NULL);
}

static void first_host(const char *list, const char *want) {
    char out[64] = "";
    mt_status s = mt_slurm_first_host(list, out, sizeof out);
    CHECK_MSG(s == MT_OK && strcmp(out, want) == 0, "'%s' -> '%s' (%s), want '%s'", list, out,
              mt_last_error(), want);
}

static void bad_list(const char *list) {
    char out[64];
    mt_status s = mt_slurm_first_host(list, out, sizeof out);
    CHECK_MSG(s == MT_ERR_INVALID_ARG, "'%s' accepted as '%s'", list, out);
    if (s != MT_OK && *list) CHECK(strstr(mt_last_error(), list) != NULL);
}

static void test_nodelists(void) {
    first_host("gpu[003-005,007],cpu1", "gpu003");
    first_host("node1", "node1");
    first_host("node1,node2", "node1");
    first_host("n[7]", "n7");
    first_host("n[10,2-4]", "n10");
    first_host("rack[1-2]-node[01-04]", "rack1-node01");
    first_host("my-host.example.com", "my-host.example.com");
    first_host("a-b[001-128],c[1-3]", "a-b001");
    first_host("[5-6]x", "5x");
    bad_list("");
    bad_list("gpu[");
    bad_list("gpu[1-2");
    bad_list("gpu]1");
    bad_list("gpu[]");
    bad_list("gpu[a-b]");
    bad_list("gpu[[1]]");
    bad_list(",node1");
    char out[4];
    CHECK(mt_slurm_first_host("longhostname", out, sizeof out) == MT_ERR_INVALID_ARG);
    CHECK(mt_slurm_first_host("x[12345]", out, sizeof out) == MT_ERR_INVALID_ARG);
}

int main(void) {
    test_nothing_set();
    test_mtrun();
    test_by_hand();
    test_invalid();
    test_slurm();
    test_nodelists();
    return check_report("test_runtime_env");
}
