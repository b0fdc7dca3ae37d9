// vision_bench: the vision tower and projector (engine/model/vision/vision_tower.h) on the CPU
// backend, for `ferry bench vision` (tools/bench/vision_bench.sh writes the models).
//
//   vision_bench DIR_224 DIR_448 [--images N]
//
// For each directory (a LLaVA-style model from make_tiny_vlm --size bench, its tower at 224^2 and
// 448^2) and each VisionPrecision (bf16 products, fp32 products: vision_tower.h): load, one
// Encode to warm up, then N Encode calls one after another (one image each, deterministic
// pseudo-random pixels in the normalized range), each timed: images/s = 1 / the fastest
// (tools/bench/timing.h: noise from other processes only adds time; the mean is printed beside
// it). The tower runs on the shared thread pool (one thread per core: the tower has no
// thread knob), so the peak below is measured on as many threads.
//
// FLOPs per image, from the config (2 x multiply-adds), counting only what Encode computes: the
// patch embedding (patches x C*p*p x D), every encoder layer up to the selected hidden state
// (q, k, v, out: 4 x n x D x D; fc1 and fc2: 2 x n x D x I; attention: n x n x D for the scores
// and n x n x D for the value sums, n = patches + 1), and the projector (tokens x D x T + tokens x
// T x T). LayerNorms, softmax, activations and bias adds are not counted.
//
// Baseline, in the same process: tools/bench/peak_flops.h's BestPeakFlops, the peak `ferry bench
// engine` quotes (the AVX512-BF16 dot product where the CPU has it), measured before the towers
// and after each, the best counting (a loaded machine only lowers it, which would flatter the
// ratio). Goal: the 448^2 tower's
// FLOP/s >= 0.5 of it. The JSON's images_per_s_224, images_per_s_448 and tower_flops_ratio are
// the bf16 variant's (the products that peak is about, as prefill's bf16 weights), the *_f32
// keys the fp32 variant's (the exact one, checked against transformers at 1e-4).
//
// Prints a table, then one JSON line.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/common/thread_pool.h"
#include "engine/model/vision/vision_tower.h"
#include "nlohmann/json.hpp"
#include "tools/bench/peak_flops.h"
#include "tools/bench/timing.h"

