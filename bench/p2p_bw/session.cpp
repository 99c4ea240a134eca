#include "p2p_bw/session.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>

namespace loom::bench {
namespace {

using Clock = std::chrono::steady_clock;

std::byte pattern(std::uint64_t message, std::size_t i) {
  return static_cast<std::byte>(((message * 131 + i * 7 + (i >> 9)) & 0xff) | 1);
}

// k % n without the division where n is 1 (one communicator, one buffer slot: the ping-pong's
// case). A 64-bit division takes tens of cycles, and a round of a ping-pong made four of them
// on its path, where fabtests' loop makes none.
std::size_t wrap(std::size_t k, std::size_t n) noexcept {
  return n == 1 ? 0 : k % n;
}

}  // namespace

Config make_config(const Options& options) {
  Config config = Config::from_env();
  if (!options.provider.empty()) config.provider = options.provider;
  if (options.rails != 0) config.data_rails = options.rails;
  if (options.ctrl_rails != 0) config.ctrl_rails = options.ctrl_rails;
  if (options.groups >= 0) config.ngroups = static_cast<unsigned>(options.groups);
  if (options.loopback) config.loopback_only = true;
  config.connect_timeout_ms = options.timeout_s * 1000;
  return config;
}

Session::Session(const Options& options, Oob& oob)
    : options_(options),
      oob_(oob),
      context_(std::make_unique<Context>(make_config(options))),
      send_buffer_(options.memory),
      recv_buffer_(options.memory) {}

Session::~Session() = default;

ProtocolCounts Session::protocol_counts() const {
  ProtocolCounts counts;
  const auto add = [&counts](const CommStats& stats) {
    counts.sent_ahead += stats.eager;
    counts.fragmented += stats.eager_fragmented;
    counts.written += stats.rendezvous;
    counts.asks += stats.asks_sent;
    counts.clear_to_sends += stats.cts_sent + stats.cts_carried;
    counts.carried += stats.cts_carried;
    counts.pushed_back += stats.control_pushed_back;
  };
  for (const auto& comm : send_) add(comm->stats());
  for (const auto& comm : recv_) add(comm->stats());
  return counts;
}

SetupFigures Session::connect_all() {
  Listener listener = context_->listen();
  oob_.send(listener.handle().view());
  const Handle peer = Handle::from_bytes(oob_.receive());
  const long rss_before = resident_kib();
  std::vector<double> times;
  const auto timeout = std::chrono::seconds(options_.timeout_s);
  // The client sends on N communicators; the server answers on one (window acks, ping-pong),
  // or on N with --bidir.
  const unsigned reverse = options_.bidir ? options_.comms : 1;
  // One communicator (each way) at a time, so each setup is timed alone; both sides drive
  // their connect and their accept in one loop, as any two ranks must.
  for (unsigned i = 0; i < options_.comms; ++i) {
    const bool want_out = options_.is_client() || i < reverse;
    const bool want_in = !options_.is_client() || i < reverse;
    std::optional<Connector> connector;
    if (want_out) connector.emplace(context_->connect(peer));
    std::unique_ptr<SendComm> out;
    std::unique_ptr<RecvComm> in;
    const auto start = Clock::now();
    double setup_us = 0;
    while ((want_out && !out) || (want_in && !in)) {
      if (want_out && !out && (out = connector->poll())) {
        setup_us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
      }
      if (want_in && !in && (in = listener.accept()) && !want_out) {
        setup_us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
      }
      if (Clock::now() - start > timeout) throw std::runtime_error("connect: peer did not answer");
    }
    times.push_back(setup_us);
    if (out) send_.push_back(std::move(out));
    if (in) recv_.push_back(std::move(in));
  }
  if (!send_.empty() && !options_.is_client()) {
    ack_send_region_ = send_[0]->register_memory(ack_.data(), ack_.size());
  }
  if (!recv_.empty() && options_.is_client()) {
    ack_recv_region_ = recv_[0]->register_memory(ack_.data(), ack_.size());
  }
  busy_pass_.assign(send_.size() + recv_.size(), 0);
  oob_.sync();
  SetupFigures figures;
  std::sort(times.begin(), times.end());
  figures.median_connect_us = times[times.size() / 2];
  figures.comms_held = send_.size() + recv_.size();
  figures.memory_per_comm_kib =
      static_cast<double>(resident_kib() - rss_before) / static_cast<double>(figures.comms_held);
  return figures;
}

void Session::prepare_buffers(std::size_t size) {
  if (size == prepared_size_) return;
  for (std::size_t i = 0; i < send_regions_.size(); ++i) send_[i]->deregister(send_regions_[i]);
  for (std::size_t i = 0; i < recv_regions_.size(); ++i) recv_[i]->deregister(recv_regions_[i]);
  send_regions_.clear();
  recv_regions_.clear();
  const std::size_t slot = std::max<std::size_t>(size, 1);
  // As fabtests does, every message of a window uses one buffer on each side; verified runs
  // need a buffer per message in flight (the server has two windows of receives posted).
  slots_ = options_.verify ? windows_posted() * options_.window : 1;
  send_buffer_.assign(slots_ * slot, std::byte{0x5A});
  recv_buffer_.assign(slots_ * slot, std::byte{0});
  staging_.resize(options_.verify && send_buffer_.on_device() ? slot : 0);
  for (auto& comm : send_) {
    send_regions_.push_back(comm->register_memory(send_buffer_.data(), send_buffer_.size(),
                                                  send_buffer_.type(), send_buffer_.device()));
  }
  for (auto& comm : recv_) {
    recv_regions_.push_back(comm->register_memory(recv_buffer_.data(), recv_buffer_.size(),
                                                  recv_buffer_.type(), recv_buffer_.device()));
  }
  prepared_size_ = size;
}

// Each communicator is tested once per pass while its oldest pending request is not done:
// testing its later ones in the same pass would read the same completion queue again for
// nothing (a system call on tcp; on shm a locked instruction on the line the sender writes).
void Session::wait_all(std::vector<Pending>& pending) {
  std::size_t left = pending.size();
  // A peer that stops answering becomes an error, not a hang.
  const auto patience = std::chrono::seconds(options_.timeout_s);
  // Read rarely, and not at all while messages finish within 255 passes: a ping-pong round
  // must not pay a clock read for it.
  Clock::time_point deadline = Clock::time_point::max();
  bool progressed = false;  // since the last look at the clock
  std::size_t first = 0;
  for (unsigned spins = 0; left > 0; ++spins) {
    if ((spins & 255) == 255) {
      const auto now = Clock::now();
      if (progressed || deadline == Clock::time_point::max()) deadline = now + patience;
      progressed = false;
      if (now > deadline) {
        throw std::runtime_error(std::to_string(left) + " message(s) made no progress for " +
                                 std::to_string(patience.count()) + " s");
      }
    }
    const std::uint64_t pass = ++pass_;
    // Requests finish mostly in order: a pass starts at the oldest one still pending.
    while (!pending[first].request.valid()) ++first;
    for (std::size_t k = first; k < pending.size(); ++k) {
      Pending& p = pending[k];
      if (!p.request.valid() || busy_pass_[p.comm_slot] == pass) continue;
      std::size_t delivered = 0;
      const Status status = p.comm->test(p.request, {&delivered, 1});
      if (status == Status::kInProgress) {
        busy_pass_[p.comm_slot] = pass;
        continue;
      }
      if (status != Status::kOk) {
        throw std::runtime_error("message " + std::to_string(p.index) + ": " +
                                 std::string(to_string(status)) + ": " + p.comm->last_error());
      }
      p.request = {};
      --left;
      progressed = true;
      if (p.data == nullptr) continue;  // a send, or the window ack
      if (recv_buffer_.on_device()) flush(p);
      if (options_.verify) {
        if (delivered != p.size) {
          throw std::runtime_error("verify: message " + std::to_string(p.index) + " delivered " +
                                   std::to_string(delivered) + " of " + std::to_string(p.size) +
                                   " bytes");
        }
        verify(p);
      }
    }
  }
  pending.clear();
}

void Session::post_sends(std::size_t first, std::size_t count, std::size_t size,
                         std::vector<Pending>& pending) {
  for (std::size_t k = first; k < first + count; ++k) {
    const std::size_t comm = wrap(k, send_.size());
    std::byte* data = send_buffer_.data() + wrap(k, slots_) * std::max<std::size_t>(size, 1);
    if (options_.verify && send_buffer_.on_device()) {
      for (std::size_t i = 0; i < size; ++i) staging_[i] = pattern(k, i);
      send_buffer_.write(data, staging_.data(), size);
    } else if (options_.verify) {
      for (std::size_t i = 0; i < size; ++i) data[i] = pattern(k, i);
    }
    const auto [status, request] =
        send_[comm]->isend(data, size, static_cast<Tag>(k), send_regions_[comm]);
    if (status != Status::kOk) {
      throw std::runtime_error("isend: " + send_[comm]->last_error());
    }
    pending.push_back({send_[comm].get(), request, k, nullptr, size, comm});
  }
}

void Session::post_receives(std::size_t first, std::size_t count, std::size_t size,
                            std::vector<Pending>& pending) {
  for (std::size_t k = first; k < first + count; ++k) {
    const std::size_t comm = wrap(k, recv_.size());
    std::byte* data = recv_buffer_.data() + wrap(k, slots_) * std::max<std::size_t>(size, 1);
    RecvBuffer buffer{data, size, static_cast<Tag>(k), recv_regions_[comm]};
    const auto [status, request] = recv_[comm]->irecv({&buffer, 1});
    if (status != Status::kOk) throw std::runtime_error("irecv: " + recv_[comm]->last_error());
    pending.push_back({recv_[comm].get(), request, k, data, size, send_.size() + comm});
  }
}

void Session::flush(const Pending& received) {
  const std::size_t comm = received.comm_slot - send_.size();
  RecvBuffer buffer{received.data, received.size, static_cast<Tag>(received.index),
                    recv_regions_[comm]};
  const Posted flush = recv_[comm]->iflush({&buffer, 1});
  if (flush.status != Status::kOk) {
    throw std::runtime_error("iflush: " + recv_[comm]->last_error());
  }
  const Status status =
      recv_[comm]->wait(flush.request, {}, std::chrono::seconds(options_.timeout_s));
  if (status != Status::kOk) {
    throw std::runtime_error("iflush of message " + std::to_string(received.index) + ": " +
                             std::string(to_string(status)) + ": " + recv_[comm]->last_error());
  }
}

// Device memory is read back to the host through the driver first.
void Session::verify(const Pending& received) {
  const std::byte* bytes = received.data;
  if (recv_buffer_.on_device()) {
    staging_.resize(std::max(staging_.size(), received.size));
    recv_buffer_.read(received.data, staging_.data(), received.size);
    bytes = staging_.data();
  }
  for (std::size_t i = 0; i < received.size; ++i) {
    if (bytes[i] != pattern(received.index, i)) {
      throw std::runtime_error("verify: message " + std::to_string(received.index) + " byte " +
                               std::to_string(i) + " is wrong");
    }
  }
}

// Windows of messages, as fabtests' bandwidth tests run them: the client posts a window of
// sends and waits for them and for a 4-byte ack the server sends once the whole window has
// arrived. With --bidir both sides send and receive windows and no ack is needed.
void Session::bandwidth(std::size_t size, std::size_t count, bool timed, Figures& figures) {
  oob_.sync();
  const auto start = Clock::now();
  if (options_.bidir) {
    exchange_windows(size, count);
  } else if (options_.is_client()) {
    send_windows(size, count);
  } else {
    receive_windows(size, count);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  message_ += count;
  if (timed) {
    figures.iterations = count;
    figures.seconds = seconds;
    figures.bytes = static_cast<std::uint64_t>(count) * size * (options_.bidir ? 2 : 1);
  }
}

// The ack's receive is posted first (its clear-to-send leaves with the first send) but waited
// for last: polling its lane while sends are in flight would only take turns from theirs.
void Session::send_windows(std::size_t size, std::size_t count) {
  std::vector<Pending> pending;
  std::vector<Pending> ack;
  pending.reserve(options_.window);
  for (std::size_t done = 0; done < count;) {
    const std::size_t n = std::min(options_.window, count - done);
    post_ack(false, ack);
    post_sends(message_ + done, n, size, pending);
    wait_all(pending);
    wait_all(ack);
    done += n;
  }
}

// The server keeps the receives of two windows posted, as an application that knows what
// comes next does: while window k arrives, window k+1's buffers are announced already, so its
// sends go the moment the ack releases them (loom sends eagerly once the receive is posted).
// Posting window k+2 happens after the ack, while window k+1 is on its way.
std::size_t Session::windows_posted() const {
  const std::size_t comms = std::max<std::size_t>(recv_.size(), 1);
  const std::size_t per_comm = (kWindowsPosted * options_.window + comms - 1) / comms;
  return per_comm <= kMaxRequestsPerComm ? kWindowsPosted : 1;
}

void Session::receive_windows(std::size_t size, std::size_t count) {
  std::vector<std::vector<Pending>> windows(windows_posted());
  for (auto& window : windows) window.reserve(options_.window);
  std::vector<Pending> ack;
  std::size_t posted = 0;
  const auto post_next = [&](std::vector<Pending>& window) {
    const std::size_t n = std::min(options_.window, count - posted);
    if (n > 0) post_receives(message_ + posted, n, size, window);
    posted += n;
  };
  for (auto& window : windows) post_next(window);
  for (std::size_t k = 0; !windows[k % windows.size()].empty(); ++k) {
    std::vector<Pending>& window = windows[k % windows.size()];
    wait_all(window);
    post_ack(true, ack);
    wait_all(ack);
    post_next(window);
  }
}

void Session::exchange_windows(std::size_t size, std::size_t count) {
  std::vector<Pending> pending;
  pending.reserve(2 * options_.window);
  for (std::size_t done = 0; done < count;) {
    const std::size_t n = std::min(options_.window, count - done);
    post_receives(message_ + done, n, size, pending);
    post_sends(message_ + done, n, size, pending);
    wait_all(pending);
    done += n;
  }
}

// The window ack: 4 bytes from the server to the client on the first reverse communicator,
// tagged apart from the data messages.
void Session::post_ack(bool send, std::vector<Pending>& pending) {
  constexpr Tag kAckTag = 0xACCACC;
  Posted ack;
  if (send) {
    ack = send_[0]->isend(ack_.data(), ack_.size(), kAckTag, ack_send_region_);
    pending.push_back({send_[0].get(), ack.request, 0, nullptr, ack_.size(), 0});
  } else {
    RecvBuffer buffer{ack_.data(), ack_.size(), kAckTag, ack_recv_region_};
    ack = recv_[0]->irecv({&buffer, 1});
    pending.push_back({recv_[0].get(), ack.request, 0, nullptr, ack_.size(), send_.size()});
  }
  if (ack.status != Status::kOk)
    throw std::runtime_error("window ack: " + std::string(to_string(ack.status)));
}

// One message there and back on the first pair of communicators; latency = round trip / 2.
// Like fabtests' pingpong: `warmup` untimed rounds, then `count` timed ones; the client's time
// over those / count / 2 is the one-way latency fabtests calls usec/xfer. Each round's time / 2
// gives the percentiles.
void Session::pingpong(std::size_t size, std::size_t warmup, std::size_t count, Figures& figures) {
  std::vector<double> one_way;
  one_way.reserve(count);
  std::vector<Pending> pending;
  std::vector<Pending> ahead;
  oob_.sync();
  const std::size_t rounds = warmup + count;
  // One clock read per round (fabtests reads none), taken once the ping left, while it flies: a
  // read between the reply's arrival and the next ping would sit on every round's path. A
  // round's time is then from one ping's departure to the next's, the last one's to its reply.
  Clock::time_point timed_start;
  Clock::time_point sent;
  for (std::size_t k = 0; k < rounds; ++k) {
    const std::size_t index = message_ + k;
    if (options_.is_client()) {
      // The reply's buffer is posted first, so the reply never waits for it.
      post_receives(index, 1, size, pending);
      post_sends(index, 1, size, pending);
      const auto now = Clock::now();
      if (k == warmup) timed_start = now;
      if (k > warmup) {
        one_way.push_back(std::chrono::duration<double, std::micro>(now - sent).count() / 2);
      }
      sent = now;
      wait_all(pending);
    } else {
      // The next ping's buffer is posted before this reply goes, so the ping never waits.
      if (k == 0) post_receives(index, 1, size, pending);
      wait_all(pending);
      if (k + 1 < rounds) post_receives(index + 1, 1, size, ahead);
      post_sends(index, 1, size, pending);
      wait_all(pending);
      pending.swap(ahead);
    }
  }
  if (options_.is_client() && count != 0) {
    const auto end = Clock::now();
    one_way.push_back(std::chrono::duration<double, std::micro>(end - sent).count() / 2);
    const double total_us = std::chrono::duration<double, std::micro>(end - timed_start).count();
    figures.lat_avg_us = total_us / static_cast<double>(one_way.size()) / 2;
  }
  message_ += rounds;
  if (one_way.empty()) return;
  figures.lat_rounds = one_way.size();
  std::sort(one_way.begin(), one_way.end());
  figures.p50_us = one_way[one_way.size() / 2];
  figures.p99_us = one_way[std::min(one_way.size() - 1, one_way.size() * 99 / 100)];
}

Figures Session::measure(std::size_t size) {
  prepare_buffers(size);
  Figures figures;
  figures.size = size;
  const std::size_t iterations =
      options_.iterations ? options_.iterations : default_iterations(size);
  if (options_.bandwidth) {
    if (options_.warmup > 0) bandwidth(size, options_.warmup, false, figures);
    bandwidth(size, iterations, true, figures);
  }
  if (options_.pingpong) {
    const std::size_t rounds = options_.lat_iterations != 0
                                   ? options_.lat_iterations
                                   : std::clamp<std::size_t>(iterations / 10, 20, 1000);
    pingpong(size, options_.warmup, rounds, figures);
  }
  return figures;
}

}  // namespace loom::bench
