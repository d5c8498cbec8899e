# Shared build helpers for monarch-cpp layers.
include(GNUInstallDirs)

# Warnings are errors on our own code only; third-party headers come in through -isystem.
set(MONARCH_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Werror)

# MONARCH_SANITIZE_FLAGS: the compile flags of a sanitizer build (also given to the outside
# project of install_consumer_test).
set(MONARCH_SANITIZE_FLAGS "")
if(MONARCH_SANITIZE)
  set(MONARCH_SANITIZE_FLAGS -fsanitize=${MONARCH_SANITIZE} -fno-omit-frame-pointer
                             -fno-sanitize-recover=all)
  if(MONARCH_SANITIZE MATCHES "thread" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # asio's handler completion uses std::atomic_thread_fence, which TSan does not model; gcc 12
    # warns about it (-Wtsan). The handoffs it guards also go through asio's mutex-protected
    # queues, which TSan does see.
    list(APPEND MONARCH_SANITIZE_FLAGS -Wno-tsan)
  endif()
  add_compile_options(${MONARCH_SANITIZE_FLAGS})
  add_link_options(-fsanitize=${MONARCH_SANITIZE})
endif()

# monarch_add_library(monarch_<layer> [STATIC|INTERFACE|...] SOURCES...): one library target per
# layer with public headers under include/monarch/<layer>/. It is also reachable as
# monarch::<layer> (an ALIAS here, the same name in an installed tree: EXPORT_NAME), and it is
# registered in the global property MONARCH_INSTALL_TARGETS, which the top-level CMakeLists.txt
# installs and exports (install(EXPORT monarchTargets)) once every layer has been added.
function(monarch_add_library name)
  add_library(${name} ${ARGN})
  string(REGEX REPLACE "^monarch_" "" layer ${name})
  add_library(monarch::${layer} ALIAS ${name})
  set_target_properties(${name} PROPERTIES EXPORT_NAME ${layer})
  get_target_property(type ${name} TYPE)
  if(type STREQUAL "INTERFACE_LIBRARY")
    set(scope INTERFACE)
  else()
    set(scope PUBLIC)
    target_compile_options(${name} PRIVATE ${MONARCH_WARNINGS})
  endif()
  target_include_directories(${name} ${scope} $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                             $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(${name} ${scope} cxx_std_20)  # the headers need C++20, in users too
  set_property(GLOBAL APPEND PROPERTY MONARCH_INSTALL_TARGETS ${name})
endfunction()

# monarch_add_test(NAME SOURCES... LIBS libs... [LABELS labels...]): a GoogleTest binary registered
# with CTest. Label "concurrency" marks tests that .ci/run also runs under ThreadSanitizer; target
# concurrency-tests builds just those binaries (and what they run), which is all that pass needs.
function(monarch_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main Threads::Threads)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src)  # src/testing/ helpers
  target_compile_options(${name} PRIVATE ${MONARCH_WARNINGS})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME ${name} COMMAND ${name})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  # An instrumented build runs the same work 2-3x slower (ASan's malloc is also libtorch's), and
  # .ci/run runs it two tests at a time: ft_llama_test took over 120 s there beside
  # ft_replica_client_test while it takes about 20 s uninstrumented. The limits are set for the
  # plain build; a sanitizer build doubles them.
  if(MONARCH_SANITIZE)
    math(EXPR T_TIMEOUT "${T_TIMEOUT} * 2")
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}")
  if("concurrency" IN_LIST T_LABELS)
    add_dependencies(concurrency-tests ${name})
  endif()
endfunction()
