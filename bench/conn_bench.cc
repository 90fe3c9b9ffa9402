// Connections, heartbeats and listers against a real `gpupool server` (figures go to
// docs/performance.md, "HTTP layer"). It starts the binary with a config holding an admin and an
// agent token, registers nodes, and then, from one epoll loop over raw non-blocking sockets:
//
//   - opens `--idle` keep-alive connections that each send one GET /healthz and then stay open,
//     silent, for the whole run (the server must keep them: its idle timeout is 60 s);
//   - runs `--beaters` heartbeating clients, one per registered node, each on its own keep-alive
//     connection, POSTing the heartbeat a simulated agent sends (8 GPUs) `--rate` times a second,
//     at phases spread over the period;
//   - optionally `--listers` clients calling GET /api/v1/jobs?limit=1000 back to back against
//     `--jobs` submitted jobs (every `--big-every`th with `--big-tasks` replicas), and one client
//     polling GET /healthz `--poll-hz` times a second.
//
// Latency is measured from the moment a request was due (not when it was written), so a client that
// falls behind shows up in the figures. A beat that is due while the previous one is unanswered is
// not sent and is counted as skipped. The server's threads, RSS (VmRSS, VmHWM) and CPU come from
// /proc/<pid>; its own count of open connections from /metrics. Nodes lost: GET /api/v1/nodes at the
// end, every node must be "ready".
//
// One machine cannot open more than `http.maxConnectionsPerAddress` (default 1,000) connections to
// the server from one address, so client sockets are bound round-robin to 127.0.0.2 ..
// 127.0.0.(1+`--addresses`); the server keeps its default cap.
//
// Exit status 1 when anything failed: a heartbeat or poll that got no 2xx, a connection refused,
// reset or timed out, an idle connection the server closed, a node not ready at the end or declared
// lost at any time (gpupool_nodes_lost_total), a heartbeat p99 over `--max-p99-ms` (when given), or a
// server that does not exit within 20 s of SIGTERM (its stacks go to the kept work directory when
// gdb is installed). Every phase is bounded in time; 2 on a setup error.
//
//   conn_bench --gpupool build/gpupool [--idle 10000] [--beaters 1000] [--seconds 25] [--rate 1]
//              [--listers 0] [--jobs 0] [--big-every 10] [--big-tasks 64] [--poll-hz 10]
//              [--addresses 20] [--max-p99-ms MS] [--keep]

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

extern char** environ;

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr char kAdminToken[] = "conn-bench-admin-token-0123456789";
constexpr char kAgentToken[] = "conn-bench-agent-token-0123456789";

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "conn_bench: %s\n", what.c_str());
  std::exit(2);
}

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// ---- options ------------------------------------------------------------------------------------

struct Options {
#ifdef GPUPOOL_BINARY
  std::string gpupool = GPUPOOL_BINARY;
#else
  std::string gpupool;
#endif
  int idle = 10000;
  int beaters = 1000;
  double seconds = 25;
  double rate = 1;  // heartbeats per second per client
  int listers = 0;
  int jobs = 0;
  int big_every = 10;
  int big_tasks = 64;
  double poll_hz = 10;
  int addresses = 20;
  double max_p99_ms = 0;  // 0: no limit
  bool keep = false;
};

bool ParseOptions(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--keep") {
      o->keep = true;
      continue;
    }
    if (i + 1 >= argc) return false;
    const std::string v = argv[++i];
    if (a == "--gpupool") o->gpupool = v;
    else if (a == "--idle") o->idle = std::max(0, std::atoi(v.c_str()));
    else if (a == "--beaters") o->beaters = std::max(0, std::atoi(v.c_str()));
    else if (a == "--seconds") o->seconds = std::clamp(std::atof(v.c_str()), 1.0, 600.0);
    else if (a == "--rate") o->rate = std::clamp(std::atof(v.c_str()), 0.1, 100.0);
    else if (a == "--listers") o->listers = std::max(0, std::atoi(v.c_str()));
    else if (a == "--jobs") o->jobs = std::max(0, std::atoi(v.c_str()));
    else if (a == "--big-every") o->big_every = std::max(0, std::atoi(v.c_str()));
    else if (a == "--big-tasks") o->big_tasks = std::clamp(std::atoi(v.c_str()), 1, 10000);
    else if (a == "--poll-hz") o->poll_hz = std::clamp(std::atof(v.c_str()), 0.0, 1000.0);
    else if (a == "--addresses") o->addresses = std::clamp(std::atoi(v.c_str()), 1, 250);
    else if (a == "--max-p99-ms") o->max_p99_ms = std::max(0.0, std::atof(v.c_str()));
    else return false;
  }
  return !o->gpupool.empty();
}

// ---- the server's /proc -------------------------------------------------------------------------

struct ProcSample {
  long threads = 0, rss_kib = 0, hwm_kib = 0;
  double cpu_s = 0;  // user + system
};

