# Installation: `cmake --install build --prefix P` puts the layer libraries, include/monarch, the
# `monarch` CLI and lib/cmake/monarch (monarchConfig.cmake + targets) under P, so that an outside
# project does find_package(monarch) and links monarch::actor, monarch::mesh, ...
# Included at the end of the top-level CMakeLists.txt, after every layer has registered itself
# (monarch_add_library appends to the global property MONARCH_INSTALL_TARGETS).
include(CMakePackageConfigHelpers)

get_property(MONARCH_INSTALL_TARGETS GLOBAL PROPERTY MONARCH_INSTALL_TARGETS)

# Instrumented static libraries need the sanitizer runtime at link time: a consumer of an
# installed sanitizer build (.ci/run's install_consumer_test) links with the same -fsanitize.
if(MONARCH_SANITIZE)
  string(REPLACE "," "$<COMMA>" _monarch_san "${MONARCH_SANITIZE}")
  foreach(t IN LISTS MONARCH_INSTALL_TARGETS)
    target_link_options(${t} INTERFACE $<INSTALL_INTERFACE:-fsanitize=${_monarch_san}>)
  endforeach()
endif()

install(TARGETS ${MONARCH_INSTALL_TARGETS} EXPORT monarchTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/monarch DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(MONARCH_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/monarch)
install(EXPORT monarchTargets NAMESPACE monarch:: FILE monarchTargets.cmake
        DESTINATION ${MONARCH_CMAKE_DIR})

# What the exported targets need from other packages, read off their link interfaces (static
# libraries list their PRIVATE dependencies there as $<LINK_ONLY:...>), so that a layer added or
# changed later needs no edit here. monarchConfig.cmake.in finds each of them before it loads
# monarchTargets.cmake.
set(_monarch_links "")
foreach(t IN LISTS MONARCH_INSTALL_TARGETS)
  if(t STREQUAL "monarch_torch")
    continue()  # libtorch's own targets: find_dependency(Torch) below provides them
  endif()
  get_target_property(_libs ${t} INTERFACE_LINK_LIBRARIES)
  if(_libs)
    list(APPEND _monarch_links ${_libs})
  endif()
endforeach()
macro(_monarch_needs var pattern)
  if(_monarch_links MATCHES "${pattern}")
    set(${var} ON)
  else()
    set(${var} OFF)
  endif()
endmacro()
_monarch_needs(MONARCH_NEEDS_THREADS "Threads::Threads")
_monarch_needs(MONARCH_NEEDS_SPDLOG "PkgConfig::SPDLOG")
_monarch_needs(MONARCH_NEEDS_UCX "PkgConfig::UCX")
_monarch_needs(MONARCH_NEEDS_CEREAL "cereal::")
_monarch_needs(MONARCH_NEEDS_JSON "nlohmann_json::")
_monarch_needs(MONARCH_NEEDS_OPENSSL "OpenSSL::")
_monarch_needs(MONARCH_NEEDS_CLI11 "CLI11::")
if(MONARCH_NEEDS_SPDLOG OR MONARCH_NEEDS_UCX)
  set(MONARCH_NEEDS_PKGCONFIG ON)
else()
  set(MONARCH_NEEDS_PKGCONFIG OFF)
endif()
if(TARGET monarch_torch AND "monarch_torch" IN_LIST MONARCH_INSTALL_TARGETS)
  set(MONARCH_NEEDS_TORCH ON)
else()
  set(MONARCH_NEEDS_TORCH OFF)
endif()
# Anything else imported (Foo::Bar) that the list above does not know would leave the installed
# targets unusable: fail here rather than in a consumer.
foreach(_lib IN LISTS _monarch_links)
  string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" _lib "${_lib}")
  if(_lib MATCHES "::" AND NOT _lib MATCHES
     "^(monarch::|Threads::Threads$|PkgConfig::SPDLOG$|PkgConfig::UCX$|cereal::|nlohmann_json::|OpenSSL::|CLI11::)")
    message(FATAL_ERROR "cmake/install.cmake: an installed monarch target links ${_lib}; add it "
                        "to cmake/monarchConfig.cmake.in (find_dependency) and to this list")
  endif()
endforeach()

configure_package_config_file(cmake/monarchConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/monarchConfig.cmake
                              INSTALL_DESTINATION ${MONARCH_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/monarchConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/monarchConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/monarchConfigVersion.cmake
        DESTINATION ${MONARCH_CMAKE_DIR})

# install_consumer_test: installs this build tree into a prefix under the build directory and
# builds tests/install_consumer/ (an outside project: find_package(monarch), monarch::actor,
# monarch::mesh and, when built, monarch::ft_torch) against it with this build's compiler, build
# type and sanitizer flags, then runs its programs and bin/monarch.
string(JOIN " " _consumer_flags ${MONARCH_SANITIZE_FLAGS})
add_test(NAME install_consumer_test
         COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${CMAKE_BINARY_DIR}
                 -DWORK_DIR=${CMAKE_BINARY_DIR}/install_consumer_test
                 -DGENERATOR=${CMAKE_GENERATOR} -DCXX=${CMAKE_CXX_COMPILER}
                 -DBUILD_TYPE=${CMAKE_BUILD_TYPE} "-DCXX_FLAGS=${_consumer_flags}"
                 -DLAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER} -DWITH_FT=${MONARCH_BUILD_FT}
                 -P ${PROJECT_SOURCE_DIR}/tests/install_consumer/run.cmake)
# Three small programs (one links libtorch) against the installed tree: under a minute on 2 busy
# cores, a few under ASan; the install itself only copies files.
set_tests_properties(install_consumer_test PROPERTIES TIMEOUT 300)
