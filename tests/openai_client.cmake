# qkv serve through OpenAI's official Node client: install the npm package `openai` (once, into
# WORK), then let tests/serve_test.py train a tiny language model, serve it and run
# tests/openai_client.mjs against it (models.list / retrieve, completions plain and streamed,
# errors as the client's typed exceptions).
# Run as: cmake -DQKV=path/to/qkv -DPYTHON=/usr/bin/python3 -DSRC=source/root -DWORK=scratch/dir -P openai_client.cmake
# Needs node and npm, and the npm registry the first time.
cmake_minimum_required(VERSION 3.22)
set(package openai)
set(version 6.49.0)  # the last major version that runs on Debian 12's Node 20 (7.x needs Node 22)

foreach(var QKV PYTHON SRC WORK)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "openai_client: -D${var}=... is required (see the top of ${CMAKE_CURRENT_LIST_FILE})")
  endif()
endforeach()
find_program(NODE node)
find_program(NPM npm)
if(NOT NODE OR NOT NPM)
  message(FATAL_ERROR "openai_client: needs node and npm on PATH (found node: ${NODE}, npm: ${NPM})")
endif()

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 600)
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " cmd)
    message(FATAL_ERROR "openai_client: ${what} failed (${rc}):\n  ${cmd}\nstdout:\n${out}\nstderr:\n${err}")
  endif()
  message(STATUS "${out}${err}")
endfunction()

set(modules ${WORK}/npm/node_modules)
set(pkg ${modules}/${package})
set(installed "")
if(EXISTS ${pkg}/package.json)
  file(READ ${pkg}/package.json manifest)
  string(JSON installed ERROR_VARIABLE json_error GET "${manifest}" version)
endif()
if(NOT installed STREQUAL version)
  file(MAKE_DIRECTORY ${WORK}/npm)
  run("npm install" ${NPM} install --no-audit --no-fund --prefix ${WORK}/npm ${package}@${version})
endif()
run("the official client against qkv serve" ${PYTHON} ${SRC}/tests/serve_test.py --qkv ${QKV}
    --openai-client ${modules} --keep ${WORK}/serve)
