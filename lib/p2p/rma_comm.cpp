// One-sided connections, both ends: descriptors exported and imported, batches planned, posted
// in waves of the connection's op contexts and completed, notifications sent in post order and
// handed out by the target in the same order, and the close of both.
#include "p2p/rma_comm.hpp"

#include <algorithm>
#include <chrono>

#include "ofi/memory_registration.hpp"
#include "p2p/context_core.hpp"
#include "util/log.hpp"

namespace loom::p2p {

// ---- initiator ----

RmaInitiatorImpl::RmaInitiatorImpl(ContextCore& core, mux::Lane& lane, std::uint64_t peer)
    : Comm(core, lane, mux::Direction::kSend, peer),
      batches_(kMaxRequests),
      ops_(kMaxRmaOpsInFlight),
      op_owner_(kMaxRmaOpsInFlight, nullptr) {
  free_ops_.reserve(kMaxRmaOpsInFlight);
  for (std::size_t i = kMaxRmaOpsInFlight; i-- > 0;) {
    ops_[i].handler = this;
    free_ops_.push_back(static_cast<std::uint32_t>(i));
  }
}

loom::RemoteRegion RmaInitiatorImpl::import_region(std::span<const std::byte> bytes) {
  RegionDescriptor descriptor;
  const char* why = decode_descriptor(bytes, descriptor);
  std::lock_guard lock(lane_->lock());
  if (why == nullptr && descriptor.context != peer_context_)
    why = "a region descriptor exported by another context than this connection's target";
  if (why == nullptr && descriptor.lane != peer_lane_)
    why = "a region descriptor exported for another connection's lane (its keys name other "
          "endpoints)";
  if (why == nullptr && descriptor.rails < data_rails_)
    why = "a region descriptor with fewer keys than the connection has data rails";
  if (why != nullptr) throw Error("import region", settings_.provider, 0, why);
  std::uint32_t slot;
  if (free_imported_.empty()) {
    slot = static_cast<std::uint32_t>(imported_.size());
    imported_.emplace_back();
  } else {
    slot = free_imported_.back();
    free_imported_.pop_back();
  }
  Imported& entry = imported_[slot];
  entry.descriptor = descriptor;
  entry.live = true;
  if (++entry.generation == 0) entry.generation = 1;
  loom::RemoteRegion region;
  region.owner_ = serial_;
  region.slot_ = slot;
  region.generation_ = entry.generation;
  return region;
}

void RmaInitiatorImpl::forget(const loom::RemoteRegion& region) {
  std::lock_guard lock(lane_->lock());
  if (region.owner_ != serial_ || region.slot_ >= imported_.size()) return;
  Imported& entry = imported_[region.slot_];
  if (!entry.live || entry.generation != region.generation_) return;
  entry.live = false;
  free_imported_.push_back(region.slot_);
}

Status RmaInitiatorImpl::post(RequestKind kind, std::span<const RmaBlock> blocks,
                              const std::optional<Notification>& notification,
                              Request*& request, NotifyProtocol protocol) {
  const char* operation = kind == RequestKind::kWrite ? "write" : "read";
  std::lock_guard lock(lane_->lock());
  if (closed_) return reject(Status::kInvalid, std::string(operation) + ": connection closed");
  if (peer_gone()) return reject(Status::kPeerError, std::string(operation) + ": " + peer_gone_);
  if (blocks.empty()) return reject(Status::kInvalid, std::string(operation) + ": empty batch");
  if (protocol != NotifyProtocol::kAfterCompletion) {
    return reject(Status::kInvalid,
                  std::string(operation) + ": the counted CQ data protocol is not built yet");
  }
  Request* r = allocate(kind);
  if (r == nullptr) [[unlikely]] {
    return reject(Status::kRetry, std::string(operation) + ": " +
                                      std::to_string(kMaxBatchesPerConnection) +
                                      " batches in flight; test some and post again");
  }
  if (!plan(*r, blocks)) {
    last_error_ = std::string(operation) + ": " + last_error_;
    r->record = RecordState::kFree;
    requests_.give_back(*r);
    return Status::kInvalid;
  }
  Batch& batch = batch_of(*r);
  if (notification) {
    batch.notification = Notify{.seq = 0,
                                .tag = notification->tag,
                                .value = notification->value,
                                .blocks = batch.blocks,
                                .bytes = batch.bytes};
    notifying_.push_back(r);
  }
  posting_.push_back(r);
  post_pending();
  request = r;
  return Status::kOk;
}

bool RmaInitiatorImpl::plan(Request& r, std::span<const RmaBlock> blocks) {
  Batch& batch = batch_of(r);
  batch.pieces.clear();
  batch.held.clear();
  batch.next = 0;
  batch.notification.reset();
  batch.blocks = static_cast<std::uint32_t>(blocks.size());
  batch.bytes = 0;
  mux::SharedRegions& shared = lane_->shared_regions();
  const std::size_t max_piece = lane_->rails().max_msg_size() == 0
                                    ? SIZE_MAX
                                    : lane_->rails().max_msg_size();
  auto refuse = [&](std::size_t i, const std::string& why) {
    for (std::uint32_t entry : batch.held) shared.let_go(entry);
    batch.held.clear();
    batch.pieces.clear();
    last_error_ = "block " + std::to_string(i) + ": " + why;
    return false;
  };
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const RmaBlock& block = blocks[i];
    if (block.length == 0) return refuse(i, "an empty block");
    if (!is_context_region(block.local)) {
      return refuse(i, block.local.valid() ? "the local region is not one of this context's "
                                             "(Context::register_memory)"
                                           : "an empty local region");
    }
    const std::uint32_t entry = shared_entry(block.local);
    if (entry == mux::SharedRegions::kNone) return refuse(i, last_error_);
    if (block.length > shared.size(entry) || block.local_offset > shared.size(entry) - block.length)
      return refuse(i, "[" + std::to_string(block.local_offset) + ", +" +
                           std::to_string(block.length) + ") lies outside the local region of " +
                           std::to_string(shared.size(entry)) + " bytes");
    const loom::RemoteRegion& remote = block.remote;
    if (remote.owner_ != serial_ || remote.slot_ >= imported_.size() ||
        !imported_[remote.slot_].live || imported_[remote.slot_].generation != remote.generation_) {
      return refuse(i, !remote.valid()           ? "an empty remote region"
                       : remote.owner_ != serial_ ? "a remote region imported by another connection"
                                                  : "a remote region this connection forgot");
    }
    const RegionDescriptor& d = imported_[remote.slot_].descriptor;
    if (!d.covers(block.remote_offset, block.length)) {
      return refuse(i, "[" + std::to_string(block.remote_offset) + ", +" +
                           std::to_string(block.length) + ") lies outside the remote region of " +
                           std::to_string(d.size) + " bytes");
    }
    shared.hold(entry);
    batch.held.push_back(entry);
    const ofi::MemoryRegistration& registration = shared.registration(entry);
    std::byte* local = const_cast<std::byte*>(shared.base(entry)) + block.local_offset;
    const std::uint64_t remote_address = d.address + block.remote_offset;
    // Long blocks stripe over the data rails (as rendezvous messages do); the rest go whole,
    // round the rails. No piece is longer than the provider takes in one transfer.
    const bool stripe = data_rails_ > 1 && block.length >= 2 * settings_.min_stripe;
    std::size_t pieces = stripe ? data_rails_ : 1;
    while (block.length / pieces > max_piece) ++pieces;
    const std::size_t base = block.length / pieces;
    const std::size_t first_rail = stripe ? 0 : next_rail_++ % data_rails_;
    for (std::size_t p = 0; p < pieces; ++p) {
      const std::size_t offset = p * base;
      const std::size_t length = p + 1 == pieces ? block.length - offset : base;
      const auto rail = static_cast<std::uint32_t>((first_rail + p) % data_rails_);
      batch.pieces.push_back(Piece{.local = local + offset,
                                   .desc = registration.desc(rail),
                                   .remote_address = remote_address + offset,
                                   .key = d.keys[rail],
                                   .length = length,
                                   .rail = rail,
                                   .block = static_cast<std::uint32_t>(i)});
    }
    batch.bytes += block.length;
  }
  return true;
}

