// The Kubernetes client against tests/kube/apiserver.py (the test API server, itself checked with
// kubectl and python3-kubernetes by tests/kube/apiserver_check.py), and kubeconfig reading.
#include "kube/kube_client.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "kube/kube_config.h"
#include "kube/kube_test_util.h"

namespace gpupool::kube {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using namespace test;  // NOLINT: the shared test helpers

class KubeClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Sh("python3 -c 'import http.server' >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
    server_ = std::make_unique<TestApiServer>(dir_.path(), std::vector<std::string>{
                                                               "--token", "t0ken", "--history", "40",
                                                               "--bookmark-seconds", "0.2"});
    ASSERT_FALSE(server_->url().empty()) << ReadText(dir_.path() + "/server.log");
    KubeEndpoint ep;
    ep.server = server_->url();
    ep.token = "t0ken";
    auto c = KubeClient::Create(ep);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(c).value();
  }

  json Pod(const std::string& name, const std::string& scheduler = "gpupool") {
    return {{"apiVersion", "v1"},
            {"kind", "Pod"},
            {"metadata", {{"name", name}, {"labels", {{"batch", "k"}}}}},
            {"spec", {{"schedulerName", scheduler}, {"containers", {{{"name", "c"}, {"image", "busybox"}}}}}}};
  }
  void CreatePod(const std::string& name, const std::string& scheduler = "gpupool") {
    const json pod = Pod(name, scheduler);
    auto r = client_->Request("POST", "/api/v1/namespaces/default/pods", &pod);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->code, 201) << r->body.dump();
  }

  TempDir dir_;
  std::unique_ptr<TestApiServer> server_;
  std::unique_ptr<KubeClient> client_;
};

TEST_F(KubeClientTest, ListPagesOneSnapshotAndTheServerFilters) {
  for (int i = 0; i < 7; ++i) CreatePod(fmt::format("p-{}", i), i % 2 == 0 ? "gpupool" : "default-scheduler");
  KubeClient::Options small;
  small.page = 2;
  KubeEndpoint ep = client_->endpoint();
  auto paged = KubeClient::Create(ep, small);
  ASSERT_TRUE(paged.ok());
  auto all = (*paged)->List("/api/v1/pods");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->items.size(), 7u);
  EXPECT_FALSE(all->resource_version.empty());
  auto mine = (*paged)->List("/api/v1/pods", "fieldSelector=" + KubeClient::Escape("spec.schedulerName=gpupool,spec.nodeName="));
  ASSERT_TRUE(mine.ok()) << mine.status().ToString();
  EXPECT_EQ(mine->items.size(), 4u);
}

// Items are handed over page by page while the next page is on its way; every page is still read
// from the first page's snapshot (a pod made during the list is not in it), and a list whose
// snapshot was compacted away meanwhile ends in an error after the pages already given.
TEST_F(KubeClientTest, AListGivenItemByItemIsOneSnapshotAndEndsOnAnExpiredContinue) {
  for (int i = 0; i < 7; ++i) CreatePod(fmt::format("s-{}", i));
  KubeClient::Options small;
  small.page = 2;
  auto paged = KubeClient::Create(client_->endpoint(), small);
  ASSERT_TRUE(paged.ok());
  std::vector<std::string> names;
  auto rv = (*paged)->ListEach("/api/v1/pods", "", [&](json&& item) {
    names.push_back(item["metadata"].value("name", ""));
    if (names.size() == 1) CreatePod("late");  // made after the snapshot: not listed
  });
  ASSERT_TRUE(rv.ok()) << rv.status().ToString();
  EXPECT_EQ(names, (std::vector<std::string>{"s-0", "s-1", "s-2", "s-3", "s-4", "s-5", "s-6"}));
  auto again = (*paged)->List("/api/v1/pods");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->items.size(), 8u);
  EXPECT_GT(std::stoll(again->resource_version), std::stoll(*rv));

  // More changes than the server keeps (--history 40) while the first page is read: the snapshot
  // the third page would come from is gone (410).
  size_t given = 0;
  auto expired = (*paged)->ListEach("/api/v1/pods", "", [&](json&&) {
    if (++given > 1) return;
    for (int i = 0; i < 45; ++i) {
      const json patch = {{"metadata", {{"labels", {{"n", std::to_string(i)}}}}}};
      ASSERT_TRUE(client_->Request("PATCH", "/api/v1/namespaces/default/pods/late", &patch,
                                   "application/merge-patch+json").ok());
    }
  });
  ASSERT_FALSE(expired.ok());
  EXPECT_EQ(expired.status().code(), StatusCode::kFailedPrecondition) << expired.status().ToString();
  EXPECT_GE(given, 2u);
  EXPECT_LT(given, 8u);
}

