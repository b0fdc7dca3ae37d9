// Fuzz target for the load tool's reader of a server's SSE stream (untrusted bytes): the input,
// after one byte that picks a cut size, is read whole and in pieces of that size. Never a crash,
// and the same result however the bytes are split: output events, usage, text, [DONE], error.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "tools/load/openai_stream.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t cut = 1 + data[0] % 17;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  ferry::OpenAiStreamReader whole(/*keep_text=*/true), pieces(/*keep_text=*/true);
  const int events = whole.Feed(bytes);
  int piece_events = 0;
  for (size_t at = 0; at < bytes.size(); at += cut) {
    piece_events += pieces.Feed(absl::string_view(bytes).substr(at, cut));
  }
  Check(events == piece_events);
  Check(events == whole.token_events());
  Check(whole.done() == pieces.done());
  Check(whole.has_usage() == pieces.has_usage());
  Check(whole.prompt_tokens() == pieces.prompt_tokens());
  Check(whole.completion_tokens() == pieces.completion_tokens());
  Check(whole.cached_tokens() == pieces.cached_tokens());
  Check(whole.text() == pieces.text());
  Check(whole.error() == pieces.error());
  return 0;
}