// Oldest batch first, so that blocks reach the provider in post order. A piece goes with FI_MORE
// when another is posted right after it in this call.
void RmaInitiatorImpl::post_pending() {
  while (!posting_.empty()) {
    Request& r = *posting_.front();
    Batch& batch = batch_of(r);
    const bool write = r.kind == RequestKind::kWrite;
    while (batch.next < batch.pieces.size()) {
      if (free_ops_.empty()) return;  // a completion posts more
      const Piece& piece = batch.pieces[batch.next];
      const std::uint32_t op = free_ops_.back();
      const bool more = batch.next + 1 < batch.pieces.size() && free_ops_.size() > 1;
      ofi::Rail& rail = lane_->rails().data(piece.rail);
      const Status status =
          write ? rail.write(peer_data_[piece.rail], piece.local, piece.length, piece.desc,
                             piece.remote_address, piece.key,
                             {.more = more, .delivery_complete = true}, &ops_[op])
                : rail.read(peer_data_[piece.rail], piece.local, piece.length, piece.desc,
                            piece.remote_address, piece.key, {.more = more}, &ops_[op]);
      if (status == Status::kRetry) {
        retry_later(r);
        return;
      }
      if (status != Status::kOk) {
        r.fail(Status::kError, std::string(write ? "write" : "read") + ": block " +
                                   std::to_string(piece.block) + ": " + rail.last_error());
        batch.next = batch.pieces.size();
        break;
      }
      free_ops_.pop_back();
      op_owner_[op] = &r;
      ++r.ops_outstanding;
      ++batch.next;
    }
    posting_.pop_front();
    if (r.batch == BatchState::kPosting) r.to(BatchState::kCompleting);
    if (r.ops_outstanding == 0) settle(r);
  }
}

