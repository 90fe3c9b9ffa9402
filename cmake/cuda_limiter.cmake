# ---- cuda_limiter: libgpupool-cuda.so, the CUDA driver-API limiter preloaded into fractional GPU
# tasks (docs/cuda_limiter.md) ----
# It links no gpupool library: it is loaded into programs that are not ours. It carries its own
# copy of libstdc++ (hidden, so it cannot interpose the program's, and no demand on the image's
# version of it), binds its own symbols to itself
# (-Bsymbolic: the addresses it hands out are its wrappers) and may leave nothing undefined (the
# driver is reached through dlopen only).
#
# The library, the fake driver and the probe are built without the sanitizers even in a
# GPUPOOL_SANITIZE build: a sanitizer runtime has to be the first library of a process, which a
# preloaded library inside an uninstrumented program cannot be. The unit tests of limiter.cc are
# compiled into cuda_limiter_test, which is instrumented like every other test.

# Removes the project-wide sanitizer flags from target.
function(gpupool_without_sanitizers target)
  foreach(property COMPILE_OPTIONS LINK_OPTIONS)
    get_target_property(options ${target} ${property})
    if(options)
      list(FILTER options EXCLUDE REGEX "sanitize")
      set_property(TARGET ${target} PROPERTY ${property} ${options})
    endif()
  endforeach()
endfunction()

add_library(gpupool-cuda SHARED
  src/cuda_limiter/preload.cc
  src/cuda_limiter/preload_memory.cc
  src/cuda_limiter/preload_launch.cc
  src/cuda_limiter/limiter.cc
  src/cuda_limiter/shared_ledger.cc
)
target_include_directories(gpupool-cuda PRIVATE src)
set_target_properties(gpupool-cuda PROPERTIES CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
target_link_libraries(gpupool-cuda PRIVATE ${CMAKE_DL_LIBS} Threads::Threads)
# It exports the driver's and NVML's names it wraps, and dlsym; nothing else.
set(GPUPOOL_CUDA_EXPORTS "${CMAKE_CURRENT_BINARY_DIR}/gpupool-cuda.map")
file(WRITE "${GPUPOOL_CUDA_EXPORTS}" "{\n  global: cu*; nvml*; dlsym;\n  local: *;\n};\n")
# --gc-sections keeps the parts of libstdc++ it does not use out, and with them their demands on
# the C library: what is left needs glibc 2.34 (dlopen in libc), the oldest a task image may have.
target_link_options(gpupool-cuda PRIVATE -Wl,-Bsymbolic -Wl,--no-undefined -Wl,--gc-sections -static-libstdc++
                                         -Wl,--exclude-libs,ALL "-Wl,--version-script=${GPUPOOL_CUDA_EXPORTS}")
set_property(TARGET gpupool-cuda APPEND PROPERTY LINK_DEPENDS "${GPUPOOL_CUDA_EXPORTS}")
gpupool_without_sanitizers(gpupool-cuda)

if(GPUPOOL_BUILD_TESTS OR GPUPOOL_BUILD_BENCH)
  # The fake driver: libcuda.so.1 in a directory of its own, for LD_LIBRARY_PATH.
  add_library(fake_cuda SHARED tests/fake_cuda/fake_cuda.cc)
  set_target_properties(fake_cuda PROPERTIES
    OUTPUT_NAME cuda
    SOVERSION 1
    LIBRARY_OUTPUT_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}/fake_cuda"
    CXX_VISIBILITY_PRESET hidden
  )
  target_include_directories(fake_cuda PRIVATE src)
  target_link_options(fake_cuda PRIVATE -Wl,-Bsymbolic)  # its cuGetProcAddress hands out its own entry points
  gpupool_without_sanitizers(fake_cuda)
endif()