ProcSample SampleProc(pid_t pid) {
  ProcSample s;
  std::ifstream status(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(status, line)) {
    auto field = [&](const char* name, long* out) {
      const size_t n = std::strlen(name);
      if (line.compare(0, n, name) == 0) *out = std::atol(line.c_str() + n);
    };
    field("Threads:", &s.threads);
    field("VmRSS:", &s.rss_kib);
    field("VmHWM:", &s.hwm_kib);
  }
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string all((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close = all.rfind(')');
  if (close != std::string::npos) {
    std::istringstream rest(all.substr(close + 2));
    std::vector<std::string> f;
    std::string x;
    while (rest >> x) f.push_back(x);
    // Fields after the name start at 3 (state); utime and stime are 14 and 15.
    if (f.size() > 13) {
      const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
      s.cpu_s = (std::atof(f[11].c_str()) + std::atof(f[12].c_str())) / tick;
    }
  }
  return s;
}

std::string ProcText(const ProcSample& s) {
  return fmt::format("threads {}, VmRSS {:.1f} MiB, VmHWM {:.1f} MiB", s.threads, s.rss_kib / 1024.0,
                     s.hwm_kib / 1024.0);
}

// A value of the Prometheus text (the first sample whose line starts with `name`), or -1.
double MetricValue(const std::string& text, const std::string& name) {
  std::istringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) {
    if (line.rfind(name + " ", 0) == 0 || line.rfind(name + "{", 0) == 0)
      return std::atof(line.c_str() + line.rfind(' ') + 1);
  }
  return -1;
}

// ---- latencies ----------------------------------------------------------------------------------

struct Lat {
  std::vector<double> ms;
  void Add(double v) { ms.push_back(v); }
  double At(double q) {
    if (ms.empty()) return 0;
    std::sort(ms.begin(), ms.end());
    const size_t i = std::min(ms.size() - 1, static_cast<size_t>(q * static_cast<double>(ms.size() - 1) + 0.5));
    return ms[i];
  }
  std::string Text() {
    if (ms.empty()) return "none";
    return fmt::format("p50 {:.2f} ms, p99 {:.2f} ms, max {:.2f} ms ({} samples)", At(0.5), At(0.99), At(1.0),
                       ms.size());
  }
};

// ---- the client loop ----------------------------------------------------------------------------

enum class Role { kIdle, kBeat, kLister, kPoll, kOnce };

struct Response {
  int status = 0;  // 0: no answer (the error says why)
  std::string body;
  std::string error;
};

struct Conn {
  int fd = -1;
  Role role = Role::kOnce;
  bool connected = false;
  bool busy = false;        // a request is out, its answer not complete
  bool want_close = false;  // the answer said Connection: close
  std::string out;
  size_t out_off = 0;
  // The answer being read.
  std::string head;
  bool in_body = false;
  size_t body_left = 0;
  int status = 0;
  bool keep_body = false;
  std::string body;
  Clock::time_point due{}, sent{};
  // What to send next (kBeat, kLister, kPoll, kIdle's one request) and what to do with the answer.
  std::function<std::string()> next;
  std::function<void(Conn&, Response)> done;
  int node = -1;
};

struct RoleStats {
  Lat lat;
  int64_t ok = 0, non2xx = 0, errors = 0, skipped = 0, closed_by_server = 0;
  int64_t bytes = 0;
  std::map<int, int64_t> statuses;
  std::string first_error;
  void Error(const std::string& e) {
    ++errors;
    if (first_error.empty()) first_error = e;
  }
};

class Loop {
 public:
  Loop(int port, int addresses) : port_(port), addresses_(addresses) {
    ep_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (ep_ < 0) Die("epoll_create1");
    buf_.resize(1 << 18);
  }
  ~Loop() {
    for (auto& c : owned_)
      if (c->fd >= 0) ::close(c->fd);
    ::close(ep_);
  }

  RoleStats& stats(Role r) { return stats_[static_cast<int>(r)]; }
  int open_count() const { return open_; }
  int connecting() const { return connecting_; }

  // Starts a connection from the next source address; false (stats()'s error noted) when the
  // socket could not even be started.
  Conn* Open(Role role) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      stats(role).Error(fmt::format("socket: {}", std::strerror(errno)));
      return nullptr;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
#ifdef IP_BIND_ADDRESS_NO_PORT
    ::setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
#endif
    sockaddr_in src{};
    src.sin_family = AF_INET;
    src.sin_addr.s_addr = htonl(0x7f000002u + static_cast<uint32_t>(next_addr_++ % addresses_));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0) {
      stats(role).Error(fmt::format("bind: {}", std::strerror(errno)));
      ::close(fd);
      return nullptr;
    }
    sockaddr_in dst{};
    dst.sin_family = AF_INET;
    dst.sin_port = htons(static_cast<uint16_t>(port_));
    dst.sin_addr.s_addr = htonl(0x7f000001u);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof dst) != 0 && errno != EINPROGRESS) {
      stats(role).Error(fmt::format("connect: {}", std::strerror(errno)));
      ::close(fd);
      return nullptr;
    }
    owned_.push_back(std::make_unique<Conn>());
    Conn* raw = owned_.back().get();
    raw->fd = fd;
    raw->role = role;
    const size_t slot = static_cast<size_t>(fd);
    if (conns_.size() <= slot) conns_.resize(slot + 1, nullptr);
    conns_[slot] = raw;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP;
    ev.data.fd = fd;
    ::epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev);
    ++connecting_;
    ++open_;
    return raw;
  }

  // Sends `request` on `c` now (it must not be busy); due: when it was meant to go out.
  void Send(Conn& c, std::string request, Clock::time_point due) {
    c.out = std::move(request);
    c.out_off = 0;
    c.busy = true;
    c.due = due;
    c.sent = Clock::now();
    c.head.clear();
    c.in_body = false;
    c.body.clear();
    if (c.connected) Flush(c);
  }

  // A timer: `f` runs at `at` on the loop.
  void At(Clock::time_point at, std::function<void()> f) { timers_.push(Timer{at, seq_++, std::move(f)}); }

  // One request on a fresh connection, with the loop running meanwhile; the answer (or why none).
  Response Request(const std::string& method, const std::string& path, const std::string& token,
                   const std::string& body, double timeout_s = 30) {
    Response out;
    bool finished = false;
    Conn* c = Open(Role::kOnce);
    if (c == nullptr) return Response{0, "", stats(Role::kOnce).first_error};
    c->keep_body = true;
    c->done = [&](Conn&, Response r) {
      out = std::move(r);
      finished = true;
    };
    Send(*c, HttpRequest(method, path, token, body, true), Clock::now());
    RunUntil([&] { return finished; }, timeout_s);
    if (!finished) {
      Close(*c);
      return Response{0, "", "timed out"};
    }
    return out;
  }

  static std::string HttpRequest(const std::string& method, const std::string& path, const std::string& token,
                                 const std::string& body, bool close = false) {
    std::string r = fmt::format("{} {} HTTP/1.1\r\nHost: 127.0.0.1\r\n", method, path);
    if (!token.empty()) r += fmt::format("Authorization: Bearer {}\r\n", token);
    if (close) r += "Connection: close\r\n";
    if (!body.empty() || method == "POST")
      r += fmt::format("Content-Type: application/json\r\nContent-Length: {}\r\n", body.size());
    r += "\r\n";
    r += body;
    return r;
  }

  // Runs the loop until `pred` holds or `timeout_s` passed; true when `pred` held.
  bool RunUntil(const std::function<bool()>& pred, double timeout_s) {
    const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    while (!pred()) {
      if (Clock::now() >= end) return false;
      Step(end);
    }
    return true;
  }
  void RunFor(double s) {
    RunUntil([] { return false; }, s);
  }

  void Close(Conn& c) {
    if (c.fd < 0) return;
    if (!c.connected) --connecting_;
    ::epoll_ctl(ep_, EPOLL_CTL_DEL, c.fd, nullptr);
    ::close(c.fd);
    --open_;
    conns_[static_cast<size_t>(c.fd)] = nullptr;  // `c` itself lives on: others may hold it
    c.fd = -1;
  }

  // Requests out for longer than `s`: an error each, and the connection closed.
  void ExpireSlow(double s) {
    const auto now = Clock::now();
    for (Conn* c : conns_) {
      if (c == nullptr || c->fd < 0 || !c->busy) continue;
      if (Ms(now - c->sent) > s * 1000) Fail(*c, "no answer within the deadline");
    }
  }

 private:
  struct Timer {
    Clock::time_point at;
    uint64_t seq;
    std::function<void()> f;
    bool operator>(const Timer& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };

  void Step(Clock::time_point end) {
    const auto now = Clock::now();
    while (!timers_.empty() && timers_.top().at <= now) {
      auto f = timers_.top().f;
      timers_.pop();
      f();
    }
    Clock::time_point wake = end;
    if (!timers_.empty()) wake = std::min(wake, timers_.top().at);
    // Sleeps to the next timer to the microsecond (epoll_wait's milliseconds would either spin or
    // send late).
    const auto wait = std::clamp(wake - Clock::now(), Clock::duration::zero(),
                                 std::chrono::duration_cast<Clock::duration>(std::chrono::milliseconds(50)));
    const auto wait_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(wait).count();
    const timespec ts{static_cast<time_t>(wait_ns / 1'000'000'000), static_cast<long>(wait_ns % 1'000'000'000)};
    epoll_event evs[256];
    const int n = ::epoll_pwait2(ep_, evs, 256, &ts, nullptr);
    for (int i = 0; i < n; ++i) {
      const size_t slot = static_cast<size_t>(evs[i].data.fd);
      if (slot >= conns_.size() || conns_[slot] == nullptr) continue;
      Conn& c = *conns_[slot];
      if (!c.connected) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          Fail(c, fmt::format("connect: {}", std::strerror(err)));
          continue;
        }
        if (!(evs[i].events & EPOLLOUT)) continue;
        c.connected = true;
        --connecting_;
        Rearm(c);
        if (c.busy) Flush(c);
        if (c.fd < 0) continue;
      } else if (evs[i].events & EPOLLOUT) {
        Flush(c);
        if (c.fd < 0) continue;
      }
      if (evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) Read(c);
    }
  }

  void Rearm(Conn& c) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP | (c.out_off < c.out.size() ? EPOLLOUT : 0u);
    ev.data.fd = c.fd;
    ::epoll_ctl(ep_, EPOLL_CTL_MOD, c.fd, &ev);
  }

  void Flush(Conn& c) {
    while (c.out_off < c.out.size()) {
      const ssize_t n = ::send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return Fail(c, fmt::format("send: {}", std::strerror(errno)));
      }
      c.out_off += static_cast<size_t>(n);
    }
    Rearm(c);
  }

  void Read(Conn& c) {
    for (;;) {
      const ssize_t n = ::recv(c.fd, buf_.data(), buf_.size(), 0);
      if (n == 0) {
        if (c.busy) return Fail(c, "the server closed the connection during a request");
        ++stats(c.role).closed_by_server;
        return Close(c);
      }
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        return Fail(c, fmt::format("recv: {}", std::strerror(errno)));
      }
      if (!Consume(c, buf_.data(), static_cast<size_t>(n))) return;
    }
  }

  // Parses what arrived; false when the connection is gone.
  bool Consume(Conn& c, const char* p, size_t n) {
    stats(c.role).bytes += static_cast<int64_t>(n);
    while (n > 0) {
      if (!c.busy) {
        Fail(c, "bytes from the server without a request");
        return false;
      }
      if (!c.in_body) {
        const size_t old = c.head.size();
        c.head.append(p, n);
        const size_t from = old >= 3 ? old - 3 : 0;
        const size_t end = c.head.find("\r\n\r\n", from);
        if (end == std::string::npos) {
          if (c.head.size() > 65536) {
            Fail(c, "answer head over 64 KiB");
            return false;
          }
          return true;
        }
        const size_t used = end + 4 - old;
        p += used;
        n -= used;
        c.head.resize(end + 2);
        if (!ParseHead(c)) return false;
        c.in_body = true;
      }
      const size_t take = std::min(n, c.body_left);
      if (c.keep_body) c.body.append(p, take);
      c.body_left -= take;
      p += take;
      n -= take;
      if (c.body_left == 0) {
        if (!Complete(c)) return false;
        if (n > 0) {
          Fail(c, "bytes after the answer");
          return false;
        }
      }
    }
    return true;
  }

  bool ParseHead(Conn& c) {
    if (c.head.compare(0, 9, "HTTP/1.1 ") != 0 || c.head.size() < 12) {
      Fail(c, "not an HTTP/1.1 answer");
      return false;
    }
    c.status = std::atoi(c.head.c_str() + 9);
    c.body_left = 0;
    c.want_close = false;
    bool length = false;
    size_t pos = c.head.find("\r\n") + 2;
    while (pos < c.head.size()) {
      const size_t eol = c.head.find("\r\n", pos);
      std::string line = c.head.substr(pos, eol - pos);
      pos = eol + 2;
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      if (name == "content-length") {
        c.body_left = static_cast<size_t>(std::strtoull(value.c_str(), nullptr, 10));
        length = true;
      } else if (name == "transfer-encoding") {
        Fail(c, "chunked answers are not read by this bench");
        return false;
      } else if (name == "connection") {
        for (char& ch : value) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        c.want_close = value.find("close") != std::string::npos;
      }
    }
    if (!length) {
      Fail(c, "answer without Content-Length");
      return false;
    }
    return true;
  }

  bool Complete(Conn& c) {
    const auto now = Clock::now();
    RoleStats& st = stats(c.role);
    ++st.statuses[c.status];
    if (c.status >= 200 && c.status < 300) {
      ++st.ok;
      st.lat.Add(Ms(now - c.due));
    } else {
      ++st.non2xx;
      if (st.first_error.empty()) st.first_error = fmt::format("HTTP {}: {}", c.status, c.head.substr(0, 200));
    }
    c.busy = false;
    c.in_body = false;
    c.head.clear();
    Response r{c.status, std::move(c.body), ""};
    c.body.clear();
    const bool close = c.want_close;
    if (c.done) c.done(c, std::move(r));
    if (close && c.fd >= 0 && c.role != Role::kOnce) {
      Fail(c, "the server closed a keep-alive connection (Connection: close)");
      return false;
    }
    if (close && c.fd >= 0) Close(c);
    return c.fd >= 0;
  }

  void Fail(Conn& c, const std::string& why) {
    stats(c.role).Error(why);
    if (c.role == Role::kOnce && c.done) {
      auto done = std::move(c.done);
      c.done = nullptr;
      done(c, Response{0, "", why});
    }
    Close(c);
  }

  int port_, addresses_;
  int ep_ = -1;
  uint64_t next_addr_ = 0;
  std::vector<char> buf_;
  std::vector<Conn*> conns_;  // by descriptor; null when closed
  std::vector<std::unique_ptr<Conn>> owned_;  // every connection ever opened (a few hundred bytes each)
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;
  uint64_t seq_ = 0;
  int open_ = 0, connecting_ = 0;
  RoleStats stats_[5];
};

