# Shared by the command-line tests: run qkv and check what it printed and wrote.
# run_qkv_stdin(rc input out err args...): runs ${QKV} args with the file `input` on standard
# input, fails unless the exit code is rc; out and err receive what it printed.
function(run_qkv_stdin expect_rc input out_var err_var)
  execute_process(COMMAND ${QKV} ${ARGN} INPUT_FILE ${input} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL expect_rc)
    message(FATAL_ERROR "qkv ${ARGN} < ${input}: exit code ${rc}, expected ${expect_rc}\nstdout: ${out}\nstderr: ${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
  set(${err_var} "${err}" PARENT_SCOPE)
endfunction()
# run_qkv(rc out err args...): the same with nothing on standard input.
function(run_qkv expect_rc out_var err_var)
  run_qkv_stdin(${expect_rc} /dev/null out err ${ARGN})
  set(${out_var} "${out}" PARENT_SCOPE)
  set(${err_var} "${err}" PARENT_SCOPE)
endfunction()

function(expect_contains text needle what)
  string(FIND "${text}" "${needle}" pos)
  if(pos EQUAL -1)
    message(FATAL_ERROR "${what}: expected to find '${needle}' in:\n${text}")
  endif()
endfunction()
function(expect_file path what)
  if(NOT EXISTS "${path}")
    message(FATAL_ERROR "${what}: ${path} was not written")
  endif()
endfunction()

