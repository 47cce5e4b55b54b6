# Writes OUT (harness/src/version.cpp.in filled in) at build time, so that every build records the commit it was
# built from: a stamp taken at configure time stays on the configure-time commit through every later incremental
# build. VARS is the configure-time half (the project version, build options, toolkit, and FLASHBENCH_SOURCE_SHA when
# given, written by harness/CMakeLists.txt); this script adds the source tree's git sha and whether it is dirty.
# configure_file leaves OUT untouched when nothing changed, so an unchanged commit recompiles nothing.
cmake_minimum_required(VERSION 3.24)
include(${VARS})
if(FLASHBENCH_SOURCE_SHA)
  set(FLASHBENCH_GIT_SHA "${FLASHBENCH_SOURCE_SHA}")
else()
  execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SRC_DIR}
                  OUTPUT_VARIABLE FLASHBENCH_GIT_SHA OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SRC_DIR}
                  OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT FLASHBENCH_GIT_SHA)
    set(FLASHBENCH_GIT_SHA "unknown")
  elseif(dirty)
    set(FLASHBENCH_GIT_SHA "${FLASHBENCH_GIT_SHA}-dirty")
  endif()
endif()
configure_file(${IN} ${OUT} @ONLY)
