// Bounded task logs: the rotation of log_pump.h on its own, and through the process runtime (the
// supervisor drains the task's pipes, the task never holds its log files).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "agent/log_pump.h"
#include "agent/runtime.h"
#include "agent/runtime_internal.h"

namespace gpupool {
namespace {

using namespace std::chrono_literals;
using agent_internal::LogSink;
using agent_internal::RotatedLogPath;

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/gpupool-log-XXXXXX";
    char* p = ::mkdtemp(tmpl);
    path_ = p != nullptr ? p : "";
  }
  ~TempDir() {
    if (!path_.empty()) (void)agent_internal::RemoveTree(path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string Numbers(int from, int to) {
  std::string s;
  for (int i = from; i <= to; ++i) s += std::to_string(i) + "\n";
  return s;
}

TEST(LogSink, RotatesAtTheCapAndKeepsTheNewestBytes) {
  TempDir dir;
  const std::string path = dir.path() + "/stdout.log";
  const std::string r1 = RotatedLogPath(path, 1), r2 = RotatedLogPath(path, 2);
  LogSink sink;
  sink.path = path.c_str();
  sink.rotated[0] = r1.c_str();
  sink.rotated[1] = r2.c_str();
  sink.keep = 2;
  sink.max_bytes = 1000;
  sink.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  ASSERT_GE(sink.fd, 0);
  const std::string all = Numbers(1, 3000);  // ~14 KB: 14x the cap
  // In uneven pieces, as a pipe delivers them.
  for (size_t pos = 0; pos < all.size(); pos += 777)
    agent_internal::LogSinkWrite(&sink, all.data() + pos, std::min<size_t>(777, all.size() - pos));
  ::close(sink.fd);
  EXPECT_LE(FileSize(path), 1000);
  EXPECT_EQ(FileSize(r1), 1000);
  EXPECT_EQ(FileSize(r2), 1000);
  EXPECT_EQ(FileSize(RotatedLogPath(path, 3)), -1);
  // The three files, oldest first, are exactly the tail of what was written.
  const std::string kept = ReadText(r2) + ReadText(r1) + ReadText(path);
  EXPECT_EQ(kept, all.substr(all.size() - kept.size()));
  EXPECT_GT(sink.rotations, 10);
  EXPECT_EQ(sink.dropped, 0u);
}

TEST(LogSink, KeepZeroTruncatesTheOneFile) {
  TempDir dir;
  const std::string path = dir.path() + "/stderr.log";
  LogSink sink;
  sink.path = path.c_str();
  sink.max_bytes = 100;
  sink.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  ASSERT_GE(sink.fd, 0);
  const std::string all = Numbers(1, 500);
  agent_internal::LogSinkWrite(&sink, all.data(), all.size());
  ::close(sink.fd);
  const std::string kept = ReadText(path);
  EXPECT_LE(kept.size(), 100u);
  EXPECT_FALSE(kept.empty());
  EXPECT_EQ(kept, all.substr(all.size() - kept.size()));
  EXPECT_EQ(FileSize(RotatedLogPath(path, 1)), -1);
}

std::unique_ptr<Runtime> MakeCapped(const std::string& state, const std::string& logs, int64_t cap, int keep) {
  RuntimeOptions opts;
  opts.state_dir = state;
  opts.cgroup_root = "none";
  opts.log_dir = logs;
  opts.log_max_bytes = cap;
  opts.log_keep = keep;
  auto rt = MakeProcessRuntime(opts);
  EXPECT_TRUE(rt.ok()) << rt.status().ToString();
  return rt.ok() ? std::move(rt).value() : nullptr;
}

TaskStatusInfo WaitDone(Runtime& rt, const std::string& id, std::chrono::milliseconds timeout = 20s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  TaskStatusInfo info;
  while (true) {
    auto r = rt.Poll(id);
    if (!r.ok()) return info;
    info = *r;
    if (info.state != RunState::kRunning || std::chrono::steady_clock::now() >= deadline) return info;
    std::this_thread::sleep_for(20ms);
  }
}

LaunchSpec Spec(const std::string& id, std::vector<std::string> argv) {
  LaunchSpec s;
  s.id = id;
  s.argv = std::move(argv);
  s.env = {{"PATH", "/usr/bin:/bin"}};
  return s;
}

TEST(TaskLogs, ATaskWritingTenTimesTheCapStaysWithinItAndEnds) {
  TempDir state, logs;
  constexpr int64_t kCap = 64 * 1024;
  auto rt = MakeCapped(state.path(), logs.path(), kCap, 1);
  ASSERT_NE(rt, nullptr);
  const std::string id = "flood-" + std::to_string(::getpid());
  // ~1.3 MB on stdout (20x the cap) and some on stderr, as fast as the task can.
  ASSERT_TRUE(rt->Start(Spec(id, {"sh", "-c", "seq 1 200000; seq 1 30000 >&2; echo done >&2"})).ok());
  TaskStatusInfo info = WaitDone(*rt, id);
  ASSERT_EQ(info.state, RunState::kExited) << "the supervisor stopped draining the pipe";
  EXPECT_EQ(info.exit_code, 0);
  const std::string out = rt->StdoutPath(id), err = rt->StderrPath(id);
  EXPECT_EQ(out, logs.path() + "/" + id + "/stdout.log");
  EXPECT_LE(FileSize(out), kCap);
  EXPECT_EQ(FileSize(RotatedLogPath(out, 1)), kCap);
  EXPECT_EQ(FileSize(RotatedLogPath(out, 2)), -1);
  EXPECT_LE(FileSize(err), kCap);
  // The newest bytes are in the current file, whole.
  const std::string tail = ReadText(RotatedLogPath(out, 1)) + ReadText(out);
  const std::string all = Numbers(1, 200000);
  EXPECT_EQ(tail, all.substr(all.size() - tail.size()));
  const std::string err_text = ReadText(err);
  EXPECT_EQ(err_text.substr(err_text.size() - 12), "\n30000\ndone\n");
  // Nothing of the logs in the state directory.
  EXPECT_EQ(FileSize(state.path() + "/" + id + "/stdout.log"), -1);
}

TEST(TaskLogs, AnEndlessWriterNeverPassesTheCap) {
  TempDir state;
  constexpr int64_t kCap = 32 * 1024;
  auto rt = MakeCapped(state.path(), "", kCap, 1);
  ASSERT_NE(rt, nullptr);
  const std::string id = "yes-" + std::to_string(::getpid());
  ASSERT_TRUE(rt->Start(Spec(id, {"yes", "a line the task writes without end"})).ok());
  const std::string out = rt->StdoutPath(id);
  EXPECT_EQ(out, state.path() + "/" + id + "/stdout.log");
  for (int i = 0; i < 10; ++i) {
    std::this_thread::sleep_for(100ms);
    const int64_t total = std::max<int64_t>(0, FileSize(out)) + std::max<int64_t>(0, FileSize(RotatedLogPath(out, 1)));
    EXPECT_LE(total, 2 * kCap);
  }
  EXPECT_EQ(FileSize(RotatedLogPath(out, 1)), kCap);  // it did write well past the cap
  auto poll = rt->Poll(id);
  ASSERT_TRUE(poll.ok());
  EXPECT_EQ(poll->state, RunState::kRunning) << "yes was blocked or died: " << poll->message;
  ASSERT_TRUE(rt->Stop(id, 1s).ok());
  EXPECT_NE(WaitDone(*rt, id).state, RunState::kRunning);
}

TEST(TaskLogs, TheTaskDoesNotHoldItsLogFiles) {
  TempDir state;
  auto rt = MakeCapped(state.path(), "", 1 << 20, 1);
  ASSERT_NE(rt, nullptr);
  const std::string id = "fds-" + std::to_string(::getpid());
  // Every descriptor the task has, and where it points.
  ASSERT_TRUE(rt->Start(Spec(id, {"sh", "-c", "for f in /proc/$$/fd/*; do echo \"$f $(readlink $f)\"; done"})).ok());
  ASSERT_EQ(WaitDone(*rt, id).state, RunState::kExited);
  const std::string text = ReadText(rt->StdoutPath(id));
  EXPECT_NE(text.find("/fd/1 pipe:"), std::string::npos) << text;
  EXPECT_NE(text.find("/fd/2 pipe:"), std::string::npos) << text;
  EXPECT_EQ(text.find(".log"), std::string::npos) << text;
}

}  // namespace
}  // namespace gpupool
