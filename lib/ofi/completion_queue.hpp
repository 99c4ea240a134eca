// A completion queue shared by the rails of one role (data or control) of a rail set on one
// NIC: a lane's progress is one read per NIC for its data rails, however many, and one for its
// control rails, which RailSet::progress skips while data flows and control is quiet. (Below
// us, rxm gives each endpoint a CQ of its own, so every read costs a poll() per endpoint bound.)
// Completions route by context; the CQ data of remote writes goes to the queue's
// RemoteWriteHandler. In FI_RX_CQ_DATA mode a remote write also completes the receive it
// consumed (a rail's receive, see RxCqDataReceives), by that receive's context like any other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ofi/completion.hpp"
#include "ofi/fid.hpp"
#include "util/log_limit.hpp"

struct fi_cq_tagged_entry;

namespace loom::ofi {

class Nic;
struct NicAttributes;

// `wanted` entries, or the device's max_cq_entries where it is known and smaller (logged).
[[nodiscard]] std::size_t clamp_cq_size(const NicAttributes& nic, std::size_t wanted);

class CompletionQueue {
 public:
  static constexpr std::size_t kBatch = 32;

  // Throws loom::Error.
  CompletionQueue(Nic& nic, std::size_t size);
  ~CompletionQueue();
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  [[nodiscard]] fid_cq* get() const noexcept { return cq_.get(); }
  void set_remote_write_handler(RemoteWriteHandler* handler) noexcept { remote_writes_ = handler; }

  // Reads up to kBatch completions and dispatches them; returns how many were handled. A
  // handler that progresses the same queue again reads nothing (0): its entries are the
  // outer call's to dispatch, in order.
  std::size_t progress();

 private:
  // progress() once the read returned something other than "nothing": out of line, so that an
  // empty read (most reads of a spinning wait) costs the call alone.
  std::size_t dispatch(const fi_cq_tagged_entry* entries, long count);
  void read_error_entry();

  Nic* nic_;
  FidPtr<fid_cq> cq_;
  // FI_RX_CQ_DATA mode: a remote write's op_context is the receive it consumed, else not ours.
  bool rx_cq_data_;
  RemoteWriteHandler* remote_writes_ = nullptr;
  util::LogLimit read_errors_;  // fi_cq_read / fi_cq_readerr failing
  bool dispatching_ = false;
  util::LogLimit orphan_errors_;  // error entries with no context to hand them to
};

}  // namespace loom::ofi
