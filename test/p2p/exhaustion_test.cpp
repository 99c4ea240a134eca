// Resource exhaustion through the p2p API: a communicator's request pool, a shared lane's
// provider queues, many communicators without grouping under a file-descriptor limit, and
// provider queues only 16 deep.
// Running out must mean back-pressure (kRetry with a clear last_error) or a clear loom::Error,
// never a crash, a hang or lost bytes; whatever was accepted must complete with every byte
// verified.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "p2p/comm.hpp"  // kMaxRequests: the pool size the refusals must match
#include "support/p2p_pair.hpp"
#include "support/pattern.hpp"

namespace loom::test {
namespace {

// ---- request pools and provider queues ------------------------------------------------------

constexpr std::size_t kPool = p2p::kMaxRequests;
constexpr std::size_t kParts = kMaxRecvBuffers;
constexpr std::size_t kSlot = 32 * 1024;
// Each receiver first fills its pool with 8-buffer receives (kPool * kParts buffers, four times
// the 256 receives a rail's queue holds), then posts single buffers: 2 * kPool more messages.
constexpr std::size_t kMessages = kPool * kParts + 2 * kPool;
// A stuck run fails instead of hanging: no completion on any communicator for this long.
constexpr auto kStall = std::chrono::seconds(60);

// Eager and rendezvous (above the default 16 KiB eager limit) mixed, some empty.
std::size_t size_of(std::size_t comm, std::size_t k) {
  const std::size_t x = k + 3 * comm;
  if (x % 9 == 3) return 0;
  if (x % 4 == 0) return 16385 + (x * 131) % 16000;
  return 1 + (x * 7919) % 12000;
}

Tag tag_of(std::size_t comm, std::size_t k) {
  return static_cast<Tag>((comm << 20) ^ k ^ 0x5000);
}

std::uint64_t seed_of(std::size_t comm, std::size_t k) {
  return 0xE00000 + (comm << 16) + k;
}

// Every communicator of a pair shares one lane (LOOM_NGROUPS=1): its provider queues (depth 256)
// see the sum of what they post.
Config pool_config() {
  Config config = test_config(1);
  config.ngroups = 1;
  return config;
}

bool mentions(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

void check_stall(std::chrono::steady_clock::time_point last, const char* role) {
  require(std::chrono::steady_clock::now() - last < kStall,
          std::string(role) + ": no request completed for 60 s");
}

void pool_receiver(Channel& channel, std::size_t ncomms) {
  Config config = pool_config();
  config.force_flush = true;  // so that iflush needs a request too
  Context context(config);
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  // At most kPool * kParts buffers of a communicator are in flight, consecutive in message
  // order. Declared before the communicators: buffers outlive the receives close() cancels.
  std::vector<std::vector<std::byte>> slabs(ncomms, std::vector<std::byte>(kPool * kParts * kSlot));
  std::vector<std::unique_ptr<RecvComm>> comms;
  for (std::size_t c = 0; c < ncomms; ++c) {
    comms.push_back(accept_one(listener));  // the sender connects one at a time: same order
    channel.barrier();
  }
  std::vector<MemoryRegion> regions(ncomms);
  for (std::size_t c = 0; c < ncomms; ++c) {
    regions[c] = comms[c]->register_memory(slabs[c].data(), slabs[c].size());
  }
  // Two buffers in three are larger than their message: a written message that does not fill
  // its buffer needs a ready-to-send, so those run under exhaustion and small queues too.
  auto buffer_of = [&](std::size_t c, std::size_t k) {
    const std::size_t capacity = std::min(size_of(c, k) + (k % 3 != 0 ? 2000 : 0), kSlot);
    return RecvBuffer{slabs[c].data() + (k % (kPool * kParts)) * kSlot, capacity, tag_of(c, k),
                      regions[c]};
  };

  // The sender filled its pools before we posted anything.
  const auto sent_before_refusal = channel.recv_value<std::uint64_t>();
  require(sent_before_refusal == ncomms * kPool,
          "the sender's pools took " + std::to_string(sent_before_refusal) + " sends");

  struct Posted {
    Request request;
    std::size_t first;
    std::size_t count;
  };
  std::vector<std::deque<Posted>> posted(ncomms);
  std::vector<std::size_t> next(ncomms, 0);
  std::string refusal;
  for (std::size_t c = 0; c < ncomms; ++c) {
    RecvComm& comm = *comms[c];
    for (;;) {
      RecvBuffer buffers[kParts];
      for (std::size_t i = 0; i < kParts; ++i) buffers[i] = buffer_of(c, next[c] + i);
      Request request;
      const Status status = post_into(comm.irecv(buffers), request);
      if (status != Status::kOk) {
        require(
            status == Status::kRetry,
            "irecv on a full pool: " + std::string(to_string(status)) + ": " + comm.last_error());
        require(!request.valid(), "a refused irecv set its request");
        require(mentions(comm.last_error(), std::to_string(kPool) + " requests already in flight"),
                "unclear refusal: " + comm.last_error());
        refusal = comm.last_error();
        break;
      }
      posted[c].push_back({request, next[c], kParts});
      next[c] += kParts;
    }
    require(posted[c].size() == kPool,
            "the receive pool took " + std::to_string(posted[c].size()) + " requests");
    RecvBuffer first = buffer_of(c, 1);  // not empty: an empty buffer needs no flush
    Request flush;
    require(post_into(comm.iflush({&first, 1}), flush) == Status::kRetry,
            "iflush on a full pool: " + comm.last_error());
    require(!flush.valid(), "a refused iflush set its request");
    require(mentions(comm.last_error(), "too many requests in flight"),
            "unclear refusal: " + comm.last_error());
  }
  std::fprintf(stderr,
               "irecv: %zu comm(s) x %zu requests of %zu buffers accepted, then kRetry "
               "(\"%s\")\n",
               ncomms, kPool, kParts, refusal.c_str());

  // Complete in order; each completion makes room for one single-buffer receive.
  std::size_t verified = 0;
  auto last = std::chrono::steady_clock::now();
  while (verified < ncomms * kMessages) {
    for (std::size_t c = 0; c < ncomms; ++c) {
      if (posted[c].empty()) continue;
      const Posted p = posted[c].front();
      std::size_t sizes[kParts] = {};
      bool done = false;
      const Status status = test_once(*comms[c], p.request, done, {sizes, p.count});
      auto what = [&] {
        return "comm " + std::to_string(c) + " receive of message " + std::to_string(p.first);
      };
      if (!done) {
        if (status != Status::kOk) throw Failure(what() + ": " + comms[c]->last_error());
        continue;
      }
      require(status == Status::kOk,
              what() + ": " + std::string(to_string(status)) + ": " + comms[c]->last_error());
      posted[c].pop_front();
      last = std::chrono::steady_clock::now();
      for (std::size_t i = 0; i < p.count; ++i) {
        const std::size_t k = p.first + i;
        require(sizes[i] == size_of(c, k), what() + ": message " + std::to_string(k) +
                                               " delivered " + std::to_string(sizes[i]) + " of " +
                                               std::to_string(size_of(c, k)) + " bytes");
        const RecvBuffer b = buffer_of(c, k);
        auto error = check_pattern({static_cast<std::byte*>(b.data), sizes[i]}, seed_of(c, k));
        require(error.empty(), what() + ": message " + std::to_string(k) + ": " + error);
        ++verified;
      }
      if (next[c] < kMessages) {
        RecvBuffer b = buffer_of(c, next[c]);
        Request request;
        require(post_into(comms[c]->irecv({&b, 1}), request) == Status::kOk,
                "irecv: " + comms[c]->last_error());
        posted[c].push_back({request, next[c]++, 1});
      }
    }
    check_stall(last, "receiver");
  }
  // With the pool free again, a flush goes through.
  RecvBuffer first = buffer_of(0, 1);
  Request flush;
  require(post_into(comms[0]->iflush({&first, 1}), flush) == Status::kOk,
          "iflush: " + comms[0]->last_error());
  finish(*comms[0], flush);
  const auto stats = context.stats();
  require(stats.lanes.size() == 1 && stats.lanes[0].comms == ncomms,
          "the communicators should share one receive lane");
  channel.barrier();
}

void pool_sender(Channel& channel, std::size_t ncomms) {
  Context context(pool_config());
  const Handle handle = recv_handle(channel);
  // One slot more than the pool: the message a refused isend offered must not overwrite one
  // in flight.
  constexpr std::size_t kSlots = kPool + 1;
  std::vector<std::vector<std::byte>> slabs(ncomms, std::vector<std::byte>(kSlots * kSlot));
  std::vector<std::unique_ptr<SendComm>> comms;
  for (std::size_t c = 0; c < ncomms; ++c) {
    comms.push_back(connect_one(context, handle));
    channel.barrier();
  }
  std::vector<MemoryRegion> regions(ncomms);
  for (std::size_t c = 0; c < ncomms; ++c) {
    regions[c] = comms[c]->register_memory(slabs[c].data(), slabs[c].size());
  }
  std::vector<std::deque<Request>> inflight(ncomms);
  std::vector<std::size_t> next(ncomms, 0);
  auto post = [&](std::size_t c) {
    std::byte* data = slabs[c].data() + (next[c] % kSlots) * kSlot;
    fill_pattern({data, size_of(c, next[c])}, seed_of(c, next[c]));
    Request request;
    const Status status = post_into(
        comms[c]->isend(data, size_of(c, next[c]), tag_of(c, next[c]), regions[c]), request);
    if (status == Status::kOk) {
      inflight[c].push_back(request);
      ++next[c];
    } else {
      require(!request.valid(), "a refused isend set its request");
    }
    return status;
  };
  // Nothing is posted on the other side yet: sends pile up until each pool is empty.
  for (std::size_t c = 0; c < ncomms; ++c) {
    Status status = Status::kOk;
    while (status == Status::kOk && next[c] <= kPool) status = post(c);
    const std::string& error = comms[c]->last_error();
    require(status == Status::kRetry,
            "isend on a full pool: " + std::string(to_string(status)) + ": " + error);
    require(next[c] == kPool, "the send pool took " + std::to_string(next[c]) + " sends");
    require(mentions(error, std::to_string(kPool) + " requests already in flight"),
            "unclear refusal: " + error);
    // Refusals take nothing: asking again changes nothing and the next message keeps its place.
    require(post(c) == Status::kRetry && next[c] == kPool, "a second refused isend");
  }
  std::fprintf(stderr, "isend: %zu comm(s) x %zu accepted, then kRetry (\"%s\")\n", ncomms, kPool,
               comms[0]->last_error().c_str());
  channel.send_value<std::uint64_t>(ncomms * kPool);
  std::size_t finished = 0;
  auto last = std::chrono::steady_clock::now();
  while (finished < ncomms * kMessages) {
    for (std::size_t c = 0; c < ncomms; ++c) {
      if (inflight[c].empty()) continue;
      bool done = false;
      const Status status = test_once(*comms[c], inflight[c].front(), done, {});
      if (status != Status::kOk) {
        throw Failure("comm " + std::to_string(c) + " send " +
                      std::to_string(next[c] - inflight[c].size()) + ": " +
                      std::string(to_string(status)) + ": " + comms[c]->last_error());
      }
      if (!done) continue;
      inflight[c].pop_front();
      ++finished;
      last = std::chrono::steady_clock::now();
      while (next[c] < kMessages && inflight[c].size() < kPool) {
        require(post(c) == Status::kOk, "isend with room in the pool: " + comms[c]->last_error());
      }
    }
    check_stall(last, "sender");
  }
  channel.barrier();
}

// ---- a refused isend sends nothing; a send done at its post needs no request ----------------

// A send refused for a full pool must not have left, even with a credit for it: its buffer is the
// application's again, to refill. And a send the provider took whole at its post (a small inject
// on a credit, with its carrier where one rides along) is done then and holds no request, so a
// full pool does not stop it. The sender fills its pool with sends above the inject size (each a
// send with a completion, pending until tested), posts a small one past the full pool, then offers
// one more large one from a buffer holding a poison pattern, refills that buffer and posts it again
// once there is room: the receiver must see every message in order, the refilled one in its place,
// and nothing else.
constexpr std::size_t kSmall = 64;            // injected: done at its post
constexpr std::size_t kLarger = 96;           // above the inject size: pending until tested
constexpr std::size_t kPastPool = kPool + 1;  // message 0, then kPool that fill the pool
constexpr std::size_t kRefused = kPool + 2;
constexpr std::uint64_t kPoison = 0xBAD;

std::size_t refusal_size(std::size_t k) {
  return k == 0 || k == kPastPool ? kSmall : kLarger;
}

Config refusal_config() {
  Config config = pool_config();
  config.eager_credits = 2 * kPool;  // credits to spare once the pool is full
  config.inject_max = kSmall;
  return config;
}

void refusal_receiver(Channel& channel) {
  Context context(refusal_config());
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  std::vector<std::byte> slab((kRefused + 2) * kLarger);  // outlives the receives close() cancels
  std::unique_ptr<RecvComm> comm = accept_one(listener);
  const MemoryRegion region = comm->register_memory(slab.data(), slab.size());
  CloseOnUnwind closing({comm.get()});
  require(channel.recv_value<std::uint64_t>() == kRefused, "the sender's refusal");
  // Everything the sender posted, then one more buffer that nothing may fill; at most a pool's
  // worth posted at a time, in order.
  std::deque<Request> posted;
  std::size_t next = 0;
  auto post_next = [&] {
    RecvBuffer buffer{slab.data() + next * kLarger, kLarger, tag_of(0, next), region};
    Request request;
    require(post_into(comm->irecv({&buffer, 1}), request) == Status::kOk,
            "irecv: " + comm->last_error());
    posted.push_back(request);
    ++next;
  };
  while (next <= kRefused + 1 && posted.size() < kPool) post_next();
  for (std::size_t k = 0; k <= kRefused; ++k) {
    const std::size_t size = finish(*comm, posted.front());
    posted.pop_front();
    if (next <= kRefused + 1) post_next();
    require(size == refusal_size(k),
            "message " + std::to_string(k) + ": " + std::to_string(size) + " bytes");
    const std::string error = check_pattern({slab.data() + k * kLarger, size}, seed_of(0, k));
    require(error.empty(), "message " + std::to_string(k) + ": " + error +
                               (k == kRefused ? " (the refused isend's bytes arrived?)" : ""));
  }
  channel.barrier();  // the sender posted nothing more
  bool done = false;
  const Status status = test_once(*comm, posted.front(), done);
  require(posted.size() == 1 && status == Status::kOk && !done,
          "a message nobody sent arrived: " + std::string(to_string(status)) + ": " +
              comm->last_error());
  channel.barrier();  // before the sender closes: its close notice would end the receive
  comm->close();
}

void refusal_sender(Channel& channel) {
  Context context(refusal_config());
  const Handle handle = recv_handle(channel);
  std::vector<std::byte> slab((kRefused + 1) * kLarger);
  std::unique_ptr<SendComm> comm = connect_one(context, handle);
  const MemoryRegion region = comm->register_memory(slab.data(), slab.size());
  CloseOnUnwind closing({comm.get()});
  auto post = [&](std::size_t k, std::uint64_t seed, Request& request) {
    std::byte* data = slab.data() + k * kLarger;
    fill_pattern({data, refusal_size(k)}, seed);
    return post_into(comm->isend(data, refusal_size(k), tag_of(0, k), region), request);
  };
  // Nothing is posted on the other side: message 0 completes on a credit, so the grant is in.
  Request first;
  require(post(0, seed_of(0, 0), first) == Status::kOk, "isend: " + comm->last_error());
  finish(*comm, first);
  std::vector<Request> inflight;
  for (std::size_t k = 1; k < kPastPool; ++k) {
    Request request;
    require(post(k, seed_of(0, k), request) == Status::kOk, "isend: " + comm->last_error());
    inflight.push_back(request);
  }
  // The pool is full, yet a small send on a credit goes: done at its post, whenever tested.
  Request past;
  require(post(kPastPool, seed_of(0, kPastPool), past) == Status::kOk && past.valid(),
          "a small isend on a credit past a full pool: " + comm->last_error());
  for (int i = 0; i < 2; ++i) {
    std::size_t sent = 0;
    require(comm->test(past, {&sent, 1}) == Status::kOk && sent == kSmall,
            "a send done at its post, tested: " + std::to_string(sent) +
                " bytes: " + comm->last_error());
  }
  require(comm->stats().eager == kRefused, "every message should have gone ahead on a credit: " +
                                               std::to_string(comm->stats().eager) + " of " +
                                               std::to_string(kRefused));
  Request refused;
  require(post(kRefused, kPoison, refused) == Status::kRetry && !refused.valid(),
          "isend on a full pool: " + comm->last_error());
  require(mentions(comm->last_error(), std::to_string(kPool) + " requests already in flight"),
          "unclear refusal: " + comm->last_error());
  channel.send_value<std::uint64_t>(kRefused);
  for (const Request& request : inflight) finish(*comm, request);
  Request again;
  require(post(kRefused, seed_of(0, kRefused), again) == Status::kOk,
          "isend with room in the pool: " + comm->last_error());
  finish(*comm, again);
  channel.barrier();
  channel.barrier();  // the receiver looked for a message too many
  comm->close();
}

// ---- many communicators, a lane each ----------------------------------------------------------

constexpr std::size_t kMany = 200;
// File descriptors each process may open beyond those it has when the test starts: every
// tcp;ofi_rxm endpoint holds sockets, so tcp runs out long before 200 lanes; shm needs none.
constexpr std::size_t kFdHeadroom = 96;
// Stops opening communicators past this much resident memory (a shm lane maps ~15 MiB, a
// tcp;ofi_rxm one ~140 MiB) or this long: the point is running out of something else first.
constexpr std::size_t kMemoryBudget = std::size_t{1} << 30;
constexpr auto kSetupBudget = std::chrono::seconds(90);

enum Verdict : std::uint32_t { kConnected = 1, kConnectFailed = 2, kBudget = 3 };

// The sanitizers' runtime needs descriptors too: UBSan's vptr check probes memory through a
// pipe and, with the table full, reports a false "invalid vptr" in whatever logs next. Sanitized
// builds therefore run out of descriptors during setup only and move the data with the limit
// lifted; other builds keep it, and tcp's lazily opened connections fail then.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
constexpr bool kSanitized = __has_feature(address_sanitizer);
#else
constexpr bool kSanitized = false;
#endif

std::size_t open_fds() {
  std::size_t count = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (readdir(dir) != nullptr) ++count;
    closedir(dir);
  }
  return count > 2 ? count - 2 : 0;  // "." and ".."
}

std::size_t rss() {
  std::FILE* statm = std::fopen("/proc/self/statm", "r");
  unsigned long size = 0, resident = 0;
  if (statm != nullptr) {
    if (std::fscanf(statm, "%lu %lu", &size, &resident) != 2) resident = 0;
    std::fclose(statm);
  }
  return resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

// Lowers this process's descriptor limit to what it holds plus `headroom`, restores it after.
class FdLimit {
 public:
  explicit FdLimit(std::size_t headroom) {
    getrlimit(RLIMIT_NOFILE, &saved_);
    rlimit lowered = saved_;
    lowered.rlim_cur = std::min<rlim_t>(saved_.rlim_cur, open_fds() + headroom);
    require(setrlimit(RLIMIT_NOFILE, &lowered) == 0, "setrlimit(RLIMIT_NOFILE) failed");
    limit_ = lowered.rlim_cur;
  }
  ~FdLimit() { setrlimit(RLIMIT_NOFILE, &saved_); }
  FdLimit(const FdLimit&) = delete;
  FdLimit& operator=(const FdLimit&) = delete;
  [[nodiscard]] rlim_t limit() const { return limit_; }

 private:
  rlimit saved_{};
  rlim_t limit_ = 0;
};

Config ungrouped_config() {
  Config config = test_config(1);
  config.ngroups = 0;
  config.connect_timeout_ms = 10000;  // a connect nobody answers fails in bounded time
  config.peer_timeout_ms = 5000;      // as does a request whose peer cannot be reached
  return config;
}

std::size_t many_size(std::size_t comm) {
  return comm % 2 == 0 ? 3000 + comm : 100000 + comm;  // eager and rendezvous
}

// An Error from running out must say what failed: the operation and the provider's reason.
void check_error_text(const std::string& what) {
  require(what.size() > 20 && (mentions(what, "fi_") || mentions(what, "refused") ||
                               mentions(what, "LOOM_CONNECT_TIMEOUT_MS")),
          "unclear error: \"" + what + "\"");
}

// Waits for `request` (bounded): kOk, or a failure whose text says what ran out or that the
// peer could not be reached. Returns whether it succeeded.
bool settle(Communicator& comm, Request request, const std::string& what, std::string& failure) {
  bool done = false;
  Status status = Status::kOk;
  poll_until([&] { return done || status != Status::kOk; },
             [&] { status = test_once(comm, request, done, {}); }, what, 30s);
  if (status == Status::kOk) return true;
  failure = what + ": " + std::string(to_string(status)) + ": " + comm.last_error();
  require(mentions(comm.last_error(), "Too many open files") || mentions(comm.last_error(), "peer"),
          "unclear failure: " + failure);
  return false;
}

// What one side saw: whether setup stopped on an error (then data-path failures that name the
// exhausted resource or the unreachable peer are allowed), and how the messages went.
struct ManySide {
  bool exhausted = false;
  std::size_t moved = 0;
  std::size_t failed = 0;
  std::string first_failure;
};

void report(const char* role, const ManySide& side) {
  std::fprintf(stderr, "ungrouped %s: %zu moved bytes, %zu failed%s%s\n", role, side.moved,
               side.failed, side.failed ? ", first: " : "", side.first_failure.c_str());
}

void many_receiver(Channel& channel) {
  auto limit = std::make_optional<FdLimit>(kFdHeadroom);
  Context context(ungrouped_config());
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  std::vector<std::vector<std::byte>> buffers(kMany);
  std::vector<std::unique_ptr<RecvComm>> comms;
  ManySide side;
  std::string accept_error;
  for (;;) {
    // Accept until the sender says how its connect went.
    std::unique_ptr<RecvComm> comm;
    poll_until([&] { return channel.readable(); },
               [&] {
                 if (comm || !accept_error.empty()) return;
                 try {
                   comm = listener.accept();
                 } catch (const Error& e) {
                   accept_error = e.what();
                 }
               },
               "the sender's verdict", 60s);
    const auto verdict = channel.recv_value<std::uint32_t>();
    if (verdict == kConnectFailed) side.exhausted = true;
    if (verdict != kConnected) break;
    if (!comm) comm = accept_one(listener, 30s);
    comms.push_back(std::move(comm));
  }
  if (!accept_error.empty()) {
    std::fprintf(stderr, "ungrouped: accept %zu failed: %s\n", comms.size() + 1,
                 accept_error.c_str());
    check_error_text(accept_error);
  }
  require(context.stats().lanes.size() == comms.size(), "a lane per communicator");
  if (kSanitized) limit.reset();
  // One message per communicator, all posted at once.
  std::vector<Request> requests(comms.size());
  std::vector<MemoryRegion> regions(comms.size());
  for (std::size_t i = 0; i < comms.size(); ++i) {
    buffers[i].resize(many_size(i));
    regions[i] = comms[i]->register_memory(buffers[i].data(), buffers[i].size());
    RecvBuffer b{buffers[i].data(), buffers[i].size(), static_cast<Tag>(i), regions[i]};
    require(post_into(comms[i]->irecv({&b, 1}), requests[i]) == Status::kOk,
            comms[i]->last_error());
  }
  for (std::size_t i = 0; i < comms.size(); ++i) {
    std::string failure;
    if (settle(*comms[i], requests[i], "receive on comm " + std::to_string(i), failure)) {
      auto error = check_pattern(buffers[i], 0xC0000 + i);
      require(error.empty(), "comm " + std::to_string(i) + ": " + error);
      ++side.moved;
    } else {
      if (side.failed++ == 0) side.first_failure = failure;
    }
  }
  report("receiver", side);
  require(side.exhausted || side.failed == 0, "nothing ran out, yet a receive failed");
  channel.send_value<std::uint64_t>(side.moved);
  channel.barrier();
  for (auto& comm : comms) comm->close();
  comms.clear();
  require(context.stats().lanes.empty(), "lanes left after closing");
  // With the descriptors back, the same context and listener give a working communicator.
  limit.reset();
  channel.barrier();
  auto again = accept_one(listener);
  std::vector<std::byte> buffer(70000);
  const CloseOnUnwind guard{again.get()};
  MemoryRegion region = again->register_memory(buffer.data(), buffer.size());
  RecvBuffer b{buffer.data(), buffer.size(), 77, region};
  Request request;
  require(post_into(again->irecv({&b, 1}), request) == Status::kOk, again->last_error());
  require(finish(*again, request) == buffer.size(), "size after recovery");
  require(check_pattern(buffer, 0xC1000).empty(), "bytes after recovery");
  channel.barrier();
}

void many_sender(Channel& channel) {
  auto limit = std::make_optional<FdLimit>(kFdHeadroom);
  Context context(ungrouped_config());
  const Handle handle = recv_handle(channel);
  const std::size_t rss_before = rss();
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::vector<std::byte>> buffers(kMany);
  std::vector<std::unique_ptr<SendComm>> comms;
  ManySide side;
  std::string stopped = "all " + std::to_string(kMany) + " connected";
  while (comms.size() < kMany) {
    if (rss() > rss_before + kMemoryBudget ||
        std::chrono::steady_clock::now() > start + kSetupBudget) {
      stopped = "stopped at the memory or time budget";
      channel.send_value<std::uint32_t>(kBudget);
      break;
    }
    try {
      comms.push_back(connect_one(context, handle, 30s));
    } catch (const Error& e) {
      stopped = std::string("connect failed: ") + e.what();
      check_error_text(e.what());
      side.exhausted = true;
      channel.send_value<std::uint32_t>(kConnectFailed);
      break;
    }
    channel.send_value<std::uint32_t>(kConnected);
  }
  std::fprintf(stderr,
               "ungrouped: %zu communicators (fd limit %llu, %zu fds open, RSS +%zu MiB, "
               "%.1f s): %s\n",
               comms.size(), static_cast<unsigned long long>(limit->limit()), open_fds(),
               (rss() - rss_before) >> 20,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
               stopped.c_str());
  require(!comms.empty(), "not even one communicator");
  if (kSanitized) limit.reset();
  std::vector<Request> requests(comms.size());
  for (std::size_t i = 0; i < comms.size(); ++i) {
    buffers[i].resize(many_size(i));
    fill_pattern(buffers[i], 0xC0000 + i);
    MemoryRegion region = comms[i]->register_memory(buffers[i].data(), buffers[i].size());
    require(post_into(
                comms[i]->isend(buffers[i].data(), buffers[i].size(), static_cast<Tag>(i), region),
                requests[i]) == Status::kOk,
            comms[i]->last_error());
  }
  for (std::size_t i = 0; i < comms.size(); ++i) {
    std::string failure;
    if (settle(*comms[i], requests[i], "send on comm " + std::to_string(i), failure)) {
      ++side.moved;
    } else if (side.failed++ == 0) {
      side.first_failure = failure;
    }
  }
  report("sender", side);
  require(side.exhausted || side.failed == 0, "nothing ran out, yet a send failed");
  const auto received = channel.recv_value<std::uint64_t>();
  require(received <= side.moved, "the receiver got more messages than were sent");
  channel.barrier();
  for (auto& comm : comms) comm->close();
  comms.clear();
  limit.reset();
  channel.barrier();
  auto again = connect_one(context, handle);
  std::vector<std::byte> buffer(70000);
  const CloseOnUnwind guard{again.get()};
  fill_pattern(buffer, 0xC1000);
  MemoryRegion region = again->register_memory(buffer.data(), buffer.size());
  Request request;
  require(post_into(again->isend(buffer.data(), buffer.size(), 77, region), request) == Status::kOk,
          again->last_error());
  finish(*again, request);
  channel.barrier();
}

// ---- tiny provider queues -------------------------------------------------------------------

// Queue sizes are the providers' (loom clamps its depths to what they offer) and libfabric reads
// them once per process: the case runs again in a fresh process with these set.
constexpr const char* kTinyQueuesMarker = "EXHAUSTION_TINY_QUEUES";
constexpr const char* kTinyQueues[] = {"FI_SHM_RX_SIZE=16", "FI_SHM_TX_SIZE=16",
                                       "FI_OFI_RXM_RX_SIZE=16", "FI_OFI_RXM_TX_SIZE=16"};
constexpr auto kTinyTimeout = std::chrono::seconds(240);

// Runs this test binary on `test_name` with `extra` added to the environment; returns "" when it
// passed, else how it ended.
std::string run_self(const char* test_name, std::span<const char* const> extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  for (const char* add : extra) {
    const std::string_view name(add, std::strchr(add, '=') - add + 1);
    std::erase_if(env, [&](const std::string& e) { return e.starts_with(name); });
    env.emplace_back(add);
  }
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string name = test_name;
  std::string warn = "--warn", no_tests = "NoTests";
  char* argv[] = {name.data(), name.data(), warn.data(), no_tests.data(), nullptr};
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child < 0) return "fork failed";
  if (child == 0) {
    execve("/proc/self/exe", argv, envp.data());
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + kTinyTimeout;
  int status = 0;
  while (waitpid(child, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      return "timed out and was killed";
    }
    std::this_thread::sleep_for(10ms);
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  return WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                             : "exited with " + std::to_string(WEXITSTATUS(status));
}

}  // namespace

TEST_CASE("p2p exhaustion: requests beyond the pool are refused with kRetry and then all complete",
          "[exhaustion]") {
  auto failure =
      run_pair([](Channel& c) { pool_receiver(c, 1); }, [](Channel& c) { pool_sender(c, 1); });
  INFO(failure);
  REQUIRE(failure.empty());
}

TEST_CASE(
    "p2p exhaustion: a full pool refuses an isend, which sends nothing, but not a send done at its "
    "post",
    "[exhaustion]") {
  auto failure = run_pair(refusal_receiver, refusal_sender);
  INFO(failure);
  REQUIRE(failure.empty());
}

TEST_CASE("p2p exhaustion: 4 communicators fill their pools on one lane past its queue depths",
          "[exhaustion]") {
  auto failure =
      run_pair([](Channel& c) { pool_receiver(c, 4); }, [](Channel& c) { pool_sender(c, 4); });
  INFO(failure);
  REQUIRE(failure.empty());
}

TEST_CASE("p2p exhaustion: up to 200 communicators without grouping under a descriptor limit",
          "[exhaustion]") {
  auto failure = run_pair(many_receiver, many_sender, 300s);
  INFO(failure);
  REQUIRE(failure.empty());
}

// Depth 16 on every rail (the bootstrap's, the control channel's and the data rails'): loom posts
// what fits, waits for room for the rest, and the pool cases above still deliver every byte.
TEST_CASE("p2p exhaustion: provider queues 16 deep still carry every message", "[exhaustion]") {
  constexpr const char* kName = "p2p exhaustion: provider queues 16 deep still carry every message";
  if (std::getenv(kTinyQueuesMarker) == nullptr) {
    std::vector<const char*> extra(std::begin(kTinyQueues), std::end(kTinyQueues));
    const std::string marker = std::string(kTinyQueuesMarker) + "=1";
    extra.push_back(marker.c_str());
    const std::string outcome = run_self(kName, extra);
    INFO("the run with queues 16 deep " << outcome);
    REQUIRE(outcome.empty());
    return;
  }
  for (std::size_t comms : {1, 4}) {
    INFO(comms << " communicator(s)");
    auto failure = run_pair([&](Channel& c) { pool_receiver(c, comms); },
                            [&](Channel& c) { pool_sender(c, comms); });
    INFO(failure);
    REQUIRE(failure.empty());
  }
}

}  // namespace loom::test
