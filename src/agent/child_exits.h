// Wakes whoever subscribed as soon as a child of this process exits: an agent's task supervisors
// are its children, so the agent learns of a task's end at once instead of at its next poll.
//
// One thread for the whole process (started on first use, never joined: it may block in waitid
// until the process ends) waits with waitid(P_ALL, WEXITED | WNOWAIT), which sees a child's exit
// without reaping it: whoever started the child still reaps it and reads its status. A child
// that stays unreaped makes the thread back off (up to 200 ms between wake-ups), so another
// component's child can never make it spin.
#pragma once

#include <cstdint>
#include <functional>

namespace gpupool {

class ChildExits {
 public:
  static ChildExits& Get();
  // `on_exit` runs on the notifier's thread (keep it short: notify a condition variable). Returns
  // the subscription, for Unsubscribe; after Unsubscribe returns, `on_exit` is not running and
  // will not run again.
  uint64_t Subscribe(std::function<void()> on_exit);
  void Unsubscribe(uint64_t id);
  // A child was started: the thread, idle while the process had none, waits on it now.
  void ChildStarted();

 private:
  ChildExits();
  struct Impl;
  Impl* impl_;  // never freed: the thread may outlive every static destructor
};

}  // namespace gpupool
