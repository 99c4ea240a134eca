// loom's one-sided API: batches of writes and reads straight into a peer's registered memory,
// and a notification the target sees once a write batch has landed.
//
// The target registers memory on its Context (Context::register_memory), accepts a one-sided
// connection (Listener::accept_rma) and exports each region for it (RmaTarget::export_region):
// a short byte string the application ships to the initiator by any means. The initiator
// connects (Context::connect_rma), imports the descriptor (RmaInitiator::import_region) and posts
// batches of blocks {its own region + offset, the remote region + offset, length}. A write batch
// may carry a Notification, which the target's RmaTarget::poll returns only once every byte of
// the batch is in its memory, exactly once, in the order the batches were posted.
//
// Connections ride on the context's lanes: they add no endpoints, whatever their number.
// Threads: as for communicators (loom/p2p.hpp): one connection is used by one thread at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "loom/error.hpp"
#include "loom/p2p.hpp"

namespace loom {

namespace p2p {
class RmaInitiatorImpl;
}

// Batches one connection keeps in flight; one more is refused with kRetry.
inline constexpr std::size_t kMaxBatchesPerConnection = kMaxRequestsPerComm;
// Provider operations (block pieces) one connection keeps posted at once; a batch with more
// posts the rest as earlier ones complete.
inline constexpr std::size_t kMaxRmaOpsInFlight = 256;
// The longest descriptor export_region gives.
inline constexpr std::size_t kMaxRegionDescriptorBytes = 192;

// A region of the target, as one initiator imported it. Cheap to copy; names nothing once the
// initiator forgot it or closed.
class RemoteRegion {
 public:
  RemoteRegion() = default;
  [[nodiscard]] bool valid() const noexcept { return generation_ != 0; }

 private:
  friend class p2p::RmaInitiatorImpl;
  std::uint64_t owner_ = 0;  // the initiator's serial number in its process
  std::uint32_t slot_ = 0;
  std::uint32_t generation_ = 0;
};

// One block of a batch: `length` bytes between [local + local_offset] and
// [remote + remote_offset]. `local` is a region of the initiator's context
// (Context::register_memory).
struct RmaBlock {
  MemoryRegion local;
  std::size_t local_offset = 0;
  RemoteRegion remote;
  std::size_t remote_offset = 0;
  std::size_t length = 0;
};

// What a write batch tells its target once it has landed: the application's tag and value, and
// the batch's block and byte counts (filled in by loom).
struct Notification {
  std::uint64_t tag = 0;
  std::uint64_t value = 0;
  std::uint32_t blocks = 0;
  std::uint64_t bytes = 0;
};

// How a write batch's notification is made to follow its bytes.
enum class NotifyProtocol : std::uint8_t {
  // Every write delivery-complete; the notification is a control message sent once all of them
  // completed. The target spends nothing per block. loom's protocol.
  kAfterCompletion = 0,
  // Every block carries remote CQ data naming the batch, the notification (sent at once) the
  // block count, and the target hands it out once it counted that many: the protocol of NIXL's
  // libfabric backend, a completion per block at the target. For comparison (fi_p2p_bw
  // --notify-protocol cq-data); needs remote CQ data (all of loom's providers have it).
  kCountedCqData = 1,
};

struct RmaStats {
  std::uint64_t batches = 0;  // completed
  std::uint64_t blocks = 0;
  std::uint64_t bytes_written = 0;
  std::uint64_t bytes_read = 0;
  std::uint64_t notifications = 0;  // sent (initiator) or returned by poll (target)
  // Initiator: writes posted FI_DELIVERY_COMPLETE (every write of a batch, or only its last on
  // each rail where the provider places writes in order; none for kCountedCqData).
  std::uint64_t delivery_waits = 0;
  std::uint64_t lane_id = 0;
  std::size_t lane_comms = 0;  // communicators and connections sharing the lane
};

class RmaInitiator {
 public:
  RmaInitiator(CommKey, std::shared_ptr<p2p::ContextCore> context, std::unique_ptr<p2p::Comm> comm);
  ~RmaInitiator();
  RmaInitiator(const RmaInitiator&) = delete;
  RmaInitiator& operator=(const RmaInitiator&) = delete;

