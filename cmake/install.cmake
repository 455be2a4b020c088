# `cmake --install BUILD [--prefix P]`: the libraries (static), the public headers and
# epxConfig.cmake, so another project does
#   find_package(epx REQUIRED)                      # CMAKE_PREFIX_PATH=P
#   target_link_libraries(app PRIVATE epx::engine)  # Buffer, launch, connect, plan, core
# with every buffer kind's library (epx::bucket, epx::pp, epx::engram), the simulator
# (epx::sim), diagnosis and load balancing (epx::diagnose, epx::eplb, epx::lb).
# (tests/consumer is that project; `scripts/run.sh test` builds it against an install).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
set(EPX_INSTALL_TARGETS epx_core epx_transport epx_plan epx_comm epx_engine epx_diagnose epx_bucket epx_pp
                        epx_engram epx_sim epx_eplb epx_lb)
if(TARGET epx_oshmem)
  list(APPEND EPX_INSTALL_TARGETS epx_oshmem)  # the OpenSHMEM link line the shmem transport needs
endif()
foreach(t ${EPX_INSTALL_TARGETS})
  string(REPLACE "epx_" "" name ${t})
  set_target_properties(${t} PROPERTIES EXPORT_NAME ${name})
endforeach()
install(TARGETS ${EPX_INSTALL_TARGETS} EXPORT epxTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
# include/epx/ is what a library user includes: installed whole. The tools' libraries (epx_io,
# epx_replay, epx_bench, epx_sim_runner) and their headers (tools/include/) are not installed.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/epx DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
set(EPX_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/epx)
install(EXPORT epxTargets NAMESPACE epx:: DESTINATION ${EPX_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/epxConfig.cmake.in ${CMAKE_BINARY_DIR}/epxConfig.cmake
                              INSTALL_DESTINATION ${EPX_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/epxConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/epxConfig.cmake ${CMAKE_BINARY_DIR}/epxConfigVersion.cmake DESTINATION ${EPX_CMAKE_DIR})
