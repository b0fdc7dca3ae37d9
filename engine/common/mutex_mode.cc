#include "engine/common/mutex_mode.h"

#include "absl/synchronization/mutex.h"

namespace ferry {

void UseProgramMutexMode() { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); }

}  // namespace ferry
