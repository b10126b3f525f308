# Multi-node jobs on hosts that are really separate (issue 18, items 4 and 5): network and UTS
# namespaces joined by a bridge (netns_lib.sh), one mtrun per host, UCX over tcp between them.
# tests/multihost/multihost.sh says what each variant checks. Without the rights to make
# namespaces (root or CAP_NET_ADMIN + CAP_SYS_ADMIN) every test here exits 77: skipped.
mt_add_mp_test(multihost_netns_selftest TIMEOUT 120 LABELS multihost
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/netns_selftest.sh)
set_tests_properties(multihost_netns_selftest PROPERTIES SKIP_RETURN_CODE 77)

# name:MT_TIMEOUT_S:ctest timeout (s). The failure cases run with MT_TIMEOUT_S=10: below UCX's own
# endpoint timeout on tcp (about 16-18 s with UCX 1.13's keepalive defaults), so that mtrun's
# heartbeat, not a rank's transport error, is what notices a cut host and names it. They take
# 2 x 10 + 10 s at worst before their checks, a training case well under a minute.
foreach(case train2:20:150 train3:20:150 train2_ifname:20:150 train3_ifname:20:150
        cut_link_node0:10:120 cut_link_node1:10:120 cut_nft_node0:10:120 cut_nft_node1:10:120
        kill_node0_sigkill:10:120 kill_node0_sighup:10:120 abuse:20:240)
  string(REPLACE ":" ";" parts ${case})
  list(GET parts 0 variant)
  list(GET parts 1 mt_timeout)
  list(GET parts 2 timeout)
  mt_add_mp_test(multihost_${variant} TIMEOUT ${timeout} LABELS multihost
    ENV MT_TIMEOUT_S=${mt_timeout}
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/multihost.sh $<TARGET_FILE:mtrun>
            $<TARGET_FILE:train_gpt> ${variant})
  set_tests_properties(multihost_${variant} PROPERTIES SKIP_RETURN_CODE 77)
endforeach()
