#include "services/common/allocator_tuning.h"

#include <malloc.h>

namespace ferry {

void TuneAllocatorForLargeBuffers() {
  ::mallopt(M_MMAP_THRESHOLD, 64 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace ferry
