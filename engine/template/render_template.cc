// render_template CASES.json: renders test cases with Ferry's chat template engine, for the
// comparison with HF transformers (tools/python/chat_template_reference.py). CASES.json is
// {"template": "...", "cases": [{"messages": [...], "tools": ..., "add_generation_prompt": b,
// "bos_token": "...", "eos_token": "...", "extra": {...}}, ...]}. Prints a JSON array of
// {"ok": true, "text": "...", "user": [[begin, end], ...]} or {"ok": false, "error": "..."}.

#include <fstream>
#include <iostream>
#include <sstream>

#include "engine/template/chat_template.h"
#include "nlohmann/json.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: render_template CASES.json\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::ordered_json doc = nlohmann::ordered_json::parse(text.str());
  nlohmann::json out = nlohmann::json::array();
  auto parsed = ferry::ChatTemplate::Parse(doc.at("template").get<std::string>());
  for (const nlohmann::ordered_json& c : doc.at("cases")) {
    if (!parsed.ok()) {
      out.push_back({{"ok", false}, {"error", std::string(parsed.status().message())}});
      continue;
    }
    ferry::ChatTemplateInputs inputs;
    inputs.messages = c.at("messages");
    inputs.tools = c.contains("tools") ? c["tools"] : nlohmann::ordered_json();
    inputs.add_generation_prompt =
        c.contains("add_generation_prompt") && c["add_generation_prompt"].get<bool>();
    inputs.bos_token = c.contains("bos_token") ? c["bos_token"].get<std::string>() : "";
    inputs.eos_token = c.contains("eos_token") ? c["eos_token"].get<std::string>() : "";
    inputs.extra = c.contains("extra") ? c["extra"] : nlohmann::ordered_json::object();
    auto prompt = (*parsed)->Apply(inputs);
    if (!prompt.ok()) {
      out.push_back({{"ok", false}, {"error", std::string(prompt.status().message())}});
      continue;
    }
    nlohmann::json user = nlohmann::json::array();
    for (const ferry::PromptSpan& s : prompt->spans) {
      if (s.user) user.push_back({s.begin, s.end});
    }
    out.push_back({{"ok", true}, {"text", prompt->text}, {"user", user}});
  }
  std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return 0;
}
