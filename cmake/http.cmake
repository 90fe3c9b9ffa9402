# ---- http: the event-driven HTTP/1.1 server (Boost.Beast over Asio, TLS through OpenSSL) ----
# Used by the server's API and the agent's endpoint; Beast stays inside server.cc.
find_package(Boost 1.74 REQUIRED)
find_package(OpenSSL REQUIRED)
add_library(gpupool_http src/http/server.cc)
target_link_libraries(gpupool_http
  PUBLIC gpupool_common
  PRIVATE Boost::boost OpenSSL::SSL OpenSSL::Crypto Threads::Threads fmt::fmt)

if(GPUPOOL_BUILD_TESTS)
  gpupool_test(http_test src/http/server_test.cc)
  target_link_libraries(http_test PRIVATE gpupool_http PkgConfig::HTTPLIB OpenSSL::SSL OpenSSL::Crypto)
endif()
