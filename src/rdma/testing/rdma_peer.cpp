// Helper process for the rdma tests: owns a registered buffer, or reads/writes someone else's.
//
//   rdma_peer owner SIZE SEED            prints "HANDLE <hex>", then serves stdin commands:
//                                          sum OFFSET LEN  -> "SUM <checksum>"
//                                          drop            -> "DROPPED"
//                                        and exits at EOF on stdin.
//   rdma_peer read HANDLE OFFSET SIZE    prints "SUM <checksum>" or "ERROR <code> <message>"
//   rdma_peer write HANDLE OFFSET SIZE SEED  writes the pattern (base OFFSET); "OK" or "ERROR ..."
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "monarch/rdma/rdma.hpp"
#include "rdma/testing/pattern.hpp"

using namespace monarch::rdma;

namespace {

int report_error(const RdmaError& e) {
  std::printf("ERROR %d %s\n", static_cast<int>(e.code()), e.what());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  std::string mode = argv[1];
  try {
    if (mode == "owner" && argc == 4) {
      size_t size = std::stoull(argv[2]);
      std::vector<std::byte> mem(size);
      testing::fill(mem, std::stoull(argv[3]));
      RdmaBuffer buf(mem, "peer-buffer");
      std::printf("HANDLE %s\n", testing::to_hex(buf.handle()).c_str());
      std::fflush(stdout);
      std::string cmd;
      while (std::cin >> cmd) {
        if (cmd == "sum") {
          size_t off = 0, len = 0;
          std::cin >> off >> len;
          buf.sync();  // the test told us (over stdin) that its writes completed
          std::printf("SUM %llu\n", static_cast<unsigned long long>(testing::checksum(
                                        std::span<const std::byte>(mem).subspan(off, len))));
        } else if (cmd == "drop") {
          buf.drop();
          std::printf("DROPPED\n");
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
