# Clang thread-safety analysis guard (the clang-tsa preset sets -Wthread-safety
# -Werror=thread-safety in CMAKE_CXX_FLAGS). Proves at configure time that the analysis really
# checks kvc::Mutex users: cmake/thread_safety_probe.cc must compile as written and must fail
# with each of its KVC_TSA_PROBE_* misuses. Costs a few seconds, in that preset only.
if(NOT (CMAKE_CXX_COMPILER_ID STREQUAL "Clang" AND CMAKE_CXX_FLAGS MATCHES "-Wthread-safety"))
  return()
endif()
if(NOT CMAKE_CXX_FLAGS MATCHES "-Werror=thread-safety")
  message(FATAL_ERROR "-Wthread-safety without -Werror=thread-safety: the analysis would only warn")
endif()

set(_kvc_tsa_probe ${CMAKE_CURRENT_LIST_DIR}/thread_safety_probe.cc)
set(_kvc_tsa_dir ${CMAKE_BINARY_DIR}/CMakeFiles/kvc_tsa_probe)
function(_kvc_tsa_try result define)
  set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)  # compile only; scoped to this function
  try_compile(ok ${_kvc_tsa_dir}/${define} SOURCES ${_kvc_tsa_probe}
    CMAKE_FLAGS "-DINCLUDE_DIRECTORIES=${PROJECT_SOURCE_DIR}"
    COMPILE_DEFINITIONS -D${define}
    CXX_STANDARD ${CMAKE_CXX_STANDARD} CXX_STANDARD_REQUIRED ON
    OUTPUT_VARIABLE out)
  set(${result} ${ok} PARENT_SCOPE)
  set(${result}_OUTPUT "${out}" PARENT_SCOPE)
endfunction()

_kvc_tsa_try(good KVC_TSA_PROBE_NONE)
if(NOT good)
  message(FATAL_ERROR "thread-safety probe: correct kvc::Mutex use is rejected:\n${good_OUTPUT}")
endif()
foreach(misuse UNLOCKED_WRITE UNLOCKED_READ WRITE_UNDER_READER_LOCK REQUIRES_NOT_HELD
               LOCK_NOT_RELEASED)
  _kvc_tsa_try(bad KVC_TSA_PROBE_${misuse})
  if(bad)
    message(FATAL_ERROR "thread-safety probe: ${misuse} compiles: the analysis does not see "
                        "through common/mutex.h (a missing annotation?)")
  endif()
endforeach()
message(STATUS "Thread-safety analysis: on, and it sees through kvc::Mutex")
