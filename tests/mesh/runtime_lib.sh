# Helpers for the runtime's multi-process scripts (sourced), on top of lib.sh. Usage of a script:
#   runtime_<name>.sh PROG_INIT [MTRUN]
# Ranks are started by hand (RANK/WORLD_SIZE/MASTER_PORT in their environment) in the
# background; every pid this script starts is killed when it ends, whatever happened.
set -u
PROG=$1
TMP_PREFIX=runtime_test
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

# A clean launch environment: only what each test sets.
for v in $(compgen -e); do
    case $v in
    RANK | WORLD_SIZE | LOCAL_RANK | LOCAL_WORLD_SIZE | GROUP_RANK | MASTER_ADDR | MASTER_PORT | \
        MT_RDZV_ID | TORCHELASTIC_RUN_ID | MT_NNODES | MT_STORE_HOSTED | MT_TIMEOUT_S | SLURM_*)
        unset "$v" ;;
    esac
done
export MT_DEVICE=cpu

# start NAME VAR=VALUE...: starts PROG with those variables; output in $TMP/NAME.out/.err,
# pid in PID_NAME
start() {
    local name=$1
    shift
    start_bg "$name" env "$@" "$PROG"
}

free_port() { "$PROG" --free-port; }
