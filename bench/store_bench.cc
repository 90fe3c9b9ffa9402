// Durable commit rate of the SQLite store (WAL, synchronous=FULL): one single-job batch per commit,
// from 1 thread straight into Store::Apply and from 1 and 8 threads through a GroupCommitter. Each
// commit is acknowledged only once fsync'd, so the figures are bounded by the disk's sync latency;
// group commit shares one sync between the callers waiting at that moment.
//
// The database lives in a fresh directory under $TMPDIR (default /tmp), removed at the end; point
// TMPDIR at the disk the server would use to measure that disk.

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include "store/sqlite_store.h"
#include "store/store.h"

namespace gpupool {
namespace {

std::atomic<uint64_t> g_next_job{0};

// A job of typical size; ids and seqs are unique across every benchmark of the run.
WriteBatch NextJobBatch() {
  const uint64_t n = g_next_job.fetch_add(1, std::memory_order_relaxed);
  JobRecord j;
  j.id = fmt::format("j-{:012d}", n);
  j.seq = n + 1;
  j.tenant = "tenant-" + std::to_string(n % 7);
  j.queue = "research";
  j.name = "train-resnet";
  j.priority = 1;
  j.state = "pending";
  j.spec_json = R"({"tasks":[{"gpu":"1","cpu":"8","memory":"32Gi","model":"A100"}],"gang":true})";
  j.created_ms = 1'700'000'000'000 + static_cast<int64_t>(n);
  j.updated_ms = j.created_ms;
  WriteBatch b;
  b.Add(PutJob{std::move(j)});
  return b;
}

void BM_ApplyDirect(benchmark::State& state, Store* store) {
  for (auto _ : state) {
    const Status st = store->Apply(NextJobBatch());
    if (!st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_GroupCommit(benchmark::State& state, GroupCommitter* committer) {
  for (auto _ : state) {
    const Status st = committer->Commit(NextJobBatch());
    if (!st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      break;
    }
  }
  // Summed over threads and divided by wall time: commits/s of the whole group of callers.
  state.SetItemsProcessed(state.iterations());
}

}  // namespace
}  // namespace gpupool

int main(int argc, char** argv) {
  using gpupool::GroupCommitter;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/gpupool_store_bench_XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string dir = tmpl;
  {
    auto store = gpupool::OpenSqliteStore({dir + "/bench.db", /*synchronous_full=*/true});
    if (!store.ok()) {
      std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
      std::filesystem::remove_all(dir);
      return 1;
    }
    gpupool::Store* s = store->get();
    GroupCommitter one(*s);
    GroupCommitter eight(*s);
    benchmark::RegisterBenchmark("BM_ApplyDirect/threads:1", gpupool::BM_ApplyDirect, s)->UseRealTime();
    benchmark::RegisterBenchmark("BM_GroupCommit", gpupool::BM_GroupCommit, &one)->Threads(1)->UseRealTime();
    benchmark::RegisterBenchmark("BM_GroupCommit", gpupool::BM_GroupCommit, &eight)
        ->Threads(8)
        ->UseRealTime();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    for (const auto& [name, c] : {std::pair{"1 thread", &one}, std::pair{"8 threads", &eight}}) {
      const GroupCommitter::Stats st = c->stats();
      std::fprintf(stderr, "group commit, %s: %llu commits in %llu groups (%.1f commits per fsync)\n", name,
                   static_cast<unsigned long long>(st.commits), static_cast<unsigned long long>(st.groups),
                   st.groups > 0 ? static_cast<double>(st.commits) / static_cast<double>(st.groups) : 0.0);
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}