TEST_F(KubeClientTest, AWatchFromAResourceVersionSeesWhatChangedAndBookmarks) {
  CreatePod("w-0");
  CreatePod("w-1");
  auto list = client_->List("/api/v1/namespaces/default/pods");
  ASSERT_TRUE(list.ok());
  std::thread writer([&] {
    std::this_thread::sleep_for(300ms);
    const json patch = {{"metadata", {{"labels", {{"seen", "yes"}}}}}};
    (void)client_->Request("PATCH", "/api/v1/namespaces/default/pods/w-0", &patch, "application/merge-patch+json");
    (void)client_->Request("DELETE", "/api/v1/namespaces/default/pods/w-1");
  });
  std::vector<std::string> seen;
  int bookmarks = 0;
  auto end = client_->Watch("/api/v1/namespaces/default/pods", "", list->resource_version,
                            [&](const WatchEvent& e) {
                              if (e.type == "BOOKMARK") {
                                ++bookmarks;
                              } else {
                                seen.push_back(e.type + " " + e.object["metadata"].value("name", ""));
                              }
                              return seen.size() < 2 || bookmarks < 2;
                            },
                            5s);
  writer.join();
  ASSERT_TRUE(end.ok()) << end.status().ToString();
  EXPECT_FALSE(end->gone);
  EXPECT_EQ(seen, (std::vector<std::string>{"MODIFIED w-0", "DELETED w-1"}));
  EXPECT_GE(bookmarks, 1);
  EXPECT_GT(std::stoll(end->resource_version), std::stoll(list->resource_version));
}

