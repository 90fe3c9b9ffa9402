# ---- agent: task runtimes (process, runc) ----
# The node agent's ways to run a task: plain processes in their own process group (cgroup limits
# where the machine allows) and OCI containers through runc. Both keep per-task state under a
# state directory so a restarted agent adopts what is still running.
add_library(gpupool_agent_runtime
  src/agent/runtime_internal.cc
  src/agent/runtime_files.cc
  src/agent/supervised_runtime.cc
  src/agent/cgroups.cc
  src/agent/supervisor_protocol.cc
  src/agent/log_pump.cc
  src/agent/process_runtime.cc
  src/agent/runc_runtime.cc
  src/agent/container_preload.cc
  src/agent/process_preload.cc
  src/agent/image_cache.cc
  src/agent/image_layout.cc
  src/agent/pod_network.cc
  src/agent/scratch_disk.cc
)
target_link_libraries(gpupool_agent_runtime
  PUBLIC gpupool_common
  PRIVATE nlohmann_json::nlohmann_json fmt::fmt OpenSSL::Crypto)  # libcrypto: SHA-256 (image_cache.cc)

# The supervisor of each task, a program of its own (src/agent/supervisor_main.cc): the agent starts
# it with posix_spawn, so starting a task never copies the agent's address space. It links libc and
# the standard library only, statically where the build allows (no dynamic loader work per task;
# sanitizer builds cannot link statically).
add_executable(gpupool-supervise
  src/agent/supervisor_main.cc
  src/agent/supervisor_protocol.cc
  src/agent/supervisor_sandbox.cc
  src/agent/log_pump.cc
)
target_include_directories(gpupool-supervise PRIVATE src)
if(NOT GPUPOOL_SANITIZE)
  target_link_options(gpupool-supervise PRIVATE -static)
endif()
add_dependencies(gpupool_agent_runtime gpupool-supervise)
# Where a binary that is not beside it (a test) finds it.
set_source_files_properties(src/agent/runtime_internal.cc PROPERTIES
  COMPILE_DEFINITIONS "GPUPOOL_SUPERVISOR_BUILD_PATH=\"$<TARGET_FILE:gpupool-supervise>\"")

if(GPUPOOL_BUILD_TESTS)
  # Starts real processes and (when runc and /bin/busybox are installed) containers.
  gpupool_test(runtime_test src/agent/runtime_test.cc src/agent/log_pump_test.cc src/agent/supervisor_test.cc
    src/agent/sandbox_test.cc src/agent/container_sandbox_test.cc src/agent/pod_network_test.cc)
  target_link_libraries(runtime_test PRIVATE gpupool_agent_runtime nlohmann_json::nlohmann_json)
  # The CUDA limiter preloaded into containers (container_preload_test.cc reads its ELF versions and
  # runs it in a glibc root filesystem built from the host's libraries).
  target_sources(runtime_test PRIVATE src/agent/container_preload_test.cc src/agent/process_preload_test.cc)
  target_compile_definitions(runtime_test PRIVATE GPUPOOL_CUDA_PRELOAD_PATH="$<TARGET_FILE:gpupool-cuda>")
  add_dependencies(runtime_test gpupool-cuda)
  # Builds small busybox images with umoci and pulls them through skopeo (no network); skips
  # when either or /bin/busybox is absent.
  gpupool_test(image_test src/agent/image_cache_test.cc)
  target_link_libraries(image_test PRIVATE gpupool_agent_runtime nlohmann_json::nlohmann_json)
endif()
