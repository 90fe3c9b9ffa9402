// Shared by the two halves of the HTTP layer (request.cc, server.cc); not part of its interface.
#pragma once

#include <string>

namespace gpupool::http {

// ASCII lower case (header names are kept lower-case).
std::string Lower(std::string s);

}  // namespace gpupool::http
