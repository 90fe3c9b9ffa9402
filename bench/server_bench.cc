// Control-plane throughput, side by side in one run (figures go to docs/performance.md):
//
//   A. Durable submissions per second. An in-process PoolService (SQLite store, the scheduling loop
//      running) behind HttpApi on 127.0.0.1, a few registered nodes, and N client threads, each
//      with its own keep-alive httplib::Client, POSTing small JSON jobs until a fixed count is
//      acknowledged (201). synchronous=FULL (durable against power loss) and NORMAL side by side.
//      Breakdown rows peel the layers off at the same thread counts: clients without TCP_NODELAY
//      (as httplib defaults), more HTTP worker threads, HTTP with the loop stopped, a what-if HTTP
//      front with TCP_NODELAY and a larger listen backlog (the bench's own code, not the server's),
//      PoolService::SubmitJob called in-process with the loop running and stopped, and the store
//      alone (job-sized batches through a GroupCommitter).
//   B. Placement rate with many nodes: nodes registered, jobs of mixed shapes queued with the loop
//      stopped, then PoolService::RunCycle() until a cycle places nothing; jobs and tasks placed per
//      second of cycle time, per placement profile (and with preemption off, to show its cost).
//   C. Restart and retention with a long history: a store holding H finished jobs (each with its
//      task and four events, stored as the server stores them, last changed eight days ago) and
//      10 pending ones. The time PoolService::Open takes to recover it, the cycles retention (7
//      days) needs to remove the history and their time, and Open again afterwards.
//   D. Lists under load: J pending jobs of 10 tasks each, L clients GETting /api/v1/jobs?limit=1000
//      (summaries) back to back for S seconds, while one client times GET /healthz and an agent's
//      heartbeat (POST .../heartbeat) every 10 ms: their p50/p99/max, and the lists answered.
//
// Every database lives in a fresh directory under $TMPDIR (default /tmp), removed at the end; point
// TMPDIR at the disk the server would use to measure that disk.
//
//   server_bench [--jobs N] [--threads 1,4,16,64] [--nodes N] [--queued N]
//                [--profiles bestfit,fgd] [--skip-http] [--skip-place] [--no-breakdown]
//                [--row-seconds S] [--cycle-budget S] [--history H] [--skip-retention]
//                [--list-jobs J] [--list-clients L] [--list-seconds S] [--skip-lists]
//                [--http-workers N] [--http-io-threads N]   (http.workers / http.ioThreads of every
//                HTTP row; default the server's)

#include <fmt/format.h>
#include <httplib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <latch>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "server/config.h"
#include "server/http_api.h"
#include "server/service.h"
#include "store/sqlite_store.h"
#include "store/store.h"

namespace gpupool {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr char kToken[] = "server-bench-admin-token";

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// ---- options ------------------------------------------------------------------------------------

struct Options {
  int jobs = 5000;  // A: submissions per setting
  std::vector<int> threads = {1, 4, 16, 64};
  int nodes = 1000;    // B: registered nodes
  int queued = 20000;  // B: queued jobs
  std::vector<std::string> profiles = {"bestfit", "fgd"};
  bool http = true;
  bool place = true;
  bool breakdown = true;
  double cycle_budget_s = 300;  // B: stop cycling a setting after this much cycle time
  double row_seconds = 60;      // A: stop a row after this long
  int history = 100000;         // C: finished jobs in the store
  bool retention = true;
  int list_jobs = 5000;      // D: pending jobs (10 tasks each)
  int list_clients = 16;     // D: clients listing back to back
  double list_seconds = 10;  // D: how long they list
  bool lists = true;
  int http_workers = 0;  // A: http.workers for every HTTP row (0: ServerConfig's default)
  int http_io_threads = 0;  // A: http.ioThreads likewise
};

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

bool ParseOptions(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    std::string v;
    if (a == "--skip-http") {
      o->http = false;
    } else if (a == "--skip-place") {
      o->place = false;
    } else if (a == "--skip-retention") {
      o->retention = false;
    } else if (a == "--history" && value(&v)) {
      o->history = std::max(1, std::atoi(v.c_str()));
    } else if (a == "--skip-lists") {
      o->lists = false;
    } else if (a == "--list-jobs" && value(&v)) {
      o->list_jobs = std::max(1, std::atoi(v.c_str()));
    } else if (a == "--list-clients" && value(&v)) {
      o->list_clients = std::max(1, std::atoi(v.c_str()));
    } else if (a == "--list-seconds" && value(&v)) {
      o->list_seconds = std::max(1.0, std::atof(v.c_str()));
    } else if (a == "--http-io-threads" && value(&v)) {
      o->http_io_threads = std::max(1, std::atoi(v.c_str()));
    } else if (a == "--http-workers" && value(&v)) {
      o->http_workers = std::max(1, std::atoi(v.c_str()));
    } else if (a == "--no-breakdown") {
      o->breakdown = false;
    } else if (a == "--jobs" && value(&v)) {
      o->jobs = std::max(1, std::atoi(v.c_str()));
    } else if (a == "--nodes" && value(&v)) {
      o->nodes = std::max(1, std::atoi(v.c_str()));
    } else if (a == "--queued" && value(&v)) {
      o->queued = std::max(1, std::atoi(v.c_str()));
    } else if (a == "--row-seconds" && value(&v)) {
      o->row_seconds = std::max(1.0, std::atof(v.c_str()));
    } else if (a == "--cycle-budget" && value(&v)) {
      o->cycle_budget_s = std::max(1.0, std::atof(v.c_str()));
    } else if (a == "--threads" && value(&v)) {
      o->threads.clear();
      for (const auto& t : SplitList(v)) o->threads.push_back(std::max(1, std::atoi(t.c_str())));
    } else if (a == "--profiles" && value(&v)) {
      o->profiles = SplitList(v);
    } else {
      std::fprintf(stderr,
                   "usage: server_bench [--jobs N] [--threads 1,4,16,64] [--nodes N] [--queued N]\n"
                   "                    [--profiles bestfit,fgd] [--skip-http] [--skip-place] "
                   "[--no-breakdown]\n                    [--row-seconds S] [--cycle-budget S] [--history H] "
                   "[--skip-retention]\n                    [--list-jobs J] [--list-clients L] "
                   "[--list-seconds S] [--skip-lists]\n                    [--http-workers N] [--http-io-threads N]\n");
      return false;
    }
  }
  return true;
}

