// Small control messages (handshakes, clear-to-send, ready-to-send, close) over control rails:
// each rail keeps registered receive buffers posted, sends go out by fi_inject when they fit or
// from registered send slots. Every received message is checked (magic, version, length) before
// its body reaches the sink; anything else is counted and dropped.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "loom/error.hpp"
#include "mux/routing.hpp"
#include "ofi/completion.hpp"
#include "ofi/rail.hpp"
#include "util/log_limit.hpp"

namespace loom::ofi {
class MemoryRegistration;
}

namespace loom::mux {

inline constexpr std::uint16_t kControlMagic = 0x4D4C;  // "LM"
// The version of loom's whole wire protocol, one number for every byte loom puts on the wire:
// each control header carries it, and the listen handle and the handshake's connect carry it
// too (p2p/messages.hpp), so that a peer speaking another version is refused at the handle or
// the handshake with a reason before anything else is exchanged. Bump it for any change in
// what goes on the wire or what it means, and regenerate test/fuzz/corpus (fuzz-seeds fails
// until then).
inline constexpr std::uint8_t kProtocolVersion = 14;
inline constexpr std::size_t kControlHeaderBytes = 8;
inline constexpr std::size_t kMaxControlMessage = 2048;
inline constexpr std::size_t kMaxControlBody = kMaxControlMessage - kControlHeaderBytes;

struct ControlHeader {
  std::uint8_t type = 0;
  CommId comm = 0;           // the communicator the message is for, on the receiving lane
  std::uint16_t length = 0;  // body bytes
};

// Writes the header for a body of `length` bytes; returns false if it does not fit.
bool encode_control_header(std::span<std::byte> out, const ControlHeader& header) noexcept;
// Validates magic, version and that the length matches the bytes received.
[[nodiscard]] std::optional<ControlHeader> decode_control_header(
    std::span<const std::byte> message) noexcept;

class ControlSink {
 public:
  virtual void on_control(const ControlHeader& header, std::span<const std::byte> body) = 0;

 protected:
  ~ControlSink() = default;
};

class ControlChannel final : ofi::CompletionHandler {
 public:
  // Receives kept posted per rail: this many, or fewer when a rail's receive queue is smaller.
  static constexpr std::size_t kRxSlotsPerRail = 64;
  static constexpr std::size_t kTxSlots = 64;

  // `rails` are the control rails to receive and send on; they outlive the channel.
  ControlChannel(std::span<ofi::Rail* const> rails, ControlSink& sink);
  ~ControlChannel();
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  [[nodiscard]] std::size_t rails() const noexcept { return rails_.size(); }
  [[nodiscard]] ofi::Rail& rail(std::size_t i) const noexcept { return *rails_[i]; }

  // Sends header + body to `peer` (an address in rails()[rail]'s AV). kRetry: no send slot or
  // provider back-pressure, try again after progress; kInvalid: body too large; kError: failed.
  // `confirmed`: never injected, so that sends_in_flight() covers it until the provider
  // reports it sent (an injected message may still sit in the provider when its endpoint
  // closes: rxd drops it).
  Status send(std::size_t rail, ofi::Address peer, std::uint8_t type, CommId comm,
              std::span<const std::byte> body, bool confirmed = false);
  // Sends confirmed, as send() does, a message that must leave although the provider pushes
  // back now: the first message to a peer waits until the provider reached it (rxm connects,
  // shm exchanges names), which takes the peer's progress. What send() cannot post now waits
  // in the outbox and is posted again at every retry() until `deadline`, then dropped (logged):
  // a peer that takes nothing for that long is gone. kOk: sent or queued; kInvalid, kError as
  // send().
  Status send_or_queue(std::size_t rail, ofi::Address peer, std::uint8_t type, CommId comm,
                       std::span<const std::byte> body,
                       std::chrono::steady_clock::time_point deadline);
  // Sends from registered slots whose completion has not come back yet, or queued.
  [[nodiscard]] bool sends_in_flight() const noexcept {
    return free_tx_.size() != kTxSlots || !outbox_.empty();
  }
  // Whether such a send to `peer` on rail `rail` is in flight or queued.
  [[nodiscard]] bool sending_to(std::size_t rail, ofi::Address peer) const noexcept;

  // Reposts receive buffers the provider refused earlier and posts what the outbox holds.
  // Called from the owner's progress; inline, since there is mostly nothing to do.
  void retry() {
    if (!reposts_.empty() || !outbox_.empty()) [[unlikely]]
      take_back();
  }

 private:
  void take_back();  // retry()'s work
  struct Slot {
    ofi::OpContext op;  // first: the completion hands back &op
    bool receive;
    bool posted = false;  // receives: held by the provider (not waiting in reposts_)
    std::uint32_t rail;
    std::uint32_t index;
    ofi::Address to = 0;  // sends: the peer
  };

  void on_completion(ofi::OpContext& op, const ofi::Completion& completion) override;
  std::byte* rx_buffer(const Slot& slot) noexcept;
  std::byte* tx_buffer(const Slot& slot) noexcept;
  Status post_receive(Slot& slot);
  void send_queued();

  std::vector<ofi::Rail*> rails_;
  ControlSink* sink_;
  std::size_t rx_per_rail_;  // before rx_slab_, which it sizes
  std::unique_ptr<std::byte[]> rx_slab_;
  std::unique_ptr<std::byte[]> tx_slab_;
  std::vector<Slot> rx_slots_;
  std::vector<Slot> tx_slots_;
  std::vector<std::uint32_t> free_tx_;
  std::vector<std::uint32_t> reposts_;
  // send_or_queue(): messages the provider did not take yet, oldest first.
  struct Queued {
    std::size_t rail;
    ofi::Address peer;
    std::uint8_t type;
    CommId comm;
    std::vector<std::byte> body;
    std::chrono::steady_clock::time_point deadline;
  };
  std::vector<Queued> outbox_;
  // Registrations bound to the control endpoints: declared last, closed first.
  std::unique_ptr<ofi::MemoryRegistration> rx_registration_;
  std::unique_ptr<ofi::MemoryRegistration> tx_registration_;
  util::LogLimit receive_errors_;  // failed receive completions, reposted and failing again
};

}  // namespace loom::mux
