#include "engine/model/dequantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/common/thread_pool.h"
#include "engine/gguf/gguf_file.h"

namespace ferry {
namespace {

struct Layout {
  uint64_t block;        // elements per block
  uint64_t block_bytes;  // bytes per block
};

// The formats this file converts (GgmlType); their layouts come from the GGUF reader's table.
bool LayoutOf(uint32_t type, Layout* layout) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return GgmlBlockLayout(type, &layout->block, &layout->block_bytes);
  }
  return false;
}

uint16_t Load16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t Load32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

// Sub-block j's (j < 8) 6-bit scale and minimum from a K-quant's 12 bytes of scales.
void ScaleMinK4(const uint8_t* q, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Dequantizes blocks [first, last) of the tensor into out, where out[0] is the first element of
// block `first`.
void DequantizeBlocks(GgmlType type, const uint8_t* data, size_t first, size_t last, float* out) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(out, data + first * 4, (last - first) * 4);
      return;
    case GgmlType::kF16:
      for (size_t i = first; i < last; ++i) out[i - first] = HalfToFloat(Load16(data + 2 * i));
      return;
    case GgmlType::kBF16:
      for (size_t i = first; i < last; ++i) out[i - first] = Bf16ToFloat(Load16(data + 2 * i));
      return;
    case GgmlType::kQ8_0:
      for (size_t b = first; b < last; ++b) {
        const uint8_t* block = data + b * 34;
        const float d = HalfToFloat(Load16(block));
        const auto* q = reinterpret_cast<const int8_t*>(block + 2);
        float* y = out + (b - first) * 32;
        for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(q[j]);
      }
      return;
    case GgmlType::kQ4_0:
      for (size_t b = first; b < last; ++b) {
        const uint8_t* block = data + b * 18;
        const float d = HalfToFloat(Load16(block));
        const uint8_t* qs = block + 2;
        float* y = out + (b - first) * 32;
        for (int j = 0; j < 16; ++j) {
          y[j] = d * static_cast<float>((qs[j] & 0x0f) - 8);
          y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
        }
      }
      return;
    case GgmlType::kQ4_1:
      for (size_t b = first; b < last; ++b) {
        const uint8_t* block = data + b * 20;
        const float d = HalfToFloat(Load16(block));
        const float m = HalfToFloat(Load16(block + 2));
        const uint8_t* qs = block + 4;
        float* y = out + (b - first) * 32;
        for (int j = 0; j < 16; ++j) {
          // Two roundings, as float32 NumPy computes (d * q) + m; -ffp-contract=off keeps the
          // compiler from fusing them.
          const float lo = d * static_cast<float>(qs[j] & 0x0f);
          const float hi = d * static_cast<float>(qs[j] >> 4);
          y[j] = lo + m;
          y[j + 16] = hi + m;
        }
      }
      return;
    case GgmlType::kQ5_0:
      for (size_t b = first; b < last; ++b) {
        const uint8_t* block = data + b * 22;
        const float d = HalfToFloat(Load16(block));
        const uint32_t qh = Load32(block + 2);
        const uint8_t* qs = block + 6;
        float* y = out + (b - first) * 32;
        for (int j = 0; j < 16; ++j) {
          const int lo = (qs[j] & 0x0f) | ((qh >> j) & 1) << 4;
          const int hi = (qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
          y[j] = d * static_cast<float>(lo - 16);
          y[j + 16] = d * static_cast<float>(hi - 16);
        }
      }
      return;
    case GgmlType::kQ5_1:
      for (size_t b = first; b < last; ++b) {
        const uint8_t* block = data + b * 24;
        const float d = HalfToFloat(Load16(block));
        const float m = HalfToFloat(Load16(block + 2));
        const uint32_t qh = Load32(block + 4);
        const uint8_t* qs = block + 8;
        float* y = out + (b - first) * 32;
        for (int j = 0; j < 16; ++j) {
          const int lo = (qs[j] & 0x0f) | ((qh >> j) & 1) << 4;
          const int hi = (qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
          const float dlo = d * static_cast<float>(lo);
          const float dhi = d * static_cast<float>(hi);
          y[j] = dlo + m;
          y[j + 16] = dhi + m;
        }
      }
      return;
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: {
      const bool five = type == GgmlType::kQ5_K;
      const size_t bytes = five ? 176 : 144;
      for (size_t b = first; b < last; ++b) {
        const uint8_t* block = data + b * bytes;
        const float d = HalfToFloat(Load16(block));
        const float dmin = HalfToFloat(Load16(block + 2));
        const uint8_t* scales = block + 4;
        const uint8_t* qh = block + 16;
        const uint8_t* qs = block + (five ? 48 : 16);
        float* y = out + (b - first) * 256;
        for (int j = 0; j < 8; ++j) {  // sub-block j: elements 32j..32j+31
          int sc, mn;
          ScaleMinK4(scales, j, &sc, &mn);
          const float scale = d * static_cast<float>(sc);
          const float min = dmin * static_cast<float>(mn);
          for (int l = 0; l < 32; ++l) {
            int q = (qs[32 * (j / 2) + l] >> (j % 2 ? 4 : 0)) & 0x0f;
            if (five) q |= ((qh[l] >> j) & 1) << 4;
            const float v = scale * static_cast<float>(q);
            y[32 * j + l] = v - min;
          }
        }
      }
      return;
    }
    case GgmlType::kQ6_K:
      for (size_t b = first; b < last; ++b) {
        const uint8_t* block = data + b * 210;
        const uint8_t* ql = block;
        const uint8_t* qh = block + 128;
        const auto* scales = reinterpret_cast<const int8_t*>(block + 192);
        const float d = HalfToFloat(Load16(block + 208));
        float* y = out + (b - first) * 256;
        for (int e = 0; e < 256; ++e) {
          // Element e = 128h + 32s + l (s < 4, l < 32): low bits from ql[64h + 32(s % 2) + l]
          // (high nibble for s >= 2), high bits 2s..2s+1 of qh[32h + l].
          const int h = e / 128, s = e % 128 / 32, l = e % 32;
          const int lo = (ql[64 * h + 32 * (s % 2) + l] >> (s >= 2 ? 4 : 0)) & 0x0f;
          const int hi = (qh[32 * h + l] >> (2 * s)) & 3;
          const float scale = d * static_cast<float>(scales[e / 16]);
          y[e] = scale * static_cast<float>((lo | hi << 4) - 32);
        }
      }
      return;
  }
}

absl::Status Check(uint32_t type, size_t size, size_t elements, Layout* layout) {
  if (!LayoutOf(type, layout)) {
    return absl::UnimplementedError(
        absl::StrCat("tensor type ", GgmlTypeName(type), " (", type, ") is not supported"));
  }
  if (elements % layout->block != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        elements, " elements are not whole ", GgmlTypeName(type), " blocks of ", layout->block));
  }
  if (size != elements / layout->block * layout->block_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(GgmlTypeName(type), " data of ", size, " bytes for ", elements, " elements"));
  }
  return absl::OkStatus();
}

