# ---- agent: the node agent loop, the task environment and MPS control daemons ----
add_library(gpupool_agent
  src/agent/agent.cc
  src/agent/agent_tasks.cc
  src/agent/agent_mounts.cc
  src/agent/agent_health.cc
  src/agent/agent_watch.cc
  src/agent/agent_mig.cc
  src/agent/child_exits.cc
  src/agent/task_env.cc
  src/agent/mps.cc
  src/agent/mps_control.cc
  src/agent/mps_limits.cc
  src/agent/node_identity.cc
)
target_link_libraries(gpupool_agent
  PUBLIC gpupool_agent_gpu gpupool_agent_runtime gpupool_common nlohmann_json::nlohmann_json
  PRIVATE gpupool_api_client gpupool_http fmt::fmt
)

if(GPUPOOL_BUILD_TESTS)
  # mps_test and agent_mps_test start the fake nvidia-cuda-mps-control of tests/fake_mps (a POSIX sh
  # script); agent_mps_test's tasks run its fake MPS client, mps-client-limits.
  gpupool_test(agent_test src/agent/task_env_test.cc src/agent/mps_test.cc src/agent/agent_mps_test.cc
               src/agent/agent_lease_test.cc src/agent/cuda_ledger_test.cc src/agent/agent_mig_test.cc)
  # It also runs whole agents against a fake server, with the fake NVML of cmake/agent_gpu.cmake.
  target_link_libraries(agent_test PRIVATE gpupool_agent PkgConfig::HTTPLIB fmt::fmt)
  target_compile_definitions(agent_test PRIVATE
    FAKE_MPS_CONTROL="${CMAKE_CURRENT_SOURCE_DIR}/tests/fake_mps/nvidia-cuda-mps-control"
    FAKE_MPS_CLIENT="${CMAKE_CURRENT_SOURCE_DIR}/tests/fake_mps/mps-client-limits"
    FAKE_NVML_PATH="$<TARGET_FILE:fake_nvml>"
    # The CUDA limiter run by the agent against the fake driver (cmake/cuda_limiter.cmake).
    CUDA_PROBE_PATH="$<TARGET_FILE:cuda_probe>"
    FAKE_CUDA_DIR="$<TARGET_FILE_DIR:fake_cuda>"
    GPUPOOL_CUDA_PRELOAD_PATH="$<TARGET_FILE:gpupool-cuda>"
  )
  add_dependencies(agent_test fake_nvml cuda_probe fake_cuda gpupool-cuda)
endif()
