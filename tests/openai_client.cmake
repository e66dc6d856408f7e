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
set(TEST_NAME openai_client)
include(${CMAKE_CURRENT_LIST_DIR}/npm_package.cmake)
npm_package(${package} ${version} ${WORK})
run("the official client against qkv serve" ${PYTHON} ${SRC}/tests/serve_test.py --qkv ${QKV}
    --openai-client ${modules} --keep ${WORK}/serve)