// Calls fn(first_block, last_block) over ranges of about 64K elements on the shared pool.
template <typename Fn>
void ForBlockRanges(size_t blocks, size_t block_elements, Fn fn) {
  const size_t per_range = std::max<size_t>(1, (64 * 1024) / block_elements);
  const size_t ranges = (blocks + per_range - 1) / per_range;
  ThreadPool::Shared().ParallelFor(
      ranges, [&](size_t r) { fn(r * per_range, std::min(blocks, (r + 1) * per_range)); });
}

}  // namespace

absl::string_view GgmlTypeName(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
      return "F32";
    case GgmlType::kF16:
      return "F16";
    case GgmlType::kBF16:
      return "BF16";
    case GgmlType::kQ8_0:
      return "Q8_0";
    case GgmlType::kQ4_0:
      return "Q4_0";
    case GgmlType::kQ4_1:
      return "Q4_1";
    case GgmlType::kQ5_0:
      return "Q5_0";
    case GgmlType::kQ5_1:
      return "Q5_1";
    case GgmlType::kQ4_K:
      return "Q4_K";
    case GgmlType::kQ5_K:
      return "Q5_K";
    case GgmlType::kQ6_K:
      return "Q6_K";
  }
  // Names of the formats Ferry does not convert, for error messages.
  static constexpr const char* kOthers[] = {"Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"};
  if (type >= 9 && type <= 15) return kOthers[type - 9];
  static constexpr const char* kIntegers[] = {"I8", "I16", "I32", "I64", "F64"};
  if (type >= 24 && type <= 28) return kIntegers[type - 24];
  return "unknown";
}

