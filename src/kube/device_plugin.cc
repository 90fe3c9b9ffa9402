#include "kube/device_plugin.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>

#include "deviceplugin_v1beta1.grpc.pb.h"
#include "podresources_v1.grpc.pb.h"

namespace gpupool::kube {

namespace {

constexpr char kApiVersion[] = "v1beta1";
constexpr size_t kMaxIdsPerContainer = 4096;
constexpr size_t kMaxContainersPerCall = 64;
constexpr size_t kMaxAnswered = 4096;

// Inode of a path, 0 when it does not exist.
ino_t InodeOf(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

grpc::Status ToGrpc(const Status& st) {
  const grpc::StatusCode code = st.code() == StatusCode::kInvalidArgument   ? grpc::StatusCode::INVALID_ARGUMENT
                                : st.code() == StatusCode::kNotFound         ? grpc::StatusCode::NOT_FOUND
                                : st.code() == StatusCode::kFailedPrecondition ? grpc::StatusCode::FAILED_PRECONDITION
                                                                               : grpc::StatusCode::INTERNAL;
  return grpc::Status(code, st.message());
}

}  // namespace

class DevicePlugin::Service final : public v1beta1::DevicePlugin::Service {
 public:
  explicit Service(DevicePlugin* plugin) : plugin_(plugin) {}

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* out) override {
    out->set_pre_start_required(false);
    out->set_get_preferred_allocation_available(true);
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    std::vector<Slot> sent;
    bool first = true;
    uint64_t generation = 0;
    while (!plugin_->stop_.load() && !ctx->IsCancelled()) {
      std::vector<Slot> slots = plugin_->Slots();
      const bool same = !first && slots.size() == sent.size() &&
                        std::equal(slots.begin(), slots.end(), sent.begin(), [](const Slot& a, const Slot& b) {
                          return a.id == b.id && a.healthy == b.healthy && a.numa == b.numa;
                        });
      if (!same) {
        v1beta1::ListAndWatchResponse resp;
        for (const Slot& s : slots) {
          v1beta1::Device* d = resp.add_devices();
          d->set_id(s.id);
          d->set_health(s.healthy ? "Healthy" : "Unhealthy");
          if (s.numa >= 0) d->mutable_topology()->add_nodes()->set_id(s.numa);
        }
        if (!writer->Write(resp)) break;
        sent = std::move(slots);
        first = false;
      }
      std::unique_lock<std::mutex> lock(plugin_->mu_);
      plugin_->cv_.wait_for(lock, std::chrono::milliseconds(500), [&] {
        return plugin_->generation_ != generation || plugin_->stop_.load();
      });
      generation = plugin_->generation_;
    }
    return grpc::Status::OK;
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*, const v1beta1::PreferredAllocationRequest* req,
                                      v1beta1::PreferredAllocationResponse* out) override {
    if (static_cast<size_t>(req->container_requests_size()) > kMaxContainersPerCall)
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "more than 64 container requests");
    for (const auto& c : req->container_requests()) {
      if (c.allocation_size() < 0 || static_cast<size_t>(c.allocation_size()) > kMaxIdsPerContainer ||
          static_cast<size_t>(c.available_deviceids_size()) > 1 << 20)
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "allocation_size or available_deviceIDs out of range");
      std::vector<std::string> available(c.available_deviceids().begin(), c.available_deviceids().end());
      std::vector<std::string> must(c.must_include_deviceids().begin(), c.must_include_deviceids().end());
      auto* r = out->add_container_responses();
      for (std::string& id : plugin_->Prefer(available, must, static_cast<size_t>(c.allocation_size())))
        r->add_deviceids(std::move(id));
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* req,
                        v1beta1::AllocateResponse* out) override {
    if (req->container_requests_size() == 0)
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no container requests");
    if (static_cast<size_t>(req->container_requests_size()) > kMaxContainersPerCall)
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "more than 64 container requests");
    for (const auto& c : req->container_requests()) {
      std::vector<std::string> ids(c.devices_ids().begin(), c.devices_ids().end());
      auto grant = plugin_->AllocateOne(ids);
      if (!grant.ok()) return ToGrpc(grant.status());
      auto* r = out->add_container_responses();
      for (const auto& [k, v] : grant->env) (*r->mutable_envs())[k] = v;
      for (const auto& m : grant->mounts) {
        auto* mount = r->add_mounts();
        mount->set_container_path(m.container_path);
        mount->set_host_path(m.host_path);
        mount->set_read_only(m.read_only);
      }
      for (const auto& d : grant->devices) {
        auto* dev = r->add_devices();
        dev->set_container_path(d.path);
        dev->set_host_path(d.path);
        dev->set_permissions(d.permissions);
      }
      for (const auto& name : grant->cdi_devices) r->add_cdi_devices()->set_name(name);
    }
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*, const v1beta1::PreStartContainerRequest*,
                                 v1beta1::PreStartContainerResponse*) override {
    return grpc::Status::OK;
  }

 private:
  DevicePlugin* plugin_;
};

