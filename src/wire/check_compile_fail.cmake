# cmake -DCXX=... -DINCLUDE_DIR=... -DSOURCE=... [-DEXPECTED=...] -P check_compile_fail.cmake
# Passes when SOURCE fails to compile with the static_assert message EXPECTED (default: the wire
# one), and compiles with -DMONARCH_WIRE_EXPECT_OK (the control: the same file with a serialisable
# type).
if(DEFINED EXPECTED)
  set(expected "${EXPECTED}")
else()
  set(expected "type T is not serialisable")
endif()
execute_process(
  COMMAND ${CXX} -std=c++20 -fsyntax-only -I${INCLUDE_DIR} ${SOURCE}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "expected ${SOURCE} to fail to compile, but it compiled")
endif()
string(FIND "${out}" "${expected}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "compile failed but without \"${expected}\":\n${out}")
endif()
execute_process(
  COMMAND ${CXX} -std=c++20 -fsyntax-only -DMONARCH_WIRE_EXPECT_OK -I${INCLUDE_DIR} ${SOURCE}
  RESULT_VARIABLE rc_ok OUTPUT_VARIABLE out_ok ERROR_VARIABLE out_ok)
if(NOT rc_ok EQUAL 0)
  message(FATAL_ERROR "control (-DMONARCH_WIRE_EXPECT_OK) failed to compile:\n${out_ok}")
endif()
message(STATUS "ok: rejected at compile time with \"${expected}\"")
