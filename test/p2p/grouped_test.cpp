// Grouped receives (lib/p2p/group.hpp): an irecv of 2-8 buffers takes each message into the
// buffer its tag names, whatever order the sends come in (in order, reversed, shuffled, equal
// tags filling their buffers in send order), eager and rendezvous messages mixed, with the
// receiver posting before the sends and after them (messages sent ahead on credits); a message
// no free buffer's tag takes, or one larger than the buffer its tag selects, fails on both sides
// with nothing written, and the communicator goes on.
#include <algorithm>
#include <array>
#include <numeric>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "support/p2p_pair.hpp"
#include "support/pattern.hpp"

namespace loom::test {
namespace {

constexpr std::size_t kSlot = 320 * 1024;  // each buffer's room in the slab
constexpr std::size_t kMaxGroup = 8;

enum class Order : std::uint8_t { kInOrder, kReversed, kShuffled, kEqualTags };

// One grouped receive and the sends that fill it: buffer i has tags[i] and room[i] bytes; send
// k carries message sizes[send_to[k]] bytes with tag tags[send_to[k]], and must land in buffer
// send_to[k] (for equal tags: the k-th send of a tag fills that tag's k-th buffer).
struct Round {
  std::vector<Tag> tags;
  std::vector<std::size_t> room;
  std::vector<std::size_t> sizes;    // by buffer
  std::vector<std::size_t> send_to;  // by send
  bool receiver_first = true;
  std::uint64_t seed = 0;
};

std::uint64_t seed_of(const Round& round, std::size_t buffer) {
  return round.seed * 16 + buffer;
}

// Where the rule puts each send, written out again here: the first free buffer with its tag.
std::vector<std::size_t> destinations(const std::vector<Tag>& tags,
                                      const std::vector<Tag>& send_tags) {
  std::vector<bool> taken(tags.size());
  std::vector<std::size_t> to;
  for (Tag tag : send_tags) {
    std::size_t i = 0;
    while (i < tags.size() && (taken[i] || tags[i] != tag)) ++i;
    REQUIRE(i < tags.size());
    taken[i] = true;
    to.push_back(i);
  }
  return to;
}

std::vector<Round> plan() {
  std::mt19937_64 rng(20261126);
  const std::size_t choices[] = {0, 1, 777, 4000, 4096, 9000, 16384, 70000, 300000};
  std::vector<Round> rounds;
  for (std::size_t n = 2; n <= kMaxGroup; ++n) {
    for (Order order : {Order::kInOrder, Order::kReversed, Order::kShuffled, Order::kEqualTags}) {
      for (bool receiver_first : {true, false}) {
        Round round;
        round.receiver_first = receiver_first;
        round.seed = rounds.size() + 1;
        for (std::size_t i = 0; i < n; ++i) {
          // Equal tags: two or three tags over the group; else distinct, not in buffer order.
          round.tags.push_back(order == Order::kEqualTags ? Tag(1000 + rng() % 2 + i % 2)
                                                          : Tag(1000 + (i * 7 + n) % 31 + 31 * i));
          round.sizes.push_back(choices[rng() % std::size(choices)]);
          round.room.push_back(round.sizes.back() + (rng() % 2 == 0 ? rng() % 3000 : 0));
        }
        std::vector<std::size_t> sends(n);  // which buffer's message each send is, by tag rank
        std::iota(sends.begin(), sends.end(), 0);
        if (order == Order::kReversed) std::reverse(sends.begin(), sends.end());
        if (order == Order::kShuffled || order == Order::kEqualTags) {
          std::shuffle(sends.begin(), sends.end(), rng);
        }
        std::vector<Tag> send_tags;
        for (std::size_t buffer : sends) send_tags.push_back(round.tags[buffer]);
        round.send_to = destinations(round.tags, send_tags);
        // With equal tags the rule decides which buffer a send fills: its size is that one's.
        rounds.push_back(round);
      }
    }
  }
  return rounds;
}

void check_round(const Round& round, const std::byte* slab, const std::size_t* sizes) {
  for (std::size_t i = 0; i < round.tags.size(); ++i) {
    require(sizes[i] == round.sizes[i], "round " + std::to_string(round.seed) + " buffer " +
                                            std::to_string(i) + ": " + std::to_string(sizes[i]) +
                                            " bytes, expected " + std::to_string(round.sizes[i]));
    const std::string wrong = check_pattern({slab + i * kSlot, round.sizes[i]}, seed_of(round, i));
    require(wrong.empty(), "round " + std::to_string(round.seed) + " buffer " + std::to_string(i) +
                               " (tag " + std::to_string(round.tags[i]) + "): " + wrong);
  }
}

TEST_CASE("p2p grouped receives take their sends by tag in any order", "[grouped]") {
  const std::vector<Round> rounds = plan();
  auto receiver = [&](Channel& channel) {
    Context context(test_config());
    Listener listener = context.listen();
    send_handle(channel, listener.handle());
    auto in = accept_one(listener);
    std::vector<std::byte> slab(kMaxGroup * kSlot);
    const CloseOnUnwind guard{in.get()};
    MemoryRegion region = in->register_memory(slab.data(), slab.size());
    for (const Round& round : rounds) {
      std::fill(slab.begin(), slab.end(), std::byte{0});
      std::vector<RecvBuffer> buffers;
      for (std::size_t i = 0; i < round.tags.size(); ++i) {
        buffers.push_back({slab.data() + i * kSlot, round.room[i], round.tags[i], region});
      }
      if (!round.receiver_first) channel.recv_value<int>();  // the sends are posted
      Request request;
      require(post_into(in->irecv(buffers), request) == Status::kOk, in->last_error());
      if (round.receiver_first) channel.send_value(1);
      std::array<std::size_t, kMaxGroup> sizes{};
      bool done = false;
      Status status = Status::kOk;
      poll_until([&] { return done || status != Status::kOk; },
                 [&] {
                   status = test_once(*in, request, done, {sizes.data(), round.tags.size()});
                 },
                 "grouped receive", 60s);
      require(status == Status::kOk && done, "round " + std::to_string(round.seed) + ": " +
                                                 std::string(to_string(status)) + ": " +
                                                 in->last_error());
      check_round(round, slab.data(), sizes.data());
    }
    channel.barrier();
  };
  auto sender = [&](Channel& channel) {
    Context context(test_config());
    auto out = connect_one(context, recv_handle(channel));
    std::vector<std::byte> slab(kMaxGroup * kSlot);
    const CloseOnUnwind guard{out.get()};
    MemoryRegion region = out->register_memory(slab.data(), slab.size());
    for (const Round& round : rounds) {
      for (std::size_t i = 0; i < round.tags.size(); ++i) {
        fill_pattern({slab.data() + i * kSlot, round.sizes[i]}, seed_of(round, i));
      }
      if (round.receiver_first) channel.recv_value<int>();
      std::vector<Request> sends;
      for (std::size_t buffer : round.send_to) {
        Request r;
        require(post_into(out->isend(slab.data() + buffer * kSlot, round.sizes[buffer],
                                     round.tags[buffer], region),
                          r) == Status::kOk,
                out->last_error());
        sends.push_back(r);
      }
      if (!round.receiver_first) channel.send_value(1);
      for (Request r : sends) finish(*out, r);
    }
    channel.barrier();
  };
  const std::string failure = run_pair(receiver, sender);
  INFO(failure);
  REQUIRE(failure.empty());
}

// Buffers {100: 1000 B, 101: 50000 B, 102: 5000 B}. Sends, in this order: tag 101 (fits),
// tag 555 (no buffer has it: takes buffer 0, the first free, and fails there), tag 102 with
// 6000 bytes (larger than its buffer: fails). Both sides report each failure; the buffers of
// failed messages stay untouched; a grouped receive after them works.
void refusals(bool receiver_first) {
  constexpr std::size_t kRoom[] = {1000, 50000, 5000};
  constexpr Tag kTags[] = {100, 101, 102};
  auto receiver = [&](Channel& channel) {
    Context context(test_config());
    Listener listener = context.listen();
    send_handle(channel, listener.handle());
    auto in = accept_one(listener);
    std::vector<std::byte> slab(3 * kSlot);
    const CloseOnUnwind guard{in.get()};
    MemoryRegion region = in->register_memory(slab.data(), slab.size());
    std::vector<RecvBuffer> buffers;
    for (std::size_t i = 0; i < 3; ++i) {
      buffers.push_back({slab.data() + i * kSlot, kRoom[i], kTags[i], region});
    }
    if (!receiver_first) channel.recv_value<int>();
    Request request;
    require(post_into(in->irecv(buffers), request) == Status::kOk, in->last_error());
    if (receiver_first) channel.send_value(1);
    std::array<std::size_t, 3> sizes{};
    bool done = false;
    Status status = Status::kOk;
    poll_until([&] { return done || status != Status::kOk; },
               [&] { status = test_once(*in, request, done, sizes); }, "grouped receive", 60s);
    require(status == Status::kInvalid || status == Status::kTruncated,
            "expected a wrong-tag or truncation failure, got " + std::string(to_string(status)) +
                ": " + in->last_error());
    for (std::size_t i : {0u, 2u}) {
      require(std::all_of(slab.begin() + i * kSlot, slab.begin() + i * kSlot + kRoom[i],
                          [](std::byte b) { return b == std::byte{0}; }),
              "buffer " + std::to_string(i) + " of a failed message was written");
    }
    const std::string wrong = check_pattern({slab.data() + kSlot, 40000}, 11);
    require(wrong.empty(), "buffer 1: " + wrong);
    // The communicator goes on: the next grouped receive, sends reversed.
    channel.send_value(2);
    buffers.resize(2);
    buffers[0] = {slab.data(), 3000, 7, region};
    buffers[1] = {slab.data() + kSlot, 90000, 8, region};
    require(post_into(in->irecv(buffers), request) == Status::kOk, in->last_error());
    done = false;
    status = Status::kOk;
    poll_until([&] { return done || status != Status::kOk; },
               [&] {
                 status = test_once(*in, request, done, {sizes.data(), 2});
               },
               "next receive");
    require(status == Status::kOk, in->last_error());
    require(sizes[0] == 3000 && sizes[1] == 90000, "next receive: wrong sizes");
    require(check_pattern({slab.data(), 3000}, 21).empty(), "next receive: buffer 0");
    require(check_pattern({slab.data() + kSlot, 90000}, 22).empty(), "next receive: buffer 1");
    channel.barrier();
  };
  auto sender = [&](Channel& channel) {
    Context context(test_config());
    auto out = connect_one(context, recv_handle(channel));
    std::vector<std::byte> slab(3 * kSlot);
    const CloseOnUnwind guard{out.get()};
    fill_pattern({slab.data(), 6000}, 13);
    fill_pattern({slab.data() + kSlot, 40000}, 11);
    fill_pattern({slab.data() + 2 * kSlot, 600}, 12);
    MemoryRegion region = out->register_memory(slab.data(), slab.size());
    if (receiver_first) channel.recv_value<int>();
    Request fits;
    Request wrong_tag;
    Request too_large;
    require(post_into(out->isend(slab.data() + kSlot, 40000, 101, region), fits) == Status::kOk,
            out->last_error());
    require(
        post_into(out->isend(slab.data() + 2 * kSlot, 600, 555, region), wrong_tag) == Status::kOk,
        out->last_error());
    require(post_into(out->isend(slab.data(), 6000, 102, region), too_large) == Status::kOk,
            out->last_error());
    if (!receiver_first) channel.send_value(1);
    finish(*out, fits);
    finish(*out, wrong_tag, Status::kInvalid);
    require(out->last_error().find("tag 555") != std::string::npos,
            "wrong-tag error does not name the tag: " + out->last_error());
    finish(*out, too_large, Status::kTruncated);
    require(channel.recv_value<int>() == 2, "receiver out of step");
    fill_pattern({slab.data(), 3000}, 21);
    fill_pattern({slab.data() + kSlot, 90000}, 22);
    Request second;
    Request first;
    require(post_into(out->isend(slab.data() + kSlot, 90000, 8, region), second) == Status::kOk,
            out->last_error());
    require(post_into(out->isend(slab.data(), 3000, 7, region), first) == Status::kOk,
            out->last_error());
    finish(*out, second);
    finish(*out, first);
    channel.barrier();
  };
  const std::string failure = run_pair(receiver, sender);
  INFO(failure);
  REQUIRE(failure.empty());
}

TEST_CASE("p2p a grouped receive refuses what no free buffer of it takes, on both sides",
          "[grouped]") {
  SECTION("receiver posts first") {
    refusals(true);
  }
  SECTION("sends first") {
    refusals(false);
  }
}

}  // namespace
}  // namespace loom::test
