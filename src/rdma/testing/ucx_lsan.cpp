// LeakSanitizer suppressions for the rdma test binaries (linked into rdma_test and rdma_peer), so
// that they also pass under ASan outside .ci/run; .ci/run sets the same list for every process
// (.ci/lsan.supp).
// UCX is an uninstrumented system library: LeakSanitizer sees a few small blocks allocated inside
// libucs (448 B in 8 objects after an endpoint to a killed owner failed) as leaked at exit. Our own
// allocations are still checked.
extern "C" const char* __lsan_default_suppressions();
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libucs.so\nleak:libucp.so\nleak:libuct.so\n";
}
