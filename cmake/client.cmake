# ---- client: the `gpupool submit|get|list|cancel|events|nodes|queues` commands ----
add_library(gpupool_client
  src/cli/client.cc
  src/cli/client_commands.cc
  src/cli/run_command.cc
)
target_link_libraries(gpupool_client
  PUBLIC gpupool_common CLI11::CLI11
  PRIVATE PkgConfig::HTTPLIB nlohmann_json::nlohmann_json yaml-cpp fmt::fmt
)

if(GPUPOOL_BUILD_TESTS)
  gpupool_test(client_test src/cli/client_test.cc src/cli/run_command_test.cc)
  target_link_libraries(client_test PRIVATE gpupool_client PkgConfig::HTTPLIB nlohmann_json::nlohmann_json)
endif()
