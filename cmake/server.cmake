# The control plane: config, the job service and its scheduling loop, the HTTP API, metrics.
add_library(gpupool_server
  src/server/config.cc
  src/server/config_people.cc
  src/server/disk_guard.cc
  src/server/resources_json.cc
  src/server/metrics.cc
  src/server/admission.cc
  src/server/job_list.cc
  src/server/service.cc
  src/server/state.cc
  src/server/state_machine.cc
  src/server/state_machine_jobs.cc
  src/server/identities.cc
  src/server/rendezvous.cc
  src/server/state_machine_nodes.cc
  src/server/node_mask.cc
  src/server/reservations.cc
  src/server/preemption_plan.cc
  src/server/job_gates.cc
  src/server/hotspots.cc
  src/server/views.cc
  src/server/retention.cc
  src/server/timeouts.cc
  src/server/service_agents.cc
  src/server/service_api.cc
  src/server/service_cycle.cc
  src/server/service_views.cc
  src/server/service_recover.cc
  src/server/http_api.cc
  src/server/http_replies.cc
  src/server/node_credentials.cc
  src/server/agent_endpoint.cc
)
target_link_libraries(gpupool_server
  PUBLIC gpupool_api gpupool_store gpupool_config gpupool_http nlohmann_json::nlohmann_json Threads::Threads
  PRIVATE gpupool_api_client yaml-cpp OpenSSL::Crypto Boost::boost)

if(GPUPOOL_BUILD_TESTS)
  gpupool_test(server_test
    src/server/config_test.cc
    src/server/service_test.cc
    src/server/sandbox_identity_test.cc
    src/server/service_property_test.cc
    src/server/state_test.cc
    src/server/hotspots_test.cc
    src/server/retention_test.cc
    src/server/timeouts_test.cc
    src/server/http_api_test.cc
    src/server/admission_test.cc
    src/server/e2e_test.cc
    src/server/agent_identity_test.cc
    src/server/node_credentials_test.cc
    src/server/long_poll_test.cc
    src/server/watches_test.cc
    src/server/agent_push_test.cc
    src/server/agent_reports_test.cc
    src/server/gpu_fault_test.cc
    src/server/stop_overdue_test.cc
    src/server/qos_sharing_test.cc
    src/server/mig_layout_test.cc
    src/server/agent_endpoint_test.cc
    src/server/reservations_test.cc
  )
  target_link_libraries(server_test PRIVATE gpupool_server gpupool_agent PkgConfig::HTTPLIB)
  # The kill -9 test runs the real binary.
  target_compile_definitions(server_test PRIVATE GPUPOOL_BINARY="$<TARGET_FILE:gpupool>")
  add_dependencies(server_test gpupool)
endif()

if(GPUPOOL_BUILD_BENCH)
  add_executable(server_bench bench/server_bench.cc)
  target_link_libraries(server_bench PRIVATE gpupool_server PkgConfig::HTTPLIB Threads::Threads)
  # Connections and heartbeats against the real binary (raw sockets + epoll; no gpupool library).
  add_executable(conn_bench bench/conn_bench.cc)
  target_link_libraries(conn_bench PRIVATE nlohmann_json::nlohmann_json fmt::fmt)
  target_compile_definitions(conn_bench PRIVATE GPUPOOL_BINARY="$<TARGET_FILE:gpupool>")
  add_dependencies(conn_bench gpupool)
endif()
