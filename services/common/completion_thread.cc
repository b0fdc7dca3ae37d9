#include "services/common/completion_thread.h"

#include <pthread.h>

namespace ferry {

CompletionThread::CompletionThread(const std::string& name) : thread_([this] { Run(); }) {
  pthread_setname_np(thread_.native_handle(), name.substr(0, 15).c_str());
}

CompletionThread::~CompletionThread() {
  queue_.Shutdown();
  thread_.join();
}

void CompletionThread::Run() {
  void* tag = nullptr;
  bool ok = false;
  while (queue_.Next(&tag, &ok)) static_cast<Tag*>(tag)->OnComplete(ok);
}

}  // namespace ferry
