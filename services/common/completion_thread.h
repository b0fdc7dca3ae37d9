// CompletionThread: one gRPC CompletionQueue and the one thread that drains it. Asynchronous
// client calls started on its queue (PrepareAsync..., Read, Finish) complete on that thread, in
// the order the queue yields them; each operation's tag is a CompletionThread::Tag, run with the
// operation's `ok`.
//
// Why not gRPC's callback API: its completions run on a pool of threads that take turns polling,
// and every completion wakes the next poller before running, so a token streamed through the
// router cost several thread wakeups. Here the thread that polls the socket is the one that runs
// the completion: one wakeup per burst of messages, none between them.
//
// Ownership: the tags belong to the caller and must stay alive until they ran. The destructor
// shuts the queue down and joins the thread once every pending operation has completed (their
// tags run, with ok = false for those cancelled): destroy it after every call on it is finished or
// cancelled. Tags must not block (they stall every call on the queue). Thread-safe.

#ifndef FERRY_SERVICES_COMMON_COMPLETION_THREAD_H_
#define FERRY_SERVICES_COMMON_COMPLETION_THREAD_H_

#include <string>
#include <thread>

#include "grpcpp/completion_queue.h"

namespace ferry {

class CompletionThread {
 public:
  class Tag {
   public:
    virtual void OnComplete(bool ok) = 0;

   protected:
    ~Tag() = default;
  };

  // `name`: the thread's name (at most 15 characters are kept).
  explicit CompletionThread(const std::string& name);
  ~CompletionThread();
  CompletionThread(const CompletionThread&) = delete;
  CompletionThread& operator=(const CompletionThread&) = delete;

  grpc::CompletionQueue* queue() { return &queue_; }

 private:
  void Run();

  grpc::CompletionQueue queue_;
  std::thread thread_;
};

// A Tag that runs (object->*method)(ok): how a call object names the steps of its operations.
template <typename T>
class MethodTag final : public CompletionThread::Tag {
 public:
  MethodTag(T* object, void (T::*method)(bool)) : object_(object), method_(method) {}
  void OnComplete(bool ok) override { (object_->*method_)(ok); }

 private:
  T* const object_;
  void (T::*const method_)(bool);
};

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_COMPLETION_THREAD_H_
