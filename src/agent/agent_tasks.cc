// Agent: the node's tasks. Assignments in, runtimes started, stopped, adopted and polled, and
// their states reported back (see agent.h).
#include "agent/agent.h"
#include "agent/child_exits.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>

#include <openssl/crypto.h>

#include "http/server.h"
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <set>
#include <sstream>

#include "agent/gpu_metrics.h"
#include "agent/node_identity.h"
#include "agent/runtime_internal.h"
#include "client/api_client.h"
#include "common/quantity.h"

namespace gpupool {

using nlohmann::json;

namespace {

bool Ok2xx(const Result<HttpReply>& r) {
  return r.ok() && r->status >= 200 && r->status < 300;
}

}  // namespace

void Agent::ApplyAssignments(const std::string& body) {
  if (ApplyAssignmentsOnly(body)) PollTasks();
}

bool Agent::ApplyAssignmentsOnly(const std::string& body) {
  const json list = json::parse(body);
  auto assignments = ParseAssignments(list);
  if (!assignments.ok()) {
    std::cerr << fmt::format("gpupool agent {}: the server's assignments: {}\n", options_.node,
                             assignments.status().ToString());
    return false;
  }
  std::string version;
  if (list.is_object() && list.contains("version") && list["version"].is_string())
    version = list["version"].get<std::string>();
  return Reconcile(*assignments, version);
}

namespace {

// A list's version, "<run token>-<counter>" (server/watches.h): false when it is not one.
bool ParseListVersion(const std::string& version, std::string* run, uint64_t* seq) {
  const size_t dash = version.rfind('-');
  if (dash == std::string::npos || dash == 0 || dash + 1 >= version.size() || version.size() > 128) return false;
  const char* first = version.data() + dash + 1;
  const char* last = version.data() + version.size();
  auto [end, ec] = std::from_chars(first, last, *seq);
  if (ec != std::errc() || end != last) return false;
  *run = version.substr(0, dash);
  return true;
}

}  // namespace

Result<Runtime*> Agent::RuntimeFor(const Assignment& a) {
  if (a.bundle.empty() && a.rootfs.empty() && a.image.empty()) return process_runtime_.get();
  const std::string cls = a.runtime_class.empty() ? "runc" : a.runtime_class;
  if (auto it = containers_.find(cls); it != containers_.end()) return it->second.get();
  auto why = container_errors_.find(cls);
  return Status::FailedPrecondition(
      fmt::format("the task needs runtime class {}, which cannot run on node {}: {}", cls, options_.node,
                  why != container_errors_.end() ? why->second
                                                 : "the agent has no binary for it (--runtime-class " + cls + "=PATH)"));
}

std::vector<Runtime*> Agent::AllRuntimes() const {
  std::vector<Runtime*> all = {process_runtime_.get()};
  for (const auto& [cls, rt] : containers_) all.push_back(rt.get());
  return all;
}

bool Agent::Reconcile(const std::vector<Assignment>& assignments, const std::string& version) {
  std::lock_guard<std::mutex> lock(mu_);
  // Lists come from two threads (the watch, and the heartbeat's answer); the later of two may be
  // the older. Applying it would start a run the server has already seen end (a second copy of the
  // task beside its next run) or stop one it has just placed. Within one server run the counter
  // orders them; a list of another run (a restarted server) is taken as it comes.
  std::string run;
  uint64_t seq = 0;
  if (ParseListVersion(version, &run, &seq)) {
    if (run == assignments_run_ && seq < assignments_seq_) {
      ++stale_lists_;
      return false;
    }
    assignments_run_ = run;
    assignments_seq_ = seq;
  }
  for (auto& [id, t] : tasks_) t.in_assignments = false;
  for (const Assignment& a : assignments) {
    const std::string id = a.run_id();
    auto it = tasks_.find(id);
    if (it == tasks_.end()) {
      // Ran here, reported and forgotten: a list that still names it is late (a restarted
      // server's first list, or one of an older run); there is nothing to start or stop.
      if (forgotten_.count(RunKey(a)) != 0) continue;
      LocalTask t;
      t.assignment = a;
      if (a.desired == "stop") {
        // Asked to stop something this agent does not know: a task an earlier agent started (adopt
        // it and stop it), or one that never ran here (it is stopped).
        auto inserted = tasks_.emplace(id, std::move(t)).first;
        LocalTask& lt = inserted->second;
        if (Adopt(lt)) {
          lt.stop_requested = true;
          StopTask(id, lt, std::chrono::seconds(a.grace_period_seconds), "an earlier agent's run, asked to stop");
        } else {
          if (AdoptableTask(id)) ClearStray(id);
          lt.exited = true;
          lt.final_state = "stopped";
          lt.final_message = "not running on this node";
        }
        continue;
      }
      // An expired lease: the server may have given up on this node; start nothing new (the task
      // is still listed on the next good answer, which renews the lease).
      // A process under this id that was started for another placement is nobody's now: it is
      // stopped and removed first; this placement's run starts on a later pass.
      if (AdoptableTask(id) && StrayOfAnotherPlacement(a)) {
        ClearStray(id);
        continue;
      }
      if (!LeaseValid() && !AdoptableTask(id)) continue;
      auto inserted = tasks_.emplace(id, std::move(t));
      StartTask(inserted.first->second);
      continue;
    }
    LocalTask& t = it->second;
    t.in_assignments = true;
    if (a.desired == "stop" && !t.stop_requested && !t.exited) {
      t.stop_requested = true;
      t.assignment.grace_period_seconds = a.grace_period_seconds;
      if (t.preparing) {
        // Never started: its image was still being pulled (the pull goes on for the cache).
        t.preparing = false;
        t.exited = true;
        t.final_state = "stopped";
        t.final_message = "stopped while its image was being pulled";
      } else if (t.runtime != nullptr) {
        StopTask(id, t, std::chrono::seconds(a.grace_period_seconds), "asked to stop");
      }
    }
  }
  // Tasks the server no longer lists: stop what still runs, forget what has been reported.
  for (auto it = tasks_.begin(); it != tasks_.end();) {
    LocalTask& t = it->second;
    if (t.in_assignments) {
      ++it;
      continue;
    }
    if (t.preparing) {
      t.preparing = false;
      t.exited = true;
      t.final_state = "stopped";
      t.final_message = "no longer assigned here while its image was being pulled";
    }
    if (t.started && !t.exited) {
      if (!t.stop_requested && t.runtime != nullptr) {
        t.stop_requested = true;
        StopTask(it->first, t, std::chrono::seconds(10), "no longer assigned here");
      }
      ++it;
      continue;
    }
    if (t.exited && t.final_reported) {
      Forget(it->first, t);
      it = tasks_.erase(it);
      continue;
    }
    ++it;
  }
  // Once the first list is applied, what runs that nobody will ask for again (an earlier
  // agent's, ended and removed while none watched) left behind goes: their pod namespaces and
  // addresses, their scratch (unmounted first). A run a runtime still knows keeps its own until it
  // is forgotten or cleared as a stray.
  if (!runs_pruned_) {
    runs_pruned_ = true;
    std::vector<std::string> keep;
    for (const auto& [id, t] : tasks_) keep.push_back(id);
    for (Runtime* rt : AllRuntimes()) {
      const auto known = rt->List();
      keep.insert(keep.end(), known.begin(), known.end());
    }
    if (pod_network_) pod_network_->Prune(keep);
    PruneScratch(keep);
  }
  return true;
}

void Agent::Forget(const std::string& id, LocalTask& t) {
  const std::string key = RunKey(t.assignment);
  if (forgotten_.insert(key).second) {
    forgotten_order_.push_back(key);
    if (forgotten_order_.size() > kMaxForgotten) {
      forgotten_.erase(forgotten_order_.front());
      forgotten_order_.pop_front();
    }
  }
  ReleaseMps(t);
  if (images_) images_->Release(id);
  if (pod_network_) {
    if (Status st = pod_network_->Detach(id); !st.ok())
      std::cerr << fmt::format("gpupool agent {}: {}\n", options_.node, st.ToString());
  }
  if (t.runtime != nullptr && t.runtime->Remove(id).ok()) {
    RemovePlacementRun(options_.state_dir, id);
    RemoveScratch(t.assignment);
  }
}

// REQUIRES: mu_ held.
Status Agent::EnsureMps(LocalTask& t) {
  const Assignment& a = t.assignment;
  if (a.isolation != "mps" || !mps_) return Status::Ok();
  // The figures of the task's CUDA_MPS_* variables, held by its server whatever the task does to them.
  const MpsTaskLimits granted = TaskMpsLimits(a);
  for (size_t i = 0; i < a.gpus.size(); ++i) {
    const AssignedGpu& g = a.gpus[i];
    // An index outside the inventory is TaskEnvironment's to refuse.
    if (g.index < 0 || static_cast<size_t>(g.index) >= inventory_.gpus.size()) continue;
    const GpuInfo& info = inventory_.gpus[static_cast<size_t>(g.index)];
    // The inventory's UUID: the one TaskEnvironment names the pipe directory after.
    const std::string& uuid = info.uuid;
    if (std::find(t.mps_gpus.begin(), t.mps_gpus.end(), uuid) != t.mps_gpus.end()) continue;
    MpsClientLimits limits;
    limits.uid = TaskUid(a);
    limits.active_thread_percentage = granted.active_thread_percentage;
    // No memory granted (a server older than always-reserved GPU memory): the whole GPU's.
    limits.pinned_mem_mib =
        granted.pinned_mem_mib[i] > 0 ? granted.pinned_mem_mib[i] : info.memory_bytes / (1024 * 1024);
    RETURN_IF_ERROR(mps_->Ensure(uuid, a.run_id(), limits));
    t.mps_gpus.push_back(uuid);
  }
  return Status::Ok();
}

// REQUIRES: mu_ held.
void Agent::ReleaseMps(LocalTask& t) {
  if (!mps_) return;
  for (const std::string& uuid : t.mps_gpus) {
    if (Status st = mps_->Release(uuid, t.assignment.run_id()); !st.ok())
      std::cerr << fmt::format("gpupool agent {}: {}\n", options_.node, st.ToString());
  }
  t.mps_gpus.clear();
}

// REQUIRES: mu_ held.
ImageCache* Agent::Images() {
  if (images_ || image_tried_) return images_.get();
  image_tried_ = true;
  auto images = ImageCache::Create(image_options_);
  if (!images.ok()) {
    image_error_ = images.status().message();
    std::cerr << fmt::format("gpupool agent {}: container images cannot be used: {}\n", options_.node, image_error_);
    return nullptr;
  }
  images_ = std::move(images).value();
  // Users recorded by an earlier agent whose tasks no runtime knows any more (they ended and were
  // cleaned up while it was gone) hold no image.
  std::set<std::string> live;
  for (Runtime* rt : AllRuntimes()) {
    for (const std::string& id : rt->List()) live.insert(id);
  }
  images_->KeepOnly(live);
  return images_.get();
}

// REQUIRES: mu_ held.
void Agent::StartTask(LocalTask& t) {
  const Assignment& a = t.assignment;
  const std::string id = a.run_id();
  auto fail = [&](const Status& st) {
    ReleaseMps(t);
    if (pod_network_) (void)pod_network_->Detach(a.run_id());
    RemoveScratch(a);  // what the start made of it (a scratch disk mounted before a later step failed)
    ++start_failures_;
    t.exited = true;
    t.final_state = "failed";
    t.final_message = "could not start: " + st.message();
  };
  auto rt = RuntimeFor(a);
  if (!rt.ok()) return fail(rt.status());
  if (!t.preparing && Adopt(t)) return;
  // An image is pulled off this thread; the task waits (its state stays assigned) and this start
  // is tried again on every poll until the image is in the cache or its pull has failed.
  std::optional<PreparedImage> image;
  if (!a.image.empty()) {
    if (Images() == nullptr)
      return fail(Status::FailedPrecondition("container images cannot be used on this node: " + image_error_));
    auto prepared = images_->Prepare(a.image);
    if (!prepared.ok()) return fail(prepared.status());  // it names the image
    if (!prepared->has_value()) {
      if (!t.preparing) std::cerr << fmt::format("gpupool agent {}: task {}: pulling image {}\n", options_.node, id, a.image);
      t.preparing = true;
      return;
    }
    image = std::move(*prepared);
    t.preparing = false;
  }
  t.runtime = *rt;
  TaskEnvOptions eo;
  eo.node = options_.node;
  eo.mps_pipe_root = options_.state_dir + "/mps";
  eo.cuda_limiter = cuda_limiter_;
  eo.cuda_limiter_containers = !inventory_.simulated;
  if (a.isolation == "mps" && mps_) {
    if (Status st = EnsureMps(t); !st.ok()) return fail(st);
    eo.mps_daemons = true;
  }
  if (Status st = EnsureMigInstances(t); !st.ok()) return fail(st);
  auto env = TaskEnvironment(a, inventory_, eo);
  if (!env.ok()) return fail(env.status());
  LaunchSpec spec;
  spec.id = id;
  spec.argv = a.command;
  spec.env = std::move(env).value();
  // The limiter preloaded (task_env.cc decides): the task's processes share one memory ledger; a
  // container's runtime binds the library in and names it in /etc/ld.so.preload (runtime.h).
  if (TaskGetsCudaLimiter(a, eo)) {
    spec.cuda_ledger = true;
    spec.cuda_limiter = cuda_limiter_;
  }
  if (image) {
    // What the image says, under what the job and the pool say (image_cache.h).
    ApplyImageConfig(image->config, a.env, &spec);
    spec.image_rootfs = image->rootfs;
    if (Status st = images_->Use(image->digest, id); !st.ok()) {
      // Evicted by a pull that ended just now (it was not in use yet): pulled again.
      if (st.code() != StatusCode::kNotFound) return fail(st);
      t.preparing = true;
      return;
    }
    t.image = a.image + "@" + image->digest;
  }
  if (spec.argv.empty() && a.bundle.empty())
    return fail(Status::InvalidArgument(image ? "the task has no command and its image names no entrypoint or cmd"
                                              : "the task has no command"));
  spec.cpu_milli = a.cpu_milli;
  spec.memory_bytes = a.memory_bytes;
  spec.bundle = a.bundle;
  spec.rootfs = a.rootfs;
  if (!a.working_dir.empty() || !image) spec.workdir = a.working_dir;
  spec.lease_path = lease_path_;
  spec.pids_max = options_.task_pids_max;
  if (!inventory_.simulated) {
    spec.devices = {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"};
    for (const AssignedGpu& g : a.gpus) {
      const GpuInfo& info = inventory_.gpus[static_cast<size_t>(g.index)];
      if (info.minor_number >= 0) spec.devices.push_back(fmt::format("/dev/nvidia{}", info.minor_number));
    }
    if (a.isolation == "mig") {
      // A MIG instance also needs the nvidia-caps nodes of its GPU and compute instance.
      const std::string root = options_.driver_root.empty() || options_.driver_root == "/" ? "" : options_.driver_root;
      std::ifstream minors(root + "/proc/driver/nvidia-caps/mig-minors");
      std::stringstream text;
      text << minors.rdbuf();
      auto caps = TaskMigCapDevices(a, inventory_, text.str());
      if (!caps.ok()) return fail(caps.status());
      spec.devices.insert(spec.devices.end(), caps->begin(), caps->end());
    }
  }
  if (!inventory_.simulated && (!a.bundle.empty() || !a.rootfs.empty() || image)) {
    if (Status st = ApplyCdi(a, &spec); !st.ok()) return fail(st);
  }
  if (Status st = SandboxTask(a, &spec); !st.ok()) return fail(st);
  // Recorded before the start: whatever runs under this id afterwards is this placement's.
  if (!a.placement_run.empty()) {
    if (Status st = WritePlacementRun(options_.state_dir, id, a.placement_run); !st.ok()) return fail(st);
  }
  if (Status st = t.runtime->Start(spec); !st.ok()) return fail(st);
  if (options_.wake_on_child_exit) ChildExits::Get().ChildStarted();
  ++starts_;
  t.started = true;
}

// REQUIRES: mu_ held.
bool Agent::Adopt(LocalTask& t) {
  const std::string id = t.assignment.run_id();
  auto rt = RuntimeFor(t.assignment);
  if (!rt.ok()) return false;
  const auto known = (*rt)->List();
  if (std::find(known.begin(), known.end(), id) == known.end()) return false;
  if (StrayOfAnotherPlacement(t.assignment)) return false;  // not this placement's: never adopted
  // This very run was started by an earlier agent (run ids differ between restarts of a task):
  // running, it is adopted; ended while no agent watched, its outcome is reported, never rerun.
  t.runtime = *rt;
  t.started = true;
  auto st = t.runtime->Poll(id);
  if (st.ok() && st->state == RunState::kRunning) {
    // Count it among its daemon's users again (restarting a daemon that died meanwhile).
    if (Status ms = EnsureMps(t); !ms.ok())
      std::cerr << fmt::format("gpupool agent {}: adopted task {}: {}\n", options_.node, id, ms.ToString());
  }
  return true;
}

void Agent::StopTask(const std::string& id, LocalTask& t, std::chrono::seconds grace, const std::string& why) {
  const Status st = t.runtime->Stop(id, grace);
  std::cerr << fmt::format("gpupool agent {}: stopping task {} ({}; TERM, KILL after {} s){}\n", options_.node, id,
                           why, grace.count(), st.ok() ? "" : ": " + st.ToString());
}

bool Agent::StrayOfAnotherPlacement(const Assignment& a) {
  if (a.placement_run.empty()) return false;  // a server of before run ids: by task id, as before
  return ReadPlacementRun(options_.state_dir, a.run_id()) != a.placement_run;
}

void Agent::ClearStray(const std::string& id) {
  for (Runtime* rt : AllRuntimes()) {
    const auto known = rt->List();
    if (std::find(known.begin(), known.end(), id) == known.end()) continue;
    auto st = rt->Poll(id);
    if (st.ok() && st->state == RunState::kRunning) {
      std::cerr << fmt::format("gpupool agent {}: task {} runs here for another placement (an earlier one, or "
                               "another pool's): stopping it, not adopting it\n",
                               options_.node, id);
      (void)rt->Stop(id, std::chrono::seconds(0));
      continue;
    }
    // Ended: free the id for this placement's run (the old logs are moved aside, not served).
    (void)rt->Remove(id);
    if (pod_network_) (void)pod_network_->Detach(id);
    std::error_code ec;
    for (const std::string& path : {rt->StdoutPath(id), rt->StderrPath(id)}) {
      if (std::filesystem::exists(path, ec)) std::filesystem::rename(path, path + ".stray", ec);
    }
  }
}

// Polls every started task and sends the reports that are due. Takes mu_.
void Agent::PollTasks() {
  std::vector<std::string> due;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const bool lease_valid = LeaseValid();
    for (auto& [id, t] : tasks_) {
      // Waiting for its image: started once the pull is done (not on an expired lease).
      if (t.preparing && !t.exited && lease_valid) StartTask(t);
      if (t.started && !t.exited && t.runtime != nullptr) {
        auto st = t.runtime->Poll(id);
        if (st.ok() && st->state == RunState::kExited) {
          t.exited = true;
          t.exit_code = st->exit_code;
          if (t.stop_requested || st->fenced) {
            t.final_state = "stopped";
          } else if (st->term_signal == 0 && st->exit_code == 0) {
            t.final_state = "succeeded";
          } else {
            t.final_state = "failed";
          }
          t.final_message = st->message;
          if (st->fenced) t.final_message = FencedMessage(st->message);
          ReleaseMps(t);
        }
      }
      if ((t.exited && !t.final_reported) || (t.started && !t.exited && !t.running_reported)) due.push_back(id);
    }
  }
  if (due.empty() || !cluster_refusal().empty()) return;  // nothing of the old pool goes to another one
  // The reports, in one call (one durable write on the server) where the server takes them.
  std::vector<std::pair<std::string, json>> bodies;  // task id -> report
  for (const std::string& id : due) {
    LocalTask copy;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = tasks_.find(id);
      if (it == tasks_.end()) continue;
      copy = it->second;
    }
    const bool final = copy.exited;
    // The run it is about: the server ignores a late report of an earlier run of the task.
    json body = {{"state", final ? copy.final_state : "running"}, {"restarts", copy.assignment.restarts}};
    if (!copy.assignment.placement_run.empty()) body["runId"] = copy.assignment.placement_run;
    if (!final && !copy.image.empty()) body["image"] = copy.image;
    if (final) {
      body["exitCode"] = copy.exit_code;
      if (!copy.final_message.empty()) body["message"] = copy.final_message;
    }
    body["jobId"] = copy.assignment.job_id;
    body["index"] = copy.assignment.index;
    bodies.emplace_back(id, std::move(body));
  }
  auto mark = [this](const std::string& id, const json& report) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tasks_.find(id);
    if (it == tasks_.end()) return;
    if (report["state"] != "running") {
      it->second.final_reported = true;
      // Already gone from the server's list (the list came while the report was on its way):
      // no later list would name it again, so it is forgotten now rather than on the next one.
      if (!it->second.in_assignments) {
        Forget(id, it->second);
        tasks_.erase(it);
      }
    } else {
      it->second.running_reported = true;
    }
  };
  size_t sent = 0;
  while (batch_reports_ && sent < bodies.size()) {
    json reports = json::array();
    const size_t end = std::min(bodies.size(), sent + 256);
    for (size_t i = sent; i < end; ++i) reports.push_back(bodies[i].second);
    auto r = NodeApi().Post(fmt::format("/api/v1/agent/nodes/{}/reports", PercentEncode(options_.node)),
                            json{{"reports", reports}}.dump());
    if (!Ok2xx(r) || !r->is_json || !r->json.contains("results") || !r->json["results"].is_array() ||
        r->json["results"].size() != end - sent)
      return;  // unreachable, refused or garbled: every report is tried again on the next tick
    const auto& results = r->json["results"];
    for (size_t i = sent; i < end; ++i) {
      const auto& res = results[i - sent];
      // Done unless the server failed on its side: a refusal (409: the task moved on, 404: the job
      // is gone) is as final as an acceptance.
      const std::string code = res.is_object() ? res.value("code", "") : "Internal";
      const bool ok = res.is_object() && res.value("ok", false);
      if (ok || (code != "Internal" && code != "IoError")) mark(bodies[i].first, bodies[i].second);
    }
    sent = end;
  }
  for (size_t i = sent; i < bodies.size(); ++i) {
    json body = bodies[i].second;
    const std::string job_id = body["jobId"];
    const int index = body["index"];
    body.erase("jobId");
    body.erase("index");
    auto r = NodeApi().Post(fmt::format("/api/v1/agent/nodes/{}/tasks/{}/{}/status", PercentEncode(options_.node),
                                       PercentEncode(job_id), index),
                           body.dump());
    // A 4xx means the server has moved on (the task was released or the job is gone): nothing to
    // retry. Unreachable, 5xx, or 401/403 (the credential is being replaced: the heartbeat
    // registers again): try again on the next tick.
    const bool done = r.ok() && r->status >= 200 && r->status < 500 && r->status != 401 && r->status != 403;
    if (done) mark(bodies[i].first, bodies[i].second);
  }
}

