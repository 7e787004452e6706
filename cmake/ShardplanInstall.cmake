include(CMakePackageConfigHelpers)
install(EXPORT shardplanTargets NAMESPACE shardplan::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/shardplan)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/shardplanConfig.cmake.in
  ${PROJECT_BINARY_DIR}/shardplanConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/shardplan)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/shardplanConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/shardplanConfig.cmake
  ${PROJECT_BINARY_DIR}/shardplanConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/shardplan)