// ---- the server process -------------------------------------------------------------------------

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(0x7f000001u);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    Die("cannot find a free port");
  ::close(fd);
  return ntohs(a.sin_port);
}

pid_t StartServer(const Options& o, const std::string& work, int port) {
  const std::string config = work + "/server.yaml";
  {
    std::ofstream f(config);
    f << "tokens:\n"
      << "  - {token: \"" << kAdminToken << "\", role: admin}\n"
      << "  - {token: \"" << kAgentToken << "\", role: agent}\n"
      << "heartbeat: {intervalSeconds: 1, timeoutSeconds: 6}\n";
  }
  const std::string listen = fmt::format("127.0.0.1:{}", port);
  const std::string data = work + "/data";
  const std::string log = work + "/server.log";
  std::vector<std::string> args = {o.gpupool, "server", "--data-dir", data, "--listen", listen, "--config", config};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  if (posix_spawn(&pid, o.gpupool.c_str(), &fa, nullptr, argv.data(), environ) != 0)
    Die(fmt::format("cannot start {}", o.gpupool));
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

// SIGTERM, then up to `s` seconds for the exit; the seconds it took, or -1 (then SIGKILLed, after
// its threads' stacks went to `stacks` when gdb is there).
double StopServer(pid_t pid, double s, const std::string& stacks = "") {
  const auto t0 = Clock::now();
  ::kill(pid, SIGTERM);
  while (Ms(Clock::now() - t0) < s * 1000) {
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) return Ms(Clock::now() - t0) / 1000;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!stacks.empty() && std::system("command -v gdb >/dev/null 2>&1") == 0) {
    const std::string cmd =
        fmt::format("gdb -p {} -batch -ex 'thread apply all bt' >'{}' 2>&1", pid, stacks);
    if (std::system(cmd.c_str()) == 0) std::printf("the hung server's stacks: %s\n", stacks.c_str());
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return -1;
}

std::string NodeBody(int i) {
  json gpus = json::array();
  for (int g = 0; g < 8; ++g) gpus.push_back({{"index", g}, {"model", "A100-80GB"}});
  return json{{"name", fmt::format("bench-node-{:04}", i)}, {"cpu", "128"}, {"memory", "1Ti"}, {"gpus", gpus}}.dump();
}

// What a simulated agent's heartbeat carries (src/agent/agent.cc, GpuStatusJson): 8 idle GPUs.
std::string HeartbeatBody() {
  json gpus = json::array();
  for (int g = 0; g < 8; ++g)
    gpus.push_back({{"index", g},
                    {"healthy", true},
                    {"reason", ""},
                    {"temperatureC", 35.0},
                    {"utilization", 0.0},
                    {"memoryUsedFraction", 0.0}});
  return json{{"gpus", gpus}}.dump();
}

std::string JobBody(int i, const Options& o) {
  const bool big = o.big_every > 0 && i % o.big_every == 0;
  json task = {{"name", "main"},
               {"replicas", big ? o.big_tasks : 1},
               {"resources", {{"cpu", "1"}, {"memory", "2Gi"}, {"gpu", 0.25}}},
               {"command", {"python3", "train.py", "--epochs", "10"}}};
  return json{{"name", fmt::format("bench-{}", i)}, {"tasks", json::array({task})}}.dump();
}

// Sends `bodies` to `path` over `conns` keep-alive connections, back to back; (ok, failed, s).
struct Batch {
  int ok = 0, failed = 0;
  double seconds = 0;
  std::string first_error;
  std::vector<std::string> answers;  // the bodies of the answers with want_status
};

Batch SendAll(Loop& loop, int conns, const std::string& path, const std::string& token,
              const std::vector<std::string>& bodies, int want_status, double timeout_s) {
  Batch b;
  size_t next = 0;
  int finished = 0;
  const auto t0 = Clock::now();
  std::vector<Conn*> opened;
  auto send_next = [&](Conn& c) {
    if (next >= bodies.size()) return;
    loop.Send(c, Loop::HttpRequest("POST", path, token, bodies[next++]), Clock::now());
  };
  for (int i = 0; i < conns && static_cast<size_t>(i) < bodies.size(); ++i) {
    Conn* c = loop.Open(Role::kOnce);
    if (c == nullptr) Die("cannot open a setup connection: " + loop.stats(Role::kOnce).first_error);
    opened.push_back(c);
    c->keep_body = true;
    c->done = [&, send_next](Conn& cc, Response r) mutable {
      ++finished;
      if (r.status == want_status) {
        ++b.ok;
        b.answers.push_back(r.body);
      } else {
        ++b.failed;
        if (b.first_error.empty()) b.first_error = fmt::format("{} {}: {}", r.status, r.error, r.body.substr(0, 200));
      }
      if (cc.fd >= 0 && r.status != 0) send_next(cc);
    };
    send_next(*c);
  }
  loop.RunUntil([&] { return finished >= static_cast<int>(bodies.size()); }, timeout_s);
  b.seconds = Ms(Clock::now() - t0) / 1000;
  b.failed += static_cast<int>(bodies.size()) - finished;
  for (Conn* c : opened) loop.Close(*c);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!ParseOptions(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: conn_bench --gpupool BINARY [--idle N] [--beaters N] [--seconds S] [--rate HZ]\n"
                 "                  [--listers N] [--jobs N] [--big-every K] [--big-tasks T] [--poll-hz HZ]\n"
                 "                  [--addresses N] [--max-p99-ms MS] [--keep]\n");
    return 2;
  }
  const int total = o.idle + o.beaters + o.listers + 16;
  if (total / o.addresses >= 1000)
    Die(fmt::format("{} connections over {} source addresses passes the server's 1,000 per address: raise "
                    "--addresses",
                    total, o.addresses));
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < static_cast<rlim_t>(total + 256))
    Die(fmt::format("the descriptor limit ({}) is below the {} connections asked for", rl.rlim_cur, total));
  ::signal(SIGPIPE, SIG_IGN);

  const char* tmp = std::getenv("TMPDIR");
  std::string work = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/gpupool-conn-bench-XXXXXX";
  if (::mkdtemp(work.data()) == nullptr) Die("mkdtemp");
  const int port = FreePort();
  std::printf("== conn_bench: %d idle connections, %d heartbeating nodes at %.1f/s for %.0f s, %d listers over "
              "%d jobs; client sockets from 127.0.0.2..127.0.0.%d\n",
              o.idle, o.beaters, o.rate, o.seconds, o.listers, o.jobs, 1 + o.addresses);
  std::printf("== load before: %s", [] {
    std::ifstream f("/proc/loadavg");
    std::string s;
    std::getline(f, s);
    return s + "\n";
  }().c_str());
  const pid_t pid = StartServer(o, work, port);
  Loop loop(port, o.addresses);
  int failures = 0;
  auto fail = [&](const std::string& why) {
    ++failures;
    std::printf("FAIL: %s\n", why.c_str());
  };

  // Up?
  {
    const auto t0 = Clock::now();
    bool up = false;
    while (Ms(Clock::now() - t0) < 20000) {
      if (::waitpid(pid, nullptr, WNOHANG) == pid) Die("the server exited; see " + work + "/server.log");
      if (loop.Request("GET", "/healthz", "", "", 2).status == 200) {
        up = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!up) {
      StopServer(pid, 5);
      Die("the server did not answer /healthz within 20 s; see " + work + "/server.log");
    }
  }
  const ProcSample at_start = SampleProc(pid);

  // Nodes, then jobs.
  const int nodes = o.beaters;
  std::map<int, std::string> node_creds;  // node index -> its credential
  {
    std::vector<std::string> bodies;
    for (int i = 0; i < nodes; ++i) bodies.push_back(NodeBody(i));
    Batch b = SendAll(loop, 8, "/api/v1/agent/register", kAgentToken, bodies, 200, 120);
    std::printf("registered %d nodes in %.2f s (%d failed%s%s)\n", b.ok, b.seconds, b.failed,
                b.first_error.empty() ? "" : ": ", b.first_error.c_str());
    if (b.failed > 0) fail("node registration");
    // Each registration answers the node's own credential: its heartbeats go with it, as an
    // agent's do (the bootstrap token only registers).
    for (const std::string& a : b.answers) {
      const auto j = nlohmann::json::parse(a, nullptr, false);
      if (j.is_discarded() || !j.contains("credential") || !j.contains("node")) continue;
      const std::string name = j["node"].value("name", "");
      if (name.size() > 11) node_creds[std::atoi(name.c_str() + 11)] = j["credential"].get<std::string>();
    }
    if (static_cast<int>(node_creds.size()) != nodes) fail("node registration: not every answer had a credential");
  }
  if (o.jobs > 0) {
    std::vector<std::string> bodies;
    for (int i = 0; i < o.jobs; ++i) bodies.push_back(JobBody(i, o));
    Batch b = SendAll(loop, 16, "/api/v1/jobs", kAdminToken, bodies, 201, 300);
    std::printf("submitted %d jobs in %.2f s (%d failed%s%s)\n", b.ok, b.seconds, b.failed,
                b.first_error.empty() ? "" : ": ", b.first_error.c_str());
    if (b.failed > 0) fail("job submission");
  }
  const ProcSample before = SampleProc(pid);

  // Heartbeaters first (their nodes must not lapse while the idle connections open).
  const std::string beat_body = HeartbeatBody();
  const auto period = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / o.rate));
  std::mt19937_64 rng(42);
  bool measuring = false;
  Clock::time_point stop_at = Clock::time_point::max();
  std::vector<Conn*> beaters;
  std::function<void(Conn*, Clock::time_point)> beat;
  beat = [&](Conn* c, Clock::time_point due) {
    if (c->fd < 0 || due >= stop_at) return;
    if (c->busy) {
      if (measuring) ++loop.stats(Role::kBeat).skipped;
    } else {
      loop.Send(*c,
                Loop::HttpRequest("POST", fmt::format("/api/v1/agent/nodes/bench-node-{:04}/heartbeat", c->node),
                                  node_creds[c->node], beat_body),
                due);
    }
    loop.At(due + period, [&, c, due] { beat(c, due + period); });
  };
  for (int i = 0; i < o.beaters; ++i) {
    Conn* c = loop.Open(Role::kBeat);
    if (c == nullptr) break;
    c->node = i;
    beaters.push_back(c);
    std::uniform_int_distribution<int64_t> phase(0, std::chrono::duration_cast<std::chrono::microseconds>(period).count());
    const auto first = Clock::now() + std::chrono::microseconds(phase(rng));
    loop.At(first, [&, c, first] { beat(c, first); });
    if (loop.connecting() >= 256) loop.RunUntil([&] { return loop.connecting() < 128; }, 30);
  }
  loop.RunUntil([&] { return loop.connecting() == 0; }, 30);

  // Idle connections: one GET /healthz each, then silence.
  const auto idle_t0 = Clock::now();
  int idle_answered = 0;
  {
    const std::string req = Loop::HttpRequest("GET", "/healthz", "", "");
    for (int i = 0; i < o.idle; ++i) {
      Conn* c = loop.Open(Role::kIdle);
      if (c == nullptr) continue;
      c->done = [&](Conn&, Response r) {
        if (r.status == 200) ++idle_answered;
      };
      loop.Send(*c, req, Clock::now());
      if (loop.connecting() >= 256) loop.RunUntil([&] { return loop.connecting() < 128; }, 30);
    }
    loop.RunUntil([&] { return idle_answered + loop.stats(Role::kIdle).errors + loop.stats(Role::kIdle).non2xx >= o.idle; },
                  60);
  }
  const double idle_open_s = Ms(Clock::now() - idle_t0) / 1000;
  std::printf("opened %d idle connections in %.2f s (%d answered /healthz; %lld errors)\n", o.idle, idle_open_s,
              idle_answered, static_cast<long long>(loop.stats(Role::kIdle).errors));
  if (idle_answered != o.idle) fail(fmt::format("{} idle connections not answered: {}", o.idle - idle_answered,
                                                loop.stats(Role::kIdle).first_error));
  const ProcSample with_idle = SampleProc(pid);

  // Listers and the /healthz poller.
  std::vector<Conn*> listers;
  const std::string list_req = Loop::HttpRequest("GET", "/api/v1/jobs?limit=1000", kAdminToken, "");
  for (int i = 0; i < o.listers; ++i) {
    Conn* c = loop.Open(Role::kLister);
    if (c == nullptr) continue;
    c->done = [&, list_req](Conn& cc, Response) {
      if (cc.fd >= 0 && Clock::now() < stop_at) loop.Send(cc, list_req, Clock::now());
    };
    listers.push_back(c);
  }
  Conn* poller = nullptr;
  std::function<void(Clock::time_point)> poll;
  const std::string poll_req = Loop::HttpRequest("GET", "/healthz", "", "");
  const auto poll_period = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(o.poll_hz > 0 ? 1.0 / o.poll_hz : 1.0));
  if (o.poll_hz > 0) {
    poller = loop.Open(Role::kPoll);
    poll = [&](Clock::time_point due) {
      if (poller == nullptr || poller->fd < 0 || due >= stop_at) return;
      if (poller->busy) {
        ++loop.stats(Role::kPoll).skipped;
      } else {
        loop.Send(*poller, poll_req, due);
      }
      loop.At(due + poll_period, [&, due] { poll(due + poll_period); });
    };
  }
  loop.RunUntil([&] { return loop.connecting() == 0; }, 30);

  // Warm-up: one period, then the measurement starts from clean counters.
  loop.RunFor(std::max(1.0, 1.0 / o.rate));
  {
    RoleStats& b = loop.stats(Role::kBeat);
    if (b.errors + b.non2xx > 0) fail(fmt::format("{} heartbeats failed before the measurement: {}", b.errors + b.non2xx, b.first_error));
    b = RoleStats{};
  }
  measuring = true;
  const auto t0 = Clock::now();
  stop_at = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  const ProcSample run_start = SampleProc(pid);
  rusage self0{};
  ::getrusage(RUSAGE_SELF, &self0);
  for (Conn* c : listers) loop.Send(*c, list_req, Clock::now());
  if (poller != nullptr) loop.At(t0, [&, t0] { poll(t0); });

  ProcSample during_max;
  ProcSample mid;
  double open_gauge_mid = -1;
  std::string metrics_mid;
  bool mid_done = false;
  while (Clock::now() < stop_at) {
    loop.RunFor(std::min(1.0, Ms(stop_at - Clock::now()) / 1000));
    loop.ExpireSlow(10);
    const ProcSample s = SampleProc(pid);
    during_max.threads = std::max(during_max.threads, s.threads);
    during_max.rss_kib = std::max(during_max.rss_kib, s.rss_kib);
    during_max.hwm_kib = std::max(during_max.hwm_kib, s.hwm_kib);
    if (!mid_done && Ms(Clock::now() - t0) / 1000 >= o.seconds / 2) {
      mid_done = true;
      mid = s;
      Response m = loop.Request("GET", "/metrics", "", "", 10);
      metrics_mid = m.body;
      open_gauge_mid = MetricValue(m.body, "gpupool_http_connections_open");
    }
  }
  const double window = Ms(Clock::now() - t0) / 1000;
  measuring = false;
  const ProcSample run_end = SampleProc(pid);
  rusage self1{};
  ::getrusage(RUSAGE_SELF, &self1);
  // Let what is in flight finish.
  loop.RunUntil([&] {
    for (Conn* c : beaters)
      if (c->fd >= 0 && c->busy) return false;
    for (Conn* c : listers)
      if (c->fd >= 0 && c->busy) return false;
    return true;
  }, 15);
  const double self_cpu = static_cast<double>(self1.ru_utime.tv_sec - self0.ru_utime.tv_sec + self1.ru_stime.tv_sec -
                                              self0.ru_stime.tv_sec) +
                          static_cast<double>(self1.ru_utime.tv_usec - self0.ru_utime.tv_usec + self1.ru_stime.tv_usec -
                                              self0.ru_stime.tv_usec) / 1e6;

  const ProcSample after_run = SampleProc(pid);
  // Nodes lost? Connections kept?
  int lost = -1;
  {
    Response r = loop.Request("GET", "/api/v1/nodes", kAdminToken, "", 30);
    if (r.status == 200) {
      lost = 0;
      std::map<std::string, int> states;
      const json list = json::parse(r.body, nullptr, false);
      const json items = list.is_object() ? list.value("items", json::array()) : json::array();
      if (static_cast<int>(items.size()) != nodes) {
        fail(fmt::format("GET /api/v1/nodes lists {} nodes, {} registered", items.size(), nodes));
      }
      for (const auto& n : items) {
        const std::string st = n.value("state", "?");
        ++states[st];
        if (st != "ready") ++lost;
      }
      std::string t;
      for (const auto& [k, v] : states) t += fmt::format(" {} {}", k, v);
      std::printf("nodes:%s\n", t.c_str());
    } else {
      fail("GET /api/v1/nodes: " + std::to_string(r.status) + " " + r.error);
    }
  }
  Response metrics_end = loop.Request("GET", "/metrics", "", "", 10);
  const ProcSample after = SampleProc(pid);

  RoleStats& hb = loop.stats(Role::kBeat);
  RoleStats& idle = loop.stats(Role::kIdle);
  RoleStats& ls = loop.stats(Role::kLister);
  RoleStats& pl = loop.stats(Role::kPoll);
  const double asked = o.beaters * o.rate;
  std::printf("\n== results (%.1f s measured)\n", window);
  std::printf("heartbeats: %lld ok = %.1f/s (asked %.1f/s); %lld skipped (previous unanswered), %lld non-2xx, "
              "%lld errors%s%s\n",
              static_cast<long long>(hb.ok), static_cast<double>(hb.ok) / window, asked,
              static_cast<long long>(hb.skipped), static_cast<long long>(hb.non2xx),
              static_cast<long long>(hb.errors), hb.first_error.empty() ? "" : "; first: ", hb.first_error.c_str());
  std::printf("heartbeat latency (from due): %s\n", hb.lat.Text().c_str());
  if (o.poll_hz > 0) {
    std::printf("/healthz poll at %.0f/s: %s; %lld skipped, %lld non-2xx, %lld errors\n", o.poll_hz, pl.lat.Text().c_str(),
                static_cast<long long>(pl.skipped), static_cast<long long>(pl.non2xx),
                static_cast<long long>(pl.errors));
  }
  if (o.listers > 0) {
    std::printf("listers: %lld lists = %.1f/s, %.1f MiB/s; %s; %lld non-2xx, %lld errors%s%s\n",
                static_cast<long long>(ls.ok), static_cast<double>(ls.ok) / window,
                static_cast<double>(ls.bytes) / window / (1 << 20), ls.lat.Text().c_str(),
                static_cast<long long>(ls.non2xx), static_cast<long long>(ls.errors),
                ls.first_error.empty() ? "" : "; first: ", ls.first_error.c_str());
  }
  std::printf("idle connections: %d opened, %lld closed by the server, %lld errors%s%s\n", o.idle,
              static_cast<long long>(idle.closed_by_server), static_cast<long long>(idle.errors),
              idle.first_error.empty() ? "" : "; first: ", idle.first_error.c_str());
  std::printf("client connections open at the end: %d\n", loop.open_count());
  std::printf("server gpupool_http_connections_open: %.0f mid-run, %.0f at the end\n", open_gauge_mid,
              MetricValue(metrics_end.body, "gpupool_http_connections_open"));
  const double lost_total = MetricValue(metrics_end.body, "gpupool_nodes_lost_total");
  std::printf("server gpupool_nodes_lost_total: %.0f (nodes declared lost at any time, each came back with its "
              "next heartbeat)\n",
              lost_total);
  for (const char* m : {"gpupool_http_connections_refused_total", "gpupool_http_timeouts_total",
                        "gpupool_http_busy_total", "gpupool_http_bad_requests_total",
                        "gpupool_http_handler_errors_total", "gpupool_http_requests_total"})
    std::printf("server %s: %.0f\n", m, MetricValue(metrics_end.body, m));
  std::printf("server at start:         %s\n", ProcText(at_start).c_str());
  std::printf("server before the load:  %s\n", ProcText(before).c_str());
  std::printf("server with idle conns:  %s\n", ProcText(with_idle).c_str());
  std::printf("server mid-run:          %s\n", ProcText(mid).c_str());
  std::printf("server during (max):     %s\n", ProcText(during_max).c_str());
  std::printf("server after the run:    %s\n", ProcText(after_run).c_str());
  std::printf("server after GET nodes:  %s\n", ProcText(after).c_str());
  std::printf("server CPU during the run: %.0f %% of one core; the bench's own: %.0f %%\n",
              100 * (run_end.cpu_s - run_start.cpu_s) / window, 100 * self_cpu / window);

  if (hb.errors + hb.non2xx > 0) fail("heartbeats failed");
  if (o.beaters > 0 && hb.ok == 0) fail("no heartbeat answered");
  if (pl.errors + pl.non2xx > 0) fail("/healthz polls failed");
  if (ls.errors > 0) fail("listers' connections failed");
  if (idle.closed_by_server + idle.errors > 0) fail("idle connections lost");
  if (lost != 0) fail(fmt::format("{} nodes not ready", lost));
  if (lost_total != 0) fail(fmt::format("{:.0f} nodes were declared lost during the run", lost_total));
  if (o.max_p99_ms > 0 && hb.lat.At(0.99) > o.max_p99_ms)
    fail(fmt::format("heartbeat p99 {:.2f} ms over {:.2f} ms", hb.lat.At(0.99), o.max_p99_ms));

  const double stop_s = StopServer(pid, 20, work + "/stacks.txt");
  std::printf("server stopped (SIGTERM) in %.2f s with %d connections open\n", stop_s, loop.open_count());
  if (stop_s < 0) fail("the server did not stop within 20 s of SIGTERM");
  std::printf("== load after: %s", [] {
    std::ifstream f("/proc/loadavg");
    std::string s;
    std::getline(f, s);
    return s + "\n";
  }().c_str());
  if (o.keep || failures > 0) {
    std::printf("work directory kept: %s\n", work.c_str());
  } else {
    std::error_code ec;
    std::filesystem::remove_all(work, ec);
  }
  std::printf("%s\n", failures == 0 ? "conn_bench: ok" : "conn_bench: FAILED");
  return failures == 0 ? 0 : 1;
}
