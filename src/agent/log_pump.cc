#include "agent/log_pump.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>

namespace gpupool::agent_internal {

std::string RotatedLogPath(const std::string& path, int n) { return path + "." + std::to_string(n); }

namespace {

void Rotate(LogSink* s) {
  ++s->rotations;
  if (s->keep <= 0) {
    // Nothing kept: start the one file again.
    if (s->fd >= 0 && (::ftruncate(s->fd, 0) != 0 || ::lseek(s->fd, 0, SEEK_SET) < 0)) {
      ::close(s->fd);
      s->fd = -1;
    }
    s->size = 0;
    return;
  }
  for (int i = s->keep - 1; i >= 1; --i) ::rename(s->rotated[i - 1], s->rotated[i]);
  ::rename(s->path, s->rotated[0]);
  if (s->fd >= 0) ::close(s->fd);
  s->fd = ::open(s->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  s->size = 0;
}

}  // namespace

void LogSinkWrite(LogSink* s, const char* data, size_t n) {
  while (n > 0) {
    if (s->fd < 0) {
      s->dropped += n;
      return;
    }
    size_t chunk = n;
    if (s->max_bytes > 0) {
      if (s->size >= s->max_bytes) {
        Rotate(s);
        continue;
      }
      const auto room = static_cast<size_t>(s->max_bytes - s->size);
      if (chunk > room) chunk = room;
    }
    ssize_t w = ::write(s->fd, data, chunk);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      // A full disk or a broken file: drop this chunk, keep draining.
      s->dropped += n;
      return;
    }
    s->size += w;
    data += w;
    n -= static_cast<size_t>(w);
  }
}

int PumpLogs(int pipes[2], LogSink* sinks[2], int wake_fd, int timeout_ms) {
  struct pollfd fds[3];
  int nfds = 0;
  int which[3];
  for (int i = 0; i < 2; ++i) {
    if (pipes[i] < 0) continue;
    fds[nfds] = {pipes[i], POLLIN, 0};
    which[nfds++] = i;
  }
  if (wake_fd >= 0) {
    fds[nfds] = {wake_fd, POLLIN, 0};
    which[nfds++] = -1;
  }
  if (nfds == 0) return 0;
  int r = ::poll(fds, static_cast<nfds_t>(nfds), timeout_ms);
  if (r > 0) {
    static char buf[64 * 1024];
    for (int k = 0; k < nfds; ++k) {
      const int i = which[k];
      if (i < 0 || fds[k].revents == 0) continue;
      // Bounded per call so that one busy stream cannot starve the other or the exit checks.
      for (int rounds = 0; rounds < 16; ++rounds) {
        ssize_t n = ::read(pipes[i], buf, sizeof(buf));
        if (n > 0) {
          LogSinkWrite(sinks[i], buf, static_cast<size_t>(n));
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        ::close(pipes[i]);  // EOF or a real error
        pipes[i] = -1;
        break;
      }
    }
  }
  return (pipes[0] >= 0 ? 1 : 0) + (pipes[1] >= 0 ? 1 : 0);
}

}  // namespace gpupool::agent_internal
