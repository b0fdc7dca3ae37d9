// A step's layout (backend.h's StepLayout: positions, sequences, block tables, first keys, rows
// that write) flattened into one array of int32 words, the form the CUDA backend copies to the
// device in one transfer and its WriteKv and Attention kernels read. Host-side; plain C++ so
// nvcc reads it too.
//
// Words, in order: positions[rows] | row_sequence[rows] | writes[rows] (1 or 0) |
// first_keys[sequences] | table_offsets[sequences + 1] | tables (every sequence's block table,
// one after the other: sequence s's at [table_offsets[s], table_offsets[s + 1])).
//
// Thread-compatible: a StepWords is a value.

#ifndef FERRY_ENGINE_BACKENDS_CUDA_STEP_UPLOAD_H_
#define FERRY_ENGINE_BACKENDS_CUDA_STEP_UPLOAD_H_

#include <cstdint>
#include <vector>

namespace ferry::cuda {

// Where each part starts, in words, and the counts.
struct StepOffsets {
  int32_t rows = 0;
  int32_t sequences = 0;
  int32_t positions = 0;
  int32_t row_sequence = 0;
  int32_t writes = 0;
  int32_t first_keys = 0;
  int32_t table_offsets = 0;
  int32_t tables = 0;
  int32_t words = 0;  // in all
  int32_t max_position = -1;
};

struct StepWords {
  StepOffsets offsets;
  std::vector<int32_t> words;
};

// Flattens a layout given as its parts (empty first_keys: 0 for all; empty no_write: every row
// writes). Returns false (and leaves `out` unspecified) when the parts disagree in length or a
// row names a sequence that is out of range.
bool FlattenStep(const std::vector<int32_t>& positions, const std::vector<int32_t>& row_sequence,
                 const std::vector<std::vector<int32_t>>& block_tables,
                 const std::vector<int32_t>& first_keys, const std::vector<uint8_t>& no_write,
                 StepWords* out);

// A recorded step's inputs (backend.h StepInputs) in one array, copied to the device in one
// transfer before the step runs or replays: ids[rows] | positions[rows] | each layout's words.
// Each layout's max_position is the step's bound (StepInputs::max_position), so that the launch
// shapes of steps of one shape are the same whatever their positions.
struct StepInputWords {
  std::vector<int32_t> words;
  int32_t ids = 0;  // where each part starts, in words
  int32_t positions = 0;
  int32_t layouts[2] = {0, 0};
  StepOffsets offsets[2];  // each layout's, relative to its own start
  int32_t layout_count = 0;
};

// Packs ids, positions and 1 or 2 flattened layouts. Returns false (and leaves `out`
// unspecified) when the counts disagree (ids, positions and each layout's rows), there are not
// 1 or 2 layouts, or a position is above max_position.
bool PackStepInputs(const std::vector<int32_t>& ids, const std::vector<int32_t>& positions,
                    const std::vector<const StepWords*>& layouts, int32_t max_position,
                    StepInputWords* out);

}  // namespace ferry::cuda

#endif  // FERRY_ENGINE_BACKENDS_CUDA_STEP_UPLOAD_H_
