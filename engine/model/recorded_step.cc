#include "engine/model/recorded_step.h"

#include <algorithm>

namespace ferry {
namespace {

// Whether `layout` is one row per sequence with tables of 1..capacity blocks.
bool OneRowPerSequence(const StepLayout& layout, int64_t capacity) {
  const int64_t n = layout.rows();
  if (static_cast<int64_t>(layout.row_sequence.size()) != n ||
      static_cast<int64_t>(layout.block_tables.size()) != n || !layout.first_keys.empty() ||
      !layout.no_write.empty()) {
    return false;
  }
  for (int64_t r = 0; r < n; ++r) {
    const auto& table = layout.block_tables[r];
    if (layout.row_sequence[r] != r || table.empty() ||
        static_cast<int64_t>(table.size()) > capacity) {
      return false;
    }
  }
  return n > 0;
}

void Pad(int64_t rows, int64_t capacity, StepLayout* layout) {
  const int64_t n = layout->rows();
  const int32_t filler = layout->block_tables[0].back();  // valid in either pool
  layout->no_write.assign(n, 0);
  for (auto& table : layout->block_tables) table.resize(capacity, table.back());
  for (int64_t r = n; r < rows; ++r) {
    layout->positions.push_back(0);
    layout->row_sequence.push_back(static_cast<int32_t>(r));
    layout->block_tables.emplace_back(capacity, filler);
    layout->no_write.push_back(1);
  }
}

}  // namespace

int64_t RecordedRows(int64_t rows, int64_t max_rows) {
  if (rows < 1) return 0;
  int64_t padded = rows;
  if (rows > 4) {
    padded = (rows + 7) / 8 * 8;
  } else if (rows == 3) {
    padded = 4;
  }
  return padded <= max_rows ? padded : 0;
}

int64_t TableCapacity(int64_t blocks) {
  int64_t capacity = 1;
  while (capacity < blocks) capacity *= 2;
  return capacity;
}

bool PadDecodeStep(int64_t rows, int64_t capacity, int64_t window_capacity,
                   std::vector<int32_t>* ids, StepLayout* layout, StepLayout* window_layout) {
  const int64_t n = layout->rows();
  if (rows < n || static_cast<int64_t>(ids->size()) != n || !OneRowPerSequence(*layout, capacity)) {
    return false;
  }
  if (window_layout != nullptr && (window_layout->positions != layout->positions ||
                                   !OneRowPerSequence(*window_layout, window_capacity))) {
    return false;
  }
  ids->resize(rows, 0);
  Pad(rows, capacity, layout);
  if (window_layout != nullptr) Pad(rows, window_capacity, window_layout);
  return true;
}

}  // namespace ferry
