// A rail is one endpoint on one NIC with its own AV; its CQ is the one its rail set shares
// among the rails of that NIC and role (or its own, alone). Data rails carry payload (tagged
// eager sends, RMA writes); control rails carry small control messages, so those never queue
// behind bulk data. Setup is in rail.cpp, the data path in rail_datapath.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loom/error.hpp"
#include "ofi/completion.hpp"
#include "ofi/completion_queue.hpp"
#include "ofi/fid.hpp"
#include "ofi/log_limit.hpp"

namespace loom::ofi {

class Nic;
class MemoryRegistration;
class Rail;

enum class RailRole : std::uint8_t { kData, kControl };

// A peer's address in this rail's AV (fi_addr_t).
using Address = std::uint64_t;

struct RailDepths {
  std::size_t tx = 256;
  std::size_t rx = 256;
};

struct RailStats {
  std::uint64_t bytes_sent = 0;     // tagged and untagged sends
  std::uint64_t bytes_written = 0;  // RMA writes
  std::uint64_t bytes_read = 0;     // RMA reads (flushes included)
};

// Each endpoint owns a small registered buffer. A flush reads a few bytes of the last received
// buffer into it through this endpoint: the read cannot complete before earlier PCIe writes of
// the NIC into GPU memory are visible (GPUDirect RDMA ordering).
class FlushBuffer {
 public:
  static constexpr std::size_t kBytes = 64;
  explicit FlushBuffer(Rail& rail);
  ~FlushBuffer();
  [[nodiscard]] std::byte* data() noexcept { return storage_.get(); }
  [[nodiscard]] const MemoryRegistration& registration() const noexcept { return *registration_; }

 private:
  std::unique_ptr<std::byte[]> storage_;
  std::unique_ptr<MemoryRegistration> registration_;
};

class Rail {
 public:
  // Receives kept posted for FI_RX_CQ_DATA providers: enough to cover a window of writes.
  static constexpr std::size_t kRxCqDataCredits = 64;

  // Opens an endpoint on `nic`, binds it to `shared` (or a CQ of its own when null) and a new
  // AV, enables it and inserts its own address (for flush reads). Throws loom::Error.
  Rail(Nic& nic, RailRole role, std::size_t index, RailDepths depths,
       CompletionQueue* shared = nullptr);
  ~Rail();
  Rail(const Rail&) = delete;
  Rail& operator=(const Rail&) = delete;

  [[nodiscard]] Nic& nic() const noexcept { return *nic_; }
  [[nodiscard]] RailRole role() const noexcept { return role_; }
  [[nodiscard]] std::size_t index() const noexcept { return index_; }
  [[nodiscard]] const RailDepths& depths() const noexcept { return depths_; }
  [[nodiscard]] std::span<const std::byte> address() const noexcept { return name_; }
  [[nodiscard]] fid_ep* endpoint() const noexcept { return endpoint_.get(); }
  [[nodiscard]] const RailStats& stats() const noexcept { return stats_; }
  // "data rail 1 on lo [tcp;ofi_rxm]"; without the provider for loom::Error, which adds it.
  [[nodiscard]] std::string describe(bool with_provider = true) const;

  // Peers. Throws loom::Error on a malformed address.
  Address insert_peer(std::span<const std::byte> address);

  [[nodiscard]] CompletionQueue& completion_queue() const noexcept { return *cq_; }
  // Sets the handler of the CQ this rail completes on (shared by the rail set's rails there).
  void set_remote_write_handler(RemoteWriteHandler* handler) noexcept {
    cq_->set_remote_write_handler(handler);
  }

  // ---- data path (rail_datapath.cpp): kOk when posted, kRetry on back-pressure (progress and
  // post again), kError otherwise with last_error() saying why. `desc` comes from
  // MemoryRegistration::desc(rail index) and may be null for providers without FI_MR_LOCAL.
  Status send(Address peer, const void* buffer, std::size_t length, void* desc, OpContext* op);
  // No completion; `length` at most the NIC's inject_size. The buffer is reusable on return.
  Status inject(Address peer, const void* buffer, std::size_t length);
  Status recv(void* buffer, std::size_t length, void* desc, OpContext* op);
  Status tagged_send(Address peer, const void* buffer, std::size_t length, void* desc,
                     std::uint64_t tag, std::uint32_t data, OpContext* op);
  // No completion, no descriptor; `length` at most the NIC's inject_size, host memory only.
  Status tagged_inject(Address peer, const void* buffer, std::size_t length, std::uint64_t tag,
                       std::uint32_t data);
  Status tagged_recv(void* buffer, std::size_t length, void* desc, std::uint64_t tag,
                     std::uint64_t ignore, OpContext* op);
  Status write(Address peer, const void* buffer, std::size_t length, void* desc,
               std::uint64_t remote_address, std::uint64_t key, std::uint32_t data, OpContext* op);
  Status read(Address peer, void* buffer, std::size_t length, void* desc,
              std::uint64_t remote_address, std::uint64_t key, OpContext* op);
  // Reads up to FlushBuffer::kBytes at `address` (inside `registration`, received through this
  // rail) into this rail's flush buffer.
  Status flush(const MemoryRegistration& registration, const void* address, std::size_t length,
               OpContext* op);
  // Asks the provider to cancel a posted receive; it completes with Status::kCancelled. kInvalid
  // (not logged) when the provider does not hold it: it completed already and its completion is
  // queued, or it was never posted.
  Status cancel(OpContext* op) noexcept;

  // Reads this rail's CQ once (and with it the other rails sharing it); returns completions
  // handled.
  std::size_t progress() { return cq_->progress(); }

  // FI_RX_CQ_DATA: whether `op` is one of this rail's credits (receives that remote CQ data
  // consumes), and posting one again once consumed or failed. A credit the provider refuses
  // (back-pressure or an error) is not lost: it waits, the CQ is told, and its next progress
  // posts it again through retry_credits() (false while some still wait).
  [[nodiscard]] bool owns_credit(const OpContext* op) const noexcept {
    return !rx_cq_data_credits_.empty() && op >= rx_cq_data_credits_.data() &&
           op < rx_cq_data_credits_.data() + rx_cq_data_credits_.size();
  }
  void repost_credit(OpContext* op);
  bool retry_credits();

  [[nodiscard]] const std::string& last_error() const noexcept { return last_error_; }
  [[nodiscard]] std::span<const std::byte> flush_bytes() const noexcept {
    return {flush_->data(), FlushBuffer::kBytes};
  }

 private:
  Status post_failed(const char* call, long rc);
  void post_rx_cq_data_credits();

  Nic* nic_;
  RailRole role_;
  std::size_t index_;
  RailDepths depths_;
  // Receives consumed by remote CQ data, for providers in FI_RX_CQ_DATA mode. Before the
  // endpoint and the CQ: the provider may write into a posted context until both are closed.
  std::vector<OpContext> rx_cq_data_credits_;
  std::vector<OpContext*> credits_waiting_;  // not posted: refused, to be posted again
  // Declaration order is teardown order, reversed: flush buffer MR, endpoint, own CQ, AV.
  FidPtr<fid_av> av_;
  std::unique_ptr<CompletionQueue> own_cq_;
  CompletionQueue* cq_;
  FidPtr<fid_ep> endpoint_;
  std::unique_ptr<FlushBuffer> flush_;
  std::vector<std::byte> name_;
  Address self_ = 0;
  RailStats stats_;
  std::string last_error_;
  LogLimit post_errors_;
};

}  // namespace loom::ofi
