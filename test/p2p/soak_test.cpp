// Soak: 8 communicators to one peer sharing 2 lanes (LOOM_NGROUPS=2) over 2 data rails carry
// messages of random sizes from 0 B to SOAK_MAX_BYTES (log-uniform, so small and large both
// come up; eager and rendezvous interleave), SOAK_MESSAGES per communicator, a window of 16
// in flight on each. Every byte is verified, the n-th message must land in the n-th buffer,
// both sides' counts, byte totals and checksums must agree, and resident memory must stay flat
// once the pipes are full. scripts/soak.sh runs it long in a release build.
//
// The variables are not LOOM_* ones: Config::from_env() refuses LOOM_* names it does not know.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <unistd.h>

#include "support/p2p_pair.hpp"
#include "support/pattern.hpp"

namespace loom::test {
namespace {

constexpr std::size_t kComms = 8;
constexpr unsigned kGroups = 2;
constexpr unsigned kRails = 2;
constexpr std::size_t kWindow = 16;  // requests in flight per communicator
constexpr std::size_t kDefaultMessages = 300;
constexpr std::size_t kDefaultMaxBytes = 8u << 20;
// Resident memory may grow this much between the end of the warm-up and the end of the run
// (allocator noise, lazily grown provider pools); a leak per message exceeds it quickly.
constexpr std::size_t kRssSlack = 64u << 20;
// Over the whole run, beyond the buffers: the first messages also open what the provider sets
// up lazily (tcp;ofi_rxm connects each rail and allocates its buffers then: ~115 MiB here).
constexpr std::size_t kRssFirstUse = 256u << 20;
// No message completes on any communicator for this long: the run is stuck.
constexpr auto kStall = std::chrono::seconds(60);
constexpr std::uint64_t kSourceSeed = 0x50A6;
constexpr std::byte kGuard{0xE7};

std::size_t env_size(const char* name, std::size_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  std::size_t value = std::strtoull(text, &end, 10);
  switch (*end) {
    case 'k':
      value <<= 10, ++end;
      break;
    case 'm':
      value <<= 20, ++end;
      break;
    case 'g':
      value <<= 30, ++end;
      break;
    default:
      break;
  }
  require(*end == '\0' && end != text, std::string(name) + "=" + text + " is not a size");
  return value;
}

struct Settings {
  std::size_t messages = env_size("SOAK_MESSAGES", kDefaultMessages);  // per communicator
  std::size_t max_bytes = env_size("SOAK_MAX_BYTES", kDefaultMaxBytes);
};

std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// What both sides agree on for message `index` of communicator `comm`.
struct Message {
  std::size_t size = 0;
  std::size_t offset = 0;  // where its bytes start in the source stream
  Tag tag = 0;
  std::size_t slack = 0;  // the receive buffer is this much larger than the message
};

// Sizes are log-uniform over [0, max]: (max + 1)^u - 1 for u uniform in [0, 1), so every
// octave is as likely as any other and about 1 in 23 messages is empty (max = 8 MiB). The
// first two messages of communicator 0 are 0 B and the maximum, so both ends always occur.
// The content is the source stream from an offset seeded by (comm, index): a message landing
// in another's buffer, shifted or cut short, cannot match.
Message plan(const Settings& settings, std::size_t comm, std::size_t index) {
  const std::uint64_t r = mix((comm << 40) ^ index);
  const double u = static_cast<double>(r >> 11) * 0x1.0p-53;
  Message m;
  m.size = static_cast<std::size_t>(std::pow(static_cast<double>(settings.max_bytes) + 1.0, u)) - 1;
  if (comm == 0 && index < 2) m.size = index == 0 ? 0 : settings.max_bytes;
  m.size = std::min(m.size, settings.max_bytes);
  const std::uint64_t s = mix(r);
  m.offset = static_cast<std::size_t>(s % (settings.max_bytes + 1));
  m.tag = static_cast<Tag>(s >> 32);
  m.slack = (s & 3) == 0 ? 64 : 0;
  return m;
}

// Both sides hold the same never-zero source stream, twice the largest message long.
std::vector<std::byte> source_stream(const Settings& settings) {
  std::vector<std::byte> source(2 * settings.max_bytes + 1);
  fill_pattern(source, kSourceSeed);
  return source;
}

// Fletcher-style sums over 8-byte words (cheap enough for tens of GB), folded per message with
// its communicator and index so that order matters too.
std::uint64_t digest(const std::byte* data, std::size_t size) {
  std::uint64_t a = size, b = 0;
  std::size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, data + i, 8);
    a += w;
    b += a;
  }
  for (; i < size; ++i) {
    a += static_cast<std::uint64_t>(data[i]);
    b += a;
  }
  return mix(a) ^ b;
}