WeightQuant WeightQuantOfGgmlType(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kQ8_0:
      return WeightQuant::kQ8_0;
    case GgmlType::kQ4_0:
      return WeightQuant::kQ4_0;
    case GgmlType::kQ4_1:
      return WeightQuant::kQ4_1;
    case GgmlType::kQ5_0:
      return WeightQuant::kQ5_0;
    case GgmlType::kQ5_1:
      return WeightQuant::kQ5_1;
    case GgmlType::kQ4_K:
      return WeightQuant::kQ4_K;
    case GgmlType::kQ5_K:
      return WeightQuant::kQ5_K;
    case GgmlType::kQ6_K:
      return WeightQuant::kQ6_K;
    default:
      return WeightQuant::kNone;
  }
}

uint32_t GgmlTypeOfWeightQuant(WeightQuant quant) {
  switch (quant) {
    case WeightQuant::kQ8_0:
      return static_cast<uint32_t>(GgmlType::kQ8_0);
    case WeightQuant::kQ4_0:
      return static_cast<uint32_t>(GgmlType::kQ4_0);
    case WeightQuant::kQ4_1:
      return static_cast<uint32_t>(GgmlType::kQ4_1);
    case WeightQuant::kQ5_0:
      return static_cast<uint32_t>(GgmlType::kQ5_0);
    case WeightQuant::kQ5_1:
      return static_cast<uint32_t>(GgmlType::kQ5_1);
    case WeightQuant::kQ4_K:
      return static_cast<uint32_t>(GgmlType::kQ4_K);
    case WeightQuant::kQ5_K:
      return static_cast<uint32_t>(GgmlType::kQ5_K);
    case WeightQuant::kQ6_K:
      return static_cast<uint32_t>(GgmlType::kQ6_K);
    case WeightQuant::kNone:
      break;
  }
  return static_cast<uint32_t>(GgmlType::kF32);
}

size_t GgmlDataSize(uint32_t type, size_t elements) {
  Layout layout;
  if (!LayoutOf(type, &layout) || elements % layout.block != 0) return 0;
  return elements / layout.block * layout.block_bytes;
}

absl::Status CheckDequantize(uint32_t type, size_t size, size_t elements) {
  Layout layout;
  return Check(type, size, elements, &layout);
}

absl::Status DequantizeToF32(uint32_t type, const uint8_t* data, size_t size, size_t elements,
                             float* out) {
  Layout layout;
  if (absl::Status s = Check(type, size, elements, &layout); !s.ok()) return s;
  const size_t blocks = elements / layout.block;
  ForBlockRanges(blocks, layout.block, [&](size_t first, size_t last) {
    DequantizeBlocks(static_cast<GgmlType>(type), data, first, last, out + first * layout.block);
  });
  return absl::OkStatus();
}

absl::Status DequantizeToBf16(uint32_t type, const uint8_t* data, size_t size, size_t elements,
                              uint16_t* out) {
  Layout layout;
  if (absl::Status s = Check(type, size, elements, &layout); !s.ok()) return s;
  const size_t blocks = elements / layout.block;
  ForBlockRanges(blocks, layout.block, [&](size_t first, size_t last) {
    const size_t begin = first * layout.block, end = last * layout.block;
    if (static_cast<GgmlType>(type) == GgmlType::kBF16) {
      for (size_t i = begin; i < end; ++i) out[i] = Load16(data + 2 * i);
      return;
    }
    // Through an fp32 scratch of this range: the same values DequantizeToF32 produces.
    std::vector<float> scratch(end - begin);
    DequantizeBlocks(static_cast<GgmlType>(type), data, first, last, scratch.data());
    for (size_t i = begin; i < end; ++i) out[i] = FloatToBf16(scratch[i - begin]);
  });
  return absl::OkStatus();
}

}  // namespace ferry
