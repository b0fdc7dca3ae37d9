#include "engine/backends/step_graph_book.h"

#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

using Action = StepGraphBook::Action;

void* Handle(int i) { return reinterpret_cast<void*>(static_cast<uintptr_t>(0x1000 + i)); }

TEST(StepGraphBookTest, RunThenRecordThenReplay) {
  StepGraphBook book(4);
  std::vector<void*> drop;
  void* recording = nullptr;
  EXPECT_EQ(book.Next(7, 0, &recording, &drop), Action::kRun);
  EXPECT_EQ(book.Next(7, 0, &recording, &drop), Action::kRecord);
  book.Recorded(7, Handle(1));
  for (int i = 0; i < 3; ++i) {
    recording = nullptr;
    EXPECT_EQ(book.Next(7, 0, &recording, &drop), Action::kReplay);
    EXPECT_EQ(recording, Handle(1));
  }
  EXPECT_TRUE(drop.empty());
  EXPECT_EQ(book.stats().run, 1);
  EXPECT_EQ(book.stats().recorded, 1);
  EXPECT_EQ(book.stats().replayed, 3);
  EXPECT_EQ(book.recordings(), 1u);
}

TEST(StepGraphBookTest, RemadeBuffersDropEveryRecording) {
  StepGraphBook book(4);
  std::vector<void*> drop;
  void* recording = nullptr;
  for (uint64_t key : {1, 2}) {
    book.Next(key, 0, &recording, &drop);
    ASSERT_EQ(book.Next(key, 0, &recording, &drop), Action::kRecord);
    book.Recorded(key, Handle(static_cast<int>(key)));
  }
  // Generation 1: both recordings go back, and key 1 starts over (run, record, replay).
  EXPECT_EQ(book.Next(1, 1, &recording, &drop), Action::kRun);
  EXPECT_EQ(drop.size(), 2u);
  EXPECT_EQ(book.stats().dropped, 2);
  EXPECT_EQ(book.Next(1, 1, &recording, &drop), Action::kRecord);
  book.Recorded(1, Handle(3));
  EXPECT_EQ(book.Next(1, 1, &recording, &drop), Action::kReplay);
  EXPECT_EQ(recording, Handle(3));
  EXPECT_EQ(book.Next(2, 1, &recording, &drop), Action::kRun);
}

TEST(StepGraphBookTest, TheLeastRecentlyUsedKeyIsForgotten) {
  StepGraphBook book(2);
  std::vector<void*> drop;
  void* recording = nullptr;
  for (uint64_t key : {1, 2}) {
    book.Next(key, 0, &recording, &drop);
    book.Next(key, 0, &recording, &drop);
    book.Recorded(key, Handle(static_cast<int>(key)));
  }
  EXPECT_EQ(book.Next(1, 0, &recording, &drop), Action::kReplay);  // 2 is now the oldest
  EXPECT_EQ(book.Next(3, 0, &recording, &drop), Action::kRun);
  ASSERT_EQ(drop.size(), 1u);
  EXPECT_EQ(drop[0], Handle(2));
  EXPECT_EQ(book.Next(1, 0, &recording, &drop), Action::kReplay);
  EXPECT_EQ(book.Next(2, 0, &recording, &drop), Action::kRun);  // forgotten: starts over
  EXPECT_EQ(book.recordings(), 1u);  // 3 (the oldest, no recording) was forgotten for 2
  book.Clear(&drop);
  EXPECT_EQ(drop, (std::vector<void*>{Handle(2), Handle(1)}));  // each handed back once
}

TEST(StepGraphBookTest, AFailedRecordingRunsAsItComesAndADroppedOneIsTriedAgain) {
  StepGraphBook book(4);
  std::vector<void*> drop;
  void* recording = nullptr;
  book.Next(5, 0, &recording, &drop);
  ASSERT_EQ(book.Next(5, 0, &recording, &drop), Action::kRecord);
  book.NotRecorded(5, /*failed=*/true);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(book.Next(5, 0, &recording, &drop), Action::kRun);
  EXPECT_EQ(book.stats().failed, 1);
  book.Next(6, 0, &recording, &drop);
  ASSERT_EQ(book.Next(6, 0, &recording, &drop), Action::kRecord);
  book.NotRecorded(6, /*failed=*/false);
  EXPECT_EQ(book.Next(6, 0, &recording, &drop), Action::kRecord);
  // An unanswered kRecord is asked again.
  EXPECT_EQ(book.Next(6, 0, &recording, &drop), Action::kRecord);
  EXPECT_TRUE(drop.empty());
}

}  // namespace
}  // namespace ferry
