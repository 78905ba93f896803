# Optional CUDA: enabled when KVC_ENABLE_CUDA is ON and nvcc is found (PATH, CUDACXX or
# CMAKE_CUDA_COMPILER). Sets KVC_HAVE_CUDA. Architectures default to sm_80 and sm_90;
# "native" is never used because it fails on machines without a GPU.
# Included from kernels/CMakeLists.txt (in-tree and standalone); safe to include twice.
if(NOT DEFINED KVC_ENABLE_CUDA)
  set(KVC_ENABLE_CUDA ON)
endif()
set(KVC_HAVE_CUDA OFF)
if(KVC_ENABLE_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    enable_language(CUDA)
    # GLOBAL: CUDA::cudart_static is linked by targets in sibling directories (tests/).
    if(NOT TARGET CUDA::cudart_static)
      find_package(CUDAToolkit REQUIRED GLOBAL)
    endif()
    set(KVC_HAVE_CUDA ON)
    message(STATUS "kvcache: CUDA ${CMAKE_CUDA_COMPILER_VERSION}, archs ${CMAKE_CUDA_ARCHITECTURES}")
  else()
    message(STATUS "kvcache: nvcc not found; building without CUDA")
  endif()
endif()