// ---- helpers ------------------------------------------------------------------------------------

class TempDir {
 public:
  TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/gpupool-server-bench-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::perror("mkdtemp");
      std::exit(1);
    }
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "server_bench: %s\n", what.c_str());
  std::exit(1);
}

// Forwards to the real store and times every Apply: how many groups the group committer formed,
// how many ops they carried, and how long the writes (the fsyncs) took.
class TimedStore final : public Store {
 public:
  explicit TimedStore(std::unique_ptr<Store> inner) : inner_(std::move(inner)) {}
  Status Apply(const WriteBatch& batch) override {
    const auto t0 = Clock::now();
    Status st = inner_->Apply(batch);
    const double dt = Seconds(Clock::now() - t0);
    std::lock_guard<std::mutex> lock(mu_);
    ++applies_;
    ops_ += batch.ops.size();
    apply_s_ += dt;
    return st;
  }
  Result<StoreSnapshot> Load() override { return inner_->Load(); }
  Result<std::vector<EventRecord>> ListEvents(const std::string& job_id, int64_t after_id,
                                              int limit) override {
    return inner_->ListEvents(job_id, after_id, limit);
  }
  int schema_version() const override { return inner_->schema_version(); }

  struct Totals {
    uint64_t applies = 0, ops = 0;
    double apply_s = 0;
  };
  Totals TakeTotals() {
    std::lock_guard<std::mutex> lock(mu_);
    Totals t{applies_, ops_, apply_s_};
    applies_ = ops_ = 0;
    apply_s_ = 0;
    return t;
  }

 private:
  std::unique_ptr<Store> inner_;
  std::mutex mu_;
  uint64_t applies_ = 0, ops_ = 0;
  double apply_s_ = 0;
};

// A service over a fresh store in `dir`; `timed` (optional) receives the store wrapper.
std::unique_ptr<PoolService> OpenService(const ServerConfig& config, TimedStore** timed) {
  SqliteStoreOptions o;
  o.path = config.data_dir + "/gpupool.db";
  o.synchronous_full = config.sync_full;
  auto store = OpenSqliteStore(o);
  if (!store.ok()) Die(store.status().ToString());
  auto wrapper = std::make_unique<TimedStore>(std::move(store).value());
  if (timed != nullptr) *timed = wrapper.get();
  auto service = PoolService::Open(config, std::move(wrapper));
  if (!service.ok()) Die(service.status().ToString());
  return std::move(service).value();
}

// A value of the Prometheus text (first sample whose line starts with `name`), or 0.
double MetricValue(const std::string& text, const std::string& name) {
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) {
    if (line.rfind(name + " ", 0) == 0 || line.rfind(name + "{", 0) == 0) {
      const size_t space = line.rfind(' ');
      return std::atof(line.c_str() + space + 1);
    }
  }
  return 0;
}

struct LatencySummary {
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
};

LatencySummary Summarize(std::vector<double> us) {
  LatencySummary s;
  if (us.empty()) return s;
  std::sort(us.begin(), us.end());
  auto at = [&](double q) {
    const size_t i =
        std::min(us.size() - 1, static_cast<size_t>(q * static_cast<double>(us.size() - 1) + 0.5));
    return us[i] / 1000.0;
  };
  s.p50_ms = at(0.50);
  s.p99_ms = at(0.99);
  s.max_ms = us.back() / 1000.0;
  return s;
}

// ---- A: submissions -----------------------------------------------------------------------------

// The job every submission sends: one task of a quarter GPU (the few nodes fill after 128 of them;
// the rest stay pending, which the loop then revisits every cycle, as a busy server would).
constexpr char kSmallJob[] =
    R"({"name":"bench","tasks":[{"name":"main","resources":{"cpu":"1","memory":"2Gi","gpu":0.25},)"
    R"("command":["python3","serve.py"]}]})";
constexpr int kFewNodes = 4;

json SmallNode(int i) {
  json gpus = json::array();
  for (int g = 0; g < 8; ++g) gpus.push_back({{"index", g}, {"model", "A100-80GB"}});
  return {{"name", fmt::format("node-{}", i)}, {"cpu", "128"}, {"memory", "1Ti"}, {"gpus", gpus}};
}

