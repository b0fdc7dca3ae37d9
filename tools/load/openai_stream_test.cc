#include "tools/load/openai_stream.h"

#include <string>

#include "gtest/gtest.h"

namespace ferry {
namespace {

constexpr char kCompletion[] =
    "data: {\"id\":\"c\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"He\","
    "\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n"
    "data: {\"id\":\"c\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"llo\","
    "\"logprobs\":null,\"finish_reason\":\"length\"}],\"usage\":null}\n\n"
    "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":2,"
    "\"total_tokens\":14,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n"
    "data: [DONE]\n\n";

TEST(OpenAiStreamReaderTest, CountsOutputEventsAndReadsTheUsage) {
  OpenAiStreamReader reader(/*keep_text=*/true);
  EXPECT_EQ(reader.Feed(kCompletion), 2);
  EXPECT_TRUE(reader.done());
  EXPECT_TRUE(reader.has_usage());
  EXPECT_EQ(reader.prompt_tokens(), 12);
  EXPECT_EQ(reader.completion_tokens(), 2);
  EXPECT_EQ(reader.cached_tokens(), 8);
  EXPECT_EQ(reader.token_events(), 2);
  EXPECT_EQ(reader.text(), "Hello");
  EXPECT_TRUE(reader.error().empty());
}

TEST(OpenAiStreamReaderTest, EventsSplitAnywhereAndCrLfReadTheSame) {
  std::string crlf;
  for (char c : std::string(kCompletion)) {
    if (c == '\n') crlf += '\r';
    crlf += c;
  }
  for (const std::string& text : {std::string(kCompletion), crlf}) {
    for (size_t cut = 1; cut < text.size(); cut += 7) {
      OpenAiStreamReader reader(true);
      int events = 0;
      for (size_t at = 0; at < text.size(); at += cut) events += reader.Feed(text.substr(at, cut));
      EXPECT_EQ(events, 2) << cut;
      EXPECT_EQ(reader.text(), "Hello");
      EXPECT_EQ(reader.cached_tokens(), 8);
      EXPECT_TRUE(reader.done());
    }
  }
}

TEST(OpenAiStreamReaderTest, ChatRoleAndFinishChunksCarryNoOutput) {
  OpenAiStreamReader reader;
  EXPECT_EQ(reader.Feed("data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"
                        "\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"),
            0);
  EXPECT_EQ(reader.Feed("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n"
                        ": a comment\n\n"
                        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":"
                        "\"stop\"}]}\n\n"),
            1);
  EXPECT_EQ(reader.text(), "");  // not kept
  EXPECT_FALSE(reader.done());
  EXPECT_FALSE(reader.has_usage());
}

TEST(OpenAiStreamReaderTest, ErrorEventsAndGarbageAreErrors) {
  OpenAiStreamReader reader;
  reader.Feed("data: {\"error\":{\"message\":\"worker lost\",\"type\":\"server_error\"}}\n\n");
  EXPECT_EQ(reader.error(), "worker lost");
  OpenAiStreamReader garbage;
  garbage.Feed("data: {not json\n\n");
  EXPECT_NE(garbage.error().find("not a JSON object"), std::string::npos);
}

}  // namespace
}  // namespace ferry
