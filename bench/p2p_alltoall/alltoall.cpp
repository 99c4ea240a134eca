#include "p2p_alltoall/alltoall.hpp"

#include <stdexcept>

namespace loom::bench {
namespace {

constexpr Tag kAlltoallTag = 0xA2A;
constexpr std::uint64_t kAlltoallKind = 2;

}  // namespace

Alltoall::Alltoall(const AlltoallOptions& options, Mesh& mesh, std::size_t max_size)
    : options_(options),
      mesh_(mesh),
      max_size_(std::max<std::size_t>(max_size, 1)),
      ring_(options.depth + 1) {
  const int n = mesh.size();
  // Unverified, as fabtests and fi_p2p_bw: every message from one buffer and into one, so that
  // the figures compare with theirs. Verified: a slot per peer and iteration in flight each way.
  const std::size_t slots = options.verify ? static_cast<std::size_t>(n - 1) * ring_ : 1;
  send_buffer_.assign(slots * max_size_, std::byte{0x5A});
  recv_buffer_.assign(slots * max_size_, std::byte{0});
  send_region_ = mesh.context().register_memory(send_buffer_.data(), send_buffer_.size());
  recv_region_ = mesh.context().register_memory(recv_buffer_.data(), recv_buffer_.size());
  // Each rank starts with the next one up, so that no rank is everyone's first.
  for (int d = 1; d < n; ++d) {
    Peer peer;
    peer.rank = (mesh.rank() + d) % n;
    peer.index = static_cast<std::size_t>(d - 1);
    peer.sends.resize(ring_);
    peer.recvs.resize(ring_);
    peers_.push_back(std::move(peer));
  }
  rounds_.resize(ring_);
}

std::byte* Alltoall::slot(const HostBuffer& buffer, const Peer& peer, std::size_t iteration) const {
  if (!options_.verify) return buffer.data();
  return buffer.data() + (peer.index * ring_ + iteration % ring_) * max_size_;
}

void Alltoall::post_receives(std::size_t size, std::size_t iteration) {
  rounds_[iteration % ring_] = Round{.left = 2 * peers_.size()};
  for (Peer& peer : peers_) {
    RecvComm& comm = mesh_.recv(peer.rank);
    const RecvBuffer buffer{slot(recv_buffer_, peer, iteration), size, kAlltoallTag, recv_region_};
    auto [status, request] = comm.irecv({&buffer, 1});
    if (status != Status::kOk) {
      throw std::runtime_error("alltoall: irecv from rank " + std::to_string(peer.rank) + ": " +
                               comm.last_error());
    }
    peer.recvs[iteration % ring_] = request;
  }
}

void Alltoall::post_sends(std::size_t size, std::size_t iteration) {
  const auto me = static_cast<std::uint64_t>(mesh_.rank());
  if (options_.verify) {
    for (const Peer& peer : peers_) {
      fill_pattern(
          slot(send_buffer_, peer, iteration), size,
          pattern_key(kAlltoallKind, me, static_cast<std::uint64_t>(peer.rank), iteration));
    }
  }
  rounds_[iteration % ring_].start = Clock::now();
  for (Peer& peer : peers_) {
    SendComm& comm = mesh_.send(peer.rank);
    auto [status, request] =
        comm.isend(slot(send_buffer_, peer, iteration), size, kAlltoallTag, send_region_);
    if (status != Status::kOk) {
      throw std::runtime_error("alltoall: isend to rank " + std::to_string(peer.rank) + ": " +
                               comm.last_error());
    }
    peer.sends[iteration % ring_] = request;
  }
}

void Alltoall::finish(std::size_t iteration) {
  Round& round = rounds_[iteration % ring_];
  if (--round.left == 0) round.end = Clock::now();
}

bool Alltoall::progress(std::size_t size, std::size_t sends_posted, std::size_t recvs_posted) {
  bool progressed = false;
  for (Peer& peer : peers_) {
    // Oldest first: a communicator's requests finish mostly in order.
    while (peer.sends_done < sends_posted) {
      SendComm& comm = mesh_.send(peer.rank);
      const Status status = comm.test(peer.sends[peer.sends_done % ring_]);
      if (status == Status::kInProgress) break;
      if (status != Status::kOk) {
        throw std::runtime_error("alltoall: send to rank " + std::to_string(peer.rank) + ": " +
                                 comm.last_error());
      }
      finish(peer.sends_done++);
      progressed = true;
    }
    while (peer.recvs_done < recvs_posted) {
      RecvComm& comm = mesh_.recv(peer.rank);
      const Status status = comm.test(peer.recvs[peer.recvs_done % ring_]);
      if (status == Status::kInProgress) break;
      if (status != Status::kOk) {
        throw std::runtime_error("alltoall: receive from rank " + std::to_string(peer.rank) + ": " +
                                 comm.last_error());
      }
      if (options_.verify) check(peer, size, peer.recvs_done);
      finish(peer.recvs_done++);
      progressed = true;
    }
  }
  return progressed;
}

void Alltoall::check(const Peer& peer, std::size_t size, std::size_t iteration) const {
  const std::uint64_t key = pattern_key(kAlltoallKind, static_cast<std::uint64_t>(peer.rank),
                                        static_cast<std::uint64_t>(mesh_.rank()), iteration);
  const std::byte* data = slot(recv_buffer_, peer, iteration);
  if (const std::size_t at = pattern_mismatch(data, size, key); at != size) {
    throw std::runtime_error(
        "alltoall -v: " + std::to_string(size) + " bytes from rank " + std::to_string(peer.rank) +
        ", iteration " + std::to_string(iteration) + ": byte " + std::to_string(at) + " differs");
  }
}

nlohmann::json Alltoall::run(std::size_t size) {
  const std::size_t iterations = alltoall_iterations(options_, size);
  const std::size_t total = options_.warmup + iterations;
  const std::size_t depth = options_.depth;
  std::vector<double> samples;
  samples.reserve(iterations);
  for (Peer& peer : peers_) peer.sends_done = peer.recvs_done = 0;
  std::size_t done = 0, sends_posted = 0, recvs_posted = 0;
  Clock::time_point first{};
  mesh_.world().barrier();
  Pacer pacer(mesh_.yields(), std::chrono::seconds(options_.timeout_s), "alltoall");
  while (done < total) {
    bool progressed = false;
    // Receives one iteration ahead of the sends, so that a peer's next message finds its
    // buffer posted.
    while (recvs_posted < total && recvs_posted < done + depth + 1) {
      post_receives(size, recvs_posted++);
    }
    while (sends_posted < total && sends_posted < done + depth && sends_posted < recvs_posted) {
      if (sends_posted == options_.warmup) first = Clock::now();
      post_sends(size, sends_posted++);
    }
    progressed |= progress(size, sends_posted, recvs_posted);
    while (done < sends_posted && rounds_[done % ring_].left == 0) {
      const Round& round = rounds_[done % ring_];
      if (done >= options_.warmup) samples.push_back(micros_between(round.start, round.end));
      ++done;
      progressed = true;
    }
    pacer.missing(total - done);
    pacer.pass(progressed);
  }
  const double seconds = iterations ? micros_between(first, Clock::now()) / 1e6 : 0;
  double sum_us = 0;
  for (double s : samples) sum_us += s;
  const double bytes = static_cast<double>(size) * static_cast<double>(peers_.size()) *
                       static_cast<double>(iterations);
  nlohmann::json row = {{"size", size},
                        {"iterations", iterations},
                        {"depth", depth},
                        {"seconds", seconds},
                        {"mean_us", iterations ? sum_us / static_cast<double>(iterations) : 0.0},
                        {"mb_per_s", seconds > 0 ? bytes / seconds / 1e6 : 0.0},
                        {"samples_us", samples}};
  row["p50_us"] = percentile(samples, 50);
  row["p99_us"] = percentile(samples, 99);
  return row;
}

}  // namespace loom::bench