std::uint64_t fold(std::uint64_t sum, std::size_t comm, std::size_t index, std::uint64_t d) {
  return sum + mix(d ^ (comm << 48) ^ index);
}

// Throws unless `status` is kOk; the text is built only then (this runs once per poll).
template <typename Describe>
void expect_ok(Status status, const Communicator& comm, const Describe& describe) {
  if (status != Status::kOk) [[unlikely]] {
    throw Failure(describe() + ": " + std::string(to_string(status)) + ": " + comm.last_error());
  }
}

std::size_t resident_bytes() {
  std::FILE* statm = std::fopen("/proc/self/statm", "r");
  if (statm == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  const int read = std::fscanf(statm, "%lu %lu", &size, &resident);
  std::fclose(statm);
  return read == 2 ? resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE)) : 0;
}

// What each side measured; the sender sends its own to the receiver at the end.
struct Summary {
  std::uint64_t messages = 0;
  std::uint64_t bytes = 0;
  std::uint64_t checksum = 0;
  std::uint64_t rss_start = 0;  // after setup, before the buffers
  std::uint64_t rss_warm = 0;   // once every communicator finished its first windows
  std::uint64_t rss_end = 0;
  std::uint64_t buffers = 0;  // bytes of buffers the test allocated
  double seconds = 0;
};

Config soak_config() {
  Config config = test_config(kRails);
  config.ngroups = kGroups;
  return config;
}

// A FIFO ring in one registered slab per receive communicator: messages complete in order, so
// buffers are freed in the order they were taken.
class Ring {
 public:
  explicit Ring(std::size_t bytes) : slab_(bytes) {}
  std::vector<std::byte>& slab() { return slab_; }

  // Offset of `size` free bytes, or SIZE_MAX when the ring is too full.
  std::size_t take(std::size_t size) {
    if (size == 0) return 0;  // holds nothing
    std::size_t at = head_;
    if (!used_.empty()) {
      const std::size_t tail = used_.front().first;
      const bool wrapped = used_.back().first < tail;
      if (wrapped) {
        if (head_ + size > tail) return SIZE_MAX;
      } else if (head_ + size > slab_.size()) {
        if (size > tail) return SIZE_MAX;
        at = 0;
      }
    } else if (head_ + size > slab_.size()) {
      at = 0;
    }
    used_.emplace_back(at, size);
    head_ = at + size;
    return at;
  }
  void give_back(std::size_t size) {
    if (size == 0) return;
    used_.pop_front();
    if (used_.empty()) head_ = 0;
  }

 private:
  std::vector<std::byte> slab_;
  std::deque<std::pair<std::size_t, std::size_t>> used_;  // offset, size
  std::size_t head_ = 0;
};

struct Slot {
  Request request;
  std::size_t index = 0;
  std::size_t offset = 0;  // in the ring (receiver)
  std::size_t capacity = 0;
};

void warmed(Summary& summary, const std::vector<std::size_t>& completed, std::size_t target) {
  if (summary.rss_warm != 0) return;
  for (std::size_t c : completed)
    if (c < target) return;
  summary.rss_warm = resident_bytes();
}

void stalled(std::chrono::steady_clock::time_point last_progress, const std::string& role,
             const std::vector<std::size_t>& completed) {
  if (std::chrono::steady_clock::now() - last_progress < kStall) return;
  std::string counts;
  for (std::size_t c : completed) counts += " " + std::to_string(c);
  throw Failure(role + ": no message completed for 60 s; completed per comm:" + counts);
}

