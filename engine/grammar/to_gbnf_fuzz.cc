// Fuzz target for the constraint compilers: byte 0 even -> the rest is a JSON Schema text,
// odd -> a regex. Every input must compile or be refused with a Status (no crash, no hang:
// the limits bound the work), and a compiled grammar must respect max_grammar_bytes.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "engine/grammar/json_schema.h"
#include "engine/grammar/regex_to_gbnf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    ferry::grammar::JsonSchemaOptions options;
    options.max_grammar_bytes = 1 << 20;
    auto g = ferry::grammar::JsonSchemaTextToGbnf(text, options);
    if (g.ok() && g->size() > options.max_grammar_bytes) std::abort();
  } else {
    auto g = ferry::grammar::RegexToGbnf(text);
    (void)g;
  }
  return 0;
}
