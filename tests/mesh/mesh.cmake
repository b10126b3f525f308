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

# The last rank flattens a dimension that does not exist: every rank fails within seconds saying
# the ranks disagree, then flattens again correctly (no call pairs with another's next one, which
# would leave the others waiting for MT_TIMEOUT_S).
mt_add_mp_test(mesh_flatten_disagree TIMEOUT 60 LABELS mesh ENV MT_TIMEOUT_S=20
  COMMAND ${MT_MESH_MTRUN} --standalone --nproc_per_node 4 ${MT_MESH_PROG}
          --shape 2x2 --names dp,tp --flatten flat --flatten-disagree)

# Invalid meshes: a non-zero exit within seconds with the message, for every case.
mt_add_mp_test(mesh_invalid TIMEOUT 180 LABELS mesh
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/mesh_invalid.sh ${MT_MESH_MTRUN} ${MT_MESH_PROG})

# Two mtrun "nodes" on loopback: tp inside each node, dp across; a tp group spanning the nodes
# is refused unless MT_ALLOW_CROSS_HOST_TP=1.
mt_add_mp_test(mesh_two_nodes TIMEOUT 240 LABELS mesh
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/mesh_two_nodes.sh ${MT_MESH_MTRUN} ${MT_MESH_PROG})

# Placement under MT_TOPO_FILE: a host whose NVLinks pair GPUs 0-2 and 1-3 gets those pairs as its
# tp groups; a fully switched host keeps the order; MT_DEVICE_MAP overrides.
set(MT_PLACEMENT_FIXTURE ${CMAKE_SOURCE_DIR}/tests/fixtures/placement/nvlink-crossed-pairs-4gpu.xml)
set(MT_SWITCHED_FIXTURE ${CMAKE_SOURCE_DIR}/tests/fixtures/topologies/nccl-ibmcloud-gx3d-h100x8-vsi-topo.xml)
foreach(spec "crossed;${MT_PLACEMENT_FIXTURE};;0,2,1,3" "switched;${MT_SWITCHED_FIXTURE};;0,1,2,3"
             "map;${MT_PLACEMENT_FIXTURE};3,1,2,0;3,1,2,0")
  list(GET spec 0 what)
  list(GET spec 1 file)
  list(GET spec 2 map)
  list(GET spec 3 gpus)
  mt_add_mp_test(mesh_placement_${what} TIMEOUT 60 LABELS mesh
    ENV MT_TIMEOUT_S=20 MT_DEVICE=cpu MT_TOPO_FILE=${file} MT_DEVICE_MAP=${map}
    COMMAND ${MT_MESH_MTRUN} --standalone --nproc_per_node 4 ${MT_MESH_PROG}
            --shape 2x2 --names dp,tp --expect-gpus ${gpus})
endforeach()