void soak_receiver(Channel& channel, const Settings& settings, Summary& summary, Summary& peer) {
  Context context(soak_config());
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  std::vector<std::unique_ptr<RecvComm>> comms;
  // The sender connects one communicator at a time: the n-th accepted is its n-th.
  for (std::size_t c = 0; c < kComms; ++c) {
    comms.push_back(accept_one(listener));
    channel.barrier();
  }
  summary.rss_start = resident_bytes();
  const std::vector<std::byte> source = source_stream(settings);
  // Room for a window's worth of average messages and always for the largest one.
  const std::size_t ring_bytes = 4 * (settings.max_bytes + 64);
  std::vector<Ring> rings;
  std::vector<MemoryRegion> regions(kComms);
  rings.reserve(kComms);
  for (std::size_t c = 0; c < kComms; ++c) {
    rings.emplace_back(ring_bytes);
    std::fill(rings[c].slab().begin(), rings[c].slab().end(), kGuard);
    regions[c] = comms[c]->register_memory(rings[c].slab().data(), ring_bytes);
  }
  const CloseOnUnwind guard{comms};  // before the rings and the source are freed
  summary.buffers = source.size() + kComms * ring_bytes;
  std::vector<std::deque<Slot>> inflight(kComms);
  std::vector<std::size_t> posted(kComms, 0), completed(kComms, 0);
  std::size_t done_comms = 0;
  channel.barrier();
  const auto start = std::chrono::steady_clock::now();
  auto last_progress = start;
  while (done_comms < kComms) {
    for (std::size_t c = 0; c < kComms; ++c) {
      RecvComm& comm = *comms[c];
      // Keep the window full while the ring has room.
      while (posted[c] < settings.messages && inflight[c].size() < kWindow) {
        const Message m = plan(settings, c, posted[c]);
        const std::size_t capacity = m.size + m.slack;
        const std::size_t at = rings[c].take(capacity);
        if (at == SIZE_MAX) break;
        RecvBuffer buffer{rings[c].slab().data() + at, capacity, m.tag, regions[c]};
        Request request;
        expect_ok(post_into(comm.irecv({&buffer, 1}), request), comm, [&] {
          return "comm " + std::to_string(c) + " irecv " + std::to_string(posted[c]);
        });
        inflight[c].push_back(Slot{request, posted[c]++, at, capacity});
      }
      if (inflight[c].empty()) continue;
      Slot& slot = inflight[c].front();
      bool done = false;
      std::size_t delivered = 0;
      const Status status = test_once(comm, slot.request, done, {&delivered, 1});
      const Message m = plan(settings, c, slot.index);
      auto what = [&] {
        return "comm " + std::to_string(c) + " message " + std::to_string(slot.index) + " (" +
               std::to_string(m.size) + " bytes)";
      };
      expect_ok(status, comm, what);
      if (!done) continue;
      if (delivered != m.size) throw Failure(what() + " delivered as " + std::to_string(delivered));
      std::byte* data = rings[c].slab().data() + slot.offset;
      if (std::memcmp(data, source.data() + m.offset, m.size) != 0) {
        std::size_t at = 0;
        while (data[at] == source[m.offset + at]) ++at;
        throw Failure(what() + ": byte " + std::to_string(at) + " differs");
      }
      // Nothing past the message was written; the guard goes back for the ring's next use.
      for (std::size_t i = m.size; i < slot.capacity; ++i) {
        if (data[i] != kGuard) {
          throw Failure(what() + ": byte " + std::to_string(i) + " past the message was written");
        }
      }
      summary.checksum = fold(summary.checksum, c, slot.index, digest(data, m.size));
      std::fill(data, data + m.size, kGuard);
      summary.bytes += m.size;
      ++summary.messages;
      rings[c].give_back(slot.capacity);
      inflight[c].pop_front();
      last_progress = std::chrono::steady_clock::now();
      if (++completed[c] == settings.messages) ++done_comms;
      warmed(summary, completed, std::min(settings.messages, 4 * kWindow));
    }
    stalled(last_progress, "receiver", completed);
  }
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  summary.rss_end = resident_bytes();
  std::uint64_t eager = 0, rendezvous = 0;
  for (auto& comm : comms) {
    const CommStats stats = comm->stats();
    eager += stats.eager;
    rendezvous += stats.rendezvous;
    require(stats.lane_comms == kComms / kGroups,
            "a receive lane carries " + std::to_string(stats.lane_comms) + " communicators");
  }
  require(eager > 0 && (rendezvous > 0 || settings.max_bytes <= context.config().eager_max),
          "both protocols should have run: eager " + std::to_string(eager) + ", rendezvous " +
              std::to_string(rendezvous));
  peer = channel.recv_value<Summary>();
  channel.barrier();
  for (auto& comm : comms) comm->close();
}

