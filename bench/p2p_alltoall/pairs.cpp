#include "p2p_alltoall/pairs.hpp"

#include <stdexcept>

#include "p2p_alltoall/traffic.hpp"

namespace loom::bench {
namespace {

constexpr Tag kPairsTag = 0xBA12;
constexpr std::uint64_t kPairsKind = 1;

}  // namespace

Pairs::Pairs(const AlltoallOptions& options, Mesh& mesh, std::size_t max_size)
    : options_(options),
      mesh_(mesh),
      max_size_(std::max<std::size_t>(max_size, 1)),
      window_(std::min(options.window, kMaxWindow)) {
  // Unverified, as fabtests: every message from one buffer into one. Verified: a buffer per
  // message in flight, per peer and direction.
  const std::size_t slots =
      options.verify ? static_cast<std::size_t>(mesh.size() - 1) * window_ : 1;
  send_buffer_.assign(slots * max_size_, std::byte{0x5A});
  recv_buffer_.assign(slots * max_size_, std::byte{0});
  send_region_ = mesh.context().register_memory(send_buffer_.data(), send_buffer_.size());
  recv_region_ = mesh.context().register_memory(recv_buffer_.data(), recv_buffer_.size());
}

std::byte* Pairs::slot(const Stream& stream, std::size_t message) const {
  const HostBuffer& buffer = stream.send ? send_buffer_ : recv_buffer_;
  if (!options_.verify) return buffer.data();
  // Peers in rank order without this one.
  const int me = mesh_.rank();
  const auto index = static_cast<std::size_t>(stream.peer < me ? stream.peer : stream.peer - 1);
  return buffer.data() + (index * window_ + message % window_) * max_size_;
}

void Pairs::check(const Stream& stream, std::size_t size, std::size_t message) const {
  const std::uint64_t key =
      pattern_key(kPairsKind, static_cast<std::uint64_t>(stream.peer),
                  static_cast<std::uint64_t>(mesh_.rank()), stream.key_base + message);
  if (const std::size_t at = pattern_mismatch(slot(stream, message), size, key); at != size) {
    throw std::runtime_error("pairs -v: message " + std::to_string(message) + " of " +
                             std::to_string(size) + " bytes from rank " +
                             std::to_string(stream.peer) + ": byte " + std::to_string(at) +
                             " differs");
  }
}

bool Pairs::advance(Stream& s, std::size_t size) {
  bool progressed = false;
  Communicator& comm = s.send ? static_cast<Communicator&>(mesh_.send(s.peer))
                              : static_cast<Communicator&>(mesh_.recv(s.peer));
  // Oldest first: requests finish mostly in order.
  while (s.done < s.posted) {
    const Status status = comm.test(s.ring[s.done % window_]);
    if (status == Status::kInProgress) break;
    if (status != Status::kOk) {
      throw std::runtime_error(std::string("pairs: ") + (s.send ? "send to" : "receive from") +
                               " rank " + std::to_string(s.peer) + ": " + comm.last_error());
    }
    if (!s.send && options_.verify) check(s, size, s.done);
    ++s.done;
    progressed = true;
    if (s.done == s.total) s.end = Clock::now();
  }
  while (s.posted < s.total && s.posted - s.done < window_) {
    std::byte* data = slot(s, s.posted);
    Posted posted;
    if (s.send) {
      if (options_.verify) {
        fill_pattern(data, size,
                     pattern_key(kPairsKind, static_cast<std::uint64_t>(mesh_.rank()),
                                 static_cast<std::uint64_t>(s.peer), s.key_base + s.posted));
      }
      posted = mesh_.send(s.peer).isend(data, size, kPairsTag, send_region_);
    } else {
      const RecvBuffer buffer{data, size, kPairsTag, recv_region_};
      posted = mesh_.recv(s.peer).irecv({&buffer, 1});
    }
    if (posted.status == Status::kRetry) break;
    if (posted.status != Status::kOk) {
      throw std::runtime_error(std::string("pairs: posting ") + (s.send ? "to" : "from") +
                               " rank " + std::to_string(s.peer) + ": " + comm.last_error());
    }
    s.ring[s.posted % window_] = posted.request;
    ++s.posted;
    progressed = true;
  }
  return progressed;
}

void Pairs::move(std::vector<Stream>& streams, std::size_t size, std::size_t count,
                 std::uint64_t phase) {
  for (Stream& s : streams) {
    s.total = count;
    s.posted = s.done = 0;
    s.key_base = (run_ << 40) | (phase << 32);
    if (count == 0) s.end = Clock::now();
  }
  std::size_t left = count == 0 ? 0 : streams.size();
  Pacer pacer(mesh_.yields(), std::chrono::seconds(options_.timeout_s), "pairs");
  while (left > 0) {
    bool progressed = false;
    for (Stream& s : streams) {
      if (s.done == s.total) continue;
      if (advance(s, size)) {
        progressed = true;
        if (s.done == s.total) --left;
      }
    }
    pacer.missing(left);
    pacer.pass(progressed);
  }
}

nlohmann::json Pairs::run(std::size_t size, bool at_once) {
  ++run_;
  const int n = mesh_.size();
  const int me = mesh_.rank();
  const std::size_t messages = pair_iterations(options_, size);
  std::vector<double> rates(static_cast<std::size_t>(n), 0.0);
  const double bytes = static_cast<double>(size) * static_cast<double>(messages);
  double received = 0, elapsed_s = 0;
  auto timed = [&](std::vector<Stream>& streams) {
    move(streams, size, options_.warmup, 0);
    const auto start = Clock::now();
    move(streams, size, messages, 1);
    for (const Stream& s : streams) {
      if (s.send) continue;
      const double us = micros_between(start, s.end);
      rates[static_cast<std::size_t>(s.peer)] = us > 0 ? bytes / us : 0;
      received += bytes;
      elapsed_s = std::max(elapsed_s, us / 1e6);
    }
  };
  if (at_once) {
    std::vector<Stream> streams;
    for (int d = 1; d < n; ++d) {
      streams.push_back({.peer = (me + d) % n, .send = true});
      streams.push_back({.peer = (me - d + n) % n, .send = false});
    }
    mesh_.world().barrier();
    timed(streams);
  } else {
    for (int from = 0; from < n; ++from) {
      for (int to = 0; to < n; ++to) {
        if (from == to) continue;
        mesh_.world().barrier();
        if (me != from && me != to) continue;
        std::vector<Stream> streams{{.peer = me == from ? to : from, .send = me == from}};
        timed(streams);
      }
    }
  }
  return {{"size", size},      {"messages", messages}, {"window", window_},
          {"mb_per_s", rates}, {"bytes", received},    {"elapsed_s", elapsed_s}};
}

}  // namespace loom::bench
