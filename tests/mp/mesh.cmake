# DeviceMesh (mesh/device_mesh.c, agree.c, mesh_placement.c) through mtrun as a user would.
mt_add_test_program(test_mesh ${CMAKE_CURRENT_LIST_DIR}/test_mesh.c)
set(MT_MESH_MTRUN ${CMAKE_BINARY_DIR}/bin/mtrun)
set(MT_MESH_PROG ${MT_TEST_BIN}/test_mesh)

# Shapes on 4 and 8 ranks: membership, coordinates and collectives on every dimension.
foreach(spec "4;1x4;dp,tp;flat" "4;4x1;dp,tp;flat" "4;2x2;dp,tp;flat" "4;4;dp;flat"
             "8;2x2x2;dp_replicate,dp_shard,tp;dp")
  list(GET spec 0 np)
  list(GET spec 1 shape)
  list(GET spec 2 names)
  list(GET spec 3 flat)
  mt_add_mp_test(mesh_shape_${shape}_np${np} TIMEOUT 120 LABELS mesh ENV MT_TIMEOUT_S=60
    COMMAND ${MT_MESH_MTRUN} --standalone --nproc_per_node ${np} ${MT_MESH_PROG}
            --shape ${shape} --names ${names} --flatten ${flat})
endforeach()

# Invalid meshes: every rank fails with the message, within seconds (MT_TIMEOUT_S=20 would show
# a hang as a timeout well before ctest's).
foreach(spec "product;3x2;dp,tp;dp 3 x tp 2 = 6 != world size 4"
             "duplicate;2x2;tp,tp;appears twice"
             "empty;2x2;dp,EMPTY;empty name"
             "zero;0x4;dp,tp;sizes must be positive"
             "negative;-2x-2;dp,tp;sizes must be positive")
  list(GET spec 0 what)
  list(GET spec 1 shape)
  list(GET spec 2 names)
  list(GET spec 3 message)
  mt_add_mp_test(mesh_invalid_${what} TIMEOUT 60 LABELS mesh ENV MT_TIMEOUT_S=20
    COMMAND ${MT_MESH_MTRUN} --standalone --nproc_per_node 4 ${MT_MESH_PROG}
            --shape ${shape} --names ${names} --expect-error ${message})
endforeach()
mt_add_mp_test(mesh_invalid_disagree TIMEOUT 60 LABELS mesh ENV MT_TIMEOUT_S=20
  COMMAND ${MT_MESH_MTRUN} --standalone --nproc_per_node 4 ${MT_MESH_PROG}
          --shape 2x2 --names dp,tp --last-rank-shape 4x1
          --expect-error "ranks disagree: ranks 0-2 passed shape 2x2 names 'dp','tp'")

# Two mtrun "nodes" on loopback: tp inside each node, dp across; a tp group spanning the nodes
# is refused unless MT_ALLOW_CROSS_HOST_TP=1.
mt_add_mp_test(mesh_two_nodes TIMEOUT 240 LABELS mesh
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/mesh_two_nodes.sh ${MT_MESH_MTRUN} ${MT_MESH_PROG})
