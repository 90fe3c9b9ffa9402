// gpupool-core: every command of gpupool (the `gpupool` users run is lean_main.cc, which runs the
// client commands itself and execs this program for the rest). Subcommands defined here:
//   demo              schedule the bundled Alibaba cluster under each placement policy
//   policies          list the placement policies and registered plugins
//   profile check F   validate a scheduling profile (YAML)
//   version
// and, from the other files of src/cli: server, agent, up, sim ..., the client commands and run.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <string>
#include <vector>

#include "cli/client_commands.h"
#include "cli/run_command.h"
#include "cli/kube_commands.h"
#include "cli/server_commands.h"
#include "cli/sim_commands.h"
#include "config/profile_yaml.h"
#include "model/ledger.h"
#include "sched/profile.h"
#include "sched/registry.h"
#include "sched/scheduler.h"
#include "sim/demo.h"

namespace {

int Fail(const gpupool::Status& st) {
  std::cerr << "gpupool: " << st.ToString() << "\n";
  return st.code() == gpupool::StatusCode::kInvalidArgument ? 2 : 1;
}

int DemoCommand(const gpupool::DemoOptions& options) {
  auto results = gpupool::RunDemo(options);
  if (!results.ok()) return Fail(results.status());
  gpupool::PrintDemo(options, *results, std::cout);
  return 0;
}

int ListPolicies() {
  const gpupool::PluginRegistry r = gpupool::DefaultRegistry();
  fmt::print("policies:   {}\n", fmt::join(gpupool::PolicyNames(), ", "));
  fmt::print("filters:    {}\n", fmt::join(r.filter_names(), ", "));
  fmt::print("scores:     {}\n", fmt::join(r.score_names(), ", "));
  fmt::print("selectors:  {}\n", fmt::join(r.selector_names(), ", "));
  fmt::print("permits:    {}\n", fmt::join(r.permit_names(), ", "));
  return 0;
}

int CheckProfile(const std::string& path) {
  auto profile = gpupool::LoadProfileFile(path);
  if (!profile.ok()) return Fail(profile.status());
  // Build every plugin against an empty cluster: unknown names and bad arguments surface here.
  gpupool::Ledger ledger;
  gpupool::SeededRng rng(1);
  const std::vector<gpupool::TypicalPod> placeholder = {{1000, 500, 1, {}, 1.0}};
  gpupool::PluginInit init;
  init.typical_pods = &placeholder;  // fgd learns its workload from the embedder; accept it here
  auto s = gpupool::Scheduler::Create(*profile, gpupool::DefaultRegistry(), ledger, rng, init);
  if (!s.ok()) return Fail(s.status().WithContext(path));
  fmt::print("{}: profile '{}' is valid ({} score plugin(s), GPU selector '{}')\n", path, profile->name,
             profile->scores.size(), profile->gpu_selector.name);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpupool: a GPU pooling scheduler for AI workloads"};
  app.require_subcommand(1);

  gpupool::DemoOptions demo;
  demo.nodes_csv = std::string(GPUPOOL_DATA_DIR) + "/alibaba/openb_node_list_gpu_node.csv";
  demo.pods_csv = std::string(GPUPOOL_DATA_DIR) + "/alibaba/openb_pod_list_default.csv";
  auto* demo_cmd =
      app.add_subcommand("demo", "Schedule the bundled Alibaba cluster under each placement policy");
  demo_cmd->add_option("--nodes", demo.nodes_csv, "Node list (openb CSV)")->capture_default_str();
  demo_cmd->add_option("--pods", demo.pods_csv, "Pod list (openb CSV)")->capture_default_str();
  demo_cmd->add_option("--policy", demo.policies, "Policies to run (default: the six published ones)")
      ->check(CLI::IsMember(gpupool::PolicyNames()));
  demo_cmd->add_option("--seed", demo.seed, "Seed of the arrival order and tie-breaks")
      ->capture_default_str();
  demo_cmd->add_option("--inflate", demo.inflate, "GPU demand as a multiple of GPU capacity")
      ->capture_default_str();

  auto* policies_cmd = app.add_subcommand("policies", "List placement policies and plugins");

  auto* profile_cmd = app.add_subcommand("profile", "Scheduling profiles");
  profile_cmd->require_subcommand(1);
  std::string profile_path;
  auto* check_cmd = profile_cmd->add_subcommand("check", "Validate a profile YAML file");
  check_cmd->add_option("file", profile_path, "Profile YAML")->required();

  auto* version_cmd = app.add_subcommand("version", "Print the version");

  const std::function<int()> run_sim = gpupool::AddSimCommands(app);
  const std::function<int()> run_server = gpupool::AddServerCommand(app);
  const std::function<int()> run_kube = gpupool::AddKubeCommands(app);
  const std::function<int()> run_job = gpupool::AddRunCommand(app);
  int client_exit = -1;
  gpupool::RegisterClientCommands(app, &client_exit);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Usage errors exit 2, which scripts can tell apart from a failed operation (1).
    (void)app.exit(e);
    return 2;
  }
  if (client_exit >= 0) return client_exit;
  if (const int rc = run_job(); rc >= 0) return rc;
  if (const int rc = run_server(); rc >= 0) return rc;
  if (const int rc = run_kube(); rc >= 0) return rc;

  if (*demo_cmd) return DemoCommand(demo);
  if (*policies_cmd) return ListPolicies();
  if (*check_cmd) return CheckProfile(profile_path);
  if (const int rc = run_sim(); rc >= 0) return rc;
  if (*version_cmd) {
    fmt::print("gpupool {}\n", GPUPOOL_VERSION);
    return 0;
  }
  return 0;
}
