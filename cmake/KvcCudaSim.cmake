# KVC_CUDA_SIM (the cudasim preset): the CUDA backend built against tests/kernels/cudasim, the
# host simulator of the CUDA runtime, instead of nvcc and libcudart. Every program of such a
# build (kvcached, the core and service tests) then has a working "cuda:0" device whose memory
# the host cannot touch outside device work, whose streams run only at synchronization points
# and whose blocks run in any order (see tests/kernels/cudasim/cuda_runtime.h): the service's
# device-pool path (allocation, staging copies, streams, every kernel) runs in CI without a
# GPU. A test build only: the kernels run on fibers, thousands of times slower than a GPU.
# Included from kernels/CMakeLists.txt; defines kvc_kernels_cuda as kernels/cuda does.
set(_kvc_sim_dir ${CMAKE_CURRENT_SOURCE_DIR}/../tests/kernels/cudasim)
set(_kvc_sim_gen)
foreach(cu ${KVC_CUDA_KERNEL_UNITS})
  set(_out ${CMAKE_CURRENT_BINARY_DIR}/cudasim_gen/${cu}.cc)
  add_custom_command(OUTPUT ${_out}
    COMMAND ${CMAKE_COMMAND} -DIN=${CMAKE_CURRENT_SOURCE_DIR}/cuda/${cu}.cu -DOUT=${_out}
            -P ${_kvc_sim_dir}/transform.cmake
    DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/cuda/${cu}.cu ${_kvc_sim_dir}/transform.cmake
    COMMENT "cudasim: ${cu}.cu as C++")
  list(APPEND _kvc_sim_gen ${_out})
endforeach()
add_library(kvc_kernels_cuda STATIC cuda/cuda_backend.cc ${_kvc_sim_dir}/cudasim.cc
  ${_kvc_sim_dir}/cudasim_memory.cc ${_kvc_sim_dir}/cudasim_scheduler.cc
  ${_kvc_sim_dir}/cudasim_streams.cc ${_kvc_sim_gen})
# cudasim's cuda_runtime.h must win over the toolkit's.
target_include_directories(kvc_kernels_cuda BEFORE PRIVATE ${_kvc_sim_dir})
target_include_directories(kvc_kernels_cuda PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/include)
target_compile_definitions(kvc_kernels_cuda PRIVATE KVC_HAVE_CUDA=1 KVC_CUDASIM=1)
target_compile_features(kvc_kernels_cuda PRIVATE cxx_std_17)
target_compile_options(kvc_kernels_cuda PRIVATE -fno-trapping-math -ffp-contract=off
  -Wno-unknown-pragmas -Wno-sign-compare -Wno-maybe-uninitialized -Wno-psabi)
target_link_libraries(kvc_kernels_cuda PUBLIC Threads::Threads)
set_target_properties(kvc_kernels_cuda PROPERTIES POSITION_INDEPENDENT_CODE ON)
kvc_set_warnings(kvc_kernels_cuda)
message(STATUS "kvcache: CUDA backend on cudasim (the host simulator; a test build)")
