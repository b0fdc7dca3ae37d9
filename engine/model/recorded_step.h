// The shape a decode step is given so that a backend can record it once and replay it for later
// steps (Backend::BeginStep; CUDA graphs): every batch of one size class gets the same row count,
// every block table the same capacity, and the step's inputs the same layout.
//
// Rows: a decode step of n sequences (one new token each) runs as RecordedRows(n) rows: 1, 2, 4,
// 8, then multiples of 8 (vLLM's capture sizes), up to the backend's max_recorded_rows(). The
// added rows are padding: token 0 at position 0, each its own sequence, whose table names the
// first real sequence's last block; they write no KV (StepLayout::no_write) and their logits
// are never read, so the real rows' results are the same (on a batch-invariant backend, the same
// bits) as in the unpadded step.
// Tables: every table, padded's included, is TableCapacity(longest) blocks long (a power of two;
// the entries past a sequence's own blocks repeat its last one and are never read).
//
// Thread-compatible: plain functions.

#ifndef FERRY_ENGINE_MODEL_RECORDED_STEP_H_
#define FERRY_ENGINE_MODEL_RECORDED_STEP_H_

#include <cstdint>
#include <vector>

#include "engine/backends/backend.h"

namespace ferry {

// The padded row count of a decode step of `rows` sequences; 0 when none fits max_rows.
int64_t RecordedRows(int64_t rows, int64_t max_rows);

// The smallest power of two that is at least `blocks` (and at least 1).
int64_t TableCapacity(int64_t blocks);

// Pads a decode step (one row per sequence: row r is sequence r) to `rows` rows with tables of
// `capacity` blocks: `ids`, `layout` and, when given, `window_layout` (a hybrid model's window
// tables, of `window_capacity`). Both layouts get no_write (padding rows: 1). Returns false and
// changes nothing when the step is not one row per sequence, a table is empty or longer than
// its capacity, or rows is fewer than the step's.
bool PadDecodeStep(int64_t rows, int64_t capacity, int64_t window_capacity,
                   std::vector<int32_t>* ids, StepLayout* layout, StepLayout* window_layout);

}  // namespace ferry

#endif  // FERRY_ENGINE_MODEL_RECORDED_STEP_H_
