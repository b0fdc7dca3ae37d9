#include "engine/backends/cuda/step_upload.h"

#include <algorithm>

namespace ferry::cuda {

bool FlattenStep(const std::vector<int32_t>& positions, const std::vector<int32_t>& row_sequence,
                 const std::vector<std::vector<int32_t>>& block_tables,
                 const std::vector<int32_t>& first_keys, const std::vector<uint8_t>& no_write,
                 StepWords* out) {
  const size_t rows = positions.size(), sequences = block_tables.size();
  if (row_sequence.size() != rows || (!no_write.empty() && no_write.size() != rows) ||
      (!first_keys.empty() && first_keys.size() != sequences)) {
    return false;
  }
  size_t table_words = 0;
  for (const auto& table : block_tables) table_words += table.size();
  StepOffsets& o = out->offsets;
  o.rows = static_cast<int32_t>(rows);
  o.sequences = static_cast<int32_t>(sequences);
  o.positions = 0;
  o.row_sequence = o.positions + o.rows;
  o.writes = o.row_sequence + o.rows;
  o.first_keys = o.writes + o.rows;
  o.table_offsets = o.first_keys + o.sequences;
  o.tables = o.table_offsets + o.sequences + 1;
  o.words = o.tables + static_cast<int32_t>(table_words);
  o.max_position = -1;
  std::vector<int32_t>& w = out->words;
  w.assign(o.words, 0);
  for (size_t r = 0; r < rows; ++r) {
    if (row_sequence[r] < 0 || static_cast<size_t>(row_sequence[r]) >= sequences) return false;
    w[o.positions + r] = positions[r];
    w[o.row_sequence + r] = row_sequence[r];
    w[o.writes + r] = no_write.empty() || no_write[r] == 0 ? 1 : 0;
    o.max_position = std::max(o.max_position, positions[r]);
  }
  int32_t at = 0;
  for (size_t s = 0; s < sequences; ++s) {
    w[o.first_keys + s] = first_keys.empty() ? 0 : first_keys[s];
    w[o.table_offsets + s] = at;
    std::copy(block_tables[s].begin(), block_tables[s].end(), w.begin() + o.tables + at);
    at += static_cast<int32_t>(block_tables[s].size());
  }
  w[o.table_offsets + sequences] = at;
  return true;
}

bool PackStepInputs(const std::vector<int32_t>& ids, const std::vector<int32_t>& positions,
                    const std::vector<const StepWords*>& layouts, int32_t max_position,
                    StepInputWords* out) {
  const size_t rows = ids.size();
  if (positions.size() != rows || layouts.empty() || layouts.size() > 2) return false;
  for (int32_t p : positions) {
    if (p > max_position) return false;
  }
  out->ids = 0;
  out->positions = static_cast<int32_t>(rows);
  int32_t at = static_cast<int32_t>(2 * rows);
  out->layout_count = static_cast<int32_t>(layouts.size());
  for (size_t i = 0; i < layouts.size(); ++i) {
    if (layouts[i]->offsets.rows != static_cast<int32_t>(rows)) return false;
    out->layouts[i] = at;
    out->offsets[i] = layouts[i]->offsets;
    out->offsets[i].max_position = max_position;
    at += layouts[i]->offsets.words;
  }
  std::vector<int32_t>& w = out->words;
  w.clear();
  w.reserve(at);
  w.insert(w.end(), ids.begin(), ids.end());
  w.insert(w.end(), positions.begin(), positions.end());
  for (const StepWords* l : layouts) w.insert(w.end(), l->words.begin(), l->words.end());
  return true;
}

}  // namespace ferry::cuda
