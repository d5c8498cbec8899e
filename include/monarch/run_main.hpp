// run_main: how our programs end on an error, instead of std::terminate's abort.
#pragma once

#include <cstdio>
#include <exception>

namespace monarch {

/// For a program's main(): `int main(int argc, char** argv) { return monarch::run_main(argv[0],
/// [&] { return run(argc, argv); }); }`. Returns body()'s exit status. An exception that escapes
/// body() (a ConfigError from a bad MONARCH_* variable, say) is printed to stderr as
/// "PROGRAM: error: MESSAGE" and gives exit status 1, instead of std::terminate's abort. Runs
/// body() on the calling thread.
template <class Body>
int run_main(const char* program, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
  } catch (...) {
    std::fprintf(stderr, "%s: error: unknown exception\n", program);
  }
  return 1;
}

}  // namespace monarch
