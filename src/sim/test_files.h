// Files for the simulator's reader tests: temporary ones, the bundled exports, whole reads.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace gpupool::testutil {

// A file that is gone when the test ends; the pid keeps tests running in parallel apart.
class TempFile {
 public:
  TempFile(const std::string& name, const std::string& text)
      : path_(::testing::TempDir() + std::to_string(::getpid()) + "-" + name) {
    std::ofstream(path_, std::ios::binary) << text;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A file of data/exports/ (the recorded and generated job exports).
inline std::string ExportFile(const std::string& name) {
  return std::string(GPUPOOL_DATA_DIR) + "/exports/" + name;
}

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace gpupool::testutil
