# ---- api: JSON/YAML codecs between the REST API and the model ---------------
# Included from the top-level CMakeLists.txt, after find_package(nlohmann_json) and
# find_package(yaml-cpp).
option(GPUPOOL_FUZZ "Build the libFuzzer targets (needs clang++)" OFF)

add_library(gpupool_api
  src/api/fields.cc
  src/api/spec_text.cc
  src/api/jobspec.cc
  src/api/node_codec.cc
  src/api/mig_report.cc
)
target_link_libraries(gpupool_api PUBLIC gpupool_sched nlohmann_json::nlohmann_json PRIVATE yaml-cpp)

if(GPUPOOL_BUILD_TESTS)
  gpupool_test(api_test src/api/jobspec_test.cc src/api/node_codec_test.cc src/api/mig_report_test.cc)
  target_link_libraries(api_test PRIVATE gpupool_api)
endif()

if(GPUPOOL_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "GPUPOOL_FUZZ needs clang++ (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++")
  endif()
  # Instrument the codecs and the model code they call, not only the fuzz target.
  target_compile_options(gpupool_api PRIVATE -fsanitize=fuzzer-no-link,address,undefined)
  add_executable(jobspec_fuzz fuzz/jobspec_fuzz.cc)
  target_compile_options(jobspec_fuzz PRIVATE -fsanitize=fuzzer,address,undefined -fno-omit-frame-pointer)
  target_link_options(jobspec_fuzz PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(jobspec_fuzz PRIVATE gpupool_api)
endif()
