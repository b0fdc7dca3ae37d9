// The default model (SmolLM2-135M-Instruct, the GGUF at $FERRY_MODEL_GGUF) for engine tests that
// run it: its bf16 weights on the CPU backend and its tokenizer, loaded once per test process
// and shared by its tests (never freed). Without the file the process exits with a message
// saying how to run it ('./ferry test' sets the variable).

#ifndef FERRY_ENGINE_SMOLLM2_TEST_MODEL_H_
#define FERRY_ENGINE_SMOLLM2_TEST_MODEL_H_

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/common/log.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/host_weights.h"
#include "engine/model/transformer.h"
#include "engine/tokenizer/tokenizer.h"

namespace ferry {

struct SmolLm2TestModel {
  std::unique_ptr<CpuBackend> backend;
  std::unique_ptr<Transformer> model;
  std::unique_ptr<Tokenizer> tokenizer;
};

inline SmolLm2TestModel& SharedSmolLm2() {
  static SmolLm2TestModel* shared = [] {
    const char* path = std::getenv("FERRY_MODEL_GGUF");
    if (path == nullptr || !std::ifstream(path).good()) {
      std::fprintf(stderr,
                   "FERRY_MODEL_GGUF is not set to an existing file; run through './ferry test'\n");
      std::exit(1);
    }
    auto* s = new SmolLm2TestModel;
    s->backend = *CpuBackend::Create();
    auto gguf = GgufFile::Open(path);
    CHECK(gguf.ok()) << gguf.status();
    auto host = LoadGgufModel(**gguf, WeightDType::kBF16, "bf16");
    CHECK(host.ok()) << host.status();
    s->model = *Transformer::Create(*host, s->backend.get());
    s->tokenizer = *Tokenizer::FromGguf(**gguf);
    return s;
  }();
  return *shared;
}

}  // namespace ferry

#endif  // FERRY_ENGINE_SMOLLM2_TEST_MODEL_H_
