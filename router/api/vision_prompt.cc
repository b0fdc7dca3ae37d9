#include "router/api/vision_prompt.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/common/status.h"
#include "engine/model/vision/vision_config.h"
#include "nlohmann/json.hpp"

namespace ferry {

absl::StatusOr<std::optional<VisionPromptSetup>> ReadVisionPromptSetup(const std::string& model,
                                                                       const Tokenizer& tokenizer) {
  struct stat st;
  if (stat(model.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return std::nullopt;
  const std::string path = model + "/config.json";
  std::ifstream in(path);
  if (!in) return std::nullopt;  // a tokenizer-only directory: no model config, no vision
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json config = nlohmann::json::parse(text.str(), nullptr, false);
  if (!config.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not JSON"));
  if (!config.contains("vision_config")) return std::nullopt;
  ASSIGN_OR_RETURN(const VisionConfig vision, ParseVisionConfig(config, path));
  VisionPromptSetup setup;
  setup.image_token = static_cast<TokenId>(vision.image_token_index);
  setup.tokens_per_image = vision.num_image_tokens();
  if (config.contains("image_seq_length") && config["image_seq_length"].is_number_integer() &&
      config["image_seq_length"].get<int64_t>() != setup.tokens_per_image) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": image_seq_length ", config["image_seq_length"].get<int64_t>(),
                     " is not the tower's ", setup.tokens_per_image,
                     " tokens per image (its patches, and the CLS token for the \"full\" "
                     "vision_feature_select_strategy)"));
  }
  if (vision.image_token_index < 0 ||
      vision.image_token_index >= static_cast<int64_t>(tokenizer.vocab_size()) ||
      !tokenizer.IsSpecial(setup.image_token)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": image_token_index ", vision.image_token_index,
                     " is not a special token of the model's tokenizer"));
  }
  return setup;
}

}  // namespace ferry