struct DevicePlugin::Grpc {
  std::unique_ptr<Service> service;
  std::unique_ptr<grpc::Server> server;
  ino_t socket_inode = 0;
  ino_t kubelet_inode = 0;
  std::shared_ptr<grpc::Channel> pod_resources;
};

DevicePlugin::DevicePlugin(Options options, PodsFn pods, InventoryFn inventory)
    : options_(std::move(options)), pods_(std::move(pods)), inventory_(std::move(inventory)),
      grpc_(std::make_unique<Grpc>()) {
  if (options_.socket_name.empty()) {
    // One socket per resource: "gpupool-gpupool.io_gpu.sock", "gpupool-nvidia.com_gpu.sock".
    std::string name = options_.resource;
    for (char& ch : name)
      if (ch == '/') ch = '_';
    options_.socket_name = "gpupool-" + name + ".sock";
  }
  grpc_->service = std::make_unique<Service>(this);
}

DevicePlugin::~DevicePlugin() { Stop(); }

Status DevicePlugin::Start() {
  if (options_.node.empty()) return Status::InvalidArgument("device plugin: the node's name is needed");
  if (options_.slots_per_gpu < 1 || options_.slots_per_gpu > 1000)
    return Status::InvalidArgument("device plugin: slots per GPU must be 1 to 1000");
  if (options_.resource.find('/') == std::string::npos)
    return Status::InvalidArgument(
        fmt::format("device plugin: resource '{}' needs a domain (gpupool.io/gpu)", options_.resource));
  if (options_.socket_name.find('/') != std::string::npos)
    return Status::InvalidArgument("device plugin: the socket name is a file name in the plugin directory");
  struct stat st {};
  if (::stat(options_.plugin_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return Status::FailedPrecondition(
        fmt::format("device plugin: {} is not a directory (is kubelet's device-plugins directory mounted?)",
                    options_.plugin_dir));
  RETURN_IF_ERROR(Serve());
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void DevicePlugin::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_.exchange(true)) return;
    ++generation_;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (grpc_->server) {
    grpc_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    grpc_->server.reset();
    if (InodeOf(socket_path()) == grpc_->socket_inode) ::unlink(socket_path().c_str());
  }
}

void DevicePlugin::Notify() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++generation_;
  }
  cv_.notify_all();
}

std::string DevicePlugin::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

void DevicePlugin::SetError(const std::string& e) {
  std::lock_guard<std::mutex> lock(mu_);
  last_error_ = e;
}

std::vector<DevicePlugin::Slot> DevicePlugin::Slots() const {
  const Inventory inv = inventory_();
  std::vector<Slot> out;
  out.reserve(inv.gpus.size() * static_cast<size_t>(options_.slots_per_gpu));
  for (const GpuInfo& g : inv.gpus)
    for (int s = 0; s < options_.slots_per_gpu; ++s) out.push_back({SlotId(g.uuid, s), g.healthy, g.numa_node});
  return out;
}

Status DevicePlugin::Serve() {
  const std::string path = socket_path();
  if (grpc_->server) {
    grpc_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    grpc_->server.reset();
  }
  ::unlink(path.c_str());  // a socket left by an earlier run
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix://" + path, grpc::InsecureServerCredentials());
  builder.RegisterService(grpc_->service.get());
  builder.SetMaxReceiveMessageSize(4 << 20);
  grpc_->server = builder.BuildAndStart();
  if (!grpc_->server) return Status::IoError(fmt::format("device plugin: cannot serve on {}", path));
  grpc_->socket_inode = InodeOf(path);
  return Status::Ok();
}

