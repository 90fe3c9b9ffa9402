#include "agent/child_exits.h"

#include <sys/wait.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

namespace gpupool {

struct ChildExits::Impl {
  std::mutex mu;
  std::condition_variable started_cv;
  bool child_started = false;
  uint64_t next_id = 1;
  std::map<uint64_t, std::function<void()>> subscribers;

  void Run() {
    using std::chrono::milliseconds;
    pid_t last = 0;
    milliseconds backoff{2};
    for (;;) {
      siginfo_t info{};
      if (::waitid(P_ALL, 0, &info, WEXITED | WNOWAIT) != 0) {
        if (errno == EINTR) continue;
        // ECHILD: no children now. Wait for one to be started (or look again in a second).
        std::unique_lock<std::mutex> lock(mu);
        started_cv.wait_for(lock, std::chrono::seconds(1), [&] { return child_started; });
        child_started = false;
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        for (auto& [id, fn] : subscribers) fn();
      }
      // The child stays a zombie until its owner reaps it; the same one seen again means its owner
      // has not (yet): wait longer each time.
      backoff = info.si_pid == last ? std::min(backoff * 2, milliseconds(200)) : milliseconds(2);
      last = info.si_pid;
      std::this_thread::sleep_for(backoff);
    }
  }
};

ChildExits::ChildExits() : impl_(new Impl) {
  std::thread([impl = impl_] { impl->Run(); }).detach();
}

ChildExits& ChildExits::Get() {
  static ChildExits* const instance = new ChildExits();  // never destroyed (see impl_)
  return *instance;
}

uint64_t ChildExits::Subscribe(std::function<void()> on_exit) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const uint64_t id = impl_->next_id++;
  impl_->subscribers.emplace(id, std::move(on_exit));
  return id;
}

void ChildExits::Unsubscribe(uint64_t id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->subscribers.erase(id);
}

void ChildExits::ChildStarted() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->child_started = true;
  impl_->started_cv.notify_all();
}

}  // namespace gpupool
