// A one-member gloo allreduce, linked against the installed monarch::ft_torch (and libtorch).
#include <chrono>
#include <cstdio>
#include <vector>

#include "monarch/ft/torch/allreduce.hpp"

int main() {
  monarch::ft::StoreServer store;
  monarch::ft::AllreduceGroup group;
  group.configure(store.host(), store.port(), "q0", 0, 1, std::chrono::seconds(10));
  std::vector<float> data{1, 2, 3};
  group.allreduce_sum(data);
  std::printf("ft_torch_app: %g %g %g\n", data[0], data[1], data[2]);
}
