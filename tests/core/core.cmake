# core: dtypes, memory accounting, devices. allocator_may_return_null lets the
# sanitizer build return NULL for the impossible allocations the device test asks for; the
# variable replaces scripts/test-asan's, so it repeats intercept_tls_get_addr=0 (why: there).
mt_add_unit_test(test_dtype SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_dtype.c TIMEOUT 60 LABELS core)
mt_add_unit_test(test_memory SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_memory.c TIMEOUT 60
                 LABELS core)
mt_add_unit_test(test_device SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_device.c TIMEOUT 120
                 LABELS core ENV ASAN_OPTIONS=allocator_may_return_null=1:intercept_tls_get_addr=0)
mt_add_unit_test(test_host_memory SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_host_memory.c
                 TIMEOUT 60 LABELS core)
mt_add_unit_test(test_device_cache SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_device_cache.c
                 TIMEOUT 60 LABELS core)
mt_add_unit_test(test_host_tier SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_host_tier.c TIMEOUT 60
                 LABELS core)
# mlock past RLIMIT_MEMLOCK is refused with one clear error. Root has CAP_IPC_LOCK, which ignores
# the limit: setpriv drops it from the bounding set so that the limit applies here too.
find_program(MT_PRLIMIT prlimit)
find_program(MT_SETPRIV setpriv)
if(MT_PRLIMIT AND MT_SETPRIV)
  add_test(NAME test_host_tier_mlock
           COMMAND ${MT_SETPRIV} --bounding-set -ipc_lock ${MT_PRLIMIT} --memlock=1048576
                   $<TARGET_FILE:test_host_tier> --mlock-refusal 1048576)
  set_tests_properties(test_host_tier_mlock PROPERTIES TIMEOUT 60 LABELS "unit;core"
                       ENVIRONMENT "MT_HOST_MLOCK=1")
endif()
# The per-rank thread pool: every index once on 1, 2, 3 and 7 threads, chunk boundaries and a
# chunk-ordered reduction independent of the thread count, two callers on one pool, the sizing
# environment and its errors.
mt_add_unit_test(test_thread_pool SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_thread_pool.c
                 TIMEOUT 60 LABELS core)
# The host AdamW: every instruction-set path of this CPU on 1, 2, 3 and 7 threads bit for bit
# against mt_op_adamw's historical scalar loop, the device op under MT_ADAMW_ISA, its errors.
mt_add_unit_test(test_host_adamw SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_host_adamw.c
                 TIMEOUT 120 LABELS core)
mt_add_unit_test(test_env_clock SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_env_clock.c TIMEOUT 60
                 LABELS core)
# The CPU GPT ops over the pool: the same bits on 1, 2, 3 and 7 threads (a child process each),
# and the old single-threaded loops' bits (GELU: within 3e-6, its vectorised tanh).
# bf16 products on oneDNN included, which must start no OpenMP threads.
mt_add_unit_test(test_cpu_ops_threads SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cpu_ops_threads.c
                 TIMEOUT 60 LABELS core gpt)
# And on each f32 product path (core/cpu/f32_gemm_path.h) whatever the CPU would choose: OpenBLAS,
# and oneDNN's f32 matmul (which every x86-64 CPU runs, at some instruction-set level).
foreach(path openblas onednn)
  add_test(NAME test_cpu_ops_threads_${path} COMMAND test_cpu_ops_threads)
  math(EXPR t "60 * ${MT_TEST_TIMEOUT_FACTOR}")
  set_tests_properties(test_cpu_ops_threads_${path} PROPERTIES TIMEOUT ${t}
                       LABELS "unit;core;gpt" ENVIRONMENT "MT_CPU_F32_GEMM=${path}")
endforeach()
# A value that names no f32 path fails the first f32 product with a message that says which.
add_test(NAME test_cpu_ops_threads_bad_path COMMAND test_cpu_ops_threads)
set_tests_properties(test_cpu_ops_threads_bad_path PROPERTIES TIMEOUT 60 LABELS "unit;core"
                     ENVIRONMENT "MT_CPU_F32_GEMM=mkl"
                     PASS_REGULAR_EXPRESSION "MT_CPU_F32_GEMM='mkl': expected onednn, openblas or auto")
# A one-block product issued before the rank's pool exists (a fresh process's first, OpenBLAS
# at 4 threads) gives one single-threaded sgemm's bits, as after the pool, on pools of 1, 2, 3
# and 7 threads (core/cpu/ops_gemm.c creates the pool first, which puts OpenBLAS on 1 thread).
# A test of the OpenBLAS path, whichever path the CPU would choose.
mt_add_unit_test(test_gemm_pool_first SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gemm_pool_first.c
                 TIMEOUT 60 LABELS core ENV MT_CPU_F32_GEMM=openblas)
