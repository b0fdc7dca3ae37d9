#include "engine/common/config.h"

#include <cstdio>
#include <fstream>

#include "gtest/gtest.h"

namespace ferry {
namespace {

constexpr char kDocument[] = R"json({
  // Comments are allowed: configs are written by people.
  "port": 8080,
  "name": "router-a",
  "verbose": true,
  "ratio": 0.8,
  "kvstore": {
    "capacity": "64GiB",
    "raw_capacity": 1048576,
    "retention": {"agent": "3d", "chat": "7d"}
  },
  "workers": [{"address": "127.0.0.1:5001"}, {"address": "127.0.0.1:5002"}],
  "tags": ["a", "b"]
})json";

TEST(ConfigTest, ReadsTypedValuesAndNestedObjects) {
  auto config = Config::Parse(kDocument, "ferry.json");
  ASSERT_TRUE(config.ok()) << config.status();
  int32_t port = 0;
  std::string name;
  bool verbose = false;
  double ratio = 0;
  std::vector<std::string> tags;
  ASSERT_TRUE(config->Read("port", &port).ok());
  ASSERT_TRUE(config->Read("name", &name).ok());
  ASSERT_TRUE(config->Read("verbose", &verbose).ok());
  ASSERT_TRUE(config->Read("ratio", &ratio).ok());
  ASSERT_TRUE(config->Read("tags", &tags).ok());
  EXPECT_EQ(port, 8080);
  EXPECT_EQ(name, "router-a");
  EXPECT_TRUE(verbose);
  EXPECT_DOUBLE_EQ(ratio, 0.8);
  EXPECT_EQ(tags, (std::vector<std::string>{"a", "b"}));

  auto store = config->Child("kvstore");
  ASSERT_TRUE(store.ok());
  EXPECT_EQ(store->path(), "kvstore");
  uint64_t capacity = 0, raw = 0;
  ASSERT_TRUE(store->ReadByteSize("capacity", &capacity).ok());
  ASSERT_TRUE(store->ReadByteSize("raw_capacity", &raw).ok());
  EXPECT_EQ(capacity, 64ull << 30);
  EXPECT_EQ(raw, 1048576u);
  auto retention = store->Child("retention");
  ASSERT_TRUE(retention.ok());
  EXPECT_EQ(retention->Keys(), (std::vector<std::string>{"agent", "chat"}));
  absl::Duration agent, chat;
  ASSERT_TRUE(retention->ReadDuration("agent", &agent).ok());
  ASSERT_TRUE(retention->ReadDuration("chat", &chat).ok());
  EXPECT_EQ(agent, absl::Hours(72));
  EXPECT_EQ(chat, absl::Hours(168));

  auto workers = config->Children("workers");
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->size(), 2u);
  std::string address;
  ASSERT_TRUE((*workers)[1].Read("address", &address).ok());
  EXPECT_EQ(address, "127.0.0.1:5002");
  ASSERT_TRUE((*workers)[0].Read("address", &address).ok());

  EXPECT_TRUE(config->CheckAllKeysUsed().ok()) << config->CheckAllKeysUsed();
}

TEST(ConfigTest, AbsentKeysKeepDefaults) {
  auto config = Config::Parse("{}", "empty.json");
  ASSERT_TRUE(config.ok());
  int64_t value = 42;
  EXPECT_TRUE(config->Read("missing", &value).ok());
  EXPECT_EQ(value, 42);
  auto child = config->Child("missing");
  ASSERT_TRUE(child.ok());
  EXPECT_TRUE(child->Read("deeper", &value).ok());
  EXPECT_EQ(value, 42);
  EXPECT_EQ(config->Require("missing").code(), absl::StatusCode::kNotFound);
  EXPECT_NE(config->Require("missing").message().find("empty.json: missing"),
            absl::string_view::npos);
  EXPECT_TRUE(Config().CheckAllKeysUsed().ok());
}

TEST(ConfigTest, WrongTypesAndRangesNameFileAndPath) {
  auto config = Config::Parse(
      R"({"a": {"port": "80", "big": 4294967296, "neg": -1, "size": "12 parsecs",
                "ttl": 30, "flag": 1, "list": [1]}})",
      "bad.json");
  ASSERT_TRUE(config.ok());
  Config a = *config->Child("a");
  int32_t port = 0;
  uint32_t big = 0;
  uint64_t neg = 0, size = 0;
  absl::Duration ttl;
  bool flag = false;
  std::vector<std::string> list;
  const absl::Status port_status = a.Read("port", &port);
  EXPECT_EQ(port_status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(port_status.message().find("bad.json: a.port: expected an integer"),
            absl::string_view::npos)
      << port_status;
  EXPECT_FALSE(a.Read("big", &big).ok());
  EXPECT_FALSE(a.Read("neg", &neg).ok());
  const absl::Status size_status = a.ReadByteSize("size", &size);
  EXPECT_NE(size_status.message().find("a.size"), absl::string_view::npos) << size_status;
  EXPECT_FALSE(a.ReadDuration("ttl", &ttl).ok());
  EXPECT_FALSE(a.Read("flag", &flag).ok());
  EXPECT_FALSE(a.Read("list", &list).ok());
  EXPECT_EQ(port, 0);
  EXPECT_FALSE(config->Child("a").value().Child("port").ok());
  EXPECT_FALSE(a.Children("port").ok());
}

TEST(ConfigTest, UnknownKeysAreReportedWithTheirPaths) {
  auto config = Config::Parse(
      R"({"port": 1, "prot": 2, "store": {"capacity": 1, "capacty": 2},
          "workers": [{"address": "x", "adress": "y"}]})",
      "typo.json");
  ASSERT_TRUE(config.ok());
  int32_t port;
  uint64_t capacity;
  std::string address;
  ASSERT_TRUE(config->Read("port", &port).ok());
  ASSERT_TRUE(config->Child("store")->ReadByteSize("capacity", &capacity).ok());
  ASSERT_TRUE((*config->Children("workers"))[0].Read("address", &address).ok());
  const absl::Status status = config->CheckAllKeysUsed();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "typo.json: unknown keys: prot, store.capacty, workers[0].adress");
}

TEST(ConfigTest, ParseErrors) {
  EXPECT_EQ(Config::Parse("{", "x.json").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Config::Parse("{", "x.json").status().message().find("x.json: not valid JSON"),
            absl::string_view::npos);
  EXPECT_FALSE(Config::Parse("[1, 2]", "x.json").ok());
  EXPECT_FALSE(Config::Parse("", "x.json").ok());
  EXPECT_FALSE(Config::Parse("{\"a\": 1} trailing", "x.json").ok());
}

TEST(ConfigTest, LoadFile) {
  const std::string path = ::testing::TempDir() + "/config_test.json";
  {
    std::ofstream out(path);
    out << R"({"port": 9000})";
  }
  auto config = Config::LoadFile(path);
  ASSERT_TRUE(config.ok()) << config.status();
  int32_t port = 0;
  ASSERT_TRUE(config->Read("port", &port).ok());
  EXPECT_EQ(port, 9000);
  std::remove(path.c_str());
  const absl::Status missing = Config::LoadFile(path).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.message().find(path), absl::string_view::npos);
}

}  // namespace
}  // namespace ferry