namespace ferry {
namespace {

constexpr double kGoal = 0.5;

// Multiply-adds of one Encode call (see the header).
double EncodeMacs(const VisionConfig& c) {
  const double n = static_cast<double>(c.num_positions()), d = static_cast<double>(c.hidden_size),
               i = static_cast<double>(c.intermediate_size),
               t = static_cast<double>(c.text_hidden_size);
  const double patch =
      static_cast<double>(c.num_patches()) * c.num_channels * c.patch_size * c.patch_size * d;
  const double layer = n * (4 * d * d + 2 * d * i) + 2 * n * n * d;
  const double tokens = static_cast<double>(c.num_image_tokens());
  const double projector = tokens * (d * t + t * t);
  return patch + static_cast<double>(c.selected_layer()) * layer + projector;
}

struct Result {
  VisionConfig config;
  double load_seconds = 0;
  double seconds = 0;            // N images
  double images_per_s = 0;       // 1 / the fastest image
  double mean_images_per_s = 0;  // N / the N images' time
  double flops_per_image = 0;
};

Result Run(const std::string& dir, VisionPrecision precision, int images) {
  Result r;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<VisionTower> tower = VisionTower::Load(dir, precision);
  if (!tower.ok()) {
    std::cerr << "vision_bench: " << dir << ": " << tower.status() << "\n";
    std::exit(1);
  }
  r.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.config = tower->config();
  std::vector<float> pixels(static_cast<size_t>(r.config.pixel_count()));
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (float& p : pixels) {  // xorshift: values in [-1.8, 2.2), as normalized CLIP pixels
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    p = static_cast<float>(state >> 40) / static_cast<float>(1 << 24) * 4.0f - 1.8f;
  }
  auto encode = [&] {
    absl::StatusOr<std::vector<float>> out = tower->Encode(pixels);
    if (!out.ok()) {
      std::cerr << "vision_bench: " << dir << ": " << out.status() << "\n";
      std::exit(1);
    }
  };
  encode();  // warm-up: first touch of the packed weights and the pool's threads
  const auto t0 = std::chrono::steady_clock::now();
  const double best = bench::BestSeconds(images, encode);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.images_per_s = 1.0 / best;
  r.mean_images_per_s = images / r.seconds;
  r.flops_per_image = 2.0 * EncodeMacs(r.config);
  return r;
}

int Main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: vision_bench DIR_224 DIR_448 [--images N]\n";
    return 2;
  }
  int images = 4;
  for (int a = 3; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--images" && a + 1 < argc && absl::SimpleAtoi(argv[a + 1], &images) && images > 0 &&
        images <= 10000) {
      ++a;
    } else {
      std::cerr << "vision_bench: bad argument '" << arg << "' (--images N, 1..10000)\n";
      return 2;
    }
  }
  const int threads = ThreadPool::Shared().threads();
  // The peak before the towers and after each of them, the best counting: a loaded machine
  // slows both the peak loops and the towers, and the towers' best image may come in a quiet
  // moment, so the peak gets as many chances.
  std::vector<bench::PeakFlops> peaks = {bench::BestPeakFlops(threads)};
  auto run = [&](const char* dir, VisionPrecision precision) {
    Result r = Run(dir, precision, images);
    peaks.push_back(bench::BestPeakFlops(threads));
    return r;
  };
  const Result small = run(argv[1], VisionPrecision::kBf16);
  const Result large = run(argv[2], VisionPrecision::kBf16);
  const Result small32 = run(argv[1], VisionPrecision::kF32);
  const Result large32 = run(argv[2], VisionPrecision::kF32);
  if (small.config.image_size != 224 || large.config.image_size != 448) {
    std::cerr << "vision_bench: expected towers of 224 and 448 px, got " << small.config.image_size
              << " and " << large.config.image_size << "\n";
    return 1;
  }
  bench::PeakFlops peak;
  std::string rounds;
  for (const bench::PeakFlops& p : peaks) {
    if (p.flops > peak.flops) peak = p;
    absl::StrAppend(&rounds, rounds.empty() ? "" : ", ", absl::SixDigits(p.flops / 1e9));
  }
  const double tower_flops = large.flops_per_image * large.images_per_s;
  const double ratio = tower_flops / peak.flops;
  const double ratio32 = large32.flops_per_image * large32.images_per_s / peak.flops;

  const VisionConfig& c = large.config;
  std::printf(
      "vision: CLIP tower + LLaVA projector (make_tiny_vlm --size bench: hidden %lld, MLP %lld, "
      "%lld of %lld layers run, %lld heads, patch %lld, projector to %lld), CPU backend, "
      "%d threads (one per core), %d images per tower after one warm-up\n",
      static_cast<long long>(c.hidden_size), static_cast<long long>(c.intermediate_size),
      static_cast<long long>(c.selected_layer()), static_cast<long long>(c.num_layers),
      static_cast<long long>(c.num_heads), static_cast<long long>(c.patch_size),
      static_cast<long long>(c.text_hidden_size), threads, images);
  std::printf(
      "  peak (%s, %d threads, same run, the best of %zu rounds around the towers: %s): "
      "%.1f GFLOP/s\n",
      peak.name.c_str(), threads, peaks.size(), rounds.c_str(), peak.flops / 1e9);
  std::printf("  %-7s %-6s %10s %10s %10s %10s %12s %10s %8s\n", "tower", "GEMMs", "positions",
              "images/s", "(mean)", "ms/image", "GFLOP/image", "GFLOP/s", "of peak");
  for (const Result* r : {&small, &large, &small32, &large32}) {
    const double flops = r->flops_per_image * r->images_per_s;
    std::printf("  %-7s %-6s %10lld %10.3f %10.3f %10.1f %12.2f %10.1f %8.3f\n",
                (std::to_string(r->config.image_size) + "^2").c_str(),
                r == &small || r == &large ? "bf16" : "fp32",
                static_cast<long long>(r->config.num_positions()), r->images_per_s,
                r->mean_images_per_s, 1e3 / r->images_per_s, r->flops_per_image / 1e9, flops / 1e9,
                flops / peak.flops);
  }
  std::printf(
      "  448^2 tower, bf16 products: %.3f of peak (goal >= %.1f): %s (fp32 products: %.3f)\n",
      ratio, kGoal, ratio >= kGoal ? "MET" : "MISSED", ratio32);
  std::printf("  load: %.2f / %.2f s (bf16), %.2f / %.2f s (fp32)\n", small.load_seconds,
              large.load_seconds, small32.load_seconds, large32.load_seconds);

  nlohmann::json out;
  out["bench"] = "vision";
  out["images_per_s_224"] = small.images_per_s;
  out["images_per_s_448"] = large.images_per_s;
  out["tower_flops_ratio"] = ratio;
  out["tower_flops_448"] = tower_flops;
  out["flops_per_image_224"] = small.flops_per_image;
  out["flops_per_image_448"] = large.flops_per_image;
  out["precision"] = "bf16";
  out["images_per_s_224_f32"] = small32.images_per_s;
  out["images_per_s_448_f32"] = large32.images_per_s;
  out["tower_flops_ratio_f32"] = ratio32;
  out["peak_flops"] = peak.flops;
  out["peak_loop"] = peak.name;
  std::vector<double> peak_rounds;
  for (const bench::PeakFlops& p : peaks) peak_rounds.push_back(p.flops);
  out["peak_flops_rounds"] = peak_rounds;
  out["threads"] = threads;
  out["images"] = images;
  out["goal_met"] = ratio >= kGoal;
  std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) { return ferry::Main(argc, argv); }
