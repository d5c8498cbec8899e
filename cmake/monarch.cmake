# Shared build helpers for monarch-cpp layers.

# Warnings are errors on our own code only; third-party headers come in through -isystem.
set(MONARCH_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Werror)

if(MONARCH_SANITIZE)
  add_compile_options(-fsanitize=${MONARCH_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${MONARCH_SANITIZE})
  if(MONARCH_SANITIZE MATCHES "thread" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # asio's handler completion uses std::atomic_thread_fence, which TSan does not model; gcc 12
    # warns about it (-Wtsan). The handoffs it guards also go through asio's mutex-protected
    # queues, which TSan does see.
    add_compile_options(-Wno-tsan)
  endif()
endif()

# monarch_add_library(NAME SOURCES...): one library target per layer with public headers under
# include/monarch/<layer>/.
function(monarch_add_library name)
  add_library(${name} ${ARGN})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/include)
  target_compile_options(${name} PRIVATE ${MONARCH_WARNINGS})
endfunction()

# monarch_add_test(NAME SOURCES... LIBS libs... [LABELS labels...]): a GoogleTest binary registered
# with CTest. Label "concurrency" marks tests that .ci/run also runs under ThreadSanitizer.
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
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}")
endfunction()
