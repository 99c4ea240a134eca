// The step trace's file: what record_step_to_file writes is what bench/scripts/step_trace.py
// reads (8-byte entries, nanoseconds << 8 | step, ended by an empty entry or the file's end).
#include "util/step_trace.hpp"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

namespace {

using loom::util::Step;

std::vector<std::uint64_t> read_entries(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<std::uint64_t> entries;
  std::uint64_t entry = 0;
  while (in.read(reinterpret_cast<char*>(&entry), sizeof entry)) entries.push_back(entry);
  return entries;
}

}  // namespace

TEST_CASE("step trace: a thread's steps land in its own file, in order, with rising times",
          "[step-trace]") {
  const Step pattern[] = {Step::kIsendBegin, Step::kSendBegin, Step::kSendEnd,     Step::kIsendEnd,
                          Step::kTestBegin,  Step::kCqEntries, Step::kTestFinished};
  constexpr int kRounds = 300;
  std::string paths[2];
  // Two threads at once: each its own file, its own steps (the second records in reverse).
  std::thread threads[2];
  for (int t = 0; t < 2; ++t) {
    threads[t] = std::thread([&, t] {
      paths[t] = loom::util::step_file_path();
      for (int round = 0; round < kRounds; ++round) {
        for (std::size_t i = 0; i < std::size(pattern); ++i) {
          loom::util::record_step_to_file(pattern[t == 0 ? i : std::size(pattern) - 1 - i]);
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  REQUIRE(paths[0] != paths[1]);
  for (int t = 0; t < 2; ++t) {
    INFO(paths[t]);
    const auto entries = read_entries(paths[t]);
    REQUIRE(entries.size() == loom::util::kStepTraceEntries);
    const std::size_t recorded = kRounds * std::size(pattern);
    CHECK(entries[recorded] == 0);
    std::uint64_t last_ns = 0;
    for (std::size_t k = 0; k < recorded; ++k) {
      const std::size_t i = k % std::size(pattern);
      const Step expected = pattern[t == 0 ? i : std::size(pattern) - 1 - i];
      REQUIRE((entries[k] & 0xFF) == static_cast<std::uint64_t>(expected));
      REQUIRE((entries[k] >> 8) >= last_ns);
      last_ns = entries[k] >> 8;
    }
    std::filesystem::remove(paths[t]);
  }
}

TEST_CASE("step trace: a full file keeps its entries and takes no more", "[step-trace]") {
  std::string path;
  std::thread([&] {
    path = loom::util::step_file_path();
    for (std::size_t k = 0; k < loom::util::kStepTraceEntries + 1000; ++k) {
      loom::util::record_step_to_file(k < loom::util::kStepTraceEntries ? Step::kIrecvBegin
                                                                        : Step::kControlIn);
    }
  }).join();
  const auto entries = read_entries(path);
  REQUIRE(entries.size() == loom::util::kStepTraceEntries);
  CHECK((entries.back() & 0xFF) == static_cast<std::uint64_t>(Step::kIrecvBegin));
  std::filesystem::remove(path);
}
