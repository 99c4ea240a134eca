// One side of a fi_p2p_bw run: the context, N communicators each way, registered buffers, and
// the measurement loops (windowed bandwidth as fabtests does it, then a ping-pong pass).
#pragma once

#include <array>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <vector>

#include "common/figures.hpp"
#include "common/memory.hpp"
#include "common/oob.hpp"
#include "common/options.hpp"
#include "loom/p2p.hpp"

namespace loom::bench {

// The context's configuration: the environment's, with the command line's overrides.
[[nodiscard]] Config make_config(const Options& options);

class Session {
 public:
  Session(const Options& options, Oob& oob);
  ~Session();

  SetupFigures connect_all();
  Figures measure(std::size_t size);

  [[nodiscard]] Context& context() { return *context_; }
  [[nodiscard]] ProtocolCounts protocol_counts() const;

 private:
  struct Pending {
    Communicator* comm;
    Request request;
    std::size_t index;  // message number, for verification
    std::byte* data;
    std::size_t size;
    std::size_t comm_slot;  // send comm i: i; receive comm i: send_.size() + i
  };

  void prepare_buffers(std::size_t size);
  // Windows of receives the server keeps posted (see receive_windows): two where each
  // communicator's share fits its request pool, else one.
  static constexpr std::size_t kWindowsPosted = 2;
  [[nodiscard]] std::size_t windows_posted() const;

  void bandwidth(std::size_t size, std::size_t count, bool timed, Figures& figures);
  void send_windows(std::size_t size, std::size_t count);
  void receive_windows(std::size_t size, std::size_t count);
  void exchange_windows(std::size_t size, std::size_t count);
  void pingpong(std::size_t size, std::size_t warmup, std::size_t count, Figures& figures);
  void post_ack(bool send, std::vector<Pending>& pending);
  void wait_all(std::vector<Pending>& pending);
  void post_sends(std::size_t first, std::size_t count, std::size_t size,
                  std::vector<Pending>& pending);
  void post_receives(std::size_t first, std::size_t count, std::size_t size,
                     std::vector<Pending>& pending);
  // A receive into device memory done: iflush it (as NCCL does before the GPU reads it).
  void flush(const Pending& received);
  void verify(const Pending& received);

  const Options& options_;
  Oob& oob_;
  std::unique_ptr<Context> context_;
  // Declared before the communicators so that they outlive them: a communicator closed on an
  // error can still have a receive or a peer's write landing in them until it is gone.
  MessageBuffer send_buffer_;
  MessageBuffer recv_buffer_;
  std::vector<std::byte> staging_;  // a message's bytes on the host, for device buffers
  std::array<std::byte, 4> ack_{};
  std::vector<std::unique_ptr<SendComm>> send_;
  std::vector<std::unique_ptr<RecvComm>> recv_;
  std::vector<MemoryRegion> send_regions_;
  std::vector<MemoryRegion> recv_regions_;
  MemoryRegion ack_send_region_;
  MemoryRegion ack_recv_region_;
  std::size_t slots_ = 0;
  std::size_t prepared_size_ = static_cast<std::size_t>(-1);
  std::vector<std::uint64_t> busy_pass_;  // by comm slot: the wait_all pass that found it busy
  std::uint64_t pass_ = 0;
  std::uint64_t message_ = 0;  // running message number: patterns differ per message
};

}  // namespace loom::bench
