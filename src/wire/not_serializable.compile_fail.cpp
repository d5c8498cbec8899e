// Compiled by check_compile_fail.cmake (not part of any target): encoding a type with no cereal
// serialisation must stop at monarch::wire's static_assert.
#include "monarch/wire/serialize.hpp"

struct NoSerialize {
  int x = 0;
#ifdef MONARCH_WIRE_EXPECT_OK
  template <class Archive>
  void serialize(Archive& ar) {
    ar(x);
  }
#endif
};

int main() {
  auto bytes = monarch::wire::encode(NoSerialize{});
  monarch::wire::encode_into(std::vector<NoSerialize>(1), bytes);  // elements are checked too
  return static_cast<int>(monarch::wire::decode<NoSerialize>(bytes).x);
}
