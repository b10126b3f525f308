# Multi-node jobs on hosts that are really separate (issue 18, items 4 and 5): network and UTS
# namespaces joined by a bridge (netns_lib.sh), one mtrun per host, UCX over tcp between them.
# tests/multihost/multihost.sh says what each variant checks. Without the rights to make
# namespaces (root or CAP_NET_ADMIN + CAP_SYS_ADMIN) every test here exits 77: skipped.
mt_add_mp_test(multihost_netns_selftest TIMEOUT 120 LABELS multihost
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/netns_selftest.sh)
set_tests_properties(multihost_netns_selftest PROPERTIES SKIP_RETURN_CODE 77)

# name, ctest timeout (s): MT_TIMEOUT_S is 20; a failure case takes 2 x 20 + 10 s at worst
# before its checks, a training case well under a minute when it works.
foreach(case train2:150 train3:150 train2_ifname:150 train3_ifname:150 cut_link_node0:150
        cut_link_node1:150 cut_nft_node0:150 cut_nft_node1:150 kill_node0_sigkill:150
        kill_node0_sighup:150 abuse:240)
  string(REPLACE ":" ";" parts ${case})
  list(GET parts 0 variant)
  list(GET parts 1 timeout)
  mt_add_mp_test(multihost_${variant} TIMEOUT ${timeout} LABELS multihost ENV MT_TIMEOUT_S=20
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/multihost.sh $<TARGET_FILE:mtrun>
            $<TARGET_FILE:train_gpt> ${variant})
  set_tests_properties(multihost_${variant} PROPERTIES SKIP_RETURN_CODE 77)
endforeach()
