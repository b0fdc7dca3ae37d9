// The C++ half of loader_errors_test.sh: loads each file of the table and checks the outcome.

#include <cstdio>
#include <string>
#include <vector>

#include "engine/gguf/gguf_file.h"
#include "engine/model/host_weights.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  struct Case {
    const char* file;
    const char* error;  // nullptr: must load
  };
  const std::vector<Case> cases = {
      {"good", nullptr},
      {"good_q8", nullptr},
      {"arch", "architecture 'gpt2' is not supported"},
      {"missing", "missing tensor model.layers.1.mlp.up_proj.weight"},
      {"unexpected", "unexpected tensor 'blk.0.attn_q.bias'"},
      {"shape", "tensor 'blk.0.attn_k.weight' has shape [17, 32], expected [16, 32]"},
      {"heads", "attention heads are not a multiple of 2 key/value heads"},
      {"q5_0_unsupported", "tensor type Q5_0 (6) is not supported"},
      {"truncated", "GGUF truncated"},
  };
  int failures = 0;
  for (const Case& c : cases) {
    const std::string path = dir + "/" + c.file + ".gguf";
    std::string error;
    auto gguf = ferry::GgufFile::Open(path);
    if (!gguf.ok()) {
      error = std::string(gguf.status().message());
    } else {
      auto weights = ferry::LoadGgufModel(**gguf, ferry::WeightDType::kF32);
      if (!weights.ok()) error = std::string(weights.status().message());
    }
    const bool ok = c.error == nullptr ? error.empty() : error.find(c.error) != std::string::npos;
    std::printf("%s %-16s %s\n", ok ? "ok  " : "FAIL", c.file,
                error.empty() ? "(loaded)" : error.c_str());
    failures += ok ? 0 : 1;
  }
  std::printf("%zu passed, %d failed\n", cases.size() - failures, failures);
  return failures == 0 ? 0 : 1;
}
