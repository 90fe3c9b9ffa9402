// The sandbox a task's supervisor sets up in the task's child before it execs (supervisor_main.cc):
// a private mount namespace that hides the agent's and the server's files and, with private_dev,
// gives the task a /dev holding only its own devices; then the task's identity (uid, gid, no
// supplementary groups, no capabilities, no_new_privs). See SupervisorPlan for the fields.
//
// Runs in the single-threaded child between fork and exec, so it may allocate; it never returns
// to the supervisor's own code with a half-built sandbox: an error is reported and the child exits.
#pragma once

#include <cstdint>
#include <string>
#include <sys/types.h>
#include <vector>

#include "agent/supervisor_protocol.h"

namespace gpupool::agent_internal {

// A device node to recreate inside the task's /dev, stat'ed on the host before /dev is covered.
struct DeviceNode {
  std::string path;  // "/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12"
  mode_t mode = 0;   // type and permission bits
  dev_t rdev = 0;
};
// The standard character devices every process expects, then `extra`; entries that are absent on
// the host, not under /dev/ or not device nodes are skipped (the agent names what the task gets,
// whatever the host has).
std::vector<DeviceNode> StatDevices(const std::vector<std::string>& extra);

// Builds the mount namespace (when plan.mount_namespace()) and drops to the task's identity. On
// failure returns false with *stage (kMsgNamespace or kMsgIdentity) and *err (errno) set.
bool EnterSandbox(const SupervisorPlan& plan, const std::vector<DeviceNode>& devices, int32_t* stage, int* err);

}  // namespace gpupool::agent_internal
