// What the files of PoolService share beyond its class: constants and small helpers (no state).
// service.cc holds the state and its changes, service_recover.cc the recovery from the store,
// service_api.cc the client requests, service_agents.cc the agent protocol, service_cycle.cc the
// scheduling loop, service_views.cc the JSON views, health, metrics and invariants.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "sched/job_shape.h"
#include "server/node_credentials.h"
#include "server/service.h"

namespace gpupool::service_internal {


constexpr size_t kRecentTasks = 10000;
// Retention removes at most this many jobs per pass, so that a long history (say, after retention
// was first turned on) is worked off over several cycles instead of stalling one.
constexpr int kMaxRemovalsPerPass = 5000;
// Meta key: the highest sequence number of a job that retention removed (so its id is never reused).
constexpr char kRemovedMaxSeqKey[] = "removed_max_seq";
constexpr char kClusterIdKey[] = "cluster_id";
// A node credential's last use is written to the store when it moved this much (it is kept in
// memory to the millisecond).
constexpr int64_t kCredentialLastUsedStepMs = 60 * 1000;
constexpr uint64_t kLearnEvery = 512;
constexpr int kMinCycleGapMs = 5;

inline std::optional<JobPhase> ParseJobPhase(const std::string& s) {
  for (JobPhase p : {JobPhase::kPending, JobPhase::kRunning, JobPhase::kSucceeded, JobPhase::kFailed,
                     JobPhase::kCancelled}) {
    if (JobPhaseName(p) == s) return p;
  }
  return std::nullopt;
}

inline std::optional<TaskPhase> ParseTaskPhase(const std::string& s) {
  for (TaskPhase p :
       {TaskPhase::kPending, TaskPhase::kAssigned, TaskPhase::kRunning, TaskPhase::kStopping,
        TaskPhase::kSucceeded, TaskPhase::kFailed, TaskPhase::kCancelled, TaskPhase::kPreempted}) {
    if (TaskPhaseName(p) == s) return p;
  }
  return std::nullopt;
}

inline bool IsLive(TaskPhase p) {
  return p == TaskPhase::kAssigned || p == TaskPhase::kRunning || p == TaskPhase::kStopping;
}
inline bool IsTerminal(JobPhase p) {
  return p == JobPhase::kSucceeded || p == JobPhase::kFailed || p == JobPhase::kCancelled;
}

inline double MonoSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// What one task holds, in the units of queue accounting (MIG instances count as a whole GPU, as
// JobDemand does).
inline Resources TaskDemand(const TaskRequest& r) {
  Job one;
  one.groups.push_back({"t", 1, r, {}});
  return JobDemand(one);
}

inline bool LabelsMatch(const std::map<std::string, std::string>& term,
                 const std::map<std::string, std::string>& labels) {
  for (const auto& [k, v] : term) {
    auto it = labels.find(k);
    if (it == labels.end() || it->second != v) return false;
  }
  return true;
}

[[noreturn]] inline void FailStop(const Status& st) {
  // The in-memory state got ahead of the disk. Stopping is the only safe answer: a restart
  // rebuilds everything from the last acknowledged state.
  std::fprintf(stderr, "gpupool server: cannot write the store, stopping: %s\n", st.ToString().c_str());
  std::fflush(stderr);
  std::_Exit(70);
}

inline NodeRecord MakeNodeRecord(const std::string& name, const nlohmann::json& spec, bool cordoned, bool draining,
                          const std::string& state, int64_t hb) {
  NodeRecord r;
  r.name = name;
  r.spec_json = spec.dump();
  r.cordoned = cordoned;
  r.draining = draining;
  r.state = state;
  r.last_heartbeat_ms = hb;
  return r;
}


inline EventRecord MakeEvent(const std::string& job_id, int64_t time_ms, const std::string& type,
                             const std::string& message) {
  EventRecord e;
  e.job_id = job_id;
  e.time_ms = time_ms;
  e.type = type;
  e.message = message;
  return e;
}

// The view a watcher of a removed job gets.
inline nlohmann::json GoneJob() {
  return nlohmann::json{{"error", {{"code", "NotFound"}, {"message", "the job was removed (retention)"}}}};
}
// A placement's run id: 128 random bits. Unguessable, and never the same twice, not even in a
// pool whose store was created anew (job ids start again there; run ids do not).
inline std::string NewRunId() { return "r-" + RandomHex(16); }

// Exit codes an agent may report: a process's own (0..255), a shell's 128+signal, and negative
// values some runtimes use for "killed"; anything else is a broken or hostile agent.
constexpr int64_t kMinExitCode = -255;
constexpr int64_t kMaxExitCode = 255;

// An integer JSON value within [lo, hi] (an unsigned value above INT64_MAX is out of range).
inline bool InIntRange(const nlohmann::json& v, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) return false;
  if (v.is_number_unsigned()) return v.get<uint64_t>() <= static_cast<uint64_t>(std::max<int64_t>(hi, 0)) &&
                                     static_cast<int64_t>(v.get<uint64_t>()) >= lo;
  const int64_t x = v.get<int64_t>();
  return x >= lo && x <= hi;
}

}  // namespace gpupool::service_internal
