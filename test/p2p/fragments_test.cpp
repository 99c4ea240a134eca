// Eager fragments (lib/p2p/eager.cpp): a message up to LOOM_EAGER_FRAGMENTS eager sizes goes
// ahead as that many eager messages of one sequence number, each on a credit, with no
// clear-to-send; the receiver places each by its index, judges the whole (the verdict is its
// alone, as for any message sent ahead) and copies only a message that fits. Every case runs on
// each provider with 4 KiB eager buffers and four fragments (shm's own choice; set here for
// tcp;ofi_rxm and epmr too), on 64 credits so that every message can go ahead.
#include <csignal>
#include <cstdio>
#include <functional>
#include <thread>

#include <catch2/catch.hpp>

#include "support/p2p_pair.hpp"

namespace loom::test {
namespace {

constexpr std::size_t kEager = 4096;
constexpr std::size_t kSlot = 4 * kEager;

Config fragments_config() {
  Config config = test_config(1);
  config.eager_max = kEager;
  config.eager_fragments = 4;
  config.eager_credits = 64;
  return config;
}

std::uint64_t seed_of(std::size_t message) {
  return 31000 + message * 11;
}

// The first message of a connection: its receive is announced (no credit is out yet), and the
// credits come with the announcement.
void send_first(SendComm& out, std::vector<std::byte>& buffer, const MemoryRegion& region) {
  fill_pattern({buffer.data(), 64}, seed_of(999));
  Request request;
  require(post_into(out.isend(buffer.data(), 64, 1, region), request) == Status::kOk,
          out.last_error());
  finish(out, request);
}
void receive_first(RecvComm& in, std::vector<std::byte>& buffer, const MemoryRegion& region) {
  RecvBuffer first{buffer.data(), kSlot, 1, region};
  Request request;
  require(post_into(in.irecv({&first, 1}), request) == Status::kOk, in.last_error());
  require(finish(in, request) == 64, "first message");
}

// A test's receiving end: its context, communicator and a registered buffer of `bytes`, past
// the connection's first message (which brings the credits).
struct Receiving {
  Receiving(Channel& channel, std::size_t bytes, const Config& config = fragments_config())
      : context(config), listener(context.listen()), buffer(bytes) {
    send_handle(channel, listener.handle());
    in = accept_one(listener);
    region = in->register_memory(buffer.data(), buffer.size());
    receive_first(*in, buffer, region);
  }
  // The case is over at both ends: they meet, then the buffer's registration goes.
  void part(Channel& channel) {
    channel.barrier();
    in->deregister(region);
  }
  Context context;
  Listener listener;
  std::vector<std::byte> buffer;
  std::unique_ptr<RecvComm> in;
  MemoryRegion region;
};

// The sending end, likewise.
struct Sending {
  Sending(Channel& channel, std::size_t bytes, const Config& config = fragments_config())
      : context(config), buffer(bytes) {
    out = connect_one(context, recv_handle(channel));
    region = out->register_memory(buffer.data(), buffer.size());
    send_first(*out, buffer, region);
  }
  void part(Channel& channel) {
    channel.barrier();
    out->deregister(region);
  }
  Context context;
  std::vector<std::byte> buffer;
  std::unique_ptr<SendComm> out;
  MemoryRegion region;
};

// Sends message k of `sizes` from slot k of the side's buffer, with tag tags(k) and its own
// pattern (seed(k)), all at once, and waits for them all: sent ahead, each is done once it left.
template <typename TagOf, typename SeedOf>
void send_window(Sending& side, const std::vector<std::size_t>& sizes, TagOf tag_of,
                 SeedOf seed_of_message) {
  std::vector<Request> requests;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    std::span<std::byte> slot{side.buffer.data() + k * kSlot, sizes[k]};
    fill_pattern(slot, seed_of_message(k));
    Request request;
    require(post_into(side.out->isend(slot.data(), slot.size(), tag_of(k), side.region), request) ==
                Status::kOk,
            side.out->last_error());
    requests.push_back(request);
  }
  for (const Request& request : requests) finish(*side.out, request);
}

// Runs the two ends, the receiver in this process; fails the case with what went wrong.
void require_pair(const std::function<void(Channel&)>& receiver,
                  const std::function<void(Channel&)>& sender) {
  const std::string failure = run_pair(receiver, sender);
  INFO(failure);
  REQUIRE(failure.empty());
}

struct Message {
  std::size_t size;
  std::size_t buffer;
  Tag tag;         // the send's
  Tag buffer_tag;  // the receive's
  Status outcome;  // the receive's
  bool post_first;
};

// Sizes across the fragment boundaries, posted before and after the message came; the last ones
// meet a buffer that is too small (surely, or only once the last fragment tells the size) or
// has another tag, and each is followed by one that fits, whose bytes must be its own.
const std::vector<Message>& messages() {
  static const std::vector<Message> list = {
      {4097, kSlot, 7, 7, Status::kOk, true},
      {5000, kSlot, 7, 7, Status::kOk, false},
      {8192, 8192, 7, 7, Status::kOk, true},
      {8193, kSlot, 7, 7, Status::kOk, false},
      {12287, 12287, 7, 7, Status::kOk, false},
      {12288, kSlot, 7, 7, Status::kOk, true},
      {16000, kSlot, 7, 7, Status::kOk, false},
      {16384, kSlot, 7, 7, Status::kOk, true},
      {12289, 12290, 7, 7, Status::kOk, true},          // may not fit until the last fragment says
      {16384, 12290, 7, 7, Status::kTruncated, true},   // held, then dropped
      {16384, 12290, 7, 7, Status::kTruncated, false},  // held before the receive, too
      {16384, 8192, 7, 7, Status::kTruncated, true},    // surely too large: none copied
      {12300, 12290, 7, 7, Status::kTruncated, false},
      {9000, kSlot, 8, 7, Status::kInvalid, true},  // another tag
      {4096, kSlot, 7, 7, Status::kOk, true},       // one buffer: no fragments
      {16384, kSlot, 7, 7, Status::kOk, false},
  };
  return list;
}

std::size_t fragmented_count(bool delivered_only) {
  std::size_t n = 0;
  for (const Message& m : messages()) {
    if (m.size > kEager && (!delivered_only || m.outcome == Status::kOk)) ++n;
  }
  return n;
}

TEST_CASE("p2p messages of several eager buffers go ahead in fragments, each in its place",
          "[fragments]") {
  auto receiver = [](Channel& channel) {
    Receiving side(channel, kSlot);
    const CloseOnUnwind guard{side.in.get()};
    RecvComm* in = side.in.get();
    std::vector<std::byte>& buffer = side.buffer;
    const MemoryRegion& region = side.region;
    for (std::size_t i = 0; i < messages().size(); ++i) {
      const Message& m = messages()[i];
      const std::string what = "message " + std::to_string(i) + " (" + std::to_string(m.size) +
                               " bytes into " + std::to_string(m.buffer) + ")";
      std::fill(buffer.begin(), buffer.end(), std::byte{0});
      if (!m.post_first) require(channel.recv_value<int>() == 1, what + ": sender out of step");
      RecvBuffer target{buffer.data(), m.buffer, m.buffer_tag, region};
      Request request;
      require(post_into(in->irecv({&target, 1}), request) == Status::kOk, in->last_error());
      if (m.post_first) channel.send_value(1);
      const std::size_t delivered = finish(*in, request, m.outcome);
      if (m.outcome == Status::kOk) {
        require(delivered == m.size, what + ": delivered " + std::to_string(delivered));
        const std::string wrong = check_pattern({buffer.data(), m.size}, seed_of(i));
        require(wrong.empty(), what + ": " + wrong);
      } else {
        // Never truncated, nor part of it: the buffer holds none of the message.
        for (const std::byte b : buffer) require(b == std::byte{0}, what + ": bytes copied in");
      }
    }
    const CommStats stats = in->stats();
    require(stats.rendezvous == 0, std::to_string(stats.rendezvous) + " messages were written");
    require(stats.eager_fragmented == fragmented_count(true),
            std::to_string(stats.eager_fragmented) + " messages received in fragments");
    side.part(channel);
  };
  auto sender = [](Channel& channel) {
    Sending side(channel, kSlot);
    const CloseOnUnwind guard{side.out.get()};
    SendComm* out = side.out.get();
    std::vector<std::byte>& buffer = side.buffer;
    const MemoryRegion& region = side.region;
    for (std::size_t i = 0; i < messages().size(); ++i) {
      const Message& m = messages()[i];
      if (m.post_first) require(channel.recv_value<int>() == 1, "receiver out of step");
      fill_pattern({buffer.data(), m.size}, seed_of(i));
      Request request;
      require(post_into(out->isend(buffer.data(), m.size, m.tag, region), request) == Status::kOk,
              out->last_error());
      // Sent ahead: done once every fragment left, whatever the receiver's verdict.
      finish(*out, request);
      if (!m.post_first) channel.send_value(1);
    }
    const CommStats stats = out->stats();
    require(stats.eager_fragmented == fragmented_count(false),
            std::to_string(stats.eager_fragmented) + " messages sent in fragments");
    require(stats.rendezvous == 0, std::to_string(stats.rendezvous) + " messages were written");
    side.part(channel);
  };
  require_pair(receiver, sender);
}

// A grouped receive places messages that came ahead by tag (p2p/group.hpp): one in fragments by
// the first of them to arrive, the rest of it following into the same buffer, among messages of
// one buffer and written ones.
TEST_CASE("p2p a grouped receive takes messages in fragments sent in another order",
          "[fragments]") {
  struct Piece {
    std::size_t size;
    Tag tag;
  };
  // Sent in this order; the receive's buffers are in tag order (tags 1..4).
  const std::vector<Piece> sent = {{9000, 3}, {100, 1}, {16384, 4}, {4097, 2}};
  constexpr std::size_t kRounds = 6;
  auto receiver = [&](Channel& channel) {
    Receiving side(channel, 5 * kSlot);
    const CloseOnUnwind guard{side.in.get()};
    RecvComm* in = side.in.get();
    std::vector<std::byte>& buffer = side.buffer;
    const MemoryRegion& region = side.region;
    for (std::size_t round = 0; round < kRounds; ++round) {
      std::fill(buffer.begin(), buffer.end(), std::byte{0});
      // Odd rounds post after the messages left (they come ahead, held), even ones before.
      if (round % 2 == 1) require(channel.recv_value<int>() == 1, "sender out of step");
      std::vector<RecvBuffer> targets;
      for (Tag tag = 1; tag <= 4; ++tag) {
        targets.push_back({buffer.data() + (tag - 1) * kSlot, kSlot, tag, region});
      }
      Request request;
      require(post_into(in->irecv(targets), request) == Status::kOk, in->last_error());
      if (round % 2 == 0) channel.send_value(1);
      std::size_t sizes[4] = {};
      bool done = false;
      Status status = Status::kOk;
      poll_until([&] { return done; }, [&] { status = test_once(*in, request, done, sizes); },
                 "grouped receive", 60s);
      require(status == Status::kOk, "round " + std::to_string(round) + ": " + in->last_error());
      for (std::size_t k = 0; k < sent.size(); ++k) {
        const std::size_t at = sent[k].tag - 1;
        const std::string what =
            "round " + std::to_string(round) + ", tag " + std::to_string(sent[k].tag);
        require(sizes[at] == sent[k].size, what + ": size " + std::to_string(sizes[at]));
        const std::string wrong =
            check_pattern({buffer.data() + at * kSlot, sent[k].size}, seed_of(round * 10 + k));
        require(wrong.empty(), what + ": " + wrong);
      }
    }
    side.part(channel);
  };
  auto sender = [&](Channel& channel) {
    Sending side(channel, 5 * kSlot);
    const CloseOnUnwind guard{side.out.get()};
    SendComm* out = side.out.get();
    for (std::size_t round = 0; round < kRounds; ++round) {
      if (round % 2 == 0) require(channel.recv_value<int>() == 1, "receiver out of step");
      std::vector<std::size_t> sizes;
      for (const Piece& piece : sent) sizes.push_back(piece.size);
      send_window(
          side, sizes, [&](std::size_t k) { return sent[k].tag; },
          [&](std::size_t k) { return seed_of(round * 10 + k); });
      if (round % 2 == 1) channel.send_value(1);
    }
    require(out->stats().eager_fragmented != 0, "no message went in fragments");
    side.part(channel);
  };
  require_pair(receiver, sender);
}

// A window of messages in fragments among single-buffer ones, every byte checked: with
// FI_EPMR_FAIL_TINJECT_EVERY (p2p-fragments-epmr-pushback) the provider refuses every few
// injects, so messages stop between their fragments and go on from there at the lane's next
// progress; no fragment may go twice or be lost.
TEST_CASE("p2p a window of messages in fragments keeps every byte", "[fragments]") {
  constexpr std::size_t kMessages = 400, kWindow = 16;
  auto size_of = [](std::size_t k) { return (k * 2741) % (kSlot + 1); };
  auto receiver = [&](Channel& channel) {
    Receiving side(channel, kWindow * kSlot);
    const CloseOnUnwind guard{side.in.get()};
    RecvComm* in = side.in.get();
    std::vector<std::byte>& buffer = side.buffer;
    const MemoryRegion& region = side.region;
    for (std::size_t base = 0; base < kMessages; base += kWindow) {
      std::vector<Request> requests;
      for (std::size_t k = 0; k < kWindow; ++k) {
        RecvBuffer target{buffer.data() + k * kSlot, kSlot, 9, region};
        Request request;
        require(post_into(in->irecv({&target, 1}), request) == Status::kOk, in->last_error());
        requests.push_back(request);
      }
      for (std::size_t k = 0; k < kWindow; ++k) {
        const std::size_t size = finish(*in, requests[k]);
        const std::string what = "message " + std::to_string(base + k);
        require(size == size_of(base + k), what + ": size " + std::to_string(size));
        const std::string wrong =
            check_pattern({buffer.data() + k * kSlot, size}, seed_of(base + k));
        require(wrong.empty(), what + ": " + wrong);
      }
    }
    side.part(channel);
  };
  auto sender = [&](Channel& channel) {
    Sending side(channel, kWindow * kSlot);
    const CloseOnUnwind guard{side.out.get()};
    SendComm* out = side.out.get();
    for (std::size_t base = 0; base < kMessages; base += kWindow) {
      std::vector<std::size_t> sizes;
      for (std::size_t k = 0; k < kWindow; ++k) sizes.push_back(size_of(base + k));
      send_window(
          side, sizes, [](std::size_t) { return Tag{9}; },
          [&](std::size_t k) { return seed_of(base + k); });
    }
    require(out->stats().eager_fragmented != 0, "no message went in fragments");
    side.part(channel);
  };
  require_pair(receiver, sender);
}

// A sender that dies between the fragments of a message (FI_EPMR_FAIL_TINJECT_EVERY=2 in
// p2p-fragments-death-epmr: within isend the first fragment's inject is refused, its retry
// goes, the second's is refused; the sender, without a progress thread, calls nothing more
// before it dies). The receive that holds a part of it, for its verdict, fails
// with a peer error within the peer timeout; nothing of the message is reported delivered.
TEST_CASE("p2p a sender that dies between the fragments of a message", "[fragments-death]") {
  constexpr auto kPeerTimeout = std::chrono::milliseconds(1500);
  auto config = [&] {
    Config c = fragments_config();
    c.progress_thread = false;
    c.peer_timeout_ms = static_cast<unsigned>(kPeerTimeout.count());
    return c;
  };
  auto survivor = [&](Channel& channel) {
    Receiving side(channel, kSlot, config());
    const CloseOnUnwind guard{side.in.get()};
    RecvComm* in = side.in.get();
    std::vector<std::byte>& buffer = side.buffer;
    const MemoryRegion& region = side.region;
    std::fill(buffer.begin(), buffer.end(), std::byte{0});
    // 12290 bytes for 16 KiB: the first fragment is held until the last would tell the size.
    RecvBuffer target{buffer.data(), 12290, 7, region};
    Request request;
    require(post_into(in->irecv({&target, 1}), request) == Status::kOk, in->last_error());
    channel.send_value(1);
    poll_until([&] { return channel.peer_closed(); },
               [&] {
                 bool done = false;
                 test_once(*in, request, done);
                 require(!done, "the receive ended before the sender died: " + in->last_error());
               },
               "the sender's death", 30s);
    const auto death = std::chrono::steady_clock::now();
    finish(*in, request, Status::kPeerError);
    const auto waited = std::chrono::steady_clock::now() - death;
    require(waited < 4 * kPeerTimeout, "the receive failed only after " +
                                           std::to_string(waited / std::chrono::milliseconds(1)) +
                                           " ms");
    for (const std::byte b : buffer) require(b == std::byte{0}, "bytes of the message copied in");
    in->close();
  };
  auto doomed = [&](Channel& channel) {
    Sending side(channel, kSlot, config());
    const CloseOnUnwind guard{side.out.get()};
    SendComm* out = side.out.get();
    std::vector<std::byte>& buffer = side.buffer;
    const MemoryRegion& region = side.region;
    require(channel.recv_value<int>() == 1, "survivor out of step");
    fill_pattern(buffer, seed_of(1));
    Request request;
    require(post_into(out->isend(buffer.data(), kSlot, 7, region), request) == Status::kOk,
            out->last_error());
    std::fflush(nullptr);
    ::raise(SIGKILL);
  };
  const std::string failure = run_pair(survivor, doomed);
  INFO(failure);
  REQUIRE(failure == "child killed by signal 9");
}

}  // namespace
}  // namespace loom::test
