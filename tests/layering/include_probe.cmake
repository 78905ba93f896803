# One include probe of tests/layering: preprocess a one-line source, #include "<HEADER>", with
# the include directories of a target (one a line in DIRS_FILE) and expect EXPECT=FAIL ("file
# not found" for that very include) or EXPECT=PASS (it resolves, and so does all it includes).
#   cmake -DCXX=... -DSTD=-std=c++17 -DDIRS_FILE=... -DIMPLICIT=dir|dir -DHEADER=...
#         -DEXPECT=FAIL|PASS -DWORK=... -P include_probe.cmake
cmake_policy(VERSION 3.25)
file(STRINGS "${DIRS_FILE}" dirs)
list(REMOVE_DUPLICATES dirs)
string(REPLACE "|" ";" implicit "${IMPLICIT}")
set(flags)
foreach(dir IN LISTS dirs)
  # The compiler's own directories (/usr/include) stay implicit: as -I they would break
  # #include_next in the standard library.
  if(dir AND NOT dir IN_LIST implicit)
    list(APPEND flags -I${dir})
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
file(WRITE "${WORK}/probe.cc" "#include \"${HEADER}\"\n")
execute_process(COMMAND ${CXX} ${STD} -E -o /dev/null ${flags} probe.cc
  WORKING_DIRECTORY "${WORK}" RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
list(JOIN flags "\n  " shown)
if(EXPECT STREQUAL "PASS")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "#include \"${HEADER}\" should resolve here but does not (exit ${rc}):\n"
                        "${err}\ninclude directories:\n  ${shown}")
  endif()
  message(STATUS "allowed: #include \"${HEADER}\" resolves")
elseif(EXPECT STREQUAL "FAIL")
  if(rc EQUAL 0)
    set(via "")
    foreach(dir IN LISTS dirs implicit)
      if(dir AND EXISTS "${dir}/${HEADER}")
        set(via " (found through ${dir})")
        break()
      endif()
    endforeach()
    message(FATAL_ERROR "#include \"${HEADER}\" crosses a forbidden dependency edge but "
                        "resolves${via}; include directories:\n  ${shown}")
  endif()
  # The probe's own include must be the one not found, not something it includes.
  set(not_found "probe\\.cc:1:[0-9]+: fatal error: [^\n]*(No such file|file not found)")
  if(NOT err MATCHES "${not_found}")
    message(FATAL_ERROR "#include \"${HEADER}\" failed, but not as a missing file:\n${err}")
  endif()
  message(STATUS "forbidden: #include \"${HEADER}\" is not found, as it must be")
else()
  message(FATAL_ERROR "EXPECT must be PASS or FAIL, not '${EXPECT}'")
endif()
