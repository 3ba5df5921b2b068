# Install rules for consumers (README "Use from C++"): one static archive libqkmla.a holding every
# layer (merged with ar, so a consumer links one library), the public header <qkmla/qkmla.hpp>, and
# a package config giving qkmla::qkmla with the libraries the archive needs (MPFR, GMP, fmt,
# toml++, Highway, threads, and the CUDA runtime when the kernels were built).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(QKMLA_ARCHIVED qkmla_api qkmla_report qkmla_gate qkmla_render qkmla_harness qkmla_impl
    qkmla_reference qkmla_gpu qkmla_gemm qkmla_io qkmla_metrics qkmla_core)
set(QKMLA_MERGED ${CMAKE_CURRENT_BINARY_DIR}/libqkmla.a)
set(QKMLA_MRI "CREATE ${QKMLA_MERGED}\n")
foreach(t ${QKMLA_ARCHIVED})
  string(APPEND QKMLA_MRI "ADDLIB $<TARGET_FILE:${t}>\n")
endforeach()
string(APPEND QKMLA_MRI "SAVE\nEND\n")
file(GENERATE OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/libqkmla.mri CONTENT "${QKMLA_MRI}")
set(QKMLA_ARCHIVE_FILES)
foreach(t ${QKMLA_ARCHIVED})
  list(APPEND QKMLA_ARCHIVE_FILES $<TARGET_FILE:${t}>)
endforeach()
add_custom_command(OUTPUT ${QKMLA_MERGED}
                   COMMAND ${CMAKE_COMMAND} -E rm -f ${QKMLA_MERGED}
                   COMMAND ${CMAKE_AR} -M < ${CMAKE_CURRENT_BINARY_DIR}/libqkmla.mri
                   DEPENDS ${QKMLA_ARCHIVED} ${QKMLA_ARCHIVE_FILES}
                   COMMENT "Merging the layers into libqkmla.a")
add_custom_target(qkmla_merged ALL DEPENDS ${QKMLA_MERGED})

install(FILES ${QKMLA_MERGED} DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${CMAKE_CURRENT_SOURCE_DIR}/api/qkmla.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/qkmla)
set(QKMLA_CONFIG_HAS_CUDA ${QKMLA_HAS_CUDA})
configure_package_config_file(${CMAKE_CURRENT_SOURCE_DIR}/api/qkmlaConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/qkmlaConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/qkmla
                              PATH_VARS CMAKE_INSTALL_LIBDIR CMAKE_INSTALL_INCLUDEDIR)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/qkmlaConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/qkmlaConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/qkmlaConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/qkmla)
