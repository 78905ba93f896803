# kvc_longctx_service_demo: the 1M-token demo through the service core (KvStore with a device
# pool). It needs cachesvc/, so it is defined from tests/CMakeLists.txt (in-tree builds only),
# not from tests/gpu/CMakeLists.txt (which also serves the standalone kernels/ build).
add_executable(kvc_longctx_service_demo ${CMAKE_CURRENT_LIST_DIR}/longctx_service_demo.cc)
target_link_libraries(kvc_longctx_service_demo PRIVATE kvc_cachesvc_core absl::flags
  absl::flags_parse absl::str_format)
kvc_set_warnings(kvc_longctx_service_demo)
set_target_properties(kvc_longctx_service_demo PROPERTIES
  RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/gpu)
if(KVC_BUILD_TESTS)
  # Small (the simulator runs kernels on fibers): on a host pool in every build; on the
  # simulated cuda:0 in the cudasim build (device-resident appends, Attend on device memory).
  if(KVC_CUDA_SIM)
    add_test(NAME kvc_longctx_service_demo@cuda_sim
             COMMAND kvc_longctx_service_demo --device=cuda:0 --tokens=2048 --layers=2 --steps=1
                     --needles=4 --chunk=700)
    set_tests_properties(kvc_longctx_service_demo@cuda_sim PROPERTIES LABELS device_sim
                         TIMEOUT 600)
  else()
    add_test(NAME kvc_longctx_service_demo_cpu
             COMMAND kvc_longctx_service_demo --device=cpu --tokens=4096 --layers=4 --steps=1
                     --needles=6 --chunk=1000)
    set_tests_properties(kvc_longctx_service_demo_cpu PROPERTIES LABELS unit TIMEOUT 120)
  endif()
endif()
