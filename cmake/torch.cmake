# libtorch (Debian libtorch-dev) for the FT pieces. Provides monarch::torch, an interface target
# whose headers come in as SYSTEM (so -Werror stays on our code only) and which links torch,
# torch_cpu and c10 with c10d's gloo backend enabled (USE_C10D_GLOO, from torch_cpu).
find_package(Torch QUIET PATHS /usr/lib/x86_64-linux-gnu/cmake/Torch)
if(NOT Torch_FOUND)
  message(FATAL_ERROR "MONARCH_BUILD_FT is ON but libtorch was not found: run `make deps` "
                      "(installs libtorch-dev libgloo-dev), or configure with -DMONARCH_BUILD_FT=OFF")
endif()
find_path(GLOO_INCLUDE_DIR gloo/config.h)
if(NOT GLOO_INCLUDE_DIR)
  message(FATAL_ERROR "gloo headers (needed by c10d ProcessGroupGloo.hpp) not found: run `make deps` "
                      "(installs libgloo-dev)")
endif()
# libgloo itself: AllreduceGroup ends a gloo op in flight through its TCP pairs
# (gloo::transport::tcp::Pair::signalExceptionExternal), and wakes the TCP device's event loop
# (gloo::transport::tcp::Device::registerDescriptor), beyond what c10d exposes.
find_library(GLOO_LIBRARY gloo)
if(NOT GLOO_LIBRARY)
  message(FATAL_ERROR "libgloo not found: run `make deps` (installs libgloo-dev)")
endif()
add_library(monarch_torch INTERFACE)
add_library(monarch::torch ALIAS monarch_torch)
# Installed and exported with the layers (monarch_ft_torch links it), as monarch::torch; the
# installed monarchConfig.cmake finds Torch first (find_dependency) for its imported targets.
set_target_properties(monarch_torch PROPERTIES EXPORT_NAME torch)
set_property(GLOBAL APPEND PROPERTY MONARCH_INSTALL_TARGETS monarch_torch)
target_link_libraries(monarch_torch INTERFACE ${TORCH_LIBRARIES} ${GLOO_LIBRARY})
target_include_directories(monarch_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS} ${GLOO_INCLUDE_DIR})
# An NCCL collective path exists only when libtorch was built with CUDA (Debian's is CPU-only).
if(TARGET torch_cuda)
  target_compile_definitions(monarch_torch INTERFACE MONARCH_FT_HAVE_NCCL=1 USE_C10D_NCCL)
  message(STATUS "monarch_ft_torch: CUDA libtorch; NCCL backend enabled")
else()
  message(STATUS "monarch_ft_torch: CPU-only libtorch; gloo backend only")
endif()