  // Checks a descriptor the target exported for this connection and keeps it. Throws
  // loom::Error naming what is wrong: not a descriptor, another version, truncated or padded,
  // or exported by another context or for another connection's lane; or a region the target
  // deregistered since: one round trip asks it (the target's lanes answer from its background
  // progress if its application does not poll, and from its own imports if it is importing).
  RemoteRegion import_region(std::span<const std::byte> descriptor);
  // The handle names nothing from now on (batches already posted with it go on).
  void forget(RemoteRegion region);

  // Posts a batch. kOk and its request. kRetry: kMaxBatchesPerConnection in flight, test some
  // and post again. kInvalid (nothing posted; last_error() says which block and why): an empty
  // batch, a block outside its local region or remote descriptor, a region of another context,
  // a forgotten or deregistered region, a closed connection. kPeerError: the target is gone.
  Posted write(std::span<const RmaBlock> blocks,
               std::optional<Notification> notification = std::nullopt,
               NotifyProtocol protocol = NotifyProtocol::kAfterCompletion);
  Posted read(std::span<const RmaBlock> blocks);

  // As Communicator::test and wait. A batch is kOk once every block completed (and its
  // notification is on its way); a write into a region the target deregistered fails it
  // (kError, quoting the provider), a target silent for LOOM_PEER_TIMEOUT_MS too (kPeerError).
  [[nodiscard]] Status test(Request request);
  [[nodiscard]] Status wait(Request request,
                            std::chrono::milliseconds timeout = std::chrono::milliseconds::max());

  // Cancels what has not been posted, waits for what the provider holds (bounded by
  // LOOM_PEER_TIMEOUT_MS), tells the target, and leaves the lane. Idempotent.
  void close();
  [[nodiscard]] const std::string& last_error() const noexcept;
  [[nodiscard]] RmaStats stats() const;
  // The label given to Context::connect_rma (0 if none; 0 once closed), as Communicator::label.
  [[nodiscard]] std::uint64_t label() const noexcept;

 private:
  std::shared_ptr<p2p::ContextCore> context_;
  std::unique_ptr<p2p::Comm> comm_;
};

class RmaTarget {
 public:
  RmaTarget(CommKey, std::shared_ptr<p2p::ContextCore> context, std::unique_ptr<p2p::Comm> comm);
  ~RmaTarget();
  RmaTarget(const RmaTarget&) = delete;
  RmaTarget& operator=(const RmaTarget&) = delete;

  // The descriptor of `region` (one of this context's) for this connection's initiator: at most
  // kMaxRegionDescriptorBytes. Registers the region on the connection's lane now if nothing did
  // yet. Once the region is deregistered its keys are revoked: later writes through the
  // descriptor fail at the initiator and land nowhere. Throws loom::Error.
  std::vector<std::byte> export_region(const MemoryRegion& region);

  // Makes progress; the next notification whose batch has landed, in post order, or none yet.
  std::optional<Notification> poll();

  // Leaves the lane; the initiator's later notifications fail there. The context's regions
  // stay registered (and writable through their descriptors) until deregistered.
  void close();
  [[nodiscard]] const std::string& last_error() const noexcept;
  [[nodiscard]] RmaStats stats() const;
  // The label the initiator's side gave Context::connect_rma: which peer this connection is.
  [[nodiscard]] std::uint64_t label() const noexcept;

 private:
  std::shared_ptr<p2p::ContextCore> context_;
  std::unique_ptr<p2p::Comm> comm_;
};

class RmaConnector {
 public:
  RmaConnector(RmaConnector&&) noexcept;
  RmaConnector& operator=(RmaConnector&&) noexcept;
  ~RmaConnector();

  // The initiator once the listener's side accepted (Listener::accept_rma), nullptr before.
  // Never blocks. Throws loom::Error as Connector::poll does.
  std::unique_ptr<RmaInitiator> poll();

 private:
  friend class Context;
  explicit RmaConnector(std::shared_ptr<p2p::ConnectorState> state);
  std::shared_ptr<p2p::ConnectorState> state_;
};

}  // namespace loom
