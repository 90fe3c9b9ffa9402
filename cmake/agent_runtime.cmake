# ---- agent: task runtimes (process, runc) ----
# The node agent's ways to run a task: plain processes in their own process group (cgroup limits
# where the machine allows) and OCI containers through runc. Both keep per-task state under a
# state directory so a restarted agent adopts what is still running.
add_library(gpupool_agent_runtime
  src/agent/runtime_internal.cc
  src/agent/log_pump.cc
  src/agent/process_runtime.cc
  src/agent/runc_runtime.cc
)
target_link_libraries(gpupool_agent_runtime
  PUBLIC gpupool_common
  PRIVATE nlohmann_json::nlohmann_json fmt::fmt)

if(GPUPOOL_BUILD_TESTS)
  # Starts real processes and (when runc and /bin/busybox are installed) containers.
  gpupool_test(runtime_test src/agent/runtime_test.cc src/agent/log_pump_test.cc)
  target_link_libraries(runtime_test PRIVATE gpupool_agent_runtime nlohmann_json::nlohmann_json)
endif()
