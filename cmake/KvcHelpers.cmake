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
