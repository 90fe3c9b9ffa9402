#include "kube/leader.h"

#include <fmt/format.h>

#include <ctime>

namespace gpupool::kube {

namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

int64_t NowNs() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }

}  // namespace

std::string MicroTimeNow() {
  const auto now = std::chrono::system_clock::now();
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:06d}Z", buf, us % 1000000);
}

LeaderElector::LeaderElector(KubeClient* client, Options options, std::function<void(bool)> on_change)
    : client_(client), options_(std::move(options)), on_change_(std::move(on_change)) {}

LeaderElector::~LeaderElector() { Stop(); }

Status LeaderElector::Validate(const Options& o) {
  if (o.identity.empty() || o.identity.size() > 253) return Status::InvalidArgument("leader election: the identity must be 1 to 253 characters");
  if (o.namespace_name.empty() || o.name.empty()) return Status::InvalidArgument("leader election: the lease needs a namespace and a name");
  if (o.retry_period.count() <= 0 || o.renew_deadline <= o.retry_period || o.lease_duration <= o.renew_deadline)
    return Status::InvalidArgument(fmt::format(
        "leader election: need 0 < retry period ({} ms) < renew deadline ({} ms) < lease duration ({} ms)",
        o.retry_period.count(), o.renew_deadline.count(), o.lease_duration.count()));
  return Status::Ok();
}

void LeaderElector::Start() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { Run(); });
}

void LeaderElector::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool LeaderElector::IsLeader() const {
  if (!leading_.load()) return false;
  const int64_t renewed = renewed_at_ns_.load();
  return renewed != 0 && NowNs() - renewed < std::chrono::nanoseconds(options_.renew_deadline).count();
}

std::string LeaderElector::holder() const {
  std::lock_guard<std::mutex> lock(mu_);
  return holder_;
}

std::string LeaderElector::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

void LeaderElector::Run() {
  while (!stop_.load()) {
    const bool held = TryAcquireOrRenew();
    if (held) {
      renewed_at_ns_ = NowNs();
      if (!leading_.load()) {
        leading_ = true;
        ++transitions_;
        if (on_change_) on_change_(true);
      }
    } else if (leading_.load() && NowNs() - renewed_at_ns_.load() >= std::chrono::nanoseconds(options_.renew_deadline).count()) {
      leading_ = false;
      lost_ = true;
      if (on_change_) on_change_(false);
      return;  // a replica that lost the lease never leads again
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, options_.retry_period, [this] { return stop_.load(); });
  }
  if (leading_.load()) {
    Release();
    leading_ = false;
    if (on_change_) on_change_(false);
  }
}

bool LeaderElector::TryAcquireOrRenew() {
  const std::string collection = fmt::format("/apis/coordination.k8s.io/v1/namespaces/{}/leases",
                                             KubeClient::Escape(options_.namespace_name));
  const std::string path = collection + "/" + KubeClient::Escape(options_.name);
  auto fail = [&](const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    last_error_ = why;
    return false;
  };
  const int duration_s = static_cast<int>((options_.lease_duration.count() + 999) / 1000);
  auto got = client_->Get(path);
  if (!got.ok()) return fail(got.status().message());
  const std::string now = MicroTimeNow();
  if (got->code == 404) {
    Json lease = {{"apiVersion", "coordination.k8s.io/v1"},
                  {"kind", "Lease"},
                  {"metadata", {{"name", options_.name}, {"namespace", options_.namespace_name}}},
                  {"spec",
                   {{"holderIdentity", options_.identity},
                    {"leaseDurationSeconds", duration_s},
                    {"acquireTime", now},
                    {"renewTime", now},
                    {"leaseTransitions", 0}}}};
    auto created = client_->Request("POST", collection, &lease);
    if (!created.ok()) return fail(created.status().message());
    if (created->code != 201 && created->code != 200) return fail(ErrorOf(*created, "creating the lease").message());
    std::lock_guard<std::mutex> lock(mu_);
    holder_ = options_.identity;
    last_error_.clear();
    return true;
  }
  if (got->code != 200 || !got->body.is_object()) return fail(ErrorOf(*got, "reading the lease").message());
  Json lease = got->body;
  Json& spec = lease["spec"];
  if (!spec.is_object()) spec = Json::object();
  const std::string holder = spec.value("holderIdentity", std::string());
  const std::string record = fmt::format("{}|{}|{}", holder, spec.value("renewTime", std::string()),
                                         spec.contains("leaseTransitions") ? spec["leaseTransitions"].dump() : "");
  const auto t = Clock::now();
  if (record != seen_record_) {
    seen_record_ = record;
    seen_at_ = t;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    holder_ = holder;
  }
  // The holder's own lease duration (bounded) decides when it has lapsed.
  std::chrono::milliseconds duration = options_.lease_duration;
  if (spec.contains("leaseDurationSeconds") && spec["leaseDurationSeconds"].is_number_integer()) {
    const int64_t s = spec["leaseDurationSeconds"].get<int64_t>();
    if (s >= 1 && s <= 3600) duration = std::chrono::seconds(s);
  }
  if (holder != options_.identity) {
    if (lost_) return false;
    if (!holder.empty() && t < seen_at_ + duration) return false;  // someone else holds it
    int64_t transitions = 0;
    if (spec.contains("leaseTransitions") && spec["leaseTransitions"].is_number_integer())
      transitions = spec["leaseTransitions"].get<int64_t>();
    spec["holderIdentity"] = options_.identity;
    spec["acquireTime"] = now;
    spec["leaseTransitions"] = transitions + 1;
  }
  spec["renewTime"] = now;
  spec["leaseDurationSeconds"] = duration_s;
  // The resourceVersion read above makes this write conditional: of two writers, one wins.
  auto put = client_->Request("PUT", path, &lease);
  if (!put.ok()) return fail(put.status().message());
  if (put->code != 200) return fail(ErrorOf(*put, "writing the lease").message());
  std::lock_guard<std::mutex> lock(mu_);
  holder_ = options_.identity;
  last_error_.clear();
  return true;
}

void LeaderElector::Release() {
  const std::string path = fmt::format("/apis/coordination.k8s.io/v1/namespaces/{}/leases/{}",
                                       KubeClient::Escape(options_.namespace_name), KubeClient::Escape(options_.name));
  auto got = client_->Get(path);
  if (!got.ok() || got->code != 200 || !got->body.is_object()) return;
  Json lease = got->body;
  Json& spec = lease["spec"];
  if (!spec.is_object() || spec.value("holderIdentity", std::string()) != options_.identity) return;
  // As Kubernetes' controllers give a lease up: no holder, a one-second duration.
  spec["holderIdentity"] = "";
  spec["leaseDurationSeconds"] = 1;
  spec["renewTime"] = MicroTimeNow();
  (void)client_->Request("PUT", path, &lease);
}

}  // namespace gpupool::kube
