# install.cmake -- `cmake --install build [--prefix DIR]` puts kvattn where C/C++ projects find it:
#   include/kvattn.h
#   lib/libkvattn.so.0.1.0 (SONAME libkvattn.so.0.1: the API is not stable before 1.0), libkvattn.a
#   bin/kvattn                                    the command (run | bench | check)
#   lib/cmake/kvattn/kvattnConfig.cmake           find_package(kvattn) -> kvattn::kvattn (shared),
#                                                 kvattn::kvattn_static
#   lib/pkgconfig/kvattn.pc                       pkg-config --cflags --libs kvattn [--static]
# Components: "runtime" (shared library, command) and "development" (the rest). The Python package
# installs only its own component (python/CMakeLists.txt), never these.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set_target_properties(kvattn_shared PROPERTIES
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}
  EXPORT_NAME kvattn)
set_target_properties(kvattn_static PROPERTIES EXPORT_NAME kvattn_static)
target_include_directories(kvattn_shared INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_include_directories(kvattn_static INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

install(TARGETS kvattn_shared EXPORT kvattnTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT development)
install(TARGETS kvattn_static EXPORT kvattnTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development)
install(FILES include/kvattn.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT development)
if(TARGET kvattn)
  install(TARGETS kvattn RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
endif()

install(EXPORT kvattnTargets NAMESPACE kvattn:: FILE kvattnTargets.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvattn COMPONENT development)
configure_package_config_file(cmake/kvattnConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/kvattnConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvattn)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/kvattnConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kvattnConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/kvattnConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvattn COMPONENT development)

# pkg-config: the shared library needs nothing more; a static link needs threads, libm
# and (CUDA builds) the static CUDA runtime and the C++ runtime its host code uses.
set(KVA_PC_LIBS_PRIVATE "-lpthread -lm")
if(KVA_HAVE_CUDA)
  string(APPEND KVA_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl -lrt -lstdc++")
endif()
configure_file(cmake/kvattn.pc.in ${CMAKE_CURRENT_BINARY_DIR}/kvattn.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kvattn.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT development)