void soak_sender(Channel& channel, const Settings& settings, Summary& summary) {
  Context context(soak_config());
  const Handle handle = recv_handle(channel);
  std::vector<std::unique_ptr<SendComm>> comms;
  for (std::size_t c = 0; c < kComms; ++c) {
    comms.push_back(connect_one(context, handle));
    channel.barrier();
  }
  summary.rss_start = resident_bytes();
  // Every message is a slice of one read-only stream: nothing to fill per message, so the
  // sender runs at the transport's pace.
  const std::vector<std::byte> source = source_stream(settings);
  summary.buffers = source.size();
  const CloseOnUnwind guard{comms};  // before the source is freed
  std::vector<MemoryRegion> regions(kComms);
  for (std::size_t c = 0; c < kComms; ++c) {
    regions[c] = comms[c]->register_memory(source.data(), source.size());
    require(
        comms[c]->stats().lane_comms == kComms / kGroups,
        "a send lane carries " + std::to_string(comms[c]->stats().lane_comms) + " communicators");
  }
  std::vector<std::deque<Slot>> inflight(kComms);
  std::vector<std::size_t> posted(kComms, 0), completed(kComms, 0);
  std::size_t done_comms = 0;
  channel.barrier();
  const auto start = std::chrono::steady_clock::now();
  auto last_progress = start;
  while (done_comms < kComms) {
    for (std::size_t c = 0; c < kComms; ++c) {
      SendComm& comm = *comms[c];
      while (posted[c] < settings.messages && inflight[c].size() < kWindow) {
        const Message m = plan(settings, c, posted[c]);
        Request request;
        expect_ok(
            post_into(comm.isend(source.data() + m.offset, m.size, m.tag, regions[c]), request),
            comm,
            [&] { return "comm " + std::to_string(c) + " isend " + std::to_string(posted[c]); });
        inflight[c].push_back(Slot{request, posted[c]++, m.offset, m.size});
      }
      if (inflight[c].empty()) continue;
      Slot& slot = inflight[c].front();
      bool done = false;
      expect_ok(test_once(comm, slot.request, done, {}), comm, [&] {
        return "comm " + std::to_string(c) + " message " + std::to_string(slot.index);
      });
      if (!done) continue;
      summary.checksum =
          fold(summary.checksum, c, slot.index, digest(source.data() + slot.offset, slot.capacity));
      summary.bytes += slot.capacity;
      ++summary.messages;
      inflight[c].pop_front();
      last_progress = std::chrono::steady_clock::now();
      if (++completed[c] == settings.messages) ++done_comms;
      warmed(summary, completed, std::min(settings.messages, 4 * kWindow));
    }
    stalled(last_progress, "sender", completed);
  }
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  summary.rss_end = resident_bytes();
  channel.send_value(summary);
  channel.barrier();
  for (auto& comm : comms) comm->close();
}

void print(const char* role, const Summary& s) {
  constexpr double kMiB = 1024.0 * 1024.0;
  std::fprintf(stderr,
               "soak %-8s %llu messages, %.3f GB in %.2f s = %.2f GB/s; RSS start %.1f MiB, "
               "warm %.1f MiB, end %.1f MiB (buffers %.1f MiB)\n",
               role, static_cast<unsigned long long>(s.messages), s.bytes / 1e9, s.seconds,
               s.bytes / s.seconds / 1e9, s.rss_start / kMiB, s.rss_warm / kMiB, s.rss_end / kMiB,
               s.buffers / kMiB);
}

// Empty when resident memory stayed within bounds: over the whole run, no more than the
// buffers plus what first use sets up; after the warm-up, no more than the slack.
std::string rss_problem(const char* role, const Summary& s) {
  if (s.rss_end > s.rss_start + s.buffers + kRssFirstUse) {
    return std::string(role) + ": resident memory grew by " +
           std::to_string((s.rss_end - s.rss_start) >> 20) + " MiB with " +
           std::to_string(s.buffers >> 20) + " MiB of buffers";
  }
  if (s.rss_end > s.rss_warm + kRssSlack) {
    return std::string(role) + ": resident memory grew by " +
           std::to_string((s.rss_end - s.rss_warm) >> 20) + " MiB after the warm-up";
  }
  return {};
}

}  // namespace

TEST_CASE(
    "p2p soak: comms × messages of random sizes, checksummed, over 2 data rails with grouping",
    "[soak]") {
  const Settings settings;
  REQUIRE(settings.messages > 0);
  std::fprintf(stderr, "soak: %zu communicators x %zu messages of 0 B..%zu B, window %zu\n", kComms,
               settings.messages, settings.max_bytes, kWindow);
  Summary received, sent;
  auto failure =
      run_pair([&](Channel& channel) { soak_receiver(channel, settings, received, sent); },
               [&](Channel& channel) {
                 Summary summary;
                 soak_sender(channel, settings, summary);
               },
               300s);
  INFO(failure);
  REQUIRE(failure.empty());
  print("receiver", received);
  print("sender", sent);
  const std::uint64_t expected = kComms * settings.messages;
  CHECK(received.messages == expected);
  CHECK(sent.messages == expected);
  CHECK(received.bytes == sent.bytes);
  CHECK(received.checksum == sent.checksum);
  CHECK(rss_problem("receiver", received) == "");
  CHECK(rss_problem("sender", sent) == "");
}

}  // namespace loom::test
