// Helper process for the rdma tests: owns a registered buffer, or reads/writes someone else's.
//
//   rdma_peer owner SIZE SEED [FLAGS]    prints "HANDLE <hex>", then serves stdin commands:
//                                          sum OFFSET LEN  -> "SUM <checksum>"
//                                          drop            -> "DROPPED"
//                                          drop-sum        -> "DROPPED <checksum> <first 8 B>
//                                                             <last 8 B>", read at once after drop
//                                        and exits at EOF on stdin. FLAGS (comma-separated):
//                                        alloc = RdmaBuffer::allocate (shm route), nodump =
//                                        prctl(PR_SET_DUMPABLE, 0) (refuses ptrace-like access),
//                                        readonly = RdmaBuffer::read_only.
//   rdma_peer read-route HANDLE OFFSET SIZE [noptrace]  reads; "SUM <checksum> ROUTE <route_for
//                                        after the read>"; noptrace first drops CAP_SYS_PTRACE.
//   rdma_peer read HANDLE OFFSET SIZE    prints "SUM <checksum>" or "ERROR <code> <message>"
//   rdma_peer write HANDLE OFFSET SIZE SEED  writes the pattern (base OFFSET); "OK" or "ERROR ..."
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "monarch/rdma/rdma.hpp"
#include "rdma/testing/pattern.hpp"

using namespace monarch::rdma;

namespace {

int report_error(const RdmaError& e) {
  std::printf("ERROR %d %s\n", static_cast<int>(e.errc()), e.what());
  std::fflush(stdout);
  return 0;
}

/// Drops CAP_SYS_PTRACE from the effective set (a root requester then gets EPERM from
/// process_vm_readv and /proc/<pid>/fd of a non-dumpable owner, like an unprivileged one).
bool drop_ptrace_capability() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (::syscall(SYS_capget, &hdr, data) != 0) return false;
  data[CAP_TO_INDEX(CAP_SYS_PTRACE)].effective &= ~CAP_TO_MASK(CAP_SYS_PTRACE);
  return ::syscall(SYS_capset, &hdr, data) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  std::string mode = argv[1];
  try {
    if (mode == "owner" && (argc == 4 || argc == 5)) {
      size_t size = std::stoull(argv[2]);
      std::string flags = argc == 5 ? argv[4] : "";
      if (flags.find("nodump") != std::string::npos) ::prctl(PR_SET_DUMPABLE, 0);
      std::vector<std::byte> vec;
      RdmaBuffer buf = [&] {
        if (flags.find("alloc") != std::string::npos)
          return RdmaBuffer::allocate(size, "peer-buffer");
        vec.resize(size);
        if (flags.find("readonly") != std::string::npos)
          return RdmaBuffer::read_only(vec, "peer-buffer");
        return RdmaBuffer(vec, "peer-buffer");
      }();
      std::span<std::byte> mem = buf.memory();
      testing::fill(mem, std::stoull(argv[3]));
      buf.sync();
      std::printf("HANDLE %s\n", testing::to_hex(buf.handle()).c_str());
      std::fflush(stdout);
      std::string cmd;
      while (std::cin >> cmd) {
        if (cmd == "sum") {
          size_t off = 0, len = 0;
          std::cin >> off >> len;
          buf.sync();  // the test told us (over stdin) that its writes completed
          uint64_t sum = testing::checksum(std::span<const std::byte>(mem).subspan(off, len));
          buf.sync();  // our reads come before the writes the test makes after our answer
          std::printf("SUM %llu\n", static_cast<unsigned long long>(sum));
        } else if (cmd == "drop") {
          buf.drop();
          std::printf("DROPPED\n");
        } else if (cmd == "drop-sum") {
          buf.drop();
          buf.sync();
          // At once: the last word, then the first (a copy still running forward would show
          // different patterns there), then the checksum of everything.
          uint64_t last = 0, first = 0;
          std::memcpy(&last, mem.data() + mem.size() - 8, 8);
          std::memcpy(&first, mem.data(), 8);
          std::printf(
              "DROPPED %llu %llu %llu\n", static_cast<unsigned long long>(testing::checksum(mem)),
              static_cast<unsigned long long>(first), static_cast<unsigned long long>(last));
        }
        std::fflush(stdout);
      }
      return 0;
    }
    if (mode == "read" && argc == 5) {
      RdmaHandle h = testing::from_hex(argv[2]);
      std::vector<std::byte> dst(std::stoull(argv[4]));
      h.read_into(dst, std::stoull(argv[3])).get();
      std::printf("SUM %llu\n", static_cast<unsigned long long>(testing::checksum(dst)));
      return 0;
    }
    if (mode == "read-then-freeze" && argc == 5) {  // reads, prints SUM, then stops itself
      RdmaHandle h = testing::from_hex(argv[2]);
      std::vector<std::byte> dst(std::stoull(argv[4]));
      h.read_into(dst, std::stoull(argv[3])).get();
      std::printf("SUM %llu\n", static_cast<unsigned long long>(testing::checksum(dst)));
      std::fflush(stdout);
      ::raise(SIGSTOP);  // never acknowledges what it received (its ack interval is long)
      return 0;
    }
    if (mode == "read-route" && (argc == 5 || argc == 6)) {
      if (argc == 6 && !drop_ptrace_capability()) {
        std::printf("SKIP cannot drop CAP_SYS_PTRACE\n");
        return 0;
      }
      RdmaHandle h = testing::from_hex(argv[2]);
      std::vector<std::byte> dst(std::stoull(argv[4]));
      h.read_into(dst, std::stoull(argv[3])).get();
      std::printf("SUM %llu ROUTE %s\n", static_cast<unsigned long long>(testing::checksum(dst)),
                  route_for(h).c_str());
      return 0;
    }
    if (mode == "write" && argc == 6) {
      RdmaHandle h = testing::from_hex(argv[2]);
      uint64_t off = std::stoull(argv[3]);
      std::vector<std::byte> src(std::stoull(argv[4]));
      testing::fill(src, std::stoull(argv[5]), off);
      h.write_from(src, off).get();
      std::printf("OK\n");
      return 0;
    }
  } catch (const RdmaError& e) {
    return report_error(e);
  } catch (const std::exception& e) {
    std::printf("ERROR 0 %s\n", e.what());
    return 1;
  }
  return 2;
}
