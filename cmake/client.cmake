# ---- api client: the HTTP client of the pool's API, shared by the CLI and the agent ----
add_library(gpupool_api_client
  src/client/api_client.cc
)
target_link_libraries(gpupool_api_client
  PUBLIC gpupool_common nlohmann_json::nlohmann_json
  PRIVATE Boost::boost OpenSSL::SSL OpenSSL::Crypto Threads::Threads fmt::fmt
)

# ---- client: the `gpupool submit|get|list|cancel|events|nodes|queues|run` commands ----
add_library(gpupool_client
  src/cli/client_commands.cc
  src/cli/client_cli.cc
  src/cli/client_render.cc
  src/cli/run_command.cc
)
target_link_libraries(gpupool_client
  PUBLIC gpupool_common gpupool_api_client CLI11::CLI11
  PRIVATE nlohmann_json::nlohmann_json yaml-cpp fmt::fmt
)

if(GPUPOOL_BUILD_TESTS)
  gpupool_test(client_test src/cli/client_test.cc src/cli/run_command_test.cc src/client/api_client_test.cc)
  target_link_libraries(client_test PRIVATE gpupool_client gpupool_http PkgConfig::HTTPLIB nlohmann_json::nlohmann_json)
endif()
