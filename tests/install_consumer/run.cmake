# install_consumer_test (registered in cmake/install.cmake):
#   cmake -DBUILD_DIR=... -DWORK_DIR=... -DGENERATOR=... -DCXX=... -DBUILD_TYPE=...
#         [-DCXX_FLAGS=...] [-DLAUNCHER=...] [-DWITH_FT=ON] -P run.cmake
# Installs the build tree BUILD_DIR into WORK_DIR/prefix, then configures and builds this
# directory's project against it with find_package(monarch) (the same compiler, build type and,
# in a sanitizer build, the same -fsanitize flags: CXX_FLAGS), and runs its programs and the
# installed `monarch` CLI. Needs a built tree (after `cmake --build`), as `cmake --install` does.
set(prefix ${WORK_DIR}/prefix)
set(consumer ${WORK_DIR}/build)
file(REMOVE_RECURSE ${WORK_DIR})

function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install_consumer_test: ${what} failed (${rc}):\n${out}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

function(expect what text)  # a literal substring of the last step's output
  string(FIND "${step_output}" "${text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "install_consumer_test: ${what}: expected \"${text}\" in:\n${step_output}")
  endif()
  message(STATUS "ok: ${what}")
endfunction()

step("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(f lib/cmake/monarch/monarchConfig.cmake include/monarch/actor/runtime.hpp bin/monarch)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "install_consumer_test: ${prefix}/${f} was not installed")
  endif()
endforeach()

set(args -S ${CMAKE_CURRENT_LIST_DIR} -B ${consumer} -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
    -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=${BUILD_TYPE} "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}")
if(LAUNCHER)
  list(APPEND args -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()
step("configure the consumer" ${CMAKE_COMMAND} ${args})
# find_package must have taken the installed config, not a build tree.
expect("find_package(monarch) found the installed tree" "from ${prefix}/")
step("build the consumer" ${CMAKE_COMMAND} --build ${consumer} --parallel 2)

step("run actor_app (monarch::actor)" ${consumer}/actor_app)
expect("actor_app" "actor_app: 5 10")
step("run mesh_app (monarch::mesh)" ${consumer}/mesh_app)
expect("mesh_app" "mesh_app: {hosts=2, gpus=2} sum=46")
if(WITH_FT)
  step("run ft_torch_app (monarch::ft_torch)" ${consumer}/ft_torch_app)
  expect("ft_torch_app" "ft_torch_app: 1 2 3")
endif()
step("run the installed monarch CLI" ${prefix}/bin/monarch --help)
expect("bin/monarch --help" "agent")
