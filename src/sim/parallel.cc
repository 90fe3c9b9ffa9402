#include "sim/parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

namespace gpupool {

Status ParallelFor(size_t n, int jobs, const std::function<Status(size_t)>& fn) {
  if (n == 0) return Status::Ok();
  if (jobs <= 0) jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const size_t workers = std::min(static_cast<size_t>(jobs), n);

  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mu;  // guards failure
  std::optional<std::pair<size_t, Status>> failure;
  auto worker = [&] {
    while (!stop.load()) {
      const size_t i = next.fetch_add(1);
      if (i >= n) return;
      Status s = Status::Ok();
      try {
        s = fn(i);
      } catch (const std::exception& ex) {
        s = Status::Internal(fmt::format("exception: {}", ex.what()));
      }
      if (s.ok()) continue;
      std::lock_guard<std::mutex> lock(mu);
      if (!failure || i < failure->first) failure.emplace(i, std::move(s));
      stop.store(true);
    }
  };

  std::vector<std::thread> threads;
  try {
    for (size_t j = 1; j < workers; ++j) threads.emplace_back(worker);
  } catch (const std::exception& ex) {
    stop.store(true);
    for (auto& th : threads) th.join();
    return Status::Internal(fmt::format("cannot start worker threads: {}", ex.what()));
  }
  worker();
  for (auto& th : threads) th.join();
  if (failure) return std::move(failure->second);
  return Status::Ok();
}

}  // namespace gpupool