void RmaInitiatorImpl::on_completion(ofi::OpContext& context, const ofi::Completion& completion) {
  const auto op = static_cast<std::uint32_t>(&context - ops_.data());
  Request& r = *op_owner_[op];
  op_owner_[op] = nullptr;
  free_ops_.push_back(op);
  --r.ops_outstanding;
  if (completion.status != Status::kOk) [[unlikely]] {
    const char* what = r.kind == RequestKind::kWrite ? "write" : "read";
    r.fail(completion.status == Status::kPeerError ? Status::kPeerError : Status::kError,
           std::string(what) + " batch: a block failed at the provider (" +
               std::string(completion.error_text) + ")");
  }
  if (r.ops_outstanding == 0 && r.batch == BatchState::kCompleting) settle(r);
  if (r.record == RecordState::kReleased && r.ops_outstanding == 0) [[unlikely]]
    release_regions(r);
  post_pending();
  if (writes_posted_owed_) answer_writes_posted();
}

void RmaInitiatorImpl::settle(Request& r) {
  Batch& batch = batch_of(r);
  if (r.status != Status::kOk) {
    r.to(BatchState::kFailed);
    send_notifications();  // a later batch's notification may have waited behind this one
    return;
  }
  ++rma_stats_.batches;
  rma_stats_.blocks += batch.blocks;
  (r.kind == RequestKind::kWrite ? rma_stats_.bytes_written : rma_stats_.bytes_read) +=
      batch.bytes;
  if (!batch.notification) {
    r.to(BatchState::kDone);
    return;
  }
  r.to(BatchState::kNotifying);
  send_notifications();
}

void RmaInitiatorImpl::send_notifications() {
  while (!notifying_.empty()) {
    Request& r = *notifying_.front();
    if (r.batch == BatchState::kFailed || !r.in_use()) {
      notifying_.pop_front();  // its notification never goes, and takes no number
      continue;
    }
    if (r.batch != BatchState::kNotifying) return;  // its writes are still out
    if (peer_gone()) {
      r.fail(Status::kPeerError, "write batch landed, but its notification cannot be sent: " +
                                     peer_gone_);
      r.to(BatchState::kFailed);
      notifying_.pop_front();
      continue;
    }
    Notify& notify = *batch_of(r).notification;
    notify.seq = next_notify_;
    std::byte body[kNotifyBytes];
    const Status status =
        send_control(MessageType::kNotify, notify.seq, {body, encode_notify(notify, body)});
    if (status == Status::kRetry) {
      retry_later(r);
      return;
    }
    if (status != Status::kOk) {
      r.fail(Status::kError, "write batch landed, but its notification failed: " + last_error_);
      r.to(BatchState::kFailed);
    } else {
      ++next_notify_;
      ++rma_stats_.notifications;
      r.to(BatchState::kDone);
    }
    notifying_.pop_front();
  }
}

