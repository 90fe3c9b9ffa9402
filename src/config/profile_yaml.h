// Scheduling profiles from YAML. The edge where yaml-cpp's exceptions become Status.
//
//   name: fgd-with-topology
//   filters: [node-unschedulable, node-resources, gpu-model, gpu-fit, mig-fit]   # optional
//   scores:
//     - {name: fgd, weight: 2}
//     - topology                      # a bare name: weight 1, no arguments
//     - name: binpack
//       args: {cpu: 1, memory: 0, gpu: 3}
//   gpuSelector: fgd                  # or {name: best}
//   permits: [gang]                   # optional
//   skipScoringSingleNode: true       # optional
#pragma once

#include <string>

#include "common/status.h"
#include "common/value.h"
#include "sched/profile.h"

namespace gpupool {

// Parses YAML text. `source` names the text in errors (a file name).
Result<Profile> ParseProfileYaml(const std::string& text, const std::string& source = "profile");
Result<Profile> LoadProfileFile(const std::string& path);

// YAML text to a Value tree (scalars become int, double, bool or string).
Result<Value> ParseYamlValue(const std::string& text, const std::string& source);

}  // namespace gpupool
