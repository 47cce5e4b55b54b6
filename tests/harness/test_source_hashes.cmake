# harness/source_hashes.cmake on a small kernels/ tree: a variant's hash follows the files compiled into it (its own,
# the kernels/ headers it includes transitively, and the .cpp beside an included header) and nothing else: not
# another variant's shared code, not its traffic model.
#   cmake -DSCRIPT=harness/source_hashes.cmake -DWORK=<scratch dir> -P tests/harness/test_source_hashes.cmake
cmake_minimum_required(VERSION 3.24)
set(K ${WORK}/kernels)
file(REMOVE_RECURSE ${WORK})
file(WRITE ${K}/common/a.cuh "#include \"kernels/common/impl.hpp\"\nint a;\n")
file(WRITE ${K}/common/impl.hpp "int impl();\n")
file(WRITE ${K}/common/impl.cpp "int impl() { return 1; }\n")
file(WRITE ${K}/common/b.cuh "int b;\n")
file(WRITE ${K}/common/traffic.hpp "int model;\n")
file(WRITE ${K}/v1/k.cu "#include \"kernels/common/a.cuh\"\n#include \"kernels/common/traffic.hpp\"\n")
file(WRITE ${K}/v1/traffic.hpp "int v1_model;\n")
file(WRITE ${K}/v1/DESIGN.md "notes\n")
file(WRITE ${K}/v2/k.cu "#include \"kernels/common/b.cuh\"\n")

function(hashes out_v1 out_v2)
  execute_process(COMMAND ${CMAKE_COMMAND} -DKERNELS_DIR=${K} -DOUT=${WORK}/h.cpp -P ${SCRIPT}
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "source_hashes.cmake failed: ${rc}")
  endif()
  file(READ ${WORK}/h.cpp text)
  foreach(v v1 v2)
    string(REGEX MATCH "\\{\"${v}\", \"([0-9a-f]+)\"\\}" m "${text}")
    if(NOT CMAKE_MATCH_1)
      message(FATAL_ERROR "no hash for ${v} in:\n${text}")
    endif()
    set(${v} ${CMAKE_MATCH_1})
  endforeach()
  set(${out_v1} ${v1} PARENT_SCOPE)
  set(${out_v2} ${v2} PARENT_SCOPE)
endfunction()

function(expect what changed v1_before v2_before v1_after v2_after)
  set(d1 NO)
  set(d2 NO)
  if(NOT v1_before STREQUAL v1_after)
    set(d1 YES)
  endif()
  if(NOT v2_before STREQUAL v2_after)
    set(d2 YES)
  endif()
  if(NOT "${d1} ${d2}" STREQUAL "${changed}")
    message(FATAL_ERROR "${what}: (v1 v2) changed ${d1} ${d2}, expected ${changed}")
  endif()
  message(STATUS "${what}: changed (v1 v2) ${d1} ${d2}, as expected")
endfunction()

hashes(h1 h2)
if(h1 STREQUAL h2)
  message(FATAL_ERROR "two variants with different sources have one hash")
endif()
set(steps
  "common/b.cuh|int b = 2|NO YES|shared code only v2 includes"
  "common/impl.cpp|int impl2()|YES NO|the .cpp beside a header v1 includes through a.cuh"
  "common/a.cuh|int a2|YES NO|a header v1 includes"
  "common/traffic.hpp|int model2|NO NO|a traffic model"
  "v1/traffic.hpp|int v1_model2|NO NO|the variant's own traffic model"
  "v1/DESIGN.md|other notes|NO NO|notes"
  "common/unused.cuh|int u|NO NO|a new shared file nobody includes"
  "v2/k.cu|int k2|NO YES|the variant's own source")
foreach(step ${steps})
  string(REPLACE "|" ";" parts "${step}")
  list(GET parts 0 file)
  list(GET parts 1 content)
  list(GET parts 2 changed)
  list(GET parts 3 what)
  file(WRITE ${K}/${file} "${content}\n")
  hashes(n1 n2)
  expect("${what}" "${changed}" ${h1} ${h2} ${n1} ${n2})
  set(h1 ${n1})
  set(h2 ${n2})
endforeach()
