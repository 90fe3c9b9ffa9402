# ---- http: the event-driven HTTP/1.1 server (Boost.Beast over Asio, TLS through OpenSSL) ----
# Used by the server's API and the agent's endpoint; Beast stays inside server_impl.h, server.cc and session.cc.
find_package(Boost 1.74 REQUIRED)
find_package(OpenSSL REQUIRED)
add_library(gpupool_http src/http/request.cc src/http/server.cc src/http/session.cc)
target_link_libraries(gpupool_http
  PUBLIC gpupool_common
  PRIVATE Boost::boost OpenSSL::SSL OpenSSL::Crypto Threads::Threads fmt::fmt)
# g++ 12 with -fsanitize=address,undefined reports a false -Wmaybe-uninitialized inside libstdc++'s
# std::regex compiler (std::function members of its NFA states), which the routes instantiate.
# Only that build of this library is spared the warning.
if(GPUPOOL_SANITIZE AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  target_compile_options(gpupool_http PRIVATE -Wno-maybe-uninitialized)
endif()

if(GPUPOOL_BUILD_TESTS)
  gpupool_test(http_test src/http/server_test.cc)
  target_link_libraries(http_test PRIVATE gpupool_http PkgConfig::HTTPLIB OpenSSL::SSL OpenSSL::Crypto)
endif()

if(GPUPOOL_FUZZ)
  # The request path: the HTTP parser with the server's limits, the guarded JSON parse, the node codec.
  add_executable(http_fuzz fuzz/http_fuzz.cc)
  target_compile_options(http_fuzz PRIVATE -fsanitize=fuzzer,address,undefined -fno-omit-frame-pointer)
  target_link_options(http_fuzz PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(http_fuzz PRIVATE gpupool_http gpupool_api)
endif()
