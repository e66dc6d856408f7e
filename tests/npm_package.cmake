# What the tests driven by an npm package share (included by their cmake -P scripts; TEST_NAME set
# first, for messages): run(), and npm_package(), which finds node and npm and installs one
# version of a package into WORK/npm once.

# run(what cmd...): runs cmd, shows its output, stops with everything it printed on failure.
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 600)
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " cmd)
    message(FATAL_ERROR "${TEST_NAME}: ${what} failed (${rc}):\n  ${cmd}\nstdout:\n${out}\nstderr:\n${err}")
  endif()
  message(STATUS "${out}${err}")
endfunction()

# npm_package(package version work): NODE (the node program), `modules` (work/npm/node_modules)
# and `pkg` (the package's directory) set in the caller, the package installed unless this version
# is already there.
macro(npm_package package version work)
  find_program(NODE node)
  find_program(NPM npm)
  if(NOT NODE OR NOT NPM)
    message(FATAL_ERROR "${TEST_NAME}: needs node and npm on PATH (found node: ${NODE}, npm: ${NPM})")
  endif()
  set(modules ${work}/npm/node_modules)
  set(pkg ${modules}/${package})
  set(installed "")
  if(EXISTS ${pkg}/package.json)
    file(READ ${pkg}/package.json manifest)
    string(JSON installed ERROR_VARIABLE json_error GET "${manifest}" version)
  endif()
  if(NOT installed STREQUAL "${version}")
    file(MAKE_DIRECTORY ${work}/npm)
    run("npm install" ${NPM} install --no-audit --no-fund --prefix ${work}/npm ${package}@${version})
  endif()
endmacro()
