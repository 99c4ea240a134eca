// fi_p2p_cost: what one small message costs in instructions, without the polling that a
// ping-pong between two processes adds (its count depends on how long the other side takes,
// under callgrind fifty times longer than without). One process, one thread, two contexts on
// loopback NICs: each round the client posts its reply's receive and sends a ping, the server
// receives it, posts nothing new and sends the reply, and every wait tests all the round's
// requests (the other side's progress is what a wait needs). A message then finishes within a
// test or two of its send, and `scripts/cost.sh` runs this under callgrind for two round counts
// and divides their difference: loom's, libfabric's and libc's instructions per message.
//   fi_p2p_cost [-p PROVIDER] [-S SIZE] [-n ROUNDS] [-w WARMUP]
// Every round's bytes are checked (a pattern that differs per round and direction).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/options.hpp"
#include "loom/p2p.hpp"

namespace {

using loom::Communicator;
using loom::Context;
using loom::MemoryRegion;
using loom::RecvBuffer;
using loom::Request;
using loom::Status;

struct CostOptions {
  std::string provider;
  std::size_t size = 8;
  std::size_t rounds = 20000;
  std::size_t warmup = 200;
  std::size_t idle_tests = 0;
  bool provider_settings = true;
};

struct Pair {
  std::unique_ptr<loom::SendComm> out;
  std::unique_ptr<loom::RecvComm> in;
};

Pair connect(Context& from, Context& to) {
  loom::Listener listener = to.listen();
  loom::Connector connector = from.connect(listener.handle());
  Pair pair;
  for (unsigned long polls = 0; !(pair.out && pair.in); ++polls) {
    if (polls == 100'000'000) throw std::runtime_error("connect: no communicator after 1e8 polls");
    if (!pair.out) pair.out = connector.poll();
    if (!pair.in) pair.in = listener.accept();
  }
  return pair;
}

// One message's buffer and its registration on the communicator that moves it, deregistered
// before the memory goes.
struct Buffer {
  Communicator& comm;
  std::vector<std::byte> bytes;
  MemoryRegion region;
  Buffer(Communicator& owner, std::size_t size)
      : comm(owner),
        bytes(std::max<std::size_t>(size, 1)),
        region(owner.register_memory(bytes.data(), bytes.size())) {}
  ~Buffer() { comm.deregister(region); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

// Round k's message in direction `dir`: a pattern by position and direction, written once, with
// the round's number in its first and last 8 bytes (or what of them fits): no two rounds or
// directions alike, at a cost per round that does not grow with the size (the bench's own
// instructions would hide loom's at 4 KiB).
void fill(std::vector<std::byte>& bytes, std::size_t size, std::size_t k, unsigned dir) {
  if (k == 0) {
    for (std::size_t i = 0; i < size; ++i) {
      bytes[i] = static_cast<std::byte>((i * 7 + dir * 61 + i / 256) & 0xff);
    }
  }
  const std::uint64_t stamp = (k << 1) | dir;
  const std::size_t head = std::min(size, sizeof stamp);
  std::memcpy(bytes.data(), &stamp, head);
  if (size > head) {
    const std::size_t tail = std::min(size - head, sizeof stamp);
    std::memcpy(bytes.data() + size - tail, &stamp, tail);
  }
}

class Rounds {
 public:
  Rounds(Pair& ping, Pair& pong, std::size_t size)
      : ping_(ping),
        pong_(pong),
        size_(size),
        ping_sent_(*ping.out, size),
        ping_received_(*ping.in, size),
        pong_sent_(*pong.out, size),
        pong_received_(*pong.in, size) {}

  // Runs `count` rounds from round `first`; throws on a failed request or wrong bytes.
  void run(std::size_t first, std::size_t count) {
    for (std::size_t k = first; k < first + count; ++k) round(k);
  }
  [[nodiscard]] std::size_t empty_tests() const noexcept { return empty_tests_; }

 private:
  struct Pending {
    Communicator* comm = nullptr;
    Request request;
    bool done = false;
    const char* what = "";
  };

  [[gnu::noinline]] void round(std::size_t k) {
    fill(ping_sent_.bytes, size_, k, 0);
    fill(pong_sent_.bytes, size_, k, 1);
    RecvBuffer reply{pong_received_.bytes.data(), size_, 2, pong_received_.region};
    RecvBuffer ping{ping_received_.bytes.data(), size_, 1, ping_received_.region};
    pending_[0] = post(*pong_.in, pong_.in->irecv({&reply, 1}), "client irecv");
    pending_[1] =
        post(*ping_.out, ping_.out->isend(ping_sent_.bytes.data(), size_, 1, ping_sent_.region),
             "client isend");
    pending_[2] = post(*ping_.in, ping_.in->irecv({&ping, 1}), "server irecv");
    pending_[3] = Pending{};
    wait(2);
    check(ping_received_, ping_sent_, k, "ping");
    pending_[3] =
        post(*pong_.out, pong_.out->isend(pong_sent_.bytes.data(), size_, 2, pong_sent_.region),
             "server isend");
    wait(3);
    wait(1);
    wait(0);
    check(pong_received_, pong_sent_, k, "reply");
  }

  static Pending post(Communicator& comm, loom::Posted posted, const char* what) {
    if (posted.status != Status::kOk) {
      throw std::runtime_error(std::string(what) + ": " + comm.last_error());
    }
    return Pending{&comm, posted.request, false, what};
  }

  // Tests request `index` until done; while it runs, every other pending one of the round once.
  void wait(std::size_t index) {
    for (unsigned long polls = 0; !test(pending_[index]); ++polls) {
      if (polls == 100'000'000) {
        throw std::runtime_error(std::string(pending_[index].what) + ": not done after 1e8 tests");
      }
      for (Pending& other : pending_) test(other);
    }
  }

  bool test(Pending& p) {
    if (p.done || p.comm == nullptr) return true;
    std::size_t delivered = 0;
    const Status status = p.comm->test(p.request, {&delivered, 1});
    if (status == Status::kInProgress) {
      ++empty_tests_;
      return false;
    }
    if (status != Status::kOk)
      throw std::runtime_error(std::string(p.what) + ": " + p.comm->last_error());
    p.done = true;
    return true;
  }

  void check(const Buffer& received, const Buffer& sent, std::size_t k, const char* what) const {
    if (std::memcmp(received.bytes.data(), sent.bytes.data(), size_) != 0) {
      throw std::runtime_error(std::string(what) + " of round " + std::to_string(k) +
                               ": the bytes received differ from those sent");
    }
  }

  Pair& ping_;
  Pair& pong_;
  std::size_t size_;
  Buffer ping_sent_, ping_received_, pong_sent_, pong_received_;
  Pending pending_[4];
  std::size_t empty_tests_ = 0;
};

// `count` tests of a receive no message is sent for: each polls the lane's queues and finds
// nothing, as a test does while its message has not arrived. The receive is left posted (the
// close cancels it).
void idle(loom::RecvComm& comm, std::size_t count) {
  Buffer buffer(comm, 64);
  RecvBuffer target{buffer.bytes.data(), 64, 3, buffer.region};
  const loom::Posted posted = comm.irecv({&target, 1});
  if (posted.status != Status::kOk) throw std::runtime_error("idle irecv: " + comm.last_error());
  for (std::size_t i = 0; i < count; ++i) {
    const Status status = comm.test(posted.request, {});
    if (status != Status::kInProgress) {
      throw std::runtime_error("idle test: a receive no message was sent for finished");
    }
  }
  std::printf("fi_p2p_cost: %zu tests of a receive nothing fills\n", count);
  comm.close();
}

bool parse(int argc, char** argv, CostOptions& o) {
  CLI::App app{
      "fi_p2p_cost: a ping-pong between two contexts in one thread, for instruction counts\n"
      "without polling (scripts/cost.sh runs it under callgrind)."};
  std::string size = "8";
  app.add_option("-p", o.provider, "libfabric provider (else LOOM_PROVIDER, FI_PROVIDER)");
  app.add_option("-S", size, "message size (k/m suffixes)");
  app.add_option("-n,--rounds", o.rounds, "timed rounds (default 20000)");
  app.add_option("-w", o.warmup, "rounds before them (default 200)");
  app.add_option("--idle", o.idle_tests,
                 "then this many tests of a receive nothing fills (what a waiting test costs)");
  loom::bench::add_provider_settings_flag(app, o.provider_settings);
  if (!loom::bench::parse_command_line(app, argc, argv)) return false;
  o.size = loom::bench::parse_size(size);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CostOptions options;
  try {
    if (!parse(argc, argv, options)) return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fi_p2p_cost: %s (try --help)\n", e.what());
    return 2;
  }
  try {
    loom::Config config = loom::Config::from_env();
    if (!options.provider.empty()) config.provider = options.provider;
    config.loopback_only = true;
    if (options.provider_settings) loom::bench::apply_provider_settings(config);
    Context client(config);
    Context server(config);
    Pair ping = connect(client, server);
    Pair pong = connect(server, client);
    {
      Rounds rounds(ping, pong, options.size);
      rounds.run(0, options.warmup);
      const std::size_t before = rounds.empty_tests();
      rounds.run(options.warmup, options.rounds);
      std::printf("fi_p2p_cost: %zu rounds of %zu B each way, %.2f empty tests per round\n",
                  options.rounds, options.size,
                  static_cast<double>(rounds.empty_tests() - before) /
                      static_cast<double>(std::max<std::size_t>(options.rounds, 1)));
    }
    if (options.idle_tests != 0) idle(*pong.in, options.idle_tests);
    for (Pair* pair : {&ping, &pong}) {
      pair->out->close();
      pair->in->close();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fi_p2p_cost: %s\n", e.what());
    return 1;
  }
  return 0;
}