Status DevicePlugin::Register() {
  const std::string kubelet = options_.plugin_dir + "/kubelet.sock";
  if (InodeOf(kubelet) == 0) return Status::IoError(fmt::format("{} does not exist (kubelet not running?)", kubelet));
  auto channel = grpc::CreateChannel("unix://" + kubelet, grpc::InsecureChannelCredentials());
  auto stub = v1beta1::Registration::NewStub(channel);
  v1beta1::RegisterRequest req;
  req.set_version(kApiVersion);
  req.set_endpoint(options_.socket_name);
  req.set_resource_name(options_.resource);
  req.mutable_options()->set_pre_start_required(false);
  req.mutable_options()->set_get_preferred_allocation_available(true);
  v1beta1::Empty resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  const grpc::Status st = stub->Register(&ctx, req, &resp);
  if (!st.ok())
    return Status::IoError(fmt::format("registering {} with kubelet: {}", options_.resource, st.error_message()));
  grpc_->kubelet_inode = InodeOf(kubelet);
  return Status::Ok();
}

void DevicePlugin::Run() {
  while (!stop_.load()) {
    // kubelet removes the plugins' sockets when it starts: serve again, and register again.
    const ino_t sock = InodeOf(socket_path());
    if (sock == 0 || sock != grpc_->socket_inode) {
      registered_ = false;
      if (Status st = Serve(); !st.ok()) SetError(st.message());
    }
    const ino_t kubelet = InodeOf(options_.plugin_dir + "/kubelet.sock");
    if (registered_.load() && kubelet != grpc_->kubelet_inode) registered_ = false;
    if (!registered_.load() && grpc_->server) {
      if (Status st = Register(); st.ok()) {
        registered_ = true;
        ++registrations_;
        SetError("");
      } else {
        SetError(st.message());
      }
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, options_.check_interval, [&] { return stop_.load(); });
  }
}

std::optional<std::vector<KubeletPod>> DevicePlugin::KubeletPods() {
  const std::string& sock = options_.pod_resources_socket;
  if (sock.empty() || InodeOf(sock) == 0) return std::nullopt;
  if (!grpc_->pod_resources)
    grpc_->pod_resources = grpc::CreateChannel("unix://" + sock, grpc::InsecureChannelCredentials());
  auto stub = v1::PodResourcesLister::NewStub(grpc_->pod_resources);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::ListPodResourcesRequest req;
  v1::ListPodResourcesResponse resp;
  if (const grpc::Status st = stub->List(&ctx, req, &resp); !st.ok()) {
    SetError(fmt::format("kubelet pod-resources List: {}", st.error_message()));
    return std::nullopt;
  }
  std::vector<KubeletPod> out;
  for (const auto& p : resp.pod_resources()) {
    KubeletPod k;
    k.namespace_name = p.namespace_();
    k.name = p.name();
    for (const auto& c : p.containers())
      for (const auto& d : c.devices())
        for (const auto& id : d.device_ids()) k.devices[c.name()][d.resource_name()].push_back(id);
    out.push_back(std::move(k));
  }
  return out;
}

