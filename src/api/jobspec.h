// Job specs: the JSON or YAML document a user submits (docs/jobspec.md) <-> model Job.
//
// Both formats go through one code path: YAML is converted to the same JSON tree first, and the
// tree is validated once. Every refusal is Status::InvalidArgument whose message is
// "<field path>: <reason>" ("tasks[0].resources.gpu: must be below 1 ..."), or "spec: <reason>"
// when no one field is at fault (malformed text, the body too large); ErrorField() recovers the
// path for the server's error object. No exception leaves these functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/workload.h"

namespace gpupool {

enum class SpecFormat { kJson, kYaml };

// Bounds on what one spec may ask for. Each is far above any real job and exists so that a
// hostile or broken spec is refused early instead of costing the server memory or time.
struct JobSpecLimits {
  size_t max_bytes = 1 << 20;            // the document's size
  int max_tasks = 10000;                 // replicas summed over all task groups
  int max_task_groups = 256;             // entries of `tasks`
  int max_gpus_per_task = 64;            // whole GPUs of one task
  int64_t max_cpu_milli = 4096000;       // one task: 4096 cores
  int64_t max_memory_mib = 1 << 26;      // one task: 64 Ti
  int64_t max_gpu_memory_mib = 1 << 20;  // per GPU: 1 Ti
  int max_command_args = 1024;
  int max_env = 1024;
  int max_labels = 64;           // job labels, and labels of each affinity term
  int max_affinity_terms = 64;   // per list (nodeSelector + nodeAffinity, togetherWith, apartFrom)
  int max_affinity_values = 64;  // values of one node affinity requirement
  int max_gpu_models = 32;
  size_t max_name_bytes = 63;      // job, task, tenant and queue names
  size_t max_string_bytes = 4096;  // command arguments, env values, paths, GPU model names
  int max_depth = 32;              // nesting of arrays and objects
  // YAML only: values after expanding aliases, and the bytes of their scalars. An alias is a
  // reference, so a small document could otherwise expand to an exponentially large tree.
  int64_t max_yaml_nodes = 200000;
  int64_t max_yaml_scalar_bytes = 4 << 20;
  int64_t max_checkpoint_interval_seconds = 365 * 24 * 3600;
};

// Parses and validates a job spec. The Job's id is left empty (the server assigns it), and so are
// tenant and queue when the spec omits them (the server decides who may set the tenant and puts a
// job without a queue in "default"). Normalisations, so that equal meanings give equal Jobs:
//   - gang.minAvailable equal to the task count is stored as 0 ("all tasks");
//   - nodeSelector entries become node affinity requirements `key In [value]`, ahead of the
//     nodeAffinity list;
//   - gpu below 1 is one GPU with gpu_share = round(gpu * 1000) milli-GPU (1000 is a whole GPU).
Result<Job> ParseJobSpec(std::string_view text, SpecFormat format, const JobSpecLimits& limits = {});

// The canonical spec of a job: every field written out, defaults included (priority, qos,
// isolation, gang, labels, affinity, command, env), quantities as strings ("2", "0.5", "8Gi"),
// gpu as a number (0.25 or 2). Empty tenant and queue, and absent optional parts (container,
// checkpoint, gpuMemory, gpuModels, migProfile) are left out. The id is not part of the spec.
// For every Job j that ParseJobSpec returns, ParseJobSpec(JobSpecToJson(j).dump(), kJson)
// returns a Job that SameJobSpec() calls equal to j.
// REQUIRES: a job ParseJobSpec could return; a request the spec cannot express (several GPUs
// each with a partial share) is written as a share of one GPU.
nlohmann::json JobSpecToJson(const Job& job);

// A task's `volumes` as the spec writes them; the server hands them to the agent in this form.
nlohmann::json VolumesToJson(const std::vector<Volume>& volumes);
// Reads `volumes` for a task whose container and checkpoint `exec` already holds (exec's own
// volumes are ignored); the agent checks an assignment's with it too. Errors name the field under
// `path` ("tasks[0].volumes[1].mountPath: ...").
Result<std::vector<Volume>> ParseVolumes(const nlohmann::json& v, const std::string& path, const TaskExec& exec,
                                         const JobSpecLimits& limits = {});

// True when the two jobs agree on every field a spec carries (all but the id).
bool SameJobSpec(const Job& a, const Job& b);

// Parses any JSON request body with the job spec's guards: nesting at most `max_depth` levels
// (the parser stops there, so no depth can exhaust the stack), no duplicate member names, and
// errors that name the field ("heartbeat.gpus[0]: nested deeper than 32 levels") and never echo
// bytes that are not text.
Result<nlohmann::json> ParseJsonBody(std::string_view text, int max_depth = 32);

// The check a job spec applies to its name, tenant and queue fields, for the same kinds of names
// given elsewhere (queues created through the API or the config, tenants of a queue's access list):
// lowercase letters, digits, '-', '.', '_', alphanumeric at both ends, at most
// limits.max_name_bytes. InvalidArgument "<path>: <reason>" otherwise.
Status CheckSpecName(std::string_view name, const std::string& path, const JobSpecLimits& limits = {});

// The field path of an error from ParseJobSpec or the node codecs ("tasks[0].resources.gpu"),
// or "" when the error concerns the whole document or is not one of theirs.
std::string ErrorField(const Status& status);

}  // namespace gpupool