if(GPUPOOL_BUILD_TESTS)
  # A program that uses the driver API as applications and the CUDA runtime do.
  add_executable(cuda_probe tests/fake_cuda/cuda_probe.cc)
  target_include_directories(cuda_probe PRIVATE src)
  target_link_libraries(cuda_probe PRIVATE fake_cuda ${CMAKE_DL_LIBS} Threads::Threads)
  gpupool_without_sanitizers(cuda_probe)

  # The NVML test loads tests/fake_nvml into the probe, so it must not be instrumented either: a
  # sanitizer build makes a plain copy of its own (agent_gpu_test keeps the instrumented one).
  set(cuda_limiter_fake_nvml fake_nvml)
  if(GPUPOOL_SANITIZE)
    gpupool_fake_nvml(fake_nvml_plain fake_nvml_plain)
    gpupool_without_sanitizers(fake_nvml_plain)
    set(cuda_limiter_fake_nvml fake_nvml_plain)
  endif()

  # The same library with its limits file at a relative path (resolved against the process's
  # working directory), so the tests can give each probe a file of its own. Only tests load it; the
  # library tasks get reads /run/gpupool/cuda-limits, fixed at build time.
  add_library(gpupool-cuda-limits-test SHARED
    src/cuda_limiter/preload.cc
    src/cuda_limiter/preload_memory.cc
    src/cuda_limiter/preload_launch.cc
    src/cuda_limiter/limiter.cc
    src/cuda_limiter/shared_ledger.cc
  )
  target_include_directories(gpupool-cuda-limits-test PRIVATE src)
  target_compile_definitions(gpupool-cuda-limits-test PRIVATE GPUPOOL_CUDA_LIMITS_FILE_FOR_TESTS="cuda-limits-for-tests")
  set_target_properties(gpupool-cuda-limits-test PROPERTIES CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  target_link_libraries(gpupool-cuda-limits-test PRIVATE ${CMAKE_DL_LIBS} Threads::Threads)
  target_link_options(gpupool-cuda-limits-test PRIVATE -Wl,-Bsymbolic -Wl,--no-undefined -Wl,--gc-sections
                      -static-libstdc++ -Wl,--exclude-libs,ALL "-Wl,--version-script=${GPUPOOL_CUDA_EXPORTS}")
  gpupool_without_sanitizers(gpupool-cuda-limits-test)

  # Not gpupool_test(): the limiter needs none of the libraries that links.
  add_executable(cuda_limiter_test src/cuda_limiter/limiter_test.cc src/cuda_limiter/preload_test.cc
                                   src/cuda_limiter/shared_ledger_test.cc src/cuda_limiter/limiter.cc
                                   src/cuda_limiter/shared_ledger.cc)
  target_include_directories(cuda_limiter_test PRIVATE src)
  target_link_libraries(cuda_limiter_test PRIVATE GTest::gtest GTest::gtest_main Threads::Threads)
  target_compile_definitions(cuda_limiter_test PRIVATE
    CUDA_PROBE_PATH="$<TARGET_FILE:cuda_probe>"
    GPUPOOL_CUDA_PRELOAD_PATH="$<TARGET_FILE:gpupool-cuda>"
    GPUPOOL_CUDA_LIMITS_TEST_PRELOAD_PATH="$<TARGET_FILE:gpupool-cuda-limits-test>"
    GPUPOOL_CUDA_LIMITS_TEST_FILE="cuda-limits-for-tests"
    FAKE_CUDA_DIR="$<TARGET_FILE_DIR:fake_cuda>"
    FAKE_NVML_DIR="$<TARGET_FILE_DIR:${cuda_limiter_fake_nvml}>"
  )
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(cuda_limiter_test PRIVATE -Wno-restrict)  # GCC bug 105651, as gpupool_test()
  endif()
  add_dependencies(cuda_limiter_test cuda_probe gpupool-cuda gpupool-cuda-limits-test fake_cuda ${cuda_limiter_fake_nvml})
  gtest_discover_tests(cuda_limiter_test DISCOVERY_TIMEOUT 60)
endif()

if(GPUPOOL_BUILD_BENCH)
  add_executable(cuda_limiter_bench bench/cuda_limiter_bench.cc)
  target_include_directories(cuda_limiter_bench PRIVATE src)
  target_link_libraries(cuda_limiter_bench PRIVATE fake_cuda)
  target_compile_definitions(cuda_limiter_bench PRIVATE GPUPOOL_CUDA_PRELOAD_PATH="$<TARGET_FILE:gpupool-cuda>")
  add_dependencies(cuda_limiter_bench gpupool-cuda)
  gpupool_without_sanitizers(cuda_limiter_bench)
endif()
