// LeakSanitizer suppressions for the rdma test binaries (linked into rdma_test and rdma_peer).
// UCX is an uninstrumented system library: LeakSanitizer sees a few small blocks allocated inside
// libucs (448 B in 8 objects after an endpoint to a killed owner failed) as leaked at exit. Our own
// allocations are still checked.
extern "C" const char* __lsan_default_suppressions();
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libucs.so\nleak:libucp.so\nleak:libuct.so\n";
}