enum class Path {
  kStoreOnly,    // GroupCommitter::Commit of a job-sized batch
  kInProcess,    // PoolService::SubmitJob
  kHttp,         // POST /api/v1/jobs to HttpApi
  kHttpNoDelay,  // POST /api/v1/jobs to the bench's own minimal front with TCP_NODELAY (a what-if)
};

struct SubmitSetting {
  std::string label;
  Path path = Path::kHttp;
  bool sync_full = true;
  bool loop = true;
  bool client_nodelay = true;  // the clients set TCP_NODELAY
  int http_threads = 0;        // 0: ServerConfig's default
  int only_threads = 0;        // run at this client count only (0: every count)
};

struct SubmitResult {
  int threads = 0;
  double seconds = 0;
  int ok = 0, failed = 0;
  bool capped = false;
  LatencySummary latency;
  TimedStore::Totals store;
  double cycles = 0, cycle_s = 0;  // scheduling cycles run during the measurement, their time
  std::string first_error;
};

// The store alone: job-sized batches (the job, its task, its Submitted event) through a group
// committer, as SubmitJob writes them. The ceiling the disk sets.
WriteBatch JobBatch(uint64_t n) {
  JobRecord j;
  j.id = fmt::format("j-{:012}", n);
  j.seq = n;
  j.tenant = "default";
  j.queue = "default";
  j.name = "bench";
  j.state = "pending";
  j.spec_json = kSmallJob;
  j.created_ms = j.updated_ms = 1'800'000'000'000 + static_cast<int64_t>(n);
  TaskRecord t;
  t.job_id = j.id;
  t.state = "pending";
  t.updated_ms = j.created_ms;
  EventRecord e;
  e.job_id = j.id;
  e.time_ms = j.created_ms;
  e.type = "Submitted";
  e.message = "by tenant 'default' to queue 'default': 1 task(s), needs cpu 1, memory 2Gi, gpu 0.25";
  WriteBatch b;
  b.Add(PutJob{std::move(j)});
  b.Add(PutTask{std::move(t)});
  b.Add(AppendEvent{std::move(e)});
  return b;
}

// What HttpApi does for POST /api/v1/jobs, cut to the bone (bearer check, SubmitJob, 201 with the
// job), on an httplib::Server with TCP_NODELAY set and a listen backlog of 1024: the what-if for
// the two HTTP-layer settings that dominate the server's figures (see docs/performance.md).
class NoDelayFront {
 public:
  NoDelayFront(PoolService& service, int threads) : service_(service) {
    server_.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
    server_.set_tcp_nodelay(true);
    server_.set_keep_alive_max_count(1000);
    server_.set_socket_options([this](int fd) {
      const int yes = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      listen_fd_ = fd;
    });
    server_.Post("/api/v1/jobs", [this](const httplib::Request& req, httplib::Response& res) {
      if (req.get_header_value("Authorization") != fmt::format("Bearer {}", kToken)) {
        res.status = 401;
        return;
      }
      auto job = service_.SubmitJob(Principal{"", Role::kAdmin}, req.body, SpecFormat::kJson);
      res.status = job.ok() ? 201 : 400;
      res.set_content(job.ok() ? job->dump() : job.status().ToString(), "application/json");
    });
  }
  ~NoDelayFront() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  NoDelayFront(const NoDelayFront&) = delete;
  NoDelayFront& operator=(const NoDelayFront&) = delete;
  int Start() {
    const int port = server_.bind_to_any_port("127.0.0.1");
    if (port < 0 || listen_fd_ < 0) Die("the what-if front cannot bind");
    // httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into the packaged
    // library): more simultaneous connects overflow it and wait for the 1 s SYN retransmit. Linux
    // takes a second listen() on a listening socket as a new backlog.
    if (::listen(listen_fd_, 1024) != 0) Die("the what-if front cannot raise its listen backlog");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return port;
  }

 private:
  PoolService& service_;
  httplib::Server server_;
  int listen_fd_ = -1;
  std::thread thread_;
};

int g_http_workers = 0;     // --http-workers
int g_http_io_threads = 0;  // --http-io-threads

