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
  src/kube/cluster_preempt.cc
  src/kube/leader.cc
  src/kube/kube_scheduler.cc
)
target_link_libraries(gpupool_kube
  PUBLIC gpupool_sched gpupool_model gpupool_common nlohmann_json::nlohmann_json
  PRIVATE gpupool_api CURL::libcurl OpenSSL::Crypto fmt::fmt
)

# The kubelet's gRPC APIs that `gpupool kube-node` speaks (device plugin v1beta1, pod-resources
# v1), compiled from src/kube/proto with Debian's protoc and grpc_cpp_plugin. Generated code is
# not ours: compiled without the project's warnings.
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
set(GPUPOOL_KUBE_PROTO_OUT ${CMAKE_CURRENT_BINARY_DIR}/kube_proto)
file(MAKE_DIRECTORY ${GPUPOOL_KUBE_PROTO_OUT})
set(GPUPOOL_KUBE_PROTO_SRCS)
foreach(name deviceplugin_v1beta1 podresources_v1)
  set(src ${CMAKE_CURRENT_SOURCE_DIR}/src/kube/proto/${name}.proto)
  set(outs ${GPUPOOL_KUBE_PROTO_OUT}/${name}.pb.cc ${GPUPOOL_KUBE_PROTO_OUT}/${name}.pb.h
           ${GPUPOOL_KUBE_PROTO_OUT}/${name}.grpc.pb.cc ${GPUPOOL_KUBE_PROTO_OUT}/${name}.grpc.pb.h)
  add_custom_command(OUTPUT ${outs}
    COMMAND protobuf::protoc --proto_path=${CMAKE_CURRENT_SOURCE_DIR}/src/kube/proto
            --cpp_out=${GPUPOOL_KUBE_PROTO_OUT} --grpc_out=${GPUPOOL_KUBE_PROTO_OUT}
            --plugin=protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin> ${src}
    DEPENDS ${src} VERBATIM)
  list(APPEND GPUPOOL_KUBE_PROTO_SRCS ${GPUPOOL_KUBE_PROTO_OUT}/${name}.pb.cc ${GPUPOOL_KUBE_PROTO_OUT}/${name}.grpc.pb.cc)
endforeach()
add_library(gpupool_kube_proto STATIC ${GPUPOOL_KUBE_PROTO_SRCS})
target_include_directories(gpupool_kube_proto SYSTEM PUBLIC ${GPUPOOL_KUBE_PROTO_OUT})
target_compile_options(gpupool_kube_proto PRIVATE -w)
target_link_libraries(gpupool_kube_proto PUBLIC gRPC::grpc++ protobuf::libprotobuf)

# `gpupool kube-node`'s parts: the kube client, the agent's GPU discovery (NVML, simulated) and
# task environment, and the device plugin.
add_library(gpupool_kube_node src/kube/node_publisher.cc src/kube/pod_admission.cc src/kube/device_plugin.cc)
target_link_libraries(gpupool_kube_node PUBLIC gpupool_kube gpupool_agent_gpu gpupool_agent
                      PRIVATE gpupool_kube_proto gpupool_api fmt::fmt)

if(GPUPOOL_BUILD_TESTS)
  # Against tests/kube/apiserver.py (python3), itself checked with kubectl and python3-kubernetes.
  gpupool_test(kube_test src/kube/kube_client_test.cc src/kube/pod_request_test.cc src/kube/informer_test.cc
    src/kube/cluster_state_test.cc src/kube/kube_scheduler_test.cc
    src/kube/node_publisher_test.cc src/kube/pod_admission_test.cc)
  target_link_libraries(kube_test PRIVATE gpupool_kube gpupool_kube_node nlohmann_json::nlohmann_json fmt::fmt)
  target_compile_definitions(kube_test PRIVATE GPUPOOL_SOURCE_DIR="${CMAKE_CURRENT_SOURCE_DIR}")
endif()
