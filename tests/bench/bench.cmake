# mt-bench-comm's report format (figures themselves live in docs/benchmarks.md, not in tests).
mt_add_mp_test(bench_comm_json TIMEOUT 120 LABELS bench
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/bench_comm_json.sh $<TARGET_FILE:mtrun>
          $<TARGET_FILE:mt-bench-comm>)
# mt-bench-checkpoint end to end on a tiny model: its report, its clean-up, its option errors.
mt_add_mp_test(bench_checkpoint_smoke TIMEOUT 120 LABELS bench
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/bench_checkpoint_smoke.sh $<TARGET_FILE:mtrun>
          $<TARGET_FILE:mt-bench-checkpoint>)
# mt-bench-recompute end to end on a tiny GPT: its lines, the lower activation peak, bad options.
mt_add_mp_test(bench_recompute_smoke TIMEOUT 120 LABELS bench
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/bench_recompute_smoke.sh
          $<TARGET_FILE:mt-bench-recompute>)
# mt-bench-sequence-parallel on a tiny GPT over tp 2: it exits non-zero when the measured tp
# traffic, or the measured saving of the activations held after the forward, differs from its
# model of them.
mt_add_mp_test(bench_sequence_parallel_smoke TIMEOUT 120 LABELS bench ENV MT_DEVICE=cpu
  COMMAND $<TARGET_FILE:mtrun> --standalone --nproc_per_node 2
          $<TARGET_FILE:mt-bench-sequence-parallel> --layers 2 --d-model 32 --heads 4 --seq 16
          --batch 2)
# mt-bench-offload on small sizes: one line per size with positive figures, bad options refused.
mt_add_mp_test(bench_offload_smoke TIMEOUT 120 LABELS bench ENV MT_DEVICE=cpu
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/bench_offload_smoke.sh $<TARGET_FILE:mt-bench-offload>)
# mt-bench-adamw on a small array: its lines per path and thread count, its option errors.
mt_add_mp_test(bench_adamw_smoke TIMEOUT 120 LABELS bench
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/bench_adamw_smoke.sh $<TARGET_FILE:mt-bench-adamw>)
# mt-bench-cpu-ops at tiny sizes: a line per op on 1 and 3 threads, its option errors.
mt_add_mp_test(bench_cpu_ops_smoke TIMEOUT 120 LABELS bench
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/bench_cpu_ops_smoke.sh $<TARGET_FILE:mt-bench-cpu-ops>)
# mt-bench-gpt-step on a tiny GPT at 2 ranks and 1 (--json): its table, its JSON figures, its
# option errors.
mt_add_mp_test(bench_gpt_step_smoke TIMEOUT 120 LABELS bench
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/bench_gpt_step_smoke.sh $<TARGET_FILE:mtrun>
          $<TARGET_FILE:mt-bench-gpt-step>)
# bench/compare_pytorch.sh's scripts without torch: they parse, --help, missing build, bad options.
add_test(NAME compare_pytorch_smoke
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/compare_pytorch_smoke.sh ${CMAKE_BINARY_DIR})
set_tests_properties(compare_pytorch_smoke PROPERTIES TIMEOUT 60 LABELS "unit;bench")
