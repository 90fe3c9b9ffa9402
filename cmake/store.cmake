# ---- store: the durable state of the control plane (SQLite, WAL) -----------
# Included from the top-level CMakeLists.txt after find_package(SQLite3) and find_package(Threads).
add_library(gpupool_store
  src/store/store.cc
  src/store/sqlite_store.cc
)
target_link_libraries(gpupool_store PUBLIC gpupool_common PRIVATE SQLite::SQLite3 Threads::Threads)

if(GPUPOOL_BUILD_TESTS)
  gpupool_test(store_test src/store/store_test.cc)
  # The test writes database files by hand (newer and older schema versions), so it uses sqlite3 too.
  target_link_libraries(store_test PRIVATE gpupool_store SQLite::SQLite3 Threads::Threads)
endif()

if(GPUPOOL_BUILD_BENCH)
  find_package(benchmark REQUIRED)
  add_executable(store_bench bench/store_bench.cc)
  target_link_libraries(store_bench PRIVATE gpupool_store benchmark::benchmark Threads::Threads)
endif()
