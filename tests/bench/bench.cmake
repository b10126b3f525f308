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
