// A Jinja-subset template engine for chat templates: the syntax real models' templates use
// (if/elif/else, for with loop variables and else, set and namespace, macros, break/continue,
// whitespace control, filters, tests, string/dict methods, raise_exception), rendered with the
// semantics of jinja2 as HF's apply_chat_template configures it: an immutable sandbox with
// trim_blocks, lstrip_blocks and loop controls, and HF's tojson (ensure_ascii=False).
//
// Bounded: rendering stops with a Status after a number of evaluation steps, an output size or a
// call depth (a runaway loop or recursion can never hang a router). Errors name the template line.
//
// A parsed Template is immutable and thread-safe; Render may run concurrently.

#ifndef FERRY_ENGINE_TEMPLATE_TEMPLATE_H_
#define FERRY_ENGINE_TEMPLATE_TEMPLATE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/template/value.h"

namespace ferry::jinja {

struct RenderLimits {
  int64_t max_steps = 20'000'000;
  size_t max_output_bytes = 16 << 20;
  int max_call_depth = 64;
};

// The rendered text and which bytes of it came from user strings.
struct Rendered {
  std::string text;
  std::vector<UserSpan> user_spans;
};

struct Node;

class Template {
 public:
  static absl::StatusOr<std::unique_ptr<Template>> Parse(absl::string_view source);
  ~Template();

  absl::StatusOr<Rendered> Render(const std::map<std::string, Value>& context,
                                  const RenderLimits& limits = {}) const;

 private:
  Template() = default;
  std::string source_;
  std::unique_ptr<Node> root_;
};

}  // namespace ferry::jinja

#endif  // FERRY_ENGINE_TEMPLATE_TEMPLATE_H_
