# Shared helpers for kvcache targets: warnings on our own code only (never on generated
# protobuf sources) and sanitizer flags chosen by KVC_SANITIZE.

function(kvc_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -Werror=unused-result
      -Werror=return-type>)
endfunction()

# KVC_SANITIZE: "" | "address,undefined" | "thread". Applied globally so every object,
# including generated code and tests, is instrumented the same way.
set(KVC_SANITIZE "" CACHE STRING "Sanitizers to build with (address,undefined | thread)")
if(KVC_SANITIZE)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${KVC_SANITIZE}>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>)
  if(KVC_SANITIZE MATCHES "undefined")
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=undefined>)
  endif()
  add_link_options(-fsanitize=${KVC_SANITIZE})
endif()

# Tests whose time limit is tight for the model-driving runs multiply it by this: the
# reference model runs ~3x slower under ASan and up to ~8x under TSan on 2 cores.
set(KVC_TEST_TIMEOUT_SCALE 1)
if(KVC_SANITIZE)
  set(KVC_TEST_TIMEOUT_SCALE 3)
endif()

# kvc_expose(<target> [PRIVATE] <path>...): the headers <target> offers, and nothing else.
# Each <path> is a folder (or a single file) relative to the repository root. It stays
# includable by its full path ("cachesvc/core/store/kv_store.h") from an include root in the build
# tree that holds only the exposed paths, each one a symlink:
#   ${CMAKE_BINARY_DIR}/include/<target>/cachesvc/core -> <repository>/cachesvc/core
# The root becomes the target's include directory: PUBLIC for a library, INTERFACE for an
# interface library, PRIVATE for an executable. With PRIVATE, a library's own private folder
# gets a root of its own, include/<target>.private, that its users never see. A source file
# therefore reaches the folders of its own target and of what that target links, nothing
# more: an #include across a forbidden edge is "file not found". Made at configure time
# (nothing is copied, so edits are seen at once, and a configure rebuilds nothing); each root
# is made afresh on every configure, so an exposure taken away is gone.
get_filename_component(KVC_SOURCE_ROOT "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
function(kvc_expose target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "PRIVATE" "" "")
  if(NOT arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "kvc_expose(${target}): no path given")
  endif()
  get_target_property(type ${target} TYPE)
  set(root ${CMAKE_BINARY_DIR}/include/${target})
  if(type STREQUAL "INTERFACE_LIBRARY")
    set(scope INTERFACE)
  elseif(type STREQUAL "EXECUTABLE")
    set(scope PRIVATE)
  elseif(arg_PRIVATE)
    set(scope PRIVATE)
    string(APPEND root .private)
  else()
    set(scope PUBLIC)
  endif()
  # clang-tidy and clang-format look for their configuration next to a header's path as
  # included, here in the build tree: without these, clang-tidy would check the headers with
  # its defaults (no naming rules) instead of the repository's .clang-tidy.
  foreach(config .clang-tidy .clang-format)
    set(link ${CMAKE_BINARY_DIR}/include/${config})
    if(EXISTS ${KVC_SOURCE_ROOT}/${config} AND NOT IS_SYMLINK ${link})
      file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/include)
      file(CREATE_LINK ${KVC_SOURCE_ROOT}/${config} ${link} SYMBOLIC)
    endif()
  endforeach()
  get_property(made GLOBAL PROPERTY "KVC_EXPOSE_ROOT_${root}" SET)
  if(NOT made)  # the first call for this root in this configure run
    file(REMOVE_RECURSE ${root})  # what an earlier run made (removes links, never follows them)
    file(MAKE_DIRECTORY ${root})
    set_property(GLOBAL PROPERTY "KVC_EXPOSE_ROOT_${root}" TRUE)
    target_include_directories(${target} ${scope} $<BUILD_INTERFACE:${root}>)
  endif()
  foreach(path IN LISTS arg_UNPARSED_ARGUMENTS)
    string(REGEX REPLACE "/+$" "" path "${path}")
    if(IS_ABSOLUTE "${path}" OR path MATCHES "(^|/)\\.\\.?(/|$)" OR
       NOT EXISTS ${KVC_SOURCE_ROOT}/${path})
      message(FATAL_ERROR "kvc_expose(${target}): '${path}' is not a path in the repository")
    endif()
    # Never write through a link made above (it would land in the source tree).
    set(prefix ${root})
    string(REPLACE "/" ";" parts "${path}")
    foreach(part IN LISTS parts)
      string(APPEND prefix /${part})
      if(IS_SYMLINK ${prefix} OR (prefix STREQUAL "${root}/${path}" AND EXISTS ${prefix}))
        message(FATAL_ERROR "kvc_expose(${target}): '${path}' overlaps a path exposed before")
      endif()
    endforeach()
    get_filename_component(parent ${root}/${path} DIRECTORY)
    file(MAKE_DIRECTORY ${parent})
    file(CREATE_LINK ${KVC_SOURCE_ROOT}/${path} ${root}/${path} SYMBOLIC)
  endforeach()
endfunction()

# gtest_discover_tests for a suite whose fixtures create their pools on
# testing::TestPoolDevice() (tests/testing/pool_device.h): as it is (label `label`) in every
# build but the cudasim one (KVC_CUDA_SIM), where the same suite runs on a simulated device
# pool instead: KVC_TEST_POOL_DEVICE=cuda:0, each test named <Suite.Test>@cuda_sim and
# labelled device_sim (the simulator is slow, so the timeout is 600 s there).
function(kvc_discover_pool_tests target label timeout)
  if(KVC_CUDA_SIM)
    gtest_discover_tests(${target} DISCOVERY_TIMEOUT 60 TEST_SUFFIX "@cuda_sim"
      PROPERTIES LABELS device_sim TIMEOUT 600 ENVIRONMENT KVC_TEST_POOL_DEVICE=cuda:0)
  else()
    gtest_discover_tests(${target} DISCOVERY_TIMEOUT 60
      PROPERTIES LABELS ${label} TIMEOUT ${timeout})
  endif()
endfunction()