void RmaInitiatorImpl::advance(Request& /*request*/) {
  post_pending();
  send_notifications();
}

void RmaInitiatorImpl::on_deferred() {
  Comm::on_deferred();
  if (writes_posted_owed_) answer_writes_posted();
}

void RmaInitiatorImpl::fail_batch(Request& r, Status status, const std::string& why) {
  r.fail(status, why);
  Batch& batch = batch_of(r);
  batch.next = batch.pieces.size();  // what was not handed to the provider never goes
  std::erase(posting_, &r);
  r.to(BatchState::kFailed);
}

void RmaInitiatorImpl::release_batch(Request& r) noexcept {
  Batch& batch = batch_of(r);
  for (std::uint32_t entry : batch.held) lane_->shared_regions().let_go(entry);
  batch.held.clear();
}

void RmaInitiatorImpl::on_control(const mux::ControlHeader& header,
                                  std::span<const std::byte> body) {
  if (on_liveness(header, body)) return;
  if (static_cast<MessageType>(header.type) == MessageType::kClose) {
    on_peer_close(body);
    return;
  }
  util::log().warn("rma initiator {} on lane {}: unexpected control message type {} dropped", id_,
                   lane_->id(), header.type);
}

// Our close notice says every write we posted has completed: the target may close its endpoints
// once it has it. So the writes in flight finish first (bounded by LOOM_PEER_TIMEOUT_MS).
CloseNotice RmaInitiatorImpl::close_notice(CloseReason reason) {
  if (reason == CloseReason::kClosed) {
    const auto deadline = std::chrono::steady_clock::now() + settings_.peer_timeout;
    auto writing = [&] {
      for (const Request& r : requests_.in_use(RequestKind::kWrite))
        if (r.ops_outstanding != 0) return true;
      return false;
    };
    while (writing() && std::chrono::steady_clock::now() < deadline) lane_->progress();
  }
  return notice_for(next_notify_, {});
}

void RmaInitiatorImpl::send_writes_posted() {
  writes_posted_owed_ = true;
  answer_writes_posted();
}

// The closing target's notice waits for our word that no write of ours is still arriving.
void RmaInitiatorImpl::answer_writes_posted() {
  for (const Request& r : requests_.in_use(RequestKind::kWrite))
    if (r.ops_outstanding != 0) return;  // the last completion answers
  const WritesPosted answer{.writes = 0};
  std::byte bytes[kWritesPostedBytes];
  const std::size_t length = encode_writes_posted(answer, bytes);
  if (send_control(MessageType::kWritesPosted, 0, {bytes, length}, true) == Status::kOk) {
    writes_posted_owed_ = false;
  } else {
    defer();
  }
}

// The target closed: what is in flight runs on (its regions outlive the connection); the
// notifications still to send fail (send_notifications).
void RmaInitiatorImpl::fail_unfinished(const CloseNotice& /*notice*/, Status /*status*/,
                                       const std::string& /*why*/) {
  send_notifications();
}

void RmaInitiatorImpl::settle_after_close() {
  fail_all(Status::kPeerError, peer_gone_);
}

RmaStats RmaInitiatorImpl::rma_stats() const {
  std::lock_guard lock(lane_->lock());
  RmaStats stats = rma_stats_;
  stats.lane_id = lane_->id();
  stats.lane_comms = lane_->stats().comms;
  return stats;
}

// ---- target ----

RmaTargetImpl::RmaTargetImpl(ContextCore& core, mux::Lane& lane, std::uint64_t peer)
    : Comm(core, lane, mux::Direction::kRecv, peer) {}

