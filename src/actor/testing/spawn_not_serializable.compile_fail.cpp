// Compiled by src/wire/check_compile_fail.cmake (not part of any target): spawn_remote with a
// constructor argument that cannot travel must stop at spawn_remote's own static_assert.
#include "monarch/actor/runtime.hpp"

struct Opaque {
  int x = 0;
#ifdef MONARCH_WIRE_EXPECT_OK
  template <class Archive>
  void serialize(Archive& ar) {
    ar(x);
  }
#endif
};

struct Holder : monarch::Actor {
  explicit Holder(Opaque o) : o_(o) {}
  Opaque o_;
};

int main() {
  monarch::Proc proc;
  auto ref = proc.spawn_remote<Holder>("unix://@nowhere", "holder", Opaque{});
  return ref.valid() ? 0 : 1;
}
