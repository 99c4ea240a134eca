// Helpers for p2p tests across two processes: handle exchange, bounded connect/accept, waits.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loom/p2p.hpp"
#include "support/pattern.hpp"
#include "support/two_process.hpp"

namespace loom::test {

// LOOM_* from the environment (the meson matrix picks the provider), then test overrides.
inline Config test_config(unsigned data_rails = 1) {
  Config config = Config::from_env();
  config.data_rails = data_rails;
  return config;
}

inline void send_handle(Channel& channel, const Handle& handle) {
  channel.send_bytes(handle.view());
}

inline Handle recv_handle(Channel& channel) {
  auto bytes = channel.recv_bytes();
  return Handle::from_bytes(bytes);
}

inline std::unique_ptr<RecvComm> accept_one(Listener& listener,
                                            std::chrono::seconds timeout = 30s) {
  std::unique_ptr<RecvComm> comm;
  poll_until([&] { return comm != nullptr; }, [&] { comm = listener.accept(); }, "accept", timeout);
  return comm;
}

inline std::unique_ptr<SendComm> connect_one(Context& context, const Handle& handle,
                                             std::chrono::seconds timeout = 30s) {
  Connector connector = context.connect(handle);
  std::unique_ptr<SendComm> comm;
  poll_until([&] { return comm != nullptr; }, [&] { comm = connector.poll(); }, "connect", timeout);
  return comm;
}

// Closes communicators when the scope that declares it unwinds: their requests still in flight
// point into buffers the unwinding frees next (posted receives, registrations, the peer's
// writes), and close() settles them first. Declared after those buffers; a scope that ends
// normally leaves the communicators to their owners.
class CloseOnUnwind {
 public:
  explicit CloseOnUnwind(std::initializer_list<Communicator*> comms)
      : close_([list = std::vector<Communicator*>(comms)] {
          for (Communicator* comm : list) comm->close();
        }) {}
  // Those `comms` holds when the scope unwinds (some may have been closed and reset by then).
  template <typename Comm>
  explicit CloseOnUnwind(std::vector<std::unique_ptr<Comm>>& comms)
      : close_([&comms] {
          for (auto& comm : comms)
            if (comm) comm->close();
        }) {}
  ~CloseOnUnwind() {
    if (std::uncaught_exceptions() <= unwinding_) return;
    try {
      close_();
    } catch (...) {  // the exception in flight says what went wrong
    }
  }
  CloseOnUnwind(const CloseOnUnwind&) = delete;
  CloseOnUnwind& operator=(const CloseOnUnwind&) = delete;

 private:
  std::function<void()> close_;
  int unwinding_ = std::uncaught_exceptions();
};

// A send and a receive communicator set up at once: both ends of `connector`'s connection, or
// one each of two connections that run concurrently (poll both, neither may wait).
struct CommPair {
  std::unique_ptr<SendComm> out;
  std::unique_ptr<RecvComm> in;
};

inline CommPair connect_both(Connector& connector, Listener& listener, const std::string& what,
                             std::chrono::seconds timeout = 30s) {
  CommPair pair;
  poll_until([&] { return pair.out && pair.in; },
             [&] {
               if (!pair.out) pair.out = connector.poll();
               if (!pair.in) pair.in = listener.accept();
             },
             what, timeout);
  return pair;
}

// A post's status, its request kept in `request` (empty unless kOk).
inline Status post_into(Posted posted, Request& request) {
  request = posted.request;
  return posted.status;
}

// One test() call, split the way most scenarios read it: `done` says whether the request
// finished, and the status is its outcome then, kOk while it runs.
inline Status test_once(Communicator& comm, Request request, bool& done,
                        std::span<std::size_t> sizes = {}) {
  const Status status = comm.test(request, sizes);
  done = status != Status::kInProgress;
  return done ? status : Status::kOk;
}

// Waits for `request`; requires kOk unless `expect` says otherwise. Returns the sizes.
inline std::size_t finish(Communicator& comm, Request request, Status expect = Status::kOk,
                          std::chrono::seconds timeout = 60s) {
  bool done = false;
  std::size_t size = 0;
  Status status = Status::kOk;
  poll_until([&] { return done || status != Status::kOk; },
             [&] {
               status = test_once(comm, request, done, {&size, 1});
             },
             "request", timeout);
  require(done, "request failed before completing: " + comm.last_error());
  require(status == expect, "request status " + std::string(to_string(status)) + ", expected " +
                                std::string(to_string(expect)) + ": " + comm.last_error());
  return size;
}

// Bytes read (iflush's reads) by each data rail of this process's lanes that receive.
inline std::vector<std::uint64_t> data_rail_reads(const Context& context) {
  std::vector<std::uint64_t> reads;
  for (const auto& lane : context.stats().lanes) {
    if (lane.recv_comms == 0) continue;
    for (const auto& rail : lane.rails)
      if (rail.data) reads.push_back(rail.bytes_read);
  }
  return reads;
}

// Flushes `target`, a receive `comm` completed (the flush must read: device memory, or
// LOOM_FORCE_FLUSH), waits for it, and returns the bytes each data rail of the receive lane read
// for it; the lane must have `rails` of them.
inline std::vector<std::uint64_t> flush_reads(const Context& context, RecvComm& comm,
                                              const RecvBuffer& target, std::size_t rails) {
  const auto before = data_rail_reads(context);
  Request flush;
  require(post_into(comm.iflush({&target, 1}), flush) == Status::kOk, comm.last_error());
  finish(comm, flush);
  const auto after = data_rail_reads(context);
  require(before.size() == rails && after.size() == rails,
          "the receive lane has " + std::to_string(after.size()) + " data rails, expected " +
              std::to_string(rails));
  std::vector<std::uint64_t> reads(rails);
  for (std::size_t r = 0; r < rails; ++r) reads[r] = after[r] - before[r];
  return reads;
}

// One message each way between the two comms of a rank, verified.
inline void exchange(SendComm& out, RecvComm& in, std::uint64_t out_seed, std::uint64_t in_seed,
                     std::size_t size) {
  std::vector<std::byte> send_buffer(size), recv_buffer(size);
  const CloseOnUnwind guard{&out, &in};
  fill_pattern(send_buffer, out_seed);
  MemoryRegion send_region = out.register_memory(send_buffer.data(), size);
  MemoryRegion recv_region = in.register_memory(recv_buffer.data(), size);
  Request receive;
  Request send;
  RecvBuffer target{recv_buffer.data(), size, 1, recv_region};
  require(post_into(in.irecv({&target, 1}), receive) == Status::kOk, in.last_error());
  require(post_into(out.isend(send_buffer.data(), size, 1, send_region), send) == Status::kOk,
          out.last_error());
  finish(out, send);
  require(finish(in, receive) == size, "wrong size");
  auto error = check_pattern(recv_buffer, in_seed);
  require(error.empty(), error);
  out.deregister(send_region);
  in.deregister(recv_region);
}

}  // namespace loom::test
