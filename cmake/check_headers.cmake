# check-headers: compiles every public header under include/monarch/ alone, so that each one
# includes what it uses. One generated .cpp per header includes it (twice: the include guard is
# checked too), compiled with the project's warnings (-Werror) and only the usage requirements
# of the library that owns the header (monarch/<layer>/... -> monarch_<layer>). Not part of
# `all`: `cmake --build build --target check-headers` (.ci/run does).
# Headers under monarch/ft/torch/ belong to monarch_ft_torch and are checked only when it is
# built (MONARCH_BUILD_FT). A header directly under monarch/ (error.hpp) uses monarch_<name>
# when that target exists, else the include directory alone.
file(GLOB_RECURSE MONARCH_PUBLIC_HEADERS CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}/include
     ${PROJECT_SOURCE_DIR}/include/monarch/*.hpp)

add_custom_target(check-headers)
set(_owners "")
foreach(h IN LISTS MONARCH_PUBLIC_HEADERS)
  string(REPLACE "/" ";" _parts "${h}")  # monarch;<layer>;...;file.hpp
  list(LENGTH _parts _n)
  list(GET _parts 1 _layer)
  if(_n EQUAL 2)
    string(REGEX REPLACE "\\.hpp$" "" _layer "${_layer}")
    set(_owner monarch_${_layer})
    if(NOT TARGET ${_owner})
      set(_owner "")
    endif()
  elseif(h MATCHES "^monarch/ft/torch/")
    if(NOT TARGET monarch_ft_torch)
      continue()
    endif()
    set(_owner monarch_ft_torch)
  else()
    set(_owner monarch_${_layer})
    if(NOT TARGET ${_owner})
      message(FATAL_ERROR "check-headers: no library target ${_owner} for include/${h}")
    endif()
  endif()
  set(_cpp ${CMAKE_BINARY_DIR}/check_headers/${h}.cpp)
  file(CONFIGURE OUTPUT ${_cpp} CONTENT "#include \"${h}\"\n#include \"${h}\"\n")
  if(_owner STREQUAL "")
    set(_key root)
  else()
    set(_key ${_owner})
  endif()
  if(NOT _key IN_LIST _owners)
    list(APPEND _owners ${_key})
    set(_sources_${_key} "")
  endif()
  list(APPEND _sources_${_key} ${_cpp})
endforeach()

foreach(_key IN LISTS _owners)
  set(_target check_headers_${_key})
  add_library(${_target} OBJECT EXCLUDE_FROM_ALL ${_sources_${_key}})
  target_compile_options(${_target} PRIVATE ${MONARCH_WARNINGS})
  if(_key STREQUAL "root")
    target_include_directories(${_target} PRIVATE ${PROJECT_SOURCE_DIR}/include)
  else()
    target_link_libraries(${_target} PRIVATE ${_key})
  endif()
  add_dependencies(check-headers ${_target})
endforeach()