TEST_F(KubeClientTest, AWatchFromBeforeTheHistoryIsGoneAndAStopFlagEndsOne) {
  CreatePod("g-0");
  auto list = client_->List("/api/v1/pods");
  ASSERT_TRUE(list.ok());
  for (int i = 0; i < 45; ++i) {
    const json patch = {{"metadata", {{"labels", {{"n", std::to_string(i)}}}}}};
    ASSERT_TRUE(client_->Request("PATCH", "/api/v1/namespaces/default/pods/g-0", &patch, "application/merge-patch+json").ok());
  }
  auto end = client_->Watch("/api/v1/pods", "", list->resource_version, [](const WatchEvent&) { return true; }, 5s);
  ASSERT_TRUE(end.ok()) << end.status().ToString();
  EXPECT_TRUE(end->gone);

  // From now on, with nothing happening: the stop flag ends it (well before the 30 s).
  std::atomic<bool> stop{false};
  std::thread stopper([&] {
    std::this_thread::sleep_for(500ms);
    stop = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto idle = client_->Watch("/api/v1/pods", "", "", [](const WatchEvent&) { return true; }, 30s, &stop);
  stopper.join();
  ASSERT_TRUE(idle.ok()) << idle.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
}

TEST_F(KubeClientTest, BindingsAndStaleWritesAreConflictsWithTheServersWords) {
  CreatePod("b-0");
  auto pod = client_->Get("/api/v1/namespaces/default/pods/b-0");
  ASSERT_TRUE(pod.ok());
  const json binding = {{"apiVersion", "v1"},
                        {"kind", "Binding"},
                        {"metadata", {{"name", "b-0"}, {"uid", pod->body["metadata"]["uid"]}}},
                        {"target", {{"kind", "Node"}, {"name", "n1"}}}};
  auto first = client_->Request("POST", "/api/v1/namespaces/default/pods/b-0/binding", &binding);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->code, 201) << first->body.dump();
  auto again = client_->Request("POST", "/api/v1/namespaces/default/pods/b-0/binding", &binding);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->code, 409);
  const Status st = ErrorOf(*again, "binding b-0");
  EXPECT_EQ(st.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(st.message().find("already assigned to node \"n1\""), std::string::npos) << st.ToString();

  json stale = pod->body;  // its resourceVersion is from before the binding
  stale["metadata"]["labels"]["x"] = "y";
  auto put = client_->Request("PUT", "/api/v1/namespaces/default/pods/b-0", &stale);
  ASSERT_TRUE(put.ok());
  EXPECT_EQ(put->code, 409);
  EXPECT_EQ(ErrorOf(*put, "update").code(), StatusCode::kAlreadyExists);
  auto missing = client_->Get("/api/v1/namespaces/default/pods/nope");
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(ErrorOf(*missing, "get").code(), StatusCode::kNotFound);
}

TEST_F(KubeClientTest, AWrongTokenIsUnauthenticatedAndAnAnswerOverTheBoundIsRefused) {
  KubeEndpoint ep = client_->endpoint();
  ep.token = "wrong";
  auto bad = KubeClient::Create(ep);
  ASSERT_TRUE(bad.ok());
  auto r = (*bad)->Get("/api/v1/pods");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(ErrorOf(*r, "list").code(), StatusCode::kUnauthenticated);

  for (int i = 0; i < 30; ++i) CreatePod(fmt::format("big-{}", i));
  KubeClient::Options tiny;
  tiny.max_body = 4096;
  tiny.page = 1000;
  auto small = KubeClient::Create(client_->endpoint(), tiny);
  ASSERT_TRUE(small.ok());
  auto list = (*small)->List("/api/v1/pods");
  ASSERT_FALSE(list.ok());
  EXPECT_EQ(list.status().code(), StatusCode::kResourceExhausted) << list.status().ToString();
}

// Over HTTPS: the server's certificate is checked against the kubeconfig's CA (a client with
// another CA is refused), and the kubeconfig's token, namespace and CA data are what is used.
// Requests keep their connections open between them, from any thread: 4 threads making 200
// requests use a handful of connections (the server sees each connection's client port), not one
// connection, and on the server's side one thread, per request.
TEST(KubeConnections, RequestsFromManyThreadsReuseAFewKeptOpenConnections) {
  if (Sh("python3 -c 'import http.server' >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
  TempDir d;
  TestApiServer server(d.path(), {"--request-log", d.path() + "/requests.jsonl"});
  ASSERT_FALSE(server.url().empty()) << ReadText(d.path() + "/server.log");
  KubeEndpoint ep;
  ep.server = server.url();
  auto c = KubeClient::Create(ep);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  KubeClient& client = **c;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 25; ++i) {
        auto r = client.Request("GET", "/api/v1/namespaces/default/pods");
        if (r.ok() && r->code == 200) ++ok;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 400);
  std::set<std::string> peers;
  std::istringstream log(ReadText(d.path() + "/requests.jsonl"));
  int requests = 0;
  for (std::string line; std::getline(log, line);) {
    const json entry = json::parse(line, nullptr, false);
    if (!entry.is_object() || !entry.contains("peer")) continue;
    ++requests;
    peers.insert(entry["peer"].get<std::string>());
  }
  EXPECT_EQ(requests, 400);
  EXPECT_LE(peers.size(), 32u) << "connections opened for 400 requests from 16 threads";
}

TEST(KubeTls, TheKubeconfigsCaAndTokenAreUsedAndAnotherCaIsRefused) {
  if (Sh("command -v openssl >/dev/null && python3 -c 'import ssl' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "no openssl or python3";
  TempDir dir;
  const std::string d = dir.path();
  const std::string certs = fmt::format(
      "cd {0} && printf 'subjectAltName=IP:127.0.0.1\\n' > ext && "
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 -subj /CN=ca >/dev/null 2>&1 && "
      "openssl req -newkey rsa:2048 -nodes -keyout tls.key -out tls.csr -subj /CN=127.0.0.1 >/dev/null 2>&1 && "
      "openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out tls.crt -days 1 -extfile ext "
      ">/dev/null 2>&1 && openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out other.crt -days 1 "
      "-subj /CN=other >/dev/null 2>&1",
      d);
  ASSERT_EQ(Sh(certs), 0);
  TestApiServer server(d, {"--tls-cert", d + "/tls.crt", "--tls-key", d + "/tls.key", "--token", "s3cret"});
  ASSERT_EQ(server.url().rfind("https://", 0), 0u) << ReadText(d + "/server.log");
  WriteText(d + "/token", "s3cret\n");
  WriteText(d + "/kubeconfig", fmt::format(R"(apiVersion: v1
kind: Config
current-context: test
clusters:
- name: c
  cluster: {{server: "{}", certificate-authority: ca.crt}}
users:
- name: u
  user: {{tokenFile: token}}
contexts:
- name: test
  context: {{cluster: c, user: u, namespace: team-a}}
)",
                                           server.url()));
  auto ep = LoadKubeconfig(d + "/kubeconfig");
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  EXPECT_EQ(ep->token, "s3cret");
  EXPECT_EQ(ep->namespace_name, "team-a");
  auto client = KubeClient::Create(*ep);
  ASSERT_TRUE(client.ok());
  auto r = (*client)->Get("/api/v1/nodes");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->code, 200) << r->body.dump();

  KubeEndpoint other = *ep;
  other.ca_pem = ReadText(d + "/other.crt");
  auto refused = KubeClient::Create(other);
  ASSERT_TRUE(refused.ok());
  auto no = (*refused)->Get("/api/v1/nodes");
  ASSERT_FALSE(no.ok());
  EXPECT_EQ(no.status().code(), StatusCode::kIoError) << no.status().ToString();
}

TEST(Kubeconfig, WhatCannotBeHonouredIsAClearError) {
  TempDir dir;
  const std::string path = dir.path() + "/kc";
  struct Case {
    std::string text, why;
  };
  const std::vector<Case> cases = {
      {"apiVersion: v1\nkind: Config\n", "no current-context"},
      {"current-context: x\ncontexts: []\n", "no contexts entry named 'x'"},
      {"current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\nclusters: [{name: c, cluster: "
       "{server: ftp://h}}]\n",
       "has no http(s) server"},
      {"current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\nclusters: [{name: c, cluster: "
       "{server: https://h}}]\nusers: [{name: u, user: {exec: {command: aws}}}]\n",
       "authenticates with 'exec'"},
      {"current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\nclusters: [{name: c, cluster: "
       "{server: https://h, certificate-authority-data: '@@@'}}]\n",
       "certificate-authority-data: not base64"},
      {"current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\nclusters: [{name: c, cluster: "
       "{server: https://h}}]\nusers: [{name: u, user: {client-certificate-data: 'QUJD'}}]\n",
       "without its key"},
      {"a: &a [1, 2]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b]\n"
       "d: &d [*c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d]\n"
       "f: &f [*e, *e, *e, *e, *e, *e, *e, *e]\ng: [*f, *f, *f, *f, *f, *f, *f, *f]\n",
       "kubeconfig"},
  };
  for (const auto& c : cases) {
    WriteText(path, c.text);
    auto ep = LoadKubeconfig(path);
    ASSERT_FALSE(ep.ok()) << c.text;
    EXPECT_NE(ep.status().message().find(c.why), std::string::npos) << ep.status().ToString();
  }
  WriteText(path, std::string(size_t{2} << 20, '#'));
  EXPECT_FALSE(LoadKubeconfig(path).ok());
  ::unsetenv("KUBERNETES_SERVICE_HOST");
  EXPECT_EQ(LoadInCluster(dir.path()).status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace gpupool::kube
