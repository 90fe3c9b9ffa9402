# ---- agent: GPU discovery (NVML at run time, simulated inventories) and GPU metrics ----
# NVML is opened with dlopen at run time (src/agent/nvml.cc), so nothing here needs an NVIDIA
# package; tests load a fake libnvidia-ml.so.1 built from tests/fake_nvml.
add_library(gpupool_agent_gpu
  src/agent/inventory.cc
  src/agent/nvml.cc
  src/agent/nvml_mig.cc
  src/agent/gpu_metrics.cc
  src/agent/cdi.cc
  src/agent/cdi_load.cc
  src/agent/cdi_generate.cc
)
target_link_libraries(gpupool_agent_gpu
  PUBLIC gpupool_api gpupool_model gpupool_common nlohmann_json::nlohmann_json
  PRIVATE yaml-cpp fmt::fmt ${CMAKE_DL_LIBS}
)

# Prints what discovery finds and the /metrics text (scripts/gpu-smoke.sh).
add_executable(gpu_probe src/agent/gpu_probe_main.cc)
target_link_libraries(gpu_probe PRIVATE gpupool_agent_gpu nlohmann_json::nlohmann_json fmt::fmt)

# The fake NVML: a shared library named exactly libnvidia-ml.so.1.
function(gpupool_fake_nvml target dir)
  add_library(${target} SHARED tests/fake_nvml/fake_nvml.cc)
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    OUTPUT_NAME "libnvidia-ml"
    SUFFIX ".so.1"
    LIBRARY_OUTPUT_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}/${dir}"
    CXX_VISIBILITY_PRESET hidden
  )
endfunction()
gpupool_fake_nvml(fake_nvml fake_nvml)
# The same without the optional entry points: Load must still succeed.
gpupool_fake_nvml(fake_nvml_minimal fake_nvml_minimal)
target_compile_definitions(fake_nvml_minimal PRIVATE FAKE_NVML_MINIMAL)

if(GPUPOOL_BUILD_TESTS)
  gpupool_test(agent_gpu_test
    src/agent/inventory_test.cc
    src/agent/nvml_test.cc
    src/agent/nvml_mig_test.cc
    src/agent/gpu_metrics_test.cc
    src/agent/cdi_test.cc
  )
  # dl: a test reads the fake's own counter of GPM samples through dlopen.
  target_link_libraries(agent_gpu_test PRIVATE gpupool_agent_gpu gpupool_api nlohmann_json::nlohmann_json
                                               ${CMAKE_DL_LIBS})
  target_compile_definitions(agent_gpu_test PRIVATE
    FAKE_NVML_PATH="$<TARGET_FILE:fake_nvml>"
    FAKE_NVML_MINIMAL_PATH="$<TARGET_FILE:fake_nvml_minimal>"
  )
  add_dependencies(agent_gpu_test fake_nvml fake_nvml_minimal)
endif()