Result<AdmittedContainer> DevicePlugin::Find(size_t count, std::chrono::milliseconds wait, const Inventory* capacity) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    AdmissionQuery q;
    q.node = options_.node;
    q.resource = options_.resource;
    q.count = count;
    q.answered = answered_;
    q.kubelet = KubeletPods();
    const std::vector<nlohmann::json> pods = pods_();
    auto found = FindAdmittedContainer(pods, q);
    bool retry = !found.ok() && found.status().code() == StatusCode::kNotFound;
    if (found.ok() && capacity != nullptr) {
      // A pod that has left may still be seen here holding its GPU for a moment (this informer lags
      // the scheduler's): an overcommit is waited out like a pod not seen yet, then refused.
      if (Status st = CheckNodeCapacity(pods, *found, *capacity, options_.node); !st.ok()) {
        found = st;
        retry = true;
      }
    }
    if (!retry) return found;
    if (std::chrono::steady_clock::now() >= deadline || stop_.load()) return found;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Result<ContainerGrant> DevicePlugin::AllocateOne(const std::vector<std::string>& ids) {
  auto fail = [this](Status st) -> Result<ContainerGrant> {
    ++allocate_failures_;
    SetError(st.message());
    return st;
  };
  if (ids.empty()) return fail(Status::InvalidArgument("Allocate: a container request without device IDs"));
  if (ids.size() > kMaxIdsPerContainer) return fail(Status::InvalidArgument("Allocate: over 4096 device IDs"));
  const Inventory inv = inventory_();
  std::set<std::string> uuids, seen;
  for (const GpuInfo& g : inv.gpus) uuids.insert(g.uuid);
  for (const std::string& id : ids) {
    const std::string gpu = SlotGpu(id);
    const size_t sep = id.rfind("::");
    const bool ok = !gpu.empty() && uuids.count(gpu) != 0 && id.size() - sep - 2 <= 4 &&
                    std::stoi(id.substr(sep + 2)) < options_.slots_per_gpu;
    if (!ok) return fail(Status::InvalidArgument(fmt::format("Allocate: '{}' is not a device of this plugin", id.substr(0, 128))));
    if (!seen.insert(id).second) return fail(Status::InvalidArgument(fmt::format("Allocate: '{}' given twice", id)));
  }
  std::lock_guard<std::mutex> lock(alloc_mu_);
  auto found = Find(ids.size(), options_.find_wait, &inv);
  if (!found.ok()) return fail(found.status());
  GrantOptions grant_options = options_.grant;
  if (found->assignment.isolation == "mps" && options_.mps != nullptr) {
    // The GPUs' MPS daemons run before the container starts (its CUDA connects at once).
    std::set<std::string> ensured;
    for (const AssignedGpu& g : found->pod_gpus) {
      if (g.index < 0 || static_cast<size_t>(g.index) >= inv.gpus.size()) continue;  // GrantFor refuses it
      const std::string& uuid = inv.gpus[static_cast<size_t>(g.index)].uuid;
      if (!ensured.insert(uuid).second) continue;
      if (Status st = options_.mps->Ensure(uuid, found->uid); !st.ok())
        return fail(st.WithContext(fmt::format("pod {}/{}: the MPS daemon of GPU {}", found->namespace_name,
                                               found->name, uuid)));
    }
    grant_options.mps_daemons = true;
  }
  auto grant = GrantFor(*found, inv, grant_options);
  if (!grant.ok())
    return fail(grant.status().WithContext(fmt::format("pod {}/{}", found->namespace_name, found->name)));
  if (answered_.size() >= kMaxAnswered) {
    // Forget pods that are gone.
    std::set<std::string> live;
    for (const nlohmann::json& p : pods_()) {
      const auto meta = p.find("metadata");
      if (meta != p.end() && meta->is_object() && meta->contains("uid") && (*meta)["uid"].is_string())
        live.insert((*meta)["uid"].get<std::string>());
    }
    for (auto it = answered_.begin(); it != answered_.end();)
      it = live.count(it->substr(0, it->find('/'))) ? std::next(it) : answered_.erase(it);
  }
  answered_.insert(found->uid + "/" + found->container);
  ++allocations_;
  return grant;
}

std::set<std::string> DevicePlugin::AdmittedPods() const {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  std::set<std::string> out;
  for (const std::string& key : answered_) out.insert(key.substr(0, key.find('/')));
  return out;
}

std::vector<std::string> DevicePlugin::Prefer(const std::vector<std::string>& available,
                                              const std::vector<std::string>& must_include, size_t size) {
  std::vector<std::string> prefer;
  {
    std::lock_guard<std::mutex> lock(alloc_mu_);
    auto found = Find(size, options_.find_wait / 2);
    if (found.ok()) {
      const Inventory inv = inventory_();
      for (const AssignedGpu& g : found->assignment.gpus)
        if (g.index >= 0 && static_cast<size_t>(g.index) < inv.gpus.size())
          prefer.push_back(inv.gpus[static_cast<size_t>(g.index)].uuid);
    }
  }
  return PreferredSlots(available, must_include, size, prefer);
}

std::string DevicePluginMetrics(const std::vector<std::unique_ptr<DevicePlugin>>& plugins) {
  if (plugins.empty()) return {};
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help, auto value) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
    for (const auto& p : plugins) out += fmt::format("{}{{resource=\"{}\"}} {}\n", name, p->resource(), value(*p));
  };
  family("gpupool_kube_node_device_plugin_registered", "gauge", "1 while kubelet has the plugin registered.",
         [](const DevicePlugin& p) { return p.registered() ? 1 : 0; });
  family("gpupool_kube_node_device_plugin_registrations_total", "counter", "Registrations with kubelet (again after each kubelet restart).",
         [](const DevicePlugin& p) { return p.registrations(); });
  family("gpupool_kube_node_allocations_total", "counter", "Containers given their GPUs through Allocate.",
         [](const DevicePlugin& p) { return p.allocations(); });
  family("gpupool_kube_node_allocate_failures_total", "counter", "Allocate calls refused (no waiting pod, bad IDs, a GPU that does not match).",
         [](const DevicePlugin& p) { return p.allocate_failures(); });
  return out;
}

}  // namespace gpupool::kube
