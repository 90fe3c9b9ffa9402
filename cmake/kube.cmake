# ---- kube: the Kubernetes API client (libcurl) and configuration (kubeconfig, in-cluster) ----
# The base of `gpupool kube-scheduler` and `gpupool kube-node` (issue 22; docs/kubernetes.md).
find_package(CURL REQUIRED)
add_library(gpupool_kube
  src/kube/kube_config.cc
  src/kube/kube_client.cc
  src/kube/pod_request.cc
  src/kube/informer.cc
  src/kube/kube_node.cc
  src/kube/cluster_state.cc
  src/kube/cluster_cycle.cc
  src/kube/leader.cc
  src/kube/kube_scheduler.cc
)
target_link_libraries(gpupool_kube
  PUBLIC gpupool_sched gpupool_model gpupool_common nlohmann_json::nlohmann_json
  PRIVATE gpupool_api CURL::libcurl OpenSSL::Crypto fmt::fmt
)

# `gpupool kube-node`'s parts: the kube client and the agent's GPU discovery (NVML, simulated).
add_library(gpupool_kube_node src/kube/node_publisher.cc)
target_link_libraries(gpupool_kube_node PUBLIC gpupool_kube gpupool_agent_gpu PRIVATE fmt::fmt)

if(GPUPOOL_BUILD_TESTS)
  # Against tests/kube/apiserver.py (python3), itself checked with kubectl and python3-kubernetes.
  gpupool_test(kube_test src/kube/kube_client_test.cc src/kube/pod_request_test.cc src/kube/informer_test.cc
    src/kube/cluster_state_test.cc src/kube/kube_scheduler_test.cc
    src/kube/node_publisher_test.cc)
  target_link_libraries(kube_test PRIVATE gpupool_kube gpupool_kube_node nlohmann_json::nlohmann_json fmt::fmt)
  target_compile_definitions(kube_test PRIVATE GPUPOOL_SOURCE_DIR="${CMAKE_CURRENT_SOURCE_DIR}")
endif()
