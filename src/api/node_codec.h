// Node registration bodies, placements and quantities <-> JSON for the REST API (docs/api.md,
// docs/jobspec.md "Node spec"). Errors follow jobspec.h: Status::InvalidArgument with
// "<field path>: <reason>" ("gpus[2].model: ..."), "spec: <reason>" for the body as a whole;
// ErrorField() (jobspec.h) recovers the path. No exception leaves these functions.
#pragma once

#include <nlohmann/json.hpp>

#include "common/quantity.h"
#include "common/status.h"
#include "model/gpu_catalog.h"
#include "model/ledger.h"
#include "model/node.h"
#include "model/topology.h"

namespace gpupool {

// A node registration body:
//   {"name", "cpu", "memory", "labels"?, "maxTasks"?, "healthy"?,
//    "machine"?: a preset of model/topology.h ("dgx-a100"): fills GPUs and topology, or
//    "gpus"?: [{"index"?, "uuid"?, "model", "memory"?, "smCount"?, "computeCapability"?,
//               "numaNode"?, "healthy"?, "migEnabled"?}],
//    "topology"?: the GPU pair-score matrix (TopologyToJson); flat when absent}
// machine excludes gpus and topology; neither makes a CPU-only node. A GPU's model is stored
// under the catalog's canonical name when the catalog knows it, and its memory, SM count and
// compute capability default to the catalog's figures. Ends with ValidateNodeSpec.
Result<NodeSpec> ParseNodeSpec(const nlohmann::json& j, const GpuCatalog& catalog);

// Everything ParseNodeSpec reads, written out (gpus and topology explicitly, never `machine`):
// ParseNodeSpec(NodeSpecToJson(s)) gives a spec SameNodeSpec() calls equal to s for every valid s.
nlohmann::json NodeSpecToJson(const NodeSpec& spec);

// Field-by-field equality of two node specs, topology included.
bool SameNodeSpec(const NodeSpec& a, const NodeSpec& b);

// A topology as its pair-score matrix: row a, column b is Score(a, b) = PCIe level score (10..60,
// see model/topology.h) + 100 per NVLink link; 0 on the diagonal.
nlohmann::json TopologyToJson(const Topology& topology);
// The inverse of TopologyToJson for `gpu_count` GPUs. Each score must decode into a PCIe level and
// a link count, the matrix must be symmetric, and the levels must describe a PCIe tree (two GPUs
// are never closer to a third than to each other's common ancestor). `path` names the field.
Result<Topology> TopologyFromJson(const nlohmann::json& j, int gpu_count,
                                  const std::string& path = "topology");

// {"node": "node-1", "cpu": "2", "memory": "8Gi",
//  "gpus": [{"index": 0, "uuid": "GPU-...", "share": 250, "memory": "10Gi",
//            "mig": {"profile": "3g.40gb", "profileId": 9, "start": 4}}],   (mig only for MIG grants)
//  "shareTask": true}
// Names come from the ledger; a node or GPU the ledger does not have is written with an empty
// name or uuid, and a MIG instance whose profile it cannot resolve without "profile".
nlohmann::json PlacementToJson(const Placement& p, const Ledger& ledger);
// The MIG geometry of GPU `gpu` of `node` (its model's), or nullptr.
const MigGeometry* GeometryOf(const Ledger& ledger, NodeIndex node, int gpu);
// The geometry's profile of driver id `id`, or nullptr.
const MigProfile* ProfileById(const MigGeometry& geometry, int id);
// The inverse: the node by name, GPUs by index (a uuid, when given, must match the ledger's), MIG
// instances by profileId or profile name (both: they must agree). shareTask defaults to what the
// GPUs say (one GPU, a partial share, no MIG). Does not check that the placement fits.
Result<Placement> PlacementFromJson(const nlohmann::json& j, const Ledger& ledger);

// Quantities as the API writes them: cpu in cores ("2", "0.5"), memory with binary units
// ("8Gi", "1536Mi").
nlohmann::json QuantityCpuJson(MilliCpu cpu);
nlohmann::json QuantityMemoryJson(MiB memory);

}  // namespace gpupool