int Agent::NewestRunOnDisk(Runtime& rt, const std::string& task) {
  namespace fs = std::filesystem;
  int newest = -1;
  std::error_code ec;
  const fs::path dir = fs::path(rt.StdoutPath(task)).parent_path().parent_path();
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int n = -1;
    if (name == task) {
      n = 0;
    } else if (name.size() > task.size() + 2 && name.compare(0, task.size() + 2, task + ".r") == 0) {
      const char* first = name.data() + task.size() + 2;
      const char* last = name.data() + name.size();
      int v = 0;
      auto [p, err] = std::from_chars(first, last, v);
      if (err == std::errc() && p == last && v > 0) n = v;
    }
    if (n > newest && ::access((it->path() / "stdout.log").c_str(), R_OK) == 0) newest = n;
  }
  return newest;
}

bool Agent::AdoptableTask(const std::string& id) {
  for (Runtime* rt : AllRuntimes()) {
    for (const std::string& known : rt->List())
      if (known == id) return true;
  }
  return false;
}

std::string Agent::FencedMessage(const std::string& runtime_message) {
  int64_t since = 0;
  double timeout = 0;
  {
    std::lock_guard<std::mutex> lock(lease_mu_);
    since = last_contact_ms_;
    timeout = lease_timeout_s_;
  }
  const double seconds = since > 0 ? static_cast<double>(agent_internal::BootTimeMs() - since) / 1000 : timeout;
  std::string how = runtime_message;
  constexpr std::string_view kPrefix = "fenced (lease expired): ";
  if (how.rfind(kPrefix, 0) == 0) how = how.substr(kPrefix.size());
  return fmt::format("fenced: no contact with the server for {:.0f} s ({})", seconds, how);
}

}  // namespace gpupool
