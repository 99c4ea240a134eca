// One-sided connections, both ends: descriptors exported and imported, batches planned, posted
// in waves of the connection's op contexts and completed, notifications sent in post order and
// handed out by the target in the same order, and the close of both.
#include "p2p/rma_comm.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include "ofi/memory_registration.hpp"
#include "p2p/context_core.hpp"
#include "util/log.hpp"

namespace loom::p2p {

// ---- both ends ----

void RmaComm::send_note(MessageType type, const RegionNote& note) {
  if (notes_out_.empty()) {
    std::byte body[kRegionNoteBytes];
    const Status status = send_control(type, 0, {body, encode_region_note(note, body)}, true);
    if (status != Status::kRetry) return;  // sent, or the peer is unreachable (liveness says)
  }
  notes_out_.emplace_back(type, note);
  defer();
}

void RmaComm::on_deferred() {
  Comm::on_deferred();
  std::size_t sent = 0;
  for (; sent < notes_out_.size() && !peer_gone(); ++sent) {
    const auto& [type, note] = notes_out_[sent];
    std::byte body[kRegionNoteBytes];
    if (send_control(type, 0, {body, encode_region_note(note, body)}, true) == Status::kRetry) {
      defer();
      break;
    }
  }
  notes_out_.erase(notes_out_.begin(), notes_out_.begin() + static_cast<std::ptrdiff_t>(sent));
}

// ---- initiator ----

RmaInitiatorImpl::RmaInitiatorImpl(ContextCore& core, mux::Lane& lane, std::uint64_t peer)
    : RmaComm(core, lane, mux::Direction::kSend, peer),
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
    why =
        "a region descriptor exported for another connection's lane (its keys name other "
        "endpoints)";
  if (why == nullptr && descriptor.rails < data_rails_)
    why = "a region descriptor with fewer keys than the connection has data rails";
  if (why != nullptr) throw Error("import region", settings_.provider, 0, why);
  // Whether the region is still live there: a stale descriptor's keys are closed, and what a
  // provider does with a write through a closed key ranges from an error to silence.
  if (peer_gone()) throw Error("import region", settings_.provider, 0, peer_gone_);
  const RegionNote query{.seq = next_query_++,
                         .slot = descriptor.slot,
                         .generation = descriptor.generation,
                         .live = false};
  answer_.reset();
  send_note(MessageType::kRegionQuery, query);
  const auto deadline = std::chrono::steady_clock::now() + settings_.peer_timeout;
  while (!(answer_ && answer_->seq == query.seq) && !peer_gone() &&
         std::chrono::steady_clock::now() < deadline) {
    lane_->progress();
    lane_->lock().unlock();
    // The target may be importing from us at this moment, waiting on our other lanes (the
    // background thread gives them a turn only every 100 ms).
    lanes_.progress_another(*lane_);
    std::this_thread::yield();
    lane_->lock().lock();
  }
  if (!(answer_ && answer_->seq == query.seq)) {
    throw Error("import region", settings_.provider, ETIMEDOUT,
                peer_gone() ? peer_gone_
                            : "the target did not answer whether the region is live within "
                              "LOOM_PEER_TIMEOUT_MS");
  }
  if (!answer_->live) {
    throw Error("import region", settings_.provider, 0,
                "a stale region descriptor: the target deregistered the region");
  }
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
  entry.revoked = false;
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
                              const std::optional<Notification>& notification, Request*& request,
                              NotifyProtocol protocol) {
  const char* operation = kind == RequestKind::kWrite ? "write" : "read";
  std::lock_guard lock(lane_->lock());
  if (closed_) return reject(Status::kInvalid, std::string(operation) + ": connection closed");
  if (peer_gone()) return reject(Status::kPeerError, std::string(operation) + ": " + peer_gone_);
  if (blocks.empty()) return reject(Status::kInvalid, std::string(operation) + ": empty batch");
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
  batch.protocol = notification ? protocol : NotifyProtocol::kAfterCompletion;
  batch.notified = false;
  if (kind == RequestKind::kWrite && batch.protocol == NotifyProtocol::kAfterCompletion) {
    choose_delivery_waits(batch);
  }
  if (notification) {
    const bool counted = protocol == NotifyProtocol::kCountedCqData;
    batch.notification =
        Notify{.seq = 0,
               .tag = notification->tag,
               .value = notification->value,
               .blocks = batch.blocks,
               .bytes = batch.bytes,
               .writes = counted ? static_cast<std::uint32_t>(batch.pieces.size()) : 0,
               .counter = counted ? next_counter_++ & mux::kImmSeqMask : 0};
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
  batch.targets.clear();
  batch.next = 0;
  batch.notification.reset();
  batch.blocks = static_cast<std::uint32_t>(blocks.size());
  batch.bytes = 0;
  mux::SharedRegions& shared = lane_->shared_regions();
  const std::size_t max_piece =
      lane_->rails().max_msg_size() == 0 ? SIZE_MAX : lane_->rails().max_msg_size();
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
      return refuse(i, !remote.valid()            ? "an empty remote region"
                       : remote.owner_ != serial_ ? "a remote region imported by another connection"
                                                  : "a remote region this connection forgot");
    }
    const RegionDescriptor& d = imported_[remote.slot_].descriptor;
    if (imported_[remote.slot_].revoked) {
      return refuse(i, "the target deregistered the remote region (its keys are revoked)");
    }
    if (!d.covers(block.remote_offset, block.length)) {
      return refuse(i, "[" + std::to_string(block.remote_offset) + ", +" +
                           std::to_string(block.length) + ") lies outside the remote region of " +
                           std::to_string(d.size) + " bytes");
    }
    shared.hold(entry);
    batch.held.push_back(entry);
    const ContextRegions::Name target{d.slot, d.generation};
    if (std::none_of(batch.targets.begin(), batch.targets.end(), [&](const auto& t) {
          return t.slot == target.slot && t.generation == target.generation;
        })) {
      batch.targets.push_back(target);
    }
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

// A batch is done (and its notification may leave) once its writes are in the target's memory.
// A write posted FI_DELIVERY_COMPLETE completes only then. Two cases need fewer:
// - The rail's provider places writes in the order they were posted (NicAttributes::
//   ordered_write_bytes covers every piece on the rail): the last piece on that rail arriving
//   means the earlier ones have, and only it waits (tcp;ofi_rxm acknowledges each such write).
// - The data rails' provider completes a write only once the peer took it, in the order its
//   endpoint posted them, and peer isolation is on (Comm::paced_above_, as two-sided stripes
//   use it: shm). There no write waits: one to a stopped or dead target would hold up every
//   later completion on the lane, to every target.
//   A plain write is shm's fast one, copied into the target's memory in the call
//   (process_vm_writev) where the kernel allows it, else one the target applies from its queue:
//   before its answer above the inject size, before the notification (which left after the
//   write's completion) up to it, as the target progresses its data rails once more before it
//   hands a notification out (RmaTargetImpl::poll_notification).
void RmaInitiatorImpl::choose_delivery_waits(Batch& batch) {
  if (paced_above_ != 0) {
    for (Piece& piece : batch.pieces) piece.delivery_complete = false;
    return;
  }
  // Bit r: rail r has a piece beyond its provider's ordered size / its last piece was seen
  // (walking from the end). LOOM_DATA_RAILS is at most 16.
  std::uint32_t unordered = 0;
  for (const Piece& piece : batch.pieces) {
    const std::size_t ordered_bytes =
        lane_->rails().data(piece.rail).nic().attributes().ordered_write_bytes;
    // max_order_waw_size orders writes "smaller than the size"; SIZE_MAX means any size.
    if (ordered_bytes != SIZE_MAX && piece.length >= ordered_bytes) unordered |= 1U << piece.rail;
  }
  std::uint32_t seen = 0;
  for (auto piece = batch.pieces.rbegin(); piece != batch.pieces.rend(); ++piece) {
    const std::uint32_t bit = 1U << piece->rail;
    piece->delivery_complete = (unordered & bit) != 0 || (seen & bit) == 0;
    seen |= bit;
  }
}

// Oldest batch first, so that blocks reach the provider in post order. A piece goes with FI_MORE
// when another is posted right after it in this call.
void RmaInitiatorImpl::post_pending() {
  while (!posting_.empty()) {
    Request& r = *posting_.front();
    Batch& batch = batch_of(r);
    const bool write = r.kind == RequestKind::kWrite;
    // Counted CQ data: each write names the batch's counter; no delivery-complete wait.
    const bool counted = batch.protocol == NotifyProtocol::kCountedCqData;
    const std::uint32_t immediate =
        counted ? mux::encode_immediate(
                      {peer_id_, static_cast<std::uint16_t>(batch.notification->counter), false, 1})
                : 0;
    while (batch.next < batch.pieces.size()) {
      if (free_ops_.empty()) return;  // a completion posts more
      const Piece& piece = batch.pieces[batch.next];
      const std::uint32_t op = free_ops_.back();
      const bool more = batch.next + 1 < batch.pieces.size() && free_ops_.size() > 1;
      ofi::Rail& rail = lane_->rails().data(piece.rail);
      const Status status =
          write ? rail.write(peer_data_[piece.rail], piece.local, piece.length, piece.desc,
                             piece.remote_address, piece.key,
                             {.more = more,
                              .delivery_complete = piece.delivery_complete,
                              .remote_cq_data = counted,
                              .data = immediate},
                             &ops_[op])
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
      rma_stats_.delivery_waits += write && piece.delivery_complete ? 1 : 0;
      op_owner_[op] = &r;
      ++r.ops_outstanding;
      ++batch.next;
    }
    posting_.pop_front();
    if (r.batch == BatchState::kPosting) r.to(BatchState::kCompleting);
    if (batch.protocol == NotifyProtocol::kCountedCqData) send_notifications();
    if (r.ops_outstanding == 0 && r.batch == BatchState::kCompleting) settle(r);
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
    // A write the provider gave back (cancelled) or failed for a lost connection: the target
    // is gone, not the block's fault.
    const bool gone = completion.status == Status::kPeerError ||
                      completion.status == Status::kCancelled || peer_gone();
    r.fail(gone ? Status::kPeerError : Status::kError,
           std::string(what) + " batch: a block failed at the provider (" +
               std::string(completion.error_text) + ")");
  }
  if (r.ops_outstanding == 0 && r.batch == BatchState::kCompleting) settle(r);
  if (r.record == RecordState::kReleased && r.ops_outstanding == 0) [[unlikely]]
    release_regions(r);
  post_pending();
  if (writes_posted_owed_) answer_writes_posted();
  if (!revocations_.empty()) [[unlikely]]
    answer_revocations();
}

void RmaInitiatorImpl::settle(Request& r) {
  Batch& batch = batch_of(r);
  if (r.status != Status::kOk) {
    r.to(BatchState::kFailed);
    if (batch.notified) {
      // A counted notification went ahead of its writes: the target must not wait for it.
      Notify cancel{.seq = batch.notification->seq};
      std::byte body[kNotifyBytes];
      (void)send_control(MessageType::kNotifyCancel, cancel.seq,
                         {body, encode_notify(cancel, body)}, true);
    }
    send_notifications();  // a later batch's notification may have waited behind this one
    return;
  }
  ++rma_stats_.batches;
  rma_stats_.blocks += batch.blocks;
  (r.kind == RequestKind::kWrite ? rma_stats_.bytes_written : rma_stats_.bytes_read) += batch.bytes;
  if (!batch.notification || batch.notified) {
    r.to(BatchState::kDone);
    return;
  }
  r.to(BatchState::kNotifying);
  send_notifications();
}

// In post order. kAfterCompletion: once every write of the batch completed; kCountedCqData:
// once every write is posted.
void RmaInitiatorImpl::send_notifications() {
  while (!notifying_.empty()) {
    Request& r = *notifying_.front();
    Batch& batch = batch_of(r);
    if (!batch.notified && (r.batch == BatchState::kFailed || !r.in_use())) {
      notifying_.pop_front();  // its notification never goes, and takes no number
      continue;
    }
    const bool due = batch.protocol == NotifyProtocol::kCountedCqData
                         ? batch.next == batch.pieces.size() && r.batch != BatchState::kPosting
                         : r.batch == BatchState::kNotifying;
    if (!due) return;
    if (peer_gone()) {
      r.fail(Status::kPeerError, "write batch: its notification cannot be sent: " + peer_gone_);
      if (r.batch == BatchState::kNotifying) r.to(BatchState::kFailed);
      notifying_.pop_front();
      continue;
    }
    Notify& notify = *batch.notification;
    notify.seq = next_notify_;
    std::byte body[kNotifyBytes];
    const Status status =
        send_control(MessageType::kNotify, notify.seq, {body, encode_notify(notify, body)});
    if (status == Status::kRetry) {
      retry_later(r);
      return;
    }
    if (status != Status::kOk) {
      r.fail(Status::kError, "write batch: its notification failed: " + last_error_);
      if (r.batch == BatchState::kNotifying) r.to(BatchState::kFailed);
    } else {
      ++next_notify_;
      ++rma_stats_.notifications;
      batch.notified = true;
      if (r.batch == BatchState::kNotifying) r.to(BatchState::kDone);
    }
    notifying_.pop_front();
  }
}

void RmaInitiatorImpl::advance(Request& /*request*/) {
  post_pending();
  send_notifications();
}

void RmaInitiatorImpl::on_deferred() {
  RmaComm::on_deferred();
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
  const auto type = static_cast<MessageType>(header.type);
  if (type == MessageType::kClose) {
    on_peer_close(body);
    return;
  }
  if (type == MessageType::kRevoke || type == MessageType::kRegionAnswer) {
    RegionNote note;
    if (const char* why = decode_region_note(body, note)) [[unlikely]] {
      util::log().warn("rma initiator {} on lane {}: {}; dropped", id_, lane_->id(), why);
      return;
    }
    if (type == MessageType::kRevoke) {
      on_revoke(note);
    } else {
      answer_ = note;
    }
    return;
  }
  util::log().warn("rma initiator {} on lane {}: unexpected control message type {} dropped", id_,
                   lane_->id(), header.type);
}

// The target deregisters a region: no block goes into it from now on (batches still being
// posted fail, what they handed over completes), then we answer.
void RmaInitiatorImpl::on_revoke(const RegionNote& note) {
  const ContextRegions::Name region{note.slot, note.generation};
  auto same = [&](const ContextRegions::Name& n) {
    return n.slot == region.slot && n.generation == region.generation;
  };
  for (Imported& entry : imported_) {
    if (same({entry.descriptor.slot, entry.descriptor.generation})) entry.revoked = true;
  }
  for (Request* r : posting_) {
    Batch& batch = batch_of(*r);
    if (std::none_of(batch.targets.begin(), batch.targets.end(), same)) continue;
    r->fail(Status::kError, std::string(r->kind == RequestKind::kWrite ? "write" : "read") +
                                " batch: the target deregistered a region it uses while the "
                                "batch was being posted; the blocks not posted by then never went");
    batch.next = batch.pieces.size();
  }
  std::erase_if(posting_, [&](Request* r) {
    if (batch_of(*r).next < batch_of(*r).pieces.size()) return false;
    r->to(BatchState::kCompleting);
    if (r->ops_outstanding == 0) settle(*r);
    return true;
  });
  revocations_.push_back({note.seq, region});
  answer_revocations();
}

bool RmaInitiatorImpl::in_flight(ContextRegions::Name region) const noexcept {
  for (const Request& r : requests_.built()) {
    if (!r.is_batch() || !r.in_use() || r.ops_outstanding == 0) continue;
    for (const auto& t : batches_[requests_.index_of(r)].targets)
      if (t.slot == region.slot && t.generation == region.generation) return true;
  }
  return false;
}

void RmaInitiatorImpl::answer_revocations() {
  std::erase_if(revocations_, [&](const Revocation& revocation) {
    if (in_flight(revocation.region)) return false;
    send_note(MessageType::kRevoked, RegionNote{.seq = revocation.seq,
                                                .slot = revocation.region.slot,
                                                .generation = revocation.region.generation,
                                                .live = false});
    return true;
  });
}

// Our close notice says every write we posted has completed: the target may close its endpoints
// once it has it. So the writes in flight finish first, or the target is found lost: silent for
// LOOM_PEER_TIMEOUT_MS counted from the last time we heard of it, at most a check after this
// wait began. The deadline only backs that up: were it the peer timeout itself, it would pass
// a moment before check_peer() gives up, and Comm::close would wait a second peer timeout.
CloseNotice RmaInitiatorImpl::close_notice(CloseReason reason) {
  if (reason == CloseReason::kClosed) {
    const auto deadline =
        std::chrono::steady_clock::now() + settings_.peer_timeout + settings_.peer_timeout / 4;
    auto writing = [&] {
      for (const Request& r : requests_.in_use(RequestKind::kWrite))
        if (r.ops_outstanding != 0) return true;
      return false;
    };
    while (writing() && std::chrono::steady_clock::now() < deadline) {
      lane_->progress();
      check_peer();  // a target silent for the peer timeout ends the wait (once, not twice)
      if (peer_ == PeerState::kLost) break;
    }
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
    : RmaComm(core, lane, mux::Direction::kRecv, peer),
      // The provider's, not paced_above_: the initiator's isolation setting decides its writes.
      progress_before_notifying_(lane.rails().data(0).nic().attributes().peer_paced_above != 0) {}

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
  // Writes shm applies from the target's queue complete at the initiator before they are
  // applied (see RmaInitiatorImpl::choose_delivery_waits): those of this notification's batch
  // were queued before it was sent, and this progress applies them.
  if (progress_before_notifying_) lane_->progress();
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
    case MessageType::kNotifyCancel:
      on_notify_cancel(body);
      return;
    case MessageType::kClose:
      on_peer_close(body);
      return;
    case MessageType::kWritesPosted:
      writes_answered_ = true;
      return;
    case MessageType::kRevoked:
    case MessageType::kRegionQuery:
      on_region_note(static_cast<MessageType>(header.type), body);
      return;
    default:
      util::log().warn("rma target {} on lane {}: unexpected control message type {} dropped", id_,
                       lane_->id(), header.type);
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
  if (seq_before(notify.seq, next_expected_) || early_.contains(notify.seq) ||
      std::any_of(counting_.begin(), counting_.end(),
                  [&](const auto& entry) { return entry.second.seq == notify.seq; })) [[unlikely]] {
    util::log().warn("rma target {} on lane {}: notification {} came twice; dropped", id_,
                     lane_->id(), notify.seq);
    return;
  }
  if (notify.writes != 0) {
    if (counts_.empty()) counts_.resize(std::size_t{1} << mux::kImmSeqBits);
    if (counts_[notify.counter] < notify.writes) {
      counting_[notify.counter] = notify;  // the writes' completions come yet
      return;
    }
    counts_[notify.counter] -= notify.writes;
  }
  early_.emplace(notify.seq, notify);
  release_in_order();
}

// kCountedCqData: one write of a batch arrived.
void RmaTargetImpl::on_remote_write(mux::WriteImmediate immediate) {
  if (counts_.empty()) counts_.resize(std::size_t{1} << mux::kImmSeqBits);
  std::uint32_t& count = counts_[immediate.seq];
  ++count;
  auto waiting = counting_.find(immediate.seq);
  if (waiting == counting_.end() || count < waiting->second.writes) return;
  count -= waiting->second.writes;
  early_.emplace(waiting->second.seq, waiting->second);
  counting_.erase(waiting);
  release_in_order();
}

void RmaTargetImpl::on_notify_cancel(std::span<const std::byte> body) {
  Notify cancel;
  if (const char* why = decode_notify(body, cancel)) [[unlikely]] {
    util::log().warn("rma target {} on lane {}: {}; dropped", id_, lane_->id(), why);
    return;
  }
  std::erase_if(counting_, [&](const auto& entry) { return entry.second.seq == cancel.seq; });
  if (!seq_before(cancel.seq, next_expected_)) early_[cancel.seq] = std::nullopt;
  release_in_order();
}

void RmaTargetImpl::release_in_order() {
  for (auto it = early_.find(next_expected_); it != early_.end();
       it = early_.find(next_expected_)) {
    if (const std::optional<Notify>& n = it->second) {
      ready_.push_back(
          Notification{.tag = n->tag, .value = n->value, .blocks = n->blocks, .bytes = n->bytes});
    }
    early_.erase(it);
    ++next_expected_;
  }
}

bool RmaTargetImpl::revoke_region(std::uint32_t slot, std::uint32_t generation) {
  if (closed_ || peer_gone() || peer_control_.empty()) return false;
  const std::uint32_t seq = next_revoke_++;
  send_note(MessageType::kRevoke,
            RegionNote{.seq = seq, .slot = slot, .generation = generation, .live = false});
  awaiting_revoked_.push_back(seq);
  since_check_ = SinceCheck::kWaitBegan;  // the peer's silence counts from now
  return true;
}

bool RmaTargetImpl::revoking() {
  if (awaiting_revoked_.empty()) return false;
  check_peer();  // pings; a dead initiator ends the wait (its provider may say so at once)
  return peer_ == PeerState::kConnected;
}

void RmaTargetImpl::on_region_note(MessageType type, std::span<const std::byte> body) {
  RegionNote note;
  if (const char* why = decode_region_note(body, note)) [[unlikely]] {
    util::log().warn("rma target {} on lane {}: {}; dropped", id_, lane_->id(), why);
    return;
  }
  if (type == MessageType::kRevoked) {
    std::erase(awaiting_revoked_, note.seq);
    return;
  }
  // Live: in the context, and registered on this lane (whose keys the descriptor carries).
  note.live = regions_->find({note.slot, note.generation}).has_value() &&
              lane_->shared_regions().find(note.slot, note.generation) != mux::SharedRegions::kNone;
  send_note(MessageType::kRegionAnswer, note);
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