SubmitResult RunSubmissions(const SubmitSetting& s, int threads, int jobs, double row_seconds) {
  TempDir dir;
  ServerConfig config;
  config.data_dir = dir.path();
  config.sync_full = s.sync_full;
  // The bench registers nodes but runs no agents: no heartbeats, so nodes must not time out.
  config.heartbeat_timeout_seconds = 86400;
  config.tokens[kToken] = Principal{"", Role::kAdmin};
  if (g_http_workers > 0) config.http.workers = g_http_workers;
  if (g_http_io_threads > 0) config.http.io_threads = g_http_io_threads;
  if (s.http_threads > 0) config.http.workers = s.http_threads;
  // One tenant submits everything, and most of it stays pending: no tenant limit gets in the way.
  config.max_pending_jobs_per_tenant = config.max_pending_tasks_per_tenant = 1000000000;

  SubmitResult r;
  r.threads = threads;
  std::unique_ptr<Store> bare_store;
  std::unique_ptr<GroupCommitter> committer;
  std::unique_ptr<PoolService> service;
  std::unique_ptr<HttpApi> api;
  std::unique_ptr<NoDelayFront> front;
  TimedStore* timed = nullptr;
  int port = 0;
  if (s.path == Path::kStoreOnly) {
    auto store = OpenSqliteStore({config.data_dir + "/gpupool.db", s.sync_full});
    if (!store.ok()) Die(store.status().ToString());
    bare_store = std::make_unique<TimedStore>(std::move(store).value());
    timed = static_cast<TimedStore*>(bare_store.get());
    committer = std::make_unique<GroupCommitter>(*bare_store);
  } else {
    service = OpenService(config, &timed);
    for (int i = 0; i < kFewNodes; ++i) {
      auto reg = service->RegisterNode(SmallNode(i));
      if (!reg.ok()) Die(reg.status().ToString());
    }
    if (s.loop) service->Start();
    if (s.path == Path::kHttp) {
      api = std::make_unique<HttpApi>(*service, config);
      auto bound = api->Start("127.0.0.1", 0);
      if (!bound.ok()) Die(bound.status().ToString());
      port = *bound;
    } else if (s.path == Path::kHttpNoDelay) {
      front = std::make_unique<NoDelayFront>(*service, config.http.workers);
      port = front->Start();
    }
  }
  const std::string metrics_before = service ? service->MetricsText() : "";
  (void)timed->TakeTotals();

  std::vector<std::vector<double>> lat(static_cast<size_t>(threads));
  std::atomic<int> done{0}, failed{0};
  std::atomic<uint64_t> next_id{1};
  std::atomic<bool> capped{false};
  std::mutex err_mu;
  std::string first_error;
  auto note_error = [&](const std::string& e) {
    failed.fetch_add(1);
    std::lock_guard<std::mutex> lock(err_mu);
    if (first_error.empty()) first_error = e;
  };
  std::latch ready(threads + 1);
  std::latch go(1);
  std::vector<std::thread> workers;
  const Principal admin{"", Role::kAdmin};
  const bool http = s.path == Path::kHttp || s.path == Path::kHttpNoDelay;
  Clock::time_point deadline;
  for (int t = 0; t < threads; ++t) {
    const int count = jobs / threads + (t < jobs % threads ? 1 : 0);
    workers.emplace_back([&, t, count] {
      std::vector<double>& mine = lat[static_cast<size_t>(t)];
      mine.reserve(static_cast<size_t>(count));
      std::unique_ptr<httplib::Client> cli;
      const httplib::Headers headers = {{"Authorization", fmt::format("Bearer {}", kToken)}};
      if (http) {
        // No request before the start: a connection beyond the server's worker count would wait
        // for a worker (keep-alive pins one per connection) and hold up the start.
        cli = std::make_unique<httplib::Client>("127.0.0.1", port);
        cli->set_keep_alive(true);
        cli->set_tcp_nodelay(s.client_nodelay);
        cli->set_read_timeout(300, 0);
        cli->set_write_timeout(300, 0);
        cli->set_connection_timeout(300, 0);
      }
      ready.count_down();
      go.wait();
      for (int i = 0; i < count; ++i) {
        if (Clock::now() > deadline) {
          capped = true;
          break;
        }
        const auto t0 = Clock::now();
        if (s.path == Path::kStoreOnly) {
          Status st = committer->Commit(JobBatch(next_id.fetch_add(1)));
          if (!st.ok()) note_error(st.ToString());
        } else if (s.path == Path::kInProcess) {
          auto res = service->SubmitJob(admin, kSmallJob, SpecFormat::kJson);
          if (!res.ok()) note_error(res.status().ToString());
        } else {
          auto res = cli->Post("/api/v1/jobs", headers, kSmallJob, "application/json");
          if (!res) {
            note_error(fmt::format("HTTP: {}", httplib::to_string(res.error())));
          } else if (res->status != 201) {
            note_error(fmt::format("HTTP {}: {}", res->status, res->body.substr(0, 200)));
          }
        }
        mine.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        done.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  ready.arrive_and_wait();
  const auto start = Clock::now();
  deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(row_seconds));
  go.count_down();
  for (auto& w : workers) w.join();
  r.seconds = Seconds(Clock::now() - start);
  r.store = timed->TakeTotals();
  if (service) {
    const std::string after = service->MetricsText();
    r.cycles = MetricValue(after, "gpupool_scheduling_cycles_total") -
               MetricValue(metrics_before, "gpupool_scheduling_cycles_total");
    r.cycle_s = MetricValue(after, "gpupool_scheduling_cycle_seconds_sum") -
                MetricValue(metrics_before, "gpupool_scheduling_cycle_seconds_sum");
  }
  r.failed = failed.load();
  r.ok = done.load() - r.failed;
  r.capped = capped.load();
  r.first_error = first_error;
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  r.latency = Summarize(std::move(all));
  front.reset();
  if (api) api->Stop();
  if (service) service->Stop();
  return r;
}

void RunPartA(const Options& o) {
  g_http_workers = o.http_workers;
  g_http_io_threads = o.http_io_threads;
  if (o.http_io_threads > 0) std::printf("http.ioThreads: %d (--http-io-threads)\n", o.http_io_threads);
  if (o.http_workers > 0) std::printf("http.workers: %d (--http-workers)\n", o.http_workers);
  const int most = *std::max_element(o.threads.begin(), o.threads.end());
  std::vector<SubmitSetting> settings = {
      {"HTTP + loop, FULL (durable)", Path::kHttp, true, true},
      {"HTTP + loop, NORMAL", Path::kHttp, false, true},
  };
  if (o.breakdown) {
    settings.push_back({"  HTTP + loop, FULL, client without NODELAY", Path::kHttp, true, true, false});
    settings.push_back({"  HTTP + loop, FULL, httpThreads=16", Path::kHttp, true, true, true, 16, most});
    settings.push_back({"  HTTP, loop stopped, FULL", Path::kHttp, true, false});
    settings.push_back({"  what-if: NODELAY+backlog front + loop, FULL", Path::kHttpNoDelay, true, true});
    settings.push_back({"  what-if: NODELAY+backlog front + loop, NORMAL", Path::kHttpNoDelay, false, true});
    settings.push_back({"  SubmitJob in-process + loop, FULL", Path::kInProcess, true, true});
    settings.push_back({"  SubmitJob in-process, loop stopped, FULL", Path::kInProcess, true, false});
    settings.push_back({"  store only (GroupCommitter), FULL", Path::kStoreOnly, true, false});
    settings.push_back({"  store only (GroupCommitter), NORMAL", Path::kStoreOnly, false, false});
  }
  std::printf(
      "\n== A. Submissions: %d small JSON jobs per row (at most %.0f s a row), %d nodes x 8 A100 "
      "registered (%d quarter-GPU tasks fit; the rest stay pending)\n",
      o.jobs, o.row_seconds, kFewNodes, kFewNodes * 8 * 4);
  std::printf("%-45s %7s %6s %8s %8s %8s %8s %7s %7s %7s %7s %7s\n", "setting", "clients", "done", "subm/s",
              "p50 ms", "p99 ms", "max ms", "applies", "ops/app", "apply s", "cycles", "cycle s");
  for (const SubmitSetting& s : settings) {
    for (int threads : o.threads) {
      if (s.only_threads > 0 && threads != s.only_threads) continue;
      const SubmitResult r = RunSubmissions(s, threads, o.jobs, o.row_seconds);
      std::printf(
          "%-45s %7d %5d%s %8.0f %8.2f %8.2f %8.1f %7llu %7.1f %7.2f %7.0f %7.2f\n", s.label.c_str(), threads,
          r.ok, r.capped ? "*" : " ", r.ok / r.seconds, r.latency.p50_ms, r.latency.p99_ms, r.latency.max_ms,
          static_cast<unsigned long long>(r.store.applies),
          r.store.applies ? static_cast<double>(r.store.ops) / static_cast<double>(r.store.applies) : 0.0,
          r.store.apply_s, r.cycles, r.cycle_s);
      if (r.failed > 0) std::printf("    %d failed; first: %s\n", r.failed, r.first_error.c_str());
      std::fflush(stdout);
    }
  }
  std::printf(
      "  done: submissions acknowledged (* the row hit its time limit first); subm/s: done / wall time;\n"
      "  p50/p99/max: per-request latency seen by the client. HTTP clients: one keep-alive httplib::Client\n"
      "  per thread, TCP_NODELAY set unless the row says otherwise. applies: Store::Apply calls (group\n"
      "  commits); ops/app: writes per Apply; apply s: time inside Apply summed over calls (write + fsync);\n"
      "  cycles / cycle s: scheduling cycles during the row and their summed time\n"
      "  (gpupool_scheduling_cycle_seconds: under the service mutex, without the cycle's own commit, which\n"
      "  the loop makes after it lets go of the mutex). what-if rows: the bench's own minimal POST /api/v1/jobs\n"
      "  route (bearer check, SubmitJob, 201) on an httplib server with TCP_NODELAY and a listen backlog of\n"
      "  1024 instead of 5; not the server's code, but what HttpApi would do with those two settings.\n");
}

// ---- B: placement -------------------------------------------------------------------------------

const char* const kModels[] = {"A100-80GB", "H100-80GB", "V100M32", "A10", "T4"};

json BigNode(int i) {
  const char* model = kModels[static_cast<size_t>(i) % std::size(kModels)];
  json gpus = json::array();
  for (int g = 0; g < 8; ++g) gpus.push_back({{"index", g}, {"model", model}});
  return {{"name", fmt::format("node-{:04}", i)},
          {"cpu", "128"},
          {"memory", "1Ti"},
          {"labels", {{"zone", i % 2 == 0 ? "a" : "b"}}},
          {"gpus", gpus}};
}

// Mixed shapes: shares of one GPU, whole GPUs, multi-GPU tasks, 2-4 task gangs; some pinned to
// models. Deterministic for a seed.
std::string MixedJob(std::mt19937& rng, int n) {
  const int pick = static_cast<int>(rng() % 100);
  json resources = {{"cpu", "4"}, {"memory", "16Gi"}};
  int replicas = 1;
  if (pick < 25) {
    resources["gpu"] = 0.25;
  } else if (pick < 40) {
    resources["gpu"] = 0.5;
    resources["gpuMemory"] = "10Gi";
  } else if (pick < 60) {
    resources["gpu"] = 1;
  } else if (pick < 70) {
    resources["gpu"] = 2;
  } else if (pick < 75) {
    resources["gpu"] = 4;
  } else if (pick < 78) {
    resources["gpu"] = 8;
  } else if (pick < 88) {
    replicas = 2 + static_cast<int>(rng() % 3);
    resources["gpu"] = 1;
  } else if (pick < 93) {
    replicas = 2 + static_cast<int>(rng() % 3);
    resources["gpu"] = 0.5;
  } else {
    resources["gpu"] = 1;
    resources["gpuModels"] = {"A100-80GB", "H100-80GB"};
  }
  json job = {
      {"name", fmt::format("mix-{}", n)},
      {"tasks", {{{"name", "w"}, {"replicas", replicas}, {"resources", resources}, {"command", {"train"}}}}}};
  return job.dump();
}

struct PlaceSetting {
  std::string profile;
  bool preemption = true;
};

void RunPlacement(const Options& o, const PlaceSetting& s) {
  TempDir dir;
  ServerConfig config;
  config.data_dir = dir.path();
  config.profile = s.profile;
  config.preemption = s.preemption;
  config.sync_full = true;
  config.max_pending_jobs_per_tenant = config.max_pending_tasks_per_tenant = 1000000000;  // one tenant queues all
  TimedStore* timed = nullptr;
  auto service = OpenService(config, &timed);

  auto t0 = Clock::now();
  for (int i = 0; i < o.nodes; ++i) {
    auto r = service->RegisterNode(BigNode(i));
    if (!r.ok()) Die(r.status().ToString());
  }
  const double reg_s = Seconds(Clock::now() - t0);

  // Queue the jobs from 8 threads (group commit), the loop stopped.
  std::vector<std::string> bodies;
  std::mt19937 rng(42);
  for (int i = 0; i < o.queued; ++i) bodies.push_back(MixedJob(rng, i));
  std::atomic<size_t> next{0};
  std::atomic<int> refused{0};
  t0 = Clock::now();
  {
    std::vector<std::thread> submitters;
    const Principal admin{"", Role::kAdmin};
    for (int t = 0; t < 8; ++t) {
      submitters.emplace_back([&] {
        for (size_t i = next.fetch_add(1); i < bodies.size(); i = next.fetch_add(1)) {
          auto r = service->SubmitJob(admin, bodies[i], SpecFormat::kJson);
          if (!r.ok()) {
            if (refused.fetch_add(1) == 0)
              std::fprintf(stderr, "refused: %s\n", r.status().ToString().c_str());
          }
        }
      });
    }
    for (auto& t : submitters) t.join();
  }
  const double submit_s = Seconds(Clock::now() - t0);
  (void)timed->TakeTotals();

  // Cycle until nothing more places.
  std::vector<double> cycle_s;
  std::vector<int> cycle_placed;
  int placed = 0;
  double total = 0;
  bool capped = false;
  const double tasks_before = MetricValue(service->MetricsText(), "gpupool_task_placements_total");
  for (;;) {
    const auto c0 = Clock::now();
    const int p = service->RunCycle();
    const double dt = Seconds(Clock::now() - c0);
    cycle_s.push_back(dt);
    cycle_placed.push_back(p);
    total += dt;
    placed += p;
    if (p == 0) break;
    if (total > o.cycle_budget_s) {
      capped = true;
      break;
    }
  }
  const std::string metrics = service->MetricsText();
  const double tasks = MetricValue(metrics, "gpupool_task_placements_total") - tasks_before;
  const TimedStore::Totals st = timed->TakeTotals();
  const double gpus_used = MetricValue(metrics, "gpupool_pool_gpu_allocated");
  const double gpus_total = MetricValue(metrics, "gpupool_pool_gpus");
  Status inv = service->CheckInvariants();
  // Time until the last placement: the cycles that placed something.
  double productive = 0;
  for (size_t i = 0; i < cycle_s.size(); ++i) {
    if (cycle_placed[i] > 0) productive += cycle_s[i];
  }
  std::string per_cycle;
  for (size_t i = 0; i < cycle_s.size(); ++i) {
    per_cycle += fmt::format("{}{}:{:.2f}s", i ? " " : "", cycle_placed[i], cycle_s[i]);
  }
  std::printf("%-9s %-6s %6.1f %8.0f %7zu %8d %8.0f %9.2f %10.0f %10.0f %10.0f %7.0f/%-5.0f %s%s\n",
              s.profile.c_str(), s.preemption ? "on" : "off", reg_s, o.queued / submit_s, cycle_s.size(),
              placed, tasks, total, placed / total, tasks / total, productive > 0 ? placed / productive : 0.0,
              gpus_used, gpus_total, capped ? "CAPPED " : "",
              inv.ok() ? "" : fmt::format("INVARIANTS: {}", inv.ToString()).c_str());
  std::printf("          cycles (placed:time) %s; store: %llu applies, %.2f s\n", per_cycle.c_str(),
              static_cast<unsigned long long>(st.applies), st.apply_s);
  if (refused > 0) std::printf("          %d submissions refused\n", refused.load());
  std::fflush(stdout);
  service->Stop();
}

void RunPartB(const Options& o) {
  std::printf(
      "\n== B. Placement: %d nodes x 8 GPUs (%s, cycled), %d queued jobs of mixed shapes, "
      "RunCycle() until a cycle places nothing (synchronous=FULL)\n",
      o.nodes, "A100-80GB/H100-80GB/V100M32/A10/T4", o.queued);
  std::printf("%-9s %-6s %6s %8s %7s %8s %8s %9s %10s %10s %10s %13s\n", "profile", "preempt", "reg s",
              "queue/s", "cycles", "jobs", "tasks", "cycle s", "jobs/s", "tasks/s", "jobs/s*", "GPUs used");
  for (const std::string& p : o.profiles) {
    for (bool preempt : {true, false}) RunPlacement(o, {p, preempt});
  }
  std::printf(
      "  reg s: registering the nodes one by one; queue/s: in-process SubmitJob rate from 8 threads with the "
      "loop\n"
      "  stopped; jobs/s, tasks/s: placed per second of cycle time, the final empty cycle included; "
      "jobs/s*:\n"
      "  the same over the cycles that placed something. preempt: config.preemption (the default is on).\n");
}

// ---- C. restart and retention ---------------------------------------------------------------------

void RunPartC(const Options& o) {
  std::printf(
      "\n== C. Restart and retention: %d finished jobs in the store (each: job, task, 4 events), 10 "
      "pending\n",
      o.history);
  TempDir dir;
  ServerConfig config;
  config.data_dir = dir.path();
  config.sync_full = true;
  config.finished_job_retention_seconds = 0;  // off while the history is written
  const std::string db = config.data_dir + "/gpupool.db";
  // One real job through the service, for the records exactly as the server stores them.
  JobRecord model_job;
  TaskRecord model_task;
  {
    auto service = OpenService(config, nullptr);
    for (int i = 0; i < 10; ++i) {
      auto r = service->SubmitJob(Principal{"", Role::kAdmin}, kSmallJob, SpecFormat::kJson);
      if (!r.ok()) Die(r.status().ToString());
    }
  }
  {
    SqliteStoreOptions so;
    so.path = db;
    auto store = OpenSqliteStore(so);
    if (!store.ok()) Die(store.status().ToString());
    auto snap = (*store)->Load();
    if (!snap.ok() || snap->jobs.empty() || snap->tasks.empty()) Die("no job to copy");
    model_job = snap->jobs.front();
    model_task = snap->tasks.front();
    const int64_t long_ago = model_job.updated_ms - int64_t{8} * 86400 * 1000;
    for (int done = 0; done < o.history;) {
      WriteBatch b;
      for (int k = 0; k < 1000 && done < o.history; ++k, ++done) {
        JobRecord j = model_job;
        j.seq = 1000 + static_cast<uint64_t>(done);  // after the 10 live ones
        j.id = fmt::format("j-{:012}", j.seq);
        j.state = "succeeded";
        j.created_ms = j.updated_ms = long_ago;
        TaskRecord t = model_task;
        t.job_id = j.id;
        t.state = "succeeded";
        t.updated_ms = long_ago;
        for (const char* type : {"Submitted", "Scheduled", "TaskStarted", "Succeeded"}) {
          EventRecord e;
          e.job_id = j.id;
          e.time_ms = long_ago;
          e.type = type;
          e.message = "bench history";
          b.Add(AppendEvent{std::move(e)});
        }
        b.Add(PutJob{std::move(j)});
        b.Add(PutTask{std::move(t)});
      }
      if (Status st = (*store)->Apply(b); !st.ok()) Die(st.ToString());
    }
  }
  auto file_mib = [&] {
    std::error_code ec;
    return static_cast<double>(std::filesystem::file_size(db, ec)) / (1 << 20);
  };
  std::printf("%-34s %10s %10s %10s\n", "step", "seconds", "jobs held", "file MiB");
  auto jobs_held = [](PoolService& s) {
    const std::string m = s.MetricsText();
    double n = 0;
    for (const char* state : {"pending", "running", "succeeded", "failed", "cancelled"}) {
      n += MetricValue(m, fmt::format("gpupool_jobs{{state=\"{}\"}}", state));
    }
    return static_cast<size_t>(n);
  };
  config.finished_job_retention_seconds = 7 * 86400;
  {
    auto t0 = Clock::now();
    auto service = OpenService(config, nullptr);
    const double open_s = Seconds(Clock::now() - t0);
    std::printf("%-34s %10.3f %10zu %10.1f\n", "open (recover) with the history", open_s, jobs_held(*service),
                file_mib());
    int cycles = 0;
    double cycle_s = 0, worst = 0;
    for (;;) {
      t0 = Clock::now();
      service->RunCycle();
      const double s = Seconds(Clock::now() - t0);
      ++cycles;
      cycle_s += s;
      worst = std::max(worst, s);
      if (MetricValue(service->MetricsText(), "gpupool_jobs_removed_total") >= o.history) break;
      if (cycles == 10000) Die("retention did not remove the history in 10,000 cycles");
    }
    if (jobs_held(*service) != 10) {
      Die(fmt::format("after retention {} jobs are held, not 10", jobs_held(*service)));
    }
    std::printf("%-34s %10.3f %10zu %10.1f\n", fmt::format("retention: {} cycles", cycles).c_str(), cycle_s,
                jobs_held(*service), file_mib());
    std::printf("%-34s %10.3f\n", "  the slowest of those cycles", worst);
  }
  {
    auto t0 = Clock::now();
    auto service = OpenService(config, nullptr);
    const double open_s = Seconds(Clock::now() - t0);
    std::printf("%-34s %10.3f %10zu %10.1f\n", "open (recover) after retention", open_s, jobs_held(*service),
                file_mib());
  }
  std::printf(
      "  synchronous=FULL; retention removes at most 5,000 jobs per cycle. SQLite reuses the freed pages "
      "but does not\n  shrink the file (VACUUM would).\n");
}

// ---- D: lists under load ---------------------------------------------------------------------

void RunPartD(const Options& o) {
  std::printf("\nD. Lists under load: %d pending jobs of 10 tasks, %d clients listing (limit=1000) for %.0f s\n",
              o.list_jobs, o.list_clients, o.list_seconds);
  TempDir dir;
  ServerConfig config;
  config.data_dir = dir.path();
  config.sync_full = false;
  config.heartbeat_timeout_seconds = 86400;
  config.tokens[kToken] = Principal{"", Role::kAdmin};
  config.http.workers = o.list_clients + 8;
  config.max_pending_jobs_per_tenant = config.max_pending_tasks_per_tenant = 1000000000;
  auto service = OpenService(config, nullptr);
  if (auto r = service->RegisterNode(SmallNode(0)); !r.ok()) Die(r.status().ToString());
  // Ten tasks of 8 GPUs each on one 8-GPU node: a gang that never fits, so every job stays pending.
  const std::string job =
      R"({"name":"wide","tasks":[{"name":"w","replicas":10,"resources":{"cpu":"1","memory":"1Gi","gpu":8},)"
      R"("command":["true"]}]})";
  const Principal admin{"", Role::kAdmin};
  for (int i = 0; i < o.list_jobs; ++i) {
    if (auto r = service->SubmitJob(admin, job, SpecFormat::kJson); !r.ok()) Die(r.status().ToString());
  }
  service->Start();
  HttpApi api(*service, config);
  auto port = api.Start("127.0.0.1", 0);
  if (!port.ok()) Die(port.status().ToString());
  const httplib::Headers headers = {{"Authorization", fmt::format("Bearer {}", kToken)}};
  std::atomic<bool> stop{false};
  std::atomic<int64_t> lists{0}, list_bytes{0}, list_errors{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < o.list_clients; ++c) {
    clients.emplace_back([&] {
      httplib::Client cli("127.0.0.1", *port);
      cli.set_read_timeout(60, 0);
      while (!stop) {
        auto r = cli.Get("/api/v1/jobs?limit=1000", headers);
        if (r && r->status == 200) {
          ++lists;
          list_bytes += static_cast<int64_t>(r->body.size());
        } else {
          ++list_errors;
        }
      }
    });
  }
  std::vector<double> health_us, beat_us;
  httplib::Client probe("127.0.0.1", *port);
  probe.set_read_timeout(60, 0);
  const auto t0 = Clock::now();
  while (Seconds(Clock::now() - t0) < o.list_seconds) {
    auto a = Clock::now();
    auto h = probe.Get("/healthz");
    auto b = Clock::now();
    auto hb = probe.Post("/api/v1/agent/nodes/node-0/heartbeat", headers, "{}", "application/json");
    auto c = Clock::now();
    if (h && h->status == 200) health_us.push_back(Seconds(b - a) * 1e6);
    if (hb && hb->status == 200) beat_us.push_back(Seconds(c - b) * 1e6);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop = true;
  for (auto& t : clients) t.join();
  const double secs = Seconds(Clock::now() - t0);
  api.Stop();
  service->Stop();
  const LatencySummary h = Summarize(health_us), hb = Summarize(beat_us);
  std::printf("  lists answered: %lld (%.1f/s, %.1f MB each), errors %lld\n", static_cast<long long>(lists.load()),
              static_cast<double>(lists.load()) / secs,
              lists.load() > 0 ? static_cast<double>(list_bytes.load()) / static_cast<double>(lists.load()) / 1e6 : 0.0,
              static_cast<long long>(list_errors.load()));
  std::printf("  GET /healthz   p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms  (%zu samples)\n", h.p50_ms, h.p99_ms,
              h.max_ms, health_us.size());
  std::printf("  heartbeat      p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms  (%zu samples)\n", hb.p50_ms, hb.p99_ms,
              hb.max_ms, beat_us.size());
}

}  // namespace
}  // namespace gpupool

int main(int argc, char** argv) {
  gpupool::Options o;
  if (!gpupool::ParseOptions(argc, argv, &o)) return 2;
  std::string command;
  for (int i = 0; i < argc; ++i) {
    if (i > 0) command += ' ';
    command += argv[i];
  }
  const char* tmp = std::getenv("TMPDIR");
  std::printf("server_bench: %s\n", command.c_str());
  std::printf("cores: %u (hardware_concurrency), %ld online; databases under %s\n",
              std::thread::hardware_concurrency(), sysconf(_SC_NPROCESSORS_ONLN),
              tmp != nullptr && *tmp != '\0' ? tmp : "/tmp");
#ifdef NDEBUG
  std::printf("build: optimised, NDEBUG\n");
#else
  std::printf("build: assertions on (not a Release build: figures are not representative)\n");
#endif
  if (o.http) gpupool::RunPartA(o);
  if (o.place) gpupool::RunPartB(o);
  if (o.retention) gpupool::RunPartC(o);
  if (o.lists) gpupool::RunPartD(o);
  return 0;
}
