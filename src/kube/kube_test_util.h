// What the kube tests share: a temporary directory and tests/kube/apiserver.py on a free port.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kube/kube_client.h"

namespace gpupool::kube::test {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

inline int Sh(const std::string& cmd) { return std::system(cmd.c_str()); }

// Polls `pred` every 20 ms until it holds (true) or `timeout` passes (false).
inline bool Eventually(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 15s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/gpupool-kube-XXXXXX";
    path_ = ::mkdtemp(tmpl) != nullptr ? tmpl : "";
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// tests/kube/apiserver.py on a free port, with `extra` arguments; stopped with the fixture.
class TestApiServer {
 public:
  TestApiServer(const std::string& dir, const std::vector<std::string>& extra) {
    const std::string ready = dir + "/url";
    std::vector<std::string> args = {"python3", std::string(GPUPOOL_SOURCE_DIR) + "/tests/kube/apiserver.py", "--port",
                                     "0", "--ready-file", ready};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      const int log = ::open((dir + "/server.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (log >= 0) {
        ::dup2(log, 1);
        ::dup2(log, 2);
      }
      ::execvp("python3", argv.data());
      ::_exit(127);
    }
    for (int i = 0; i < 200 && url_.empty(); ++i) {
      std::this_thread::sleep_for(25ms);
      url_ = ReadText(ready);
      while (!url_.empty() && url_.back() == '\n') url_.pop_back();
    }
  }
  ~TestApiServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  const std::string& url() const { return url_; }

 private:
  pid_t pid_ = -1;
  std::string url_;
};

// A client of `server` (plain HTTP, no credentials); nullptr when it cannot be made.
inline std::unique_ptr<KubeClient> ClientOf(const TestApiServer& server) {
  KubeEndpoint ep;
  ep.server = server.url();
  auto c = KubeClient::Create(ep);
  return c.ok() ? std::move(c).value() : nullptr;
}

}  // namespace gpupool::kube::test
