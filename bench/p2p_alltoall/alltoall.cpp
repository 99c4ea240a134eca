#include "p2p_alltoall/alltoall.hpp"

#include <stdexcept>

#include "p2p_alltoall/traffic.hpp"

namespace loom::bench {
namespace {

constexpr Tag kAlltoallTag = 0xA2A;
constexpr std::uint64_t kAlltoallKind = 2;

}  // namespace

Alltoall::Alltoall(const AlltoallOptions& options, Mesh& mesh, std::size_t max_size)
    : options_(options), mesh_(mesh), max_size_(std::max<std::size_t>(max_size, 1)) {
  const int n = mesh.size();
  const auto others = static_cast<std::size_t>(n - 1);
  send_buffer_.assign(others * max_size_, std::byte{0x5A});
  recv_buffer_.assign(others * max_size_, std::byte{0});
  send_region_ = mesh.context().register_memory(send_buffer_.data(), send_buffer_.size());
  recv_region_ = mesh.context().register_memory(recv_buffer_.data(), recv_buffer_.size());
  // Each rank starts with the next one up, so that no rank is everyone's first.
  for (int d = 1; d < n; ++d) {
    peers_.push_back({.rank = (mesh.rank() + d) % n, .slot = static_cast<std::size_t>(d - 1)});
  }
}

void Alltoall::post_receive(Peer& peer, std::size_t size, std::size_t iteration) {
  RecvComm& comm = mesh_.recv(peer.rank);
  const RecvBuffer buffer{recv_buffer_.data() + peer.slot * max_size_, size, kAlltoallTag,
                          recv_region_};
  auto [status, request] = comm.irecv({&buffer, 1});
  if (status != Status::kOk) {
    throw std::runtime_error("alltoall: irecv from rank " + std::to_string(peer.rank) + ": " +
                             comm.last_error());
  }
  peer.recv = request;
  peer.recv_iteration = iteration;
}

void Alltoall::check(const Peer& peer, std::size_t size, std::size_t iteration) const {
  const std::byte* data = recv_buffer_.data() + peer.slot * max_size_;
  const std::uint64_t key = pattern_key(kAlltoallKind, static_cast<std::uint64_t>(peer.rank),
                                        static_cast<std::uint64_t>(mesh_.rank()), iteration);
  if (const std::size_t at = pattern_mismatch(data, size, key); at != size) {
    throw std::runtime_error(
        "alltoall -v: " + std::to_string(size) + " bytes from rank " + std::to_string(peer.rank) +
        ", iteration " + std::to_string(iteration) + ": byte " + std::to_string(at) + " differs");
  }
}

nlohmann::json Alltoall::run(std::size_t size) {
  const std::size_t iterations = alltoall_iterations(options_, size);
  const std::size_t total = options_.warmup + iterations;
  const auto me = static_cast<std::uint64_t>(mesh_.rank());
  std::vector<double> samples;
  samples.reserve(iterations);
  for (Peer& peer : peers_) post_receive(peer, size, 0);
  mesh_.world().barrier();
  for (std::size_t it = 0; it < total; ++it) {
    if (options_.verify) {
      for (const Peer& peer : peers_) {
        fill_pattern(send_buffer_.data() + peer.slot * max_size_, size,
                     pattern_key(kAlltoallKind, me, static_cast<std::uint64_t>(peer.rank), it));
      }
    }
    const auto start = Clock::now();
    for (Peer& peer : peers_) {
      SendComm& comm = mesh_.send(peer.rank);
      auto [status, request] =
          comm.isend(send_buffer_.data() + peer.slot * max_size_, size, kAlltoallTag, send_region_);
      if (status != Status::kOk) {
        throw std::runtime_error("alltoall: isend to rank " + std::to_string(peer.rank) + ": " +
                                 comm.last_error());
      }
      peer.send = request;
      peer.received = false;
    }
    std::size_t left = 2 * peers_.size();
    Pacer pacer(mesh_.yields(), std::chrono::seconds(options_.timeout_s), "alltoall");
    while (left > 0) {
      bool progressed = false;
      for (Peer& peer : peers_) {
        if (peer.send.valid()) {
          SendComm& comm = mesh_.send(peer.rank);
          const Status status = comm.test(peer.send);
          if (status != Status::kInProgress) {
            if (status != Status::kOk) {
              throw std::runtime_error("alltoall: send to rank " + std::to_string(peer.rank) +
                                       ": " + comm.last_error());
            }
            peer.send = Request{};
            --left;
            progressed = true;
          }
        }
        if (!peer.received) {
          RecvComm& comm = mesh_.recv(peer.rank);
          const Status status = comm.test(peer.recv);
          if (status != Status::kInProgress) {
            if (status != Status::kOk) {
              throw std::runtime_error("alltoall: receive from rank " + std::to_string(peer.rank) +
                                       ": " + comm.last_error());
            }
            if (options_.verify) check(peer, size, it);
            peer.received = true;
            --left;
            progressed = true;
            // The peer's next message finds its buffer posted.
            if (it + 1 < total) post_receive(peer, size, it + 1);
          }
        }
      }
      pacer.missing(left);
      pacer.pass(progressed);
    }
    if (it >= options_.warmup) samples.push_back(micros_between(start, Clock::now()));
  }
  double sum_us = 0;
  for (double s : samples) sum_us += s;
  const double bytes = static_cast<double>(size) * static_cast<double>(peers_.size()) *
                       static_cast<double>(iterations);
  nlohmann::json row = {{"size", size},
                        {"iterations", iterations},
                        {"seconds", sum_us / 1e6},
                        {"mean_us", iterations ? sum_us / static_cast<double>(iterations) : 0.0},
                        {"mb_per_s", sum_us > 0 ? bytes / sum_us : 0.0},
                        {"samples_us", samples}};
  row["p50_us"] = percentile(samples, 50);
  row["p99_us"] = percentile(samples, 99);
  return row;
}

}  // namespace loom::bench