std::vector<std::byte> RmaTargetImpl::export_region(const MemoryRegion& region) {
  std::lock_guard lock(lane_->lock());
  auto fail = [&](const std::string& why) {
    return Error("export region", settings_.provider, 0, why);
  };
  if (closed_) throw fail("the connection is closed");
  if (!is_context_region(region)) {
    throw fail(region.valid() ? "not a region of this context (Context::register_memory)"
                              : "an empty region");
  }
  const std::uint32_t entry = shared_entry(region);
  if (entry == mux::SharedRegions::kNone) throw fail(last_error_);
  const mux::SharedRegions& shared = lane_->shared_regions();
  const ofi::MemoryRegistration& registration = shared.registration(entry);
  RegionDescriptor descriptor{.context = context_id_,
                              .lane = lane_->id(),
                              .slot = name_of(region).slot,
                              .generation = name_of(region).generation,
                              .address = registration.remote_address(shared.base(entry)),
                              .size = shared.size(entry),
                              .rails = static_cast<std::uint8_t>(lane_->rails().data_rails()),
                              .keys = {}};
  for (std::size_t i = 0; i < descriptor.rails; ++i) descriptor.keys[i] = registration.key(i);
  std::vector<std::byte> bytes(descriptor_bytes(descriptor.rails));
  if (encode_descriptor(descriptor, bytes) != bytes.size()) throw fail("descriptor does not fit");
  return bytes;
}

std::optional<Notification> RmaTargetImpl::poll_notification() {
  std::unique_lock lock(lane_->lock());
  if (ready_.empty()) lane_->progress();
  if (ready_.empty()) {
    lock.unlock();
    kick_other_lanes();
    return std::nullopt;
  }
  Notification next = ready_.front();
  ready_.pop_front();
  ++rma_stats_.notifications;
  return next;
}

void RmaTargetImpl::on_control(const mux::ControlHeader& header, std::span<const std::byte> body) {
  if (on_liveness(header, body)) return;
  switch (static_cast<MessageType>(header.type)) {
    case MessageType::kNotify:
      on_notify(body);
      return;
    case MessageType::kClose:
      on_peer_close(body);
      return;
    case MessageType::kWritesPosted:
      writes_answered_ = true;
      return;
    default:
      util::log().warn("rma target {} on lane {}: unexpected control message type {} dropped",
                       id_, lane_->id(), header.type);
  }
}

// In post order, exactly once: a notification ahead of its turn waits for those before it; one
// already handed out (or malformed) is dropped with a warning.
void RmaTargetImpl::on_notify(std::span<const std::byte> body) {
  Notify notify;
  if (const char* why = decode_notify(body, notify)) [[unlikely]] {
    util::log().warn("rma target {} on lane {}: {}; dropped", id_, lane_->id(), why);
    return;
  }
  if (seq_before(notify.seq, next_expected_) || early_.contains(notify.seq)) [[unlikely]] {
    util::log().warn("rma target {} on lane {}: notification {} came twice; dropped", id_,
                     lane_->id(), notify.seq);
    return;
  }
  early_.emplace(notify.seq, notify);
  for (auto it = early_.find(next_expected_); it != early_.end();
       it = early_.find(next_expected_)) {
    const Notify& n = it->second;
    ready_.push_back(
        Notification{.tag = n.tag, .value = n.value, .blocks = n.blocks, .bytes = n.bytes});
    early_.erase(it);
    ++next_expected_;
  }
}

CloseNotice RmaTargetImpl::close_notice(CloseReason reason) {
  CloseNotice notice = notice_for(next_expected_, {});
  if (reason == CloseReason::kClosed) {
    notice.awaits_writes = true;
    awaiting_writes_ = true;
  }
  return notice;
}

RmaStats RmaTargetImpl::rma_stats() const {
  std::lock_guard lock(lane_->lock());
  RmaStats stats = rma_stats_;
  stats.lane_id = lane_->id();
  stats.lane_comms = lane_->stats().comms;
  return stats;
}

}  // namespace loom::p2p
