// Eager credits (lib/p2p/eager.cpp): messages sent ahead into the receiver's eager buffers
// before their buffers are posted, credits running out and coming back, a sender far ahead of
// its receiver, eager and rendezvous messages mixed, and a peer dying with credits out.
#include <algorithm>
#include <csignal>
#include <deque>
#include <optional>
#include <random>
#include <thread>

#include <catch2/catch.hpp>

#include "providers/profile.hpp"
#include "support/p2p_pair.hpp"

namespace loom::test {
namespace {

using namespace std::chrono_literals;

constexpr std::size_t kEagerMax = 16 * 1024;
constexpr auto kBound = 6000ms;  // peer timeout (2 s) and the slack a loaded CI machine needs

// No credits given: LOOM_EAGER_CREDITS=auto, the provider's profile decides. One eager buffer per
// message (LOOM_EAGER_FRAGMENTS=1): the counts below are of messages on a credit each; messages
// in several have their own tests (fragments_test.cpp).
Config credits_config(std::optional<unsigned> credits) {
  Config config = test_config(1);
  config.eager_max = kEagerMax;
  config.eager_fragments = 1;
  config.eager_credits = credits;
  config.peer_timeout_ms = 2000;
  return config;
}

std::uint64_t seed_of(std::size_t message) {
  return 7000 + message * 13;
}

// Messages (and their buffers) one after the other in one registered buffer.
struct Layout {
  std::vector<std::size_t> sizes;    // message sizes
  std::vector<std::size_t> buffers;  // receive buffer sizes (>= the message's)
  std::vector<std::size_t> at;
  std::size_t total = 0;
  Layout(std::vector<std::size_t> message_sizes, std::vector<std::size_t> buffer_sizes)
      : sizes(std::move(message_sizes)), buffers(std::move(buffer_sizes)) {
    for (std::size_t size : buffers) {
      at.push_back(total);
      total += std::max<std::size_t>(size, 1);
    }
  }
};

// Tests each request until all are done (kOk required) or `span` passed; how many are done.
std::size_t test_all(Communicator& comm, const std::vector<Request>& requests,
                     std::vector<bool>& done, std::chrono::milliseconds span) {
  const auto end = std::chrono::steady_clock::now() + span;
  std::size_t finished = 0;
  do {
    finished = 0;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      if (!done[i]) {
        bool now = false;
        const Status status = test_once(comm, requests[i], now, {});
        require(status == Status::kOk, "request " + std::to_string(i) + ": " + comm.last_error());
        done[i] = now;
      }
      finished += done[i] ? 1 : 0;
    }
  } while (finished != requests.size() && std::chrono::steady_clock::now() < end);
  return finished;
}

// The receiver posts its buffers only when told, in batches of `batch` with `pause` between
// them (making no progress meanwhile); the sender has posted every message before the first.
// Messages sent ahead before that are at most the credits (LOOM_EAGER_CREDITS, or the
// provider's where `credits` is empty); with `all_credits`, all but the one message 0 may have
// taken (its buffer is granted again only with the next batch).
void run_late_receiver(const Layout& layout, std::optional<unsigned> credits, std::size_t batch,
                       std::chrono::milliseconds pause, bool all_credits = false) {
  const std::size_t n = layout.sizes.size();
  const unsigned granted =
      credits.value_or(providers::profile_for(test_config().provider).eager_credits);
  auto receiver = [&](Channel& channel) {
    Context context(credits_config(credits));
    Listener listener = context.listen();
    send_handle(channel, listener.handle());
    auto in = accept_one(listener);
    std::vector<std::byte> buffer(layout.total);
    const CloseOnUnwind guard{in.get()};
    MemoryRegion region = in->register_memory(buffer.data(), buffer.size());
    // One message first: its progress sends the credits.
    RecvBuffer first{buffer.data(), layout.buffers[0], 1, region};
    Request request;
    require(post_into(in->irecv({&first, 1}), request) == Status::kOk, in->last_error());
    require(finish(*in, request) == layout.sizes[0], "message 0 size");
    channel.send_value(1);
    require(channel.recv_value<int>() == 2, "sender out of step");  // its messages are posted
    std::vector<Request> receives;
    for (std::size_t i = 1; i < n; i += batch) {
      for (std::size_t k = i; k < std::min(n, i + batch); ++k) {
        RecvBuffer target{buffer.data() + layout.at[k], layout.buffers[k], Tag(k + 1), region};
        Request r;
        require(post_into(in->irecv({&target, 1}), r) == Status::kOk, in->last_error());
        receives.push_back(r);
      }
      std::this_thread::sleep_for(pause);  // posts late, and makes no progress meanwhile
    }
    for (std::size_t k = 1; k < n; ++k) {
      const std::size_t size = finish(*in, receives[k - 1]);
      require(size == layout.sizes[k], "message " + std::to_string(k) + ": " +
                                           std::to_string(size) + " bytes, expected " +
                                           std::to_string(layout.sizes[k]));
      const std::string wrong = check_pattern({buffer.data() + layout.at[k], size}, seed_of(k));
      require(wrong.empty(), "message " + std::to_string(k) + ": " + wrong);
      // Nothing past the message: the buffer was zero.
      for (std::size_t b = size; b < layout.buffers[k]; ++b)
        require(buffer[layout.at[k] + b] == std::byte{0},
                "written past message " + std::to_string(k));
    }
    channel.barrier();
  };
  auto sender = [&](Channel& channel) {
    Context context(credits_config(credits));
    auto out = connect_one(context, recv_handle(channel));
    std::vector<std::byte> buffer(layout.total);
    const CloseOnUnwind guard{out.get()};
    for (std::size_t k = 0; k < n; ++k)
      fill_pattern({buffer.data() + layout.at[k], layout.sizes[k]}, seed_of(k));
    MemoryRegion region = out->register_memory(buffer.data(), buffer.size());
    Request request;
    require(
        post_into(out->isend(buffer.data(), layout.sizes[0], 1, region), request) == Status::kOk,
        out->last_error());
    finish(*out, request);
    require(channel.recv_value<int>() == 1, "receiver out of step");
    const std::uint64_t eager_before = out->stats().eager;
    std::vector<Request> sends;
    for (std::size_t k = 1; k < n; ++k) {
      Request r;
      require(
          post_into(out->isend(buffer.data() + layout.at[k], layout.sizes[k], Tag(k + 1), region),
                    r) == Status::kOk,
          out->last_error());
      sends.push_back(r);
    }
    // No buffer is posted: what went ahead used credits and finished when it left (the receiver
    // alone judges it); nothing else may complete.
    std::vector<bool> done(sends.size());
    const std::size_t finished_early = test_all(*out, sends, done, 300ms);
    const std::uint64_t ahead = out->stats().eager - eager_before;
    require(finished_early == ahead, std::to_string(finished_early) + " sends completed before " +
                                         "their buffers were posted, " + std::to_string(ahead) +
                                         " went ahead");
    for (std::size_t k = 0; k < ahead; ++k) require(done[k], "a send ahead is not done");
    // Messages go ahead in order only (p2p/group.hpp): one too large for a credit holds back
    // the rest.
    const std::size_t eager_max = context.nics().front().eager_max;
    std::size_t leading = 0;
    while (1 + leading < n && layout.sizes[1 + leading] <= eager_max) ++leading;
    const std::size_t least = std::min<std::size_t>(leading, all_credits ? granted - 1 : 1);
    require(ahead >= least && ahead <= std::min<std::size_t>(granted, leading),
            std::to_string(ahead) + " messages went ahead on " + std::to_string(granted) +
                " credits (" + std::to_string(leading) + " eager ones lead)");
    channel.send_value(2);
    test_all(*out, sends, done, 60s);
    require(std::all_of(done.begin(), done.end(), [](bool d) { return d; }), "sends pending");
    const CommStats stats = out->stats();
    require(stats.eager + stats.rendezvous == n, "every message went eagerly or by write");
    // The credits came back with the buffers: more went eagerly than the first ones ahead.
    require(stats.eager - eager_before > ahead, "no credit came back");
    channel.barrier();
  };
  const std::string failure = run_pair(receiver, sender);
  INFO(failure);
  REQUIRE(failure.empty());
}

TEST_CASE("p2p eager credits run out and come back", "[credits]") {
  // 40 eager messages on 4 credits: 4 go ahead, the rest wait for their buffers (and go on
  // the credits given back with them, or by write); every byte checked.
  std::vector<std::size_t> sizes;
  for (std::size_t k = 0; k < 41; ++k) sizes.push_back((k * 997) % kEagerMax);
  run_late_receiver(Layout(sizes, sizes), 4, 8, 50ms);
}

// Without LOOM_EAGER_CREDITS each provider's profile sets the credits (shm 64, others 16):
// exactly that many of 100 small messages go ahead before any buffer is posted.
TEST_CASE("p2p eager credits default to the provider's", "[credits]") {
  std::vector<std::size_t> sizes;
  for (std::size_t k = 0; k < 101; ++k) sizes.push_back(64 + (k * 131) % 2000);
  run_late_receiver(Layout(sizes, sizes), std::nullopt, 50, 20ms, true);
}

// The pool holds 4 x the credits (a share for several peers), but only buffers that back a
// promise are posted: the rest stay idle, neither receive-queue entries on the NIC nor a ring
// of cold memory that each message would land in (the provider fills the oldest posted
// buffer). 300 eager messages of differing sizes and patterns, one at a time, then the receive
// lane's figures.
TEST_CASE("p2p a receive lane posts eager buffers for its credits and not its whole pool",
          "[credits]") {
  constexpr unsigned kCredits = 8;
  constexpr std::size_t kMessages = 300;
  auto size_of = [](std::size_t k) { return 1 + (k * 389) % 3000; };
  auto receiver = [&](Channel& channel) {
    Context context(credits_config(kCredits));
    Listener listener = context.listen();
    send_handle(channel, listener.handle());
    auto in = accept_one(listener);
    std::vector<std::byte> buffer(4096);
    const CloseOnUnwind guard{in.get()};
    MemoryRegion region = in->register_memory(buffer.data(), buffer.size());
    for (std::size_t k = 0; k < kMessages; ++k) {
      RecvBuffer target{buffer.data(), buffer.size(), Tag(k), region};
      Request r;
      require(post_into(in->irecv({&target, 1}), r) == Status::kOk, in->last_error());
      const std::size_t size = finish(*in, r);
      require(size == size_of(k), "message " + std::to_string(k) + ": " + std::to_string(size) +
                                      " bytes, expected " + std::to_string(size_of(k)));
      const std::string wrong = check_pattern({buffer.data(), size}, seed_of(k));
      require(wrong.empty(), "message " + std::to_string(k) + ": " + wrong);
    }
    channel.barrier();  // the sender saw its messages go eagerly
    const ContextStats stats = context.stats();
    bool found = false;
    for (const LaneDescription& lane : stats.lanes) {
      if (lane.recv_comms == 0) continue;
      found = true;
      require(lane.eager_buffers == std::size_t{4} * kCredits,
              "pool of " + std::to_string(lane.eager_buffers) + " buffers");
      require(lane.eager_buffers_posted >= 1 && lane.eager_buffers_posted <= kCredits,
              std::to_string(lane.eager_buffers_posted) + " of " +
                  std::to_string(lane.eager_buffers) + " eager buffers posted for " +
                  std::to_string(kCredits) + " credits");
    }
    require(found, "no receive lane");
    channel.barrier();
  };
  auto sender = [&](Channel& channel) {
    Context context(credits_config(kCredits));
    auto out = connect_one(context, recv_handle(channel));
    std::vector<std::byte> buffer(4096);
    const CloseOnUnwind guard{out.get()};
    MemoryRegion region = out->register_memory(buffer.data(), buffer.size());
    for (std::size_t k = 0; k < kMessages; ++k) {
      fill_pattern({buffer.data(), size_of(k)}, seed_of(k));
      Request r;
      require(post_into(out->isend(buffer.data(), size_of(k), Tag(k), region), r) == Status::kOk,
              out->last_error());
      finish(*out, r);
    }
    // All but the first few went on credits (the rest by write, before the first grant).
    require(out->stats().eager > kMessages / 2,
            std::to_string(out->stats().eager) + " of " + std::to_string(kMessages) + " eager");
    channel.barrier();
    channel.barrier();
  };
  const std::string failure = run_pair(receiver, sender);
  INFO(failure);
  REQUIRE(failure.empty());
}

// A receiving communicator whose promise found the lane's pool dry waits for credits, and gets
// them when buffers come back, not only at its next batch: its sender may have messages
// waiting that no receive will announce soon (posted ahead of their receives). One process,
// five communicators each way on one lane, 4 credits (a pool of 16): the first four take
// the whole pool, the fifth's sender posts a message while none is left and asks for it in
// vain; then messages on two of the first come and go, and their buffers must reach the fifth.
TEST_CASE("p2p a communicator that found the pool dry gets credits when buffers come back",
          "[credits]") {
  constexpr unsigned kCredits = 4;
  constexpr std::size_t kComms = 5;
  constexpr std::size_t kSize = 64;
  Config config = credits_config(kCredits);
  config.peer_timeout_ms = 60000;  // no liveness ping, whose answer would promise too
  Context context(config);
  Listener listener = context.listen();
  // Each message's buffer and pattern; declared before the communicators, freed after them.
  struct Message {
    Communicator* comm = nullptr;
    Request request;
    std::vector<std::byte> buffer;
    std::uint64_t seed = 0;
    bool receive = false;
    bool done = false;
  };
  std::deque<Message> messages;
  std::vector<std::unique_ptr<SendComm>> outs;
  std::vector<std::unique_ptr<RecvComm>> ins;
  for (std::size_t i = 0; i < kComms; ++i) {
    Connector connector = context.connect(listener.handle());
    CommPair pair = connect_both(connector, listener, "communicators " + std::to_string(i));
    outs.push_back(std::move(pair.out));
    ins.push_back(std::move(pair.in));
  }
  const CloseOnUnwind close_outs{outs};
  const CloseOnUnwind close_ins{ins};
  auto post_receive = [&](std::size_t comm, std::uint64_t seed) -> Message& {
    Message& m = messages.emplace_back();
    m = Message{.comm = ins[comm].get(),
                .buffer = std::vector<std::byte>(kSize),
                .seed = seed,
                .receive = true};
    MemoryRegion region = ins[comm]->register_memory(m.buffer.data(), kSize);
    RecvBuffer target{m.buffer.data(), kSize, Tag(seed), region};
    require(post_into(ins[comm]->irecv({&target, 1}), m.request) == Status::kOk,
            ins[comm]->last_error());
    return m;
  };
  auto post_send = [&](std::size_t comm, std::uint64_t seed) -> Message& {
    Message& m = messages.emplace_back();
    m = Message{.comm = outs[comm].get(), .buffer = std::vector<std::byte>(kSize), .seed = seed};
    fill_pattern(m.buffer, seed);
    MemoryRegion region = outs[comm]->register_memory(m.buffer.data(), kSize);
    require(post_into(outs[comm]->isend(m.buffer.data(), kSize, Tag(seed), region), m.request) ==
                Status::kOk,
            outs[comm]->last_error());
    return m;
  };
  // One test of every pending request: both lanes progress.
  auto pump = [&] {
    for (Message& m : messages) {
      if (m.done) continue;
      const Status status = test_once(*m.comm, m.request, m.done);
      require(status == Status::kOk,
              "message " + std::to_string(m.seed) + " failed: " + m.comm->last_error());
    }
  };
  auto pump_until = [&](const Message& m, const std::string& what) {
    poll_until([&] { return m.done; }, pump, what, 10000ms);
  };

  // The first four take the pool: a receive each, announced with its credits promised.
  std::vector<Message*> first;
  for (std::size_t i = 0; i + 1 < kComms; ++i) first.push_back(&post_receive(i, 100 + i));
  // The fifth finds none left: a receive, and its message by clear-to-send.
  const std::size_t fifth = kComms - 1;
  Message& fifth_receive = post_receive(fifth, 200);
  pump_until(post_send(fifth, 200), "the fifth communicator's first send");
  pump_until(fifth_receive, "the fifth communicator's first receive");
  // A message posted ahead of its receive, with no credit: its sender asks, in vain.
  Message& waiting = post_send(fifth, 201);
  const auto until = std::chrono::steady_clock::now() + 300ms;
  while (std::chrono::steady_clock::now() < until) pump();
  REQUIRE_FALSE(waiting.done);  // else the pool was not dry, and the rest shows nothing
  const std::uint64_t eager_before = outs[fifth]->stats().eager;
  // Messages on the first two communicators land and are delivered: their buffers come back,
  // and the waiting message must go ahead on the credits they became (granted at half of
  // LOOM_EAGER_CREDITS: two).
  for (std::size_t i = 0; i < 2; ++i) {
    post_send(i, 100 + i);
    pump_until(*first[i], "communicator " + std::to_string(i) + "'s message");
  }
  pump_until(waiting, "the message that waited for a credit");
  CHECK(outs[fifth]->stats().eager == eager_before + 1);
  // Its receive, posted now, takes it from the eager buffer it waits in; the other first
  // receives get their messages.
  pump_until(post_receive(fifth, 201), "the late receive");
  for (std::size_t i = 2; i + 1 < kComms; ++i) {
    post_send(i, 100 + i);
    pump_until(*first[i], "communicator " + std::to_string(i) + "'s message");
  }
  for (const Message& m : messages) {
    CHECK(m.done);
    if (m.receive) CHECK(check_pattern(m.buffer, m.seed).empty());
  }
}

TEST_CASE("p2p a sender far ahead of a receiver that posts late", "[credits]") {
  // 120 messages in flight, eager ones of every size up to the limit among rendezvous ones;
  // the receiver posts them a few at a time, its buffers larger than the messages.
  std::mt19937_64 rng(20261124);
  std::vector<std::size_t> sizes{64}, buffers{64};
  const std::size_t choices[] = {
      0, 1, 64, 4095, 4096, kEagerMax - 1, kEagerMax, kEagerMax + 1, 65536, 300000};
  for (std::size_t k = 1; k < 121; ++k) {
    const std::size_t size = choices[rng() % std::size(choices)];
    sizes.push_back(size);
    buffers.push_back(size + (rng() % 3 == 0 ? rng() % 5000 : 0));
  }
  run_late_receiver(Layout(sizes, buffers), 16, 5, 20ms);
}

TEST_CASE("p2p mixed eager and rendezvous messages in random order, both sides posting freely",
          "[credits]") {
  std::mt19937_64 rng(424242);
  std::vector<std::size_t> sizes, buffers;
  const std::size_t choices[] = {0, 8, 256, 4096, 9000, kEagerMax, kEagerMax + 8, 100000, 1u << 20};
  for (std::size_t k = 0; k < 400; ++k) {
    const std::size_t size = choices[rng() % std::size(choices)];
    sizes.push_back(size);
    buffers.push_back(size + (rng() % 2 == 0 ? rng() % 4096 : 0));
  }
  const Layout layout(sizes, buffers);
  constexpr std::size_t kWindow = 24;
  auto receiver = [&](Channel& channel) {
    Context context(credits_config(8));
    Listener listener = context.listen();
    send_handle(channel, listener.handle());
    auto in = accept_one(listener);
    std::vector<std::byte> buffer(layout.total);
    const CloseOnUnwind guard{in.get()};
    MemoryRegion region = in->register_memory(buffer.data(), buffer.size());
    std::mt19937_64 pace(7);
    for (std::size_t first = 0; first < sizes.size(); first += kWindow) {
      const std::size_t last = std::min(sizes.size(), first + kWindow);
      std::vector<Request> receives;
      for (std::size_t k = first; k < last; ++k) {
        RecvBuffer target{buffer.data() + layout.at[k], buffers[k], Tag(k), region};
        Request r;
        require(post_into(in->irecv({&target, 1}), r) == Status::kOk, in->last_error());
        receives.push_back(r);
        if (pace() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(pace() % 300));
      }
      for (std::size_t k = first; k < last; ++k) {
        const std::size_t size = finish(*in, receives[k - first]);
        require(size == sizes[k], "message " + std::to_string(k) + " size");
        const std::string wrong = check_pattern({buffer.data() + layout.at[k], size}, seed_of(k));
        require(wrong.empty(), "message " + std::to_string(k) + ": " + wrong);
      }
    }
    const CommStats stats = in->stats();
    require(stats.eager > 0 && stats.rendezvous > 0, "both protocols ran");
    channel.barrier();
  };
  auto sender = [&](Channel& channel) {
    Context context(credits_config(8));
    auto out = connect_one(context, recv_handle(channel));
    std::vector<std::byte> buffer(layout.total);
    const CloseOnUnwind guard{out.get()};
    for (std::size_t k = 0; k < sizes.size(); ++k)
      fill_pattern({buffer.data() + layout.at[k], sizes[k]}, seed_of(k));
    MemoryRegion region = out->register_memory(buffer.data(), buffer.size());
    std::mt19937_64 pace(11);
    for (std::size_t first = 0; first < sizes.size(); first += kWindow) {
      const std::size_t last = std::min(sizes.size(), first + kWindow);
      std::vector<Request> sends;
      for (std::size_t k = first; k < last; ++k) {
        Request r;
        require(post_into(out->isend(buffer.data() + layout.at[k], sizes[k], Tag(k), region), r) ==
                    Status::kOk,
                out->last_error());
        sends.push_back(r);
        if (pace() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(pace() % 300));
      }
      for (Request r : sends) finish(*out, r);
    }
    channel.barrier();
  };
  const std::string failure = run_pair(receiver, sender);
  INFO(failure);
  REQUIRE(failure.empty());
}

// Peer death with credits out. The receiver dies holding messages sent ahead: those sends
// finished when they left; a send waiting for its buffer's announcement ends with a peer error
// within the bound. The sender dies after sending ahead: what arrived whole is delivered (every
// byte checked), the rest fails within the bound.
constexpr std::size_t kAhead = 6;
constexpr std::size_t kSize = 3000;

struct Outcome {
  Status status = Status::kOk;
  std::size_t size = 0;
  std::chrono::steady_clock::time_point ended;
};

// Tests `requests` until every one ended (any status).
std::vector<Outcome> outcomes(Communicator& comm, const std::vector<Request>& requests) {
  std::vector<Outcome> result(requests.size());
  std::vector<bool> ended(requests.size());
  poll_until([&] { return std::all_of(ended.begin(), ended.end(), [](bool e) { return e; }); },
             [&] {
               for (std::size_t i = 0; i < requests.size(); ++i) {
                 if (ended[i]) continue;
                 bool done = false;
                 result[i].status = test_once(comm, requests[i], done, {&result[i].size, 1});
                 if (done || result[i].status != Status::kOk) {
                   ended[i] = true;
                   result[i].ended = std::chrono::steady_clock::now();
                 }
               }
             },
             "every request to end", 30s);
  return result;
}

// Message 0 (waited for), the peer's go, then messages 1..kAhead, each in its own slot of
// `buffer` with its own pattern: all of them must go ahead on credits.
std::vector<Request> send_ahead(SendComm& out, Channel& channel, std::vector<std::byte>& buffer,
                                const MemoryRegion& region) {
  Request r;
  require(post_into(out.isend(buffer.data(), kSize, 1, region), r) == Status::kOk,
          out.last_error());
  finish(out, r);
  require(channel.recv_value<int>() == 1, "peer out of step");
  const std::uint64_t before = out.stats().eager;
  std::vector<Request> sends;
  for (std::size_t k = 1; k <= kAhead; ++k) {
    std::span<std::byte> message{buffer.data() + k * kSize, kSize};
    fill_pattern(message, seed_of(k));
    require(post_into(out.isend(message.data(), kSize, Tag(k + 1), region), r) == Status::kOk,
            out.last_error());
    sends.push_back(r);
  }
  require(out.stats().eager - before == kAhead, "every message went ahead on a credit");
  return sends;
}

void wait_for_death(Channel& channel) {
  poll_until([&] { return channel.peer_closed(); }, [] { std::this_thread::sleep_for(1ms); },
             "the peer's death", 30s);
}

TEST_CASE("p2p a receiver dies holding messages sent ahead", "[credits]") {
  auto doomed = [&](Channel& channel) {
    Context context(credits_config(8));
    Listener listener = context.listen();
    send_handle(channel, listener.handle());
    auto in = accept_one(listener);
    std::vector<std::byte> buffer(kSize);
    const CloseOnUnwind guard{in.get()};
    MemoryRegion region = in->register_memory(buffer.data(), buffer.size());
    for (std::size_t k = 0; k < 2; ++k) {
      RecvBuffer target{buffer.data(), kSize, Tag(k + 1), region};
      Request r;
      require(post_into(in->irecv({&target, 1}), r) == Status::kOk, in->last_error());
      finish(*in, r);
      if (k == 0) {
        channel.send_value(1);
        require(channel.recv_value<int>() == 2, "survivor out of step");
      }
    }
    // Message 1 arrived and the rest went ahead with it: die holding them.
    std::this_thread::sleep_for(50ms);
    std::fflush(nullptr);
    ::raise(SIGKILL);
  };
  auto survivor = [&](Channel& channel) {
    Context context(credits_config(8));
    auto out = connect_one(context, recv_handle(channel));
    std::vector<std::byte> buffer(kSize * (kAhead + 1));
    const CloseOnUnwind guard{out.get()};
    MemoryRegion region = out->register_memory(buffer.data(), buffer.size());
    std::vector<Request> sends = send_ahead(*out, channel, buffer, region);
    channel.send_value(2);
    // Sent ahead, so done when they left; the receiver's death cannot undo that.
    for (const Outcome& end : outcomes(*out, sends)) {
      require(end.status == Status::kOk, "a send ahead failed: " + out->last_error());
    }
    wait_for_death(channel);
    const auto death = std::chrono::steady_clock::now();
    // Larger than a credit: it waits for its buffer's announcement, which never comes.
    std::vector<std::byte> large(4 * kEagerMax);
    const MemoryRegion large_region = out->register_memory(large.data(), large.size());
    Request waiting;
    const Status posted =
        post_into(out->isend(large.data(), large.size(), 99, large_region), waiting);
    if (posted == Status::kOk) {
      const Outcome end = outcomes(*out, {waiting}).front();
      require(end.status == Status::kPeerError, "the send after the death ended " +
                                                    std::string(to_string(end.status)) + ": " +
                                                    out->last_error());
      const auto took =
          std::chrono::duration_cast<std::chrono::milliseconds>(end.ended - death).count();
      require(end.ended - death < kBound,
              "the send after the death ended " + std::to_string(took) + " ms after it");
    } else {
      require(posted == Status::kPeerError, "isend after the death: " + out->last_error());
    }
    out->deregister(large_region);
    out->close();
  };
  const std::string failure = run_pair(survivor, doomed);
  INFO(failure);
  REQUIRE(failure == "child killed by signal 9");
}

TEST_CASE("p2p a sender dies after sending ahead", "[credits]") {
  auto doomed = [&](Channel& channel) {
    Context context(credits_config(8));
    auto out = connect_one(context, recv_handle(channel));
    std::vector<std::byte> buffer(kSize * (kAhead + 1));
    const CloseOnUnwind guard{out.get()};
    MemoryRegion region = out->register_memory(buffer.data(), buffer.size());
    const std::vector<Request> sends = send_ahead(*out, channel, buffer, region);
    // Progress hands them to the wire where the provider needs it (tcp); each is done once it
    // left, before its buffer is announced.
    std::vector<bool> done(sends.size());
    require(test_all(*out, sends, done, 10s) == sends.size(), "a send ahead did not finish");
    std::fflush(nullptr);
    ::raise(SIGKILL);
  };
  auto survivor = [&](Channel& channel) {
    Context context(credits_config(8));
    Listener listener = context.listen();
    send_handle(channel, listener.handle());
    auto in = accept_one(listener);
    std::vector<std::byte> buffer(kSize * (kAhead + 3));
    const CloseOnUnwind guard{in.get()};
    MemoryRegion region = in->register_memory(buffer.data(), buffer.size());
    RecvBuffer first{buffer.data(), kSize, 1, region};
    Request r;
    require(post_into(in->irecv({&first, 1}), r) == Status::kOk, in->last_error());
    finish(*in, r);
    channel.send_value(1);
    wait_for_death(channel);
    const auto death = std::chrono::steady_clock::now();
    // Its messages, and two it never sent.
    std::vector<Request> receives;
    for (std::size_t k = 1; k <= kAhead + 2; ++k) {
      RecvBuffer target{buffer.data() + k * kSize, kSize, Tag(k + 1), region};
      const Status posted = post_into(in->irecv({&target, 1}), r);
      if (posted == Status::kPeerError) break;  // the death is known already
      require(posted == Status::kOk, in->last_error());
      receives.push_back(r);
    }
    const std::vector<Outcome> ends = outcomes(*in, receives);
    std::size_t delivered = 0;
    for (std::size_t i = 0; i < ends.size(); ++i) {
      const std::size_t k = i + 1;
      const auto took =
          std::chrono::duration_cast<std::chrono::milliseconds>(ends[i].ended - death);
      require(took < kBound, "receive " + std::to_string(k) + " ended " +
                                 std::to_string(took.count()) + " ms after the death");
      if (ends[i].status == Status::kOk && k <= kAhead) {
        require(ends[i].size == kSize, "receive " + std::to_string(k) + " size");
        const std::string wrong = check_pattern({buffer.data() + k * kSize, kSize}, seed_of(k));
        require(wrong.empty(), "receive " + std::to_string(k) + ": " + wrong);
        ++delivered;
        continue;
      }
      require(ends[i].status == Status::kPeerError,
              "receive " + std::to_string(k) + " ended " + std::string(to_string(ends[i].status)));
    }
    std::fprintf(stderr, "sender died after sending %zu ahead: %zu delivered, %zu failed\n", kAhead,
                 delivered, ends.size() - delivered);
    in->close();
  };
  const std::string failure = run_pair(survivor, doomed);
  INFO(failure);
  REQUIRE(failure == "child killed by signal 9");
}

}  // namespace
}  // namespace loom::test
