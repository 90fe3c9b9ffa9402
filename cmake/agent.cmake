# ---- agent: the node agent loop and the task environment ----
add_library(gpupool_agent
  src/agent/agent.cc
  src/agent/task_env.cc
)
target_link_libraries(gpupool_agent
  PUBLIC gpupool_agent_gpu gpupool_agent_runtime gpupool_common nlohmann_json::nlohmann_json
  PRIVATE gpupool_client PkgConfig::HTTPLIB fmt::fmt
)

if(GPUPOOL_BUILD_TESTS)
  gpupool_test(agent_test src/agent/task_env_test.cc)
  target_link_libraries(agent_test PRIVATE gpupool_agent)
endif()
