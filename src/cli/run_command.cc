#include "cli/run_command.h"

#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

namespace gpupool {

namespace {

using Json = nlohmann::ordered_json;

// A job name from the command's first word: lower-case letters, digits and '-', at most 63.
std::string NameFromCommand(const std::vector<std::string>& command) {
  std::string base = command.empty() ? "run" : command.front();
  if (const auto slash = base.rfind('/'); slash != std::string::npos) base = base.substr(slash + 1);
  std::string name;
  for (char c : base) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u)) {
      name += static_cast<char>(std::tolower(u));
    } else if (!name.empty() && name.back() != '-') {
      name += '-';
    }
    if (name.size() == 56) break;
  }
  while (!name.empty() && name.back() == '-') name.pop_back();
  if (name.empty() || !std::isalpha(static_cast<unsigned char>(name.front()))) name = "run-" + name;
  while (!name.empty() && name.back() == '-') name.pop_back();
  return name;
}

bool Terminal(const std::string& state) {
  return state == "succeeded" || state == "failed" || state == "cancelled";
}

std::string Str(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

// "killed by SIGTERM ..." -> 15; 0 when the message names no signal.
int SignalIn(const std::string& message) {
  const auto at = message.find("SIG");
  if (at == std::string::npos) return 0;
  size_t end = at + 3;
  while (end < message.size() && std::isupper(static_cast<unsigned char>(message[end]))) ++end;
  const std::string abbrev = message.substr(at + 3, end - at - 3);
  for (int sig = 1; sig < NSIG; ++sig) {
    const char* a = sigabbrev_np(sig);
    if (a != nullptr && abbrev == a) return sig;
  }
  return 0;
}

// The output of the job's first task, read from its node's agent through the server.
class LogPump {
 public:
  LogPump(const ApiClient& client, std::string job_id, std::ostream& out, std::ostream& err)
      : client_(client), path_(fmt::format("/api/v1/jobs/{}/tasks/0/logs", PercentEncode(job_id))), out_(out),
        err_(err) {}
  // Reads what is new in both streams; true when anything was.
  bool Once() {
    std::lock_guard<std::mutex> lock(mu_);
    bool any = false;
    for (int s = 0; s < 2; ++s) {
      for (int round = 0; round < 64; ++round) {  // a burst of output: keep reading, boundedly
        auto r = client_.Get(WithQuery(path_, {{"stream", s == 0 ? "stdout" : "stderr"},
                                               {"offset", std::to_string(offset_[s])}}));
        if (r.ok() && r->status == 200 && r->body.empty() && r->log_size >= 0 && r->log_size < offset_[s]) {
          offset_[s] = 0;  // rotated (the agent's --log-max-bytes): the new file from its start
          continue;
        }
        if (!r.ok() || r->status != 200 || r->body.empty()) break;
        (s == 0 ? out_ : err_) << r->body << std::flush;
        offset_[s] += static_cast<int64_t>(r->body.size());
        any = true;
      }
    }
    return any;
  }
  // Polls until Stop: every 50 ms while output comes, backing off to 1 s while it does not.
  void Start() {
    thread_ = std::thread([this] {
      auto pause = std::chrono::milliseconds(50);
      while (!stop_) {
        pause = Once() ? std::chrono::milliseconds(50) : std::min(pause * 2, std::chrono::milliseconds(1000));
        std::unique_lock<std::mutex> lock(wait_mu_);
        cv_.wait_for(lock, pause, [this] { return stop_.load(); });
      }
    });
  }
  void Stop() {
    stop_ = true;
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  ~LogPump() { Stop(); }

 private:
  const ApiClient& client_;
  std::string path_;
  std::ostream& out_;
  std::ostream& err_;
  std::mutex mu_;
  int64_t offset_[2] = {0, 0};
  std::atomic<bool> stop_{false};
  std::mutex wait_mu_;
  std::condition_variable cv_;
  std::thread thread_;
};

int ExitForReply(const Result<HttpReply>& r, std::ostream& err, std::string_view doing) {
  if (!r.ok()) {
    err << "gpupool run: " << doing << ": " << r.status().message() << "\n";
    return kExitUnavailable;
  }
  err << "gpupool run: " << doing << ": " << ErrorMessage(*r) << "\n";
  // Called only when the answer is not the one expected: never a success, even for a 2xx.
  const int code = ExitCodeForHttpStatus(r->status);
  return code == kExitOk ? kExitError : code;
}

}  // namespace

Result<std::string> RunSpecJson(const RunOptions& o) {
  if (o.command.empty()) return Status::InvalidArgument("command: give one after --, or a spec with -f");
  Json resources = {{"cpu", o.cpu}, {"memory", o.memory}};
  if (!o.gpu.empty()) {
    double gpu = 0;
    size_t used = 0;
    try {
      gpu = std::stod(o.gpu, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != o.gpu.size() || !(gpu > 0) || gpu > 1024)
      return Status::InvalidArgument(fmt::format("--gpu: '{}' is not a number of GPUs (e.g. 0.25, 1, 8)", o.gpu));
    if (gpu == static_cast<double>(static_cast<int64_t>(gpu))) {
      resources["gpu"] = static_cast<int64_t>(gpu);
    } else {
      resources["gpu"] = gpu;
    }
  }
  if (!o.gpu_memory.empty()) resources["gpuMemory"] = o.gpu_memory;
  Json task = {{"name", "main"}, {"resources", resources}, {"command", o.command}};
  if (!o.isolation.empty()) task["isolation"] = o.isolation;
  if (!o.env.empty()) {
    Json env = Json::object();
    for (const std::string& kv : o.env) {
      const auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0)
        return Status::InvalidArgument(fmt::format("--env: '{}' is not KEY=VALUE", kv));
      env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    task["env"] = env;
  }
  Json spec = {{"name", o.name.empty() ? NameFromCommand(o.command) : o.name}};
  if (!o.queue.empty()) spec["queue"] = o.queue;
  if (!o.qos.empty()) spec["qos"] = o.qos;
  if (o.priority) spec["priority"] = *o.priority;
  spec["tasks"] = Json::array({task});
  return spec.dump();
}

int RunExitCode(const Json& job) {
  const std::string state = Str(job, "state");
  if (state == "succeeded") return kExitOk;
  auto tasks = job.find("tasks");
  if (tasks != job.end() && tasks->is_array()) {
    for (const Json& t : *tasks) {
      if (Str(t, "state") != "failed") continue;
      const auto code = t.find("exitCode");
      if (code != t.end() && code->is_number_integer() && code->get<int64_t>() != 0)
        return static_cast<int>(std::clamp<int64_t>(code->get<int64_t>(), 1, 255));
      if (const int sig = SignalIn(Str(t, "message")); sig > 0) return 128 + sig;
      return kExitError;
    }
  }
  return kExitError;
}

int RunJob(const RunOptions& o, const ApiClient& client, std::istream& in, std::ostream& out, std::ostream& err,
           const std::function<int()>& interrupted) {
  // The spec: a command line, or a file as `gpupool submit` sends it.
  std::string body;
  std::string content_type = "application/json";
  if (!o.file.empty()) {
    if (!o.command.empty()) {
      err << "gpupool run: give a spec file (-f) or a command, not both\n";
      return kExitUsage;
    }
    std::stringstream ss;
    if (o.file == "-") {
      ss << in.rdbuf();
    } else {
      std::ifstream f(o.file);
      if (!f) {
        err << "gpupool run: cannot read " << o.file << "\n";
        return kExitUsage;
      }
      ss << f.rdbuf();
    }
    body = ss.str();
    const auto first = body.find_first_not_of(" \t\r\n");
    if (first == std::string::npos || body[first] != '{') content_type = "application/yaml";
  } else {
    auto spec = RunSpecJson(o);
    if (!spec.ok()) {
      err << "gpupool run: " << spec.status().message() << "\n";
      return kExitUsage;
    }
    body = *spec;
  }

  auto submitted = client.Post("/api/v1/jobs", body, content_type);
  if (!submitted.ok() || submitted->status != 201 || !submitted->is_json)
    return ExitForReply(submitted, err, "submit");
  Json job = submitted->json;
  const std::string id = Str(job, "id");
  if (o.verbose) err << "gpupool run: job " << id << " submitted\n";

  LogPump logs(client, id, out, err);
  bool pumping = false;
  bool cancel_sent = false;
  bool told_pending = false;
  const auto submitted_at = std::chrono::steady_clock::now();
  const std::string job_path = fmt::format("/api/v1/jobs/{}", PercentEncode(id));
  RequestInterrupter never;
  while (!Terminal(Str(job, "state"))) {
    const int signals = interrupted();
    if (signals >= 2) {
      logs.Stop();
      err << "gpupool run: left job " << id << " (" << Str(job, "state") << ")\n";
      return 130;
    }
    if (signals == 1 && !cancel_sent) {
      cancel_sent = true;
      err << "gpupool run: cancelling job " << id << " (Ctrl-C again to stop waiting)\n";
      auto c = client.Post(job_path + "/cancel");
      if (!c.ok() || (c->status != 200 && c->status != 409)) (void)ExitForReply(c, err, "cancel");
    }
    // Wait for the next change, a second at a time so that a Ctrl-C is seen promptly.
    auto r = client.GetInterruptible(
        WithQuery(job_path, {{"wait", "1"}, {"since", Str(job, "version")}}), never, 15);
    if (r.ok() && r->status == 304) {
      if (!told_pending && Str(job, "state") == "pending" &&
          std::chrono::steady_clock::now() - submitted_at > std::chrono::seconds(2)) {
        told_pending = true;
        const std::string why = Str(job, "reason");
        err << "gpupool run: job " << id << " is waiting" << (why.empty() ? "" : ": " + why) << "\n";
      }
      continue;
    }
    if (!r.ok() || r->status != 200 || !r->is_json) return ExitForReply(r, err, "job " + id);
    job = r->json;
    if (!pumping && Str(job, "state") == "running") {
      if (o.verbose) err << "gpupool run: job " << id << " is running\n";
      pumping = true;
      logs.Start();
    }
  }
  logs.Stop();
  // Everything the task wrote, up to its end.
  while (logs.Once()) {
  }
  const std::string state = Str(job, "state");
  if (state == "cancelled") {
    err << "gpupool run: job " << id << " was cancelled\n";
    return cancel_sent ? 130 : kExitError;
  }
  if (state == "failed" && o.verbose) {
    const std::string why = Str(job, "reason");
    err << "gpupool run: job " << id << " failed" << (why.empty() ? "" : ": " + why) << "\n";
  }
  return RunExitCode(job);
}

std::function<int()> AddRunCommand(CLI::App& app) {
  struct State {
    RunOptions run;
    ClientFlags flags;
    int64_t priority = 0;
    CLI::Option* priority_opt = nullptr;
  };
  auto s = std::make_shared<State>();
  auto* cmd = app.add_subcommand(
      "run", "Run a command as a job: stream its output, Ctrl-C cancels, exit with its exit code");
  cmd->add_option("--server", s->flags.server, "Server address (default: $GPUPOOL_SERVER, else http://127.0.0.1:8470)");
  cmd->add_option("--token", s->flags.token, "Bearer token (default: $GPUPOOL_TOKEN, else <data dir>/admin.token)");
  cmd->add_option("--token-file", s->flags.token_file, "Read the bearer token from this file");
  cmd->add_option("-f,--file", s->run.file, "A job spec (YAML or JSON) instead of a command; its first task's output streams");
  cmd->add_option("--name", s->run.name, "Job name (default: from the command)");
  cmd->add_option("--gpu", s->run.gpu, "GPUs: a share below 1 (0.25) or a whole number (default: none)");
  cmd->add_option("--gpu-memory", s->run.gpu_memory, "GPU memory per GPU, e.g. 10Gi");
  cmd->add_option("--cpu", s->run.cpu, "CPU cores (default 1)");
  cmd->add_option("--memory", s->run.memory, "Memory (default 1Gi)");
  cmd->add_option("--queue", s->run.queue, "Queue (default: default)");
  cmd->add_option("--qos", s->run.qos, "guaranteed, burstable or best-effort");
  cmd->add_option("--isolation", s->run.isolation, "How GPU shares are isolated: timeslice, mps, mig, exclusive");
  s->priority_opt = cmd->add_option("--priority", s->priority, "Priority (-1000000..1000000)");
  cmd->add_option("-e,--env", s->run.env, "Environment KEY=VALUE (repeatable)");
  cmd->add_flag("-v,--verbose", s->run.verbose, "Say what happens to the job (on stderr)");
  cmd->add_option("command", s->run.command, "The command and its arguments (after --)");
  return [cmd, s]() -> int {
    if (!*cmd) return -1;
    if (s->priority_opt->count() > 0) s->run.priority = s->priority;
    Result<ClientConfig> config = ResolveClientConfig(s->flags, ProcessEnv());
    if (!config.ok()) {
      std::cerr << "gpupool run: " << config.status().message() << "\n";
      return kExitUsage;
    }
    if (!config->warning.empty()) std::cerr << "gpupool: " << config->warning << "\n";
    auto client = ApiClient::Create(*config);
    if (!client.ok()) {
      std::cerr << "gpupool run: " << client.status().message() << "\n";
      return kExitUsage;
    }
    // Ctrl-C and SIGTERM are counted by a thread of their own (blocked everywhere else).
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    std::atomic<int> count{0};
    std::atomic<bool> done{false};
    std::thread counter([&] {
      while (!done) {
        if (sigwaitinfo(&signals, nullptr) > 0 && !done) ++count;
      }
    });
    const int rc = RunJob(s->run, *client, std::cin, std::cout, std::cerr, [&] { return count.load(); });
    done = true;
    pthread_kill(counter.native_handle(), SIGTERM);  // wakes it (blocked here, so only it takes it)
    counter.join();
    std::cout.flush();
    return rc;
  };
}

}  // namespace gpupool
