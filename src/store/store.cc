#include "store/store.h"

#include <condition_variable>
#include <deque>
#include <iterator>
#include <memory>
#include <mutex>
#include <utility>

namespace gpupool {

void WriteBatch::Append(WriteBatch other) {
  // Taking the other's storage is cheapest, unless this batch already reserved more.
  if (ops.empty() && ops.capacity() <= other.ops.capacity()) {
    ops = std::move(other.ops);
    return;
  }
  ops.reserve(ops.size() + other.ops.size());
  std::move(other.ops.begin(), other.ops.end(), std::back_inserter(ops));
}

// ---- GroupCommitter ---------------------------------------------------------------------------
//
// Every caller parks its batch in `queue` (FIFO) and sleeps on its own condition variable. A caller
// whose batch is not done, finding no write in progress and batches queued, becomes the leader: it
// takes batches from the front of the queue (whole batches only; at least one, then more while the
// group stays within max_ops_per_group), releases the mutex, applies the merged batch with one
// Store::Apply, retakes the mutex and hands the status to every batch of the group. It wakes only
// who has something to do: the callers of the group, and the first caller still queued and
// waiting, who leads the next group (a caller that enqueued but is not waiting yet leads when it
// comes to Wait). Waking everybody cost every queued caller a wake-up and a sleep per group. The
// leader's own batch need not be in the group it wrote (the front of the queue goes first, so
// callers are served in arrival order); it then simply waits or leads again.
//
// A Pending is shared by its caller's Ticket and the queue (then the leader's group), so a ticket
// dropped without Wait leaves nothing dangling; only the leader of its group touches it while
// `writing` is true.

struct GroupCommitter::Impl {
  struct Pending {
    WriteBatch batch;
    Status status;
    bool done = false;
    bool waiting = false;        // its caller sleeps in Wait
    std::condition_variable cv;  // its caller's
  };

  Impl(Store& s, size_t max_ops) : store(s), max_ops_per_group(max_ops) {}

  Store& store;
  const size_t max_ops_per_group;

  mutable std::mutex mu;
  std::deque<std::shared_ptr<Pending>> queue;  // guarded by mu
  bool writing = false;        // guarded by mu: a leader is inside Store::Apply
  Stats stats;                 // guarded by mu
};

GroupCommitter::GroupCommitter(Store& store, size_t max_ops_per_group)
    : impl_(std::make_unique<Impl>(store, max_ops_per_group)) {}

// REQUIRES: no Commit in flight (the owner joins its callers first).
GroupCommitter::~GroupCommitter() = default;

Status GroupCommitter::Commit(WriteBatch batch) {
  return Wait(Enqueue(std::move(batch)));
}

GroupCommitter::Ticket GroupCommitter::Enqueue(WriteBatch batch) {
  Impl& im = *impl_;
  std::lock_guard<std::mutex> lock(im.mu);
  ++im.stats.commits;
  Ticket t;
  // Nothing to make durable: an empty ticket answers at once and keeps empty batches out of groups.
  if (batch.empty()) return t;
  auto p = std::make_shared<Impl::Pending>();
  p->batch = std::move(batch);
  im.queue.push_back(p);
  t.pending_ = std::move(p);
  return t;
}

Status GroupCommitter::Wait(Ticket ticket) {
  if (!ticket.pending_) return Status::Ok();
  Impl& im = *impl_;
  auto* self = static_cast<Impl::Pending*>(ticket.pending_.get());
  std::unique_lock<std::mutex> lock(im.mu);
  while (!self->done) {
    if (im.writing || im.queue.empty()) {
      self->waiting = true;
      self->cv.wait(lock);
      self->waiting = false;
      continue;
    }
    // Lead: take whole batches from the front while they fit, but always at least one.
    std::vector<std::shared_ptr<Impl::Pending>> group;
    size_t ops = 0;
    while (!im.queue.empty()) {
      std::shared_ptr<Impl::Pending> next = im.queue.front();
      if (!group.empty() && ops + next->batch.ops.size() > im.max_ops_per_group) break;
      ops += next->batch.ops.size();
      group.push_back(next);
      im.queue.pop_front();
    }
    im.writing = true;
    ++im.stats.groups;
    lock.unlock();

    // The batches of the group belong to this leader until it marks them done, so they can be
    // moved out without the mutex.
    WriteBatch merged;
    merged.ops.reserve(ops);
    for (const auto& p : group) merged.Append(std::move(p->batch));
    const Status st = im.store.Apply(merged);

    lock.lock();
    for (const auto& p : group) {
      p->status = st;
      p->done = true;
      if (p->waiting) p->cv.notify_one();
    }
    im.writing = false;
    // The next group's leader: this caller, while its own batch is still queued; otherwise the
    // first queued caller that is waiting.
    if (self->done) {
      for (const auto& p : im.queue) {
        if (p->waiting) {
          p->cv.notify_one();
          break;
        }
      }
    }
  }
  return std::move(self->status);
}

GroupCommitter::Stats GroupCommitter::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace gpupool
