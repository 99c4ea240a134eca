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
#include "ofi/flush_buffer.hpp"
#include "util/log_limit.hpp"

namespace loom::ofi {

class Nic;
class Rail;

enum class RailRole : std::uint8_t { kData, kControl };

// A peer's address in this rail's AV (fi_addr_t).
using Address = std::uint64_t;

struct RailDepths {
  std::size_t tx = 256;
  std::size_t rx = 256;
};

// How a one-sided transfer of loom's RMA connections is posted (fi_writemsg/fi_readmsg flags).
struct RmaPost {
  // FI_MORE: another post follows at once, so the provider may hold this one for one doorbell.
  bool more = false;
  // FI_DELIVERY_COMPLETE: the write completes only once its data is in the target's memory
  // (and on shm, once the target checked its key instead of copying straight into it).
  bool delivery_complete = false;
  // FI_REMOTE_CQ_DATA with `data`: the write leaves a completion at the target.
  bool remote_cq_data = false;
  std::uint32_t data = 0;
};

struct RailStats {
  std::uint64_t bytes_sent = 0;     // tagged and untagged sends
  std::uint64_t bytes_written = 0;  // RMA writes
  std::uint64_t bytes_read = 0;     // RMA reads (flushes included)
};

// FI_RX_CQ_DATA (efa, verbs): remote CQ data consumes a posted receive, and the write's
// completion carries that receive's context. A data rail keeps kCount empty receives
// posted; each is an OpContext whose handler is this object, so the CQ routes it back here like
// any other operation, and it is posted again at once. A receive the provider refuses
// (back-pressure) waits until retry(); one that completes in error is logged and posted again:
// each one lost would leave one remote write fewer that can complete.
class RxCqDataReceives final : public CompletionHandler {
 public:
  static constexpr std::size_t kCount = 64;

  explicit RxCqDataReceives(Rail& rail) noexcept : rail_(&rail) {}
  // Posts every receive. Throws loom::Error when the provider refuses one other than for
  // back-pressure.
  void post_all();
  // Posts again the receives the provider refused; false while some still wait.
  bool retry() { return waiting_.empty() || retry_waiting(); }
  // Asks the provider to cancel the receives it holds (the rail is closing); they complete with
  // kCancelled, which posts nothing.
  void cancel_posted() noexcept;

  void on_completion(OpContext& receive, const Completion& completion) override;

 private:
  void repost(OpContext& receive);
  bool retry_waiting();

  Rail* rail_;
  std::vector<OpContext> receives_;
  std::vector<OpContext*> waiting_;  // not posted: refused, to be posted again
  util::LogLimit errors_;            // receives completing in error
};

class Rail {
 public:
  // Receives kept posted for FI_RX_CQ_DATA providers: enough to cover a window of writes.
  static constexpr std::size_t kRxCqDataReceives = RxCqDataReceives::kCount;

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
  // What MemoryRegistration needs of this rail: NIC, endpoint, index and name (describe()).
  // Valid as long as the rail.
  [[nodiscard]] RegistrationTarget registration_target() const noexcept {
    return RegistrationTarget{nic_, endpoint_.get(), index_, description_};
  }

  // Peers. Throws loom::Error on a malformed address.
  Address insert_peer(std::span<const std::byte> address);
  // Takes the peer out of the AV (rxm closes its connection to it). Only once nothing of the
  // rail's is in flight to it: a failure is logged, never thrown.
  void remove_peer(Address peer) noexcept;

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
  // A write without remote CQ data: the target learns of it only from what follows.
  Status write(Address peer, const void* buffer, std::size_t length, void* desc,
               std::uint64_t remote_address, std::uint64_t key, OpContext* op);
  // One block of a one-sided batch (fi_writemsg with `how`'s flags).
  Status write(Address peer, const void* buffer, std::size_t length, void* desc,
               std::uint64_t remote_address, std::uint64_t key, RmaPost how, OpContext* op);
  // No completion, no descriptor; `length` at most the NIC's inject_size, host memory only.
  Status inject_write(Address peer, const void* buffer, std::size_t length,
                      std::uint64_t remote_address, std::uint64_t key, std::uint32_t data);
  Status read(Address peer, void* buffer, std::size_t length, void* desc,
              std::uint64_t remote_address, std::uint64_t key, OpContext* op);
  // One block of a one-sided batch (fi_readmsg with `how`'s FI_MORE).
  Status read(Address peer, void* buffer, std::size_t length, void* desc,
              std::uint64_t remote_address, std::uint64_t key, RmaPost how, OpContext* op);
  // Reads up to FlushBuffer::kBytes at `address` (inside `registration`, received through this
  // rail) into this rail's flush buffer.
  Status flush(const MemoryRegistration& registration, const void* address, std::size_t length,
               OpContext* op);
  // Asks the provider to cancel a posted receive; it completes with Status::kCancelled. kInvalid
  // (not logged) when the provider does not hold it: it completed already and its completion is
  // queued, or it was never posted.
  Status cancel(OpContext* op) noexcept;

  // Posts again the FI_RX_CQ_DATA receives the provider refused (RxCqDataReceives); false while
  // some still wait. The rail set calls it for its data rails before reading their CQs.
  bool retry_receives() { return receives_.retry(); }

  // Reads this rail's CQ once (and with it the other rails sharing it), after posting again
  // this rail's refused receives; returns completions handled.
  std::size_t progress() {
    retry_receives();
    return cq_->progress();
  }

  [[nodiscard]] const std::string& last_error() const noexcept { return last_error_; }
  [[nodiscard]] std::span<const std::byte> flush_bytes() const noexcept {
    return {flush_->data(), FlushBuffer::kBytes};
  }

 private:
  Status post_failed(const char* call, long rc);

  Nic* nic_;
  RailRole role_;
  std::size_t index_;
  RailDepths depths_;
  std::string description_;  // describe(): the name registrations give in their errors
  // Receives consumed by remote CQ data, for providers in FI_RX_CQ_DATA mode. Declared before
  // the endpoint and the CQ, so destroyed after them: the provider may write into a posted
  // context until both are closed.
  RxCqDataReceives receives_;
  // Declaration order is teardown order, reversed: flush buffer MR, endpoint, own CQ, AV.
  FidPtr<fid_av> av_;
  std::unique_ptr<CompletionQueue> own_cq_;
  CompletionQueue* cq_;
  FidPtr<fid_ep> endpoint_;
  std::unique_ptr<FlushBuffer> flush_;  // after the endpoint: its MR may be bound to it
  std::vector<std::byte> name_;
  Address self_ = 0;
  RailStats stats_;
  std::string last_error_;
  util::LogLimit post_errors_;
};

// The registration targets of `rails`, in order, for MemoryRegistration and RegistrationTable. The
// rails must outlive what is registered through them.
[[nodiscard]] std::vector<RegistrationTarget> registration_targets(std::span<Rail* const> rails);

}  // namespace loom::ofi
