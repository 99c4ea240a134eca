#include "p2p/recv_comm.hpp"

#include "ofi/memory_registration.hpp"
#include "p2p/context_core.hpp"
#include "util/log.hpp"

namespace loom::p2p {

RecvCommImpl::RecvCommImpl(std::shared_ptr<ContextCore> core, mux::Lane& lane)
    : Comm(std::move(core), lane, mux::Direction::kRecv), by_seq_(kSeqWindow) {}

Status RecvCommImpl::irecv(std::span<const RecvBuffer> buffers, Request*& request) {
  request = nullptr;
  std::lock_guard lock(lane_->mutex());
  if (closed_) [[unlikely]]
    return reject(Status::kInvalid, "irecv on a closed communicator");
  if (peer_gone()) [[unlikely]] {
    return reject(Status::kPeerError, "irecv: " + peer_gone_);
  }
  if (buffers.empty() || buffers.size() > kMaxParts) [[unlikely]] {
    return reject(Status::kInvalid, "irecv takes 1 to " + std::to_string(kMaxParts) +
                                        " buffers, got " + std::to_string(buffers.size()));
  }
  const ofi::MemoryRegistration* registrations[kMaxParts] = {};
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].size == 0) continue;
    registrations[i] = lookup(buffers[i].region, buffers[i].data, buffers[i].size);
    if (registrations[i] == nullptr) [[unlikely]]
      return Status::kInvalid;
  }
  Request* r = allocate(RequestKind::kRecv);
  if (r == nullptr) [[unlikely]] {
    return reject(Status::kRetry, "irecv: " + std::to_string(kMaxRequests) +
                                      " requests already in flight; test some first");
  }
  r->part_count = static_cast<std::uint8_t>(buffers.size());
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const std::uint32_t seq = next_seq_++;
    r->parts[i] = Part{.data = static_cast<std::byte*>(buffers[i].data),
                       .size = buffers[i].size,
                       .tag = buffers[i].tag,
                       .registration = registrations[i],
                       .seq = seq};
    by_seq_[seq % kSeqWindow] = Slot{r, static_cast<std::uint8_t>(i)};
  }
  advance(*r);
  request = r;
  return Status::kOk;
}

Status RecvCommImpl::iflush(std::span<const RecvBuffer> buffers, Request*& request) {
  request = nullptr;
  std::lock_guard lock(lane_->mutex());
  if (closed_) [[unlikely]]
    return reject(Status::kInvalid, "iflush on a closed communicator");
  // The read must come from device memory: one from a host buffer orders nothing on the GPU.
  const RecvBuffer* target = nullptr;
  const ofi::MemoryRegistration* registration = nullptr;
  bool device = false;
  for (const RecvBuffer& buffer : buffers) {
    if (buffer.size == 0) continue;
    const auto* found = lookup(buffer.region, buffer.data, buffer.size);
    if (found == nullptr) return Status::kInvalid;
    const bool on_device = found->type() != MemoryType::kHost;
    if (target == nullptr || (on_device && !device)) {
      target = &buffer;
      registration = found;
    }
    device |= on_device;
  }
  // Host memory is coherent with the NIC's writes: nothing to flush unless a test forces it.
  // Device memory is flushed unless LOOM_GPU_FLUSH=0 says the platform makes the NIC's writes
  // visible to the GPU at completion.
  const Config& config = core_->config();
  if (target == nullptr || !(config.force_flush || (device && config.gpu_flush))) {
    return Status::kOk;
  }
  Request* r = allocate(RequestKind::kFlush);
  if (r == nullptr) return reject(Status::kRetry, "iflush: too many requests in flight");
  r->part_count = 1;
  r->parts[0] = Part{.data = static_cast<std::byte*>(target->data),
                     .size = target->size,
                     .tag = target->tag,
                     .registration = registration};
  // A read orders only the writes that came through its own NIC before it, and a message may
  // have come through any data rail (eager: one; rendezvous: striped): one read per data rail.
  // A flush's "stripes" are those reads.
  r->stripes = static_cast<std::uint8_t>(data_rails_);
  advance(*r);
  request = r;
  return Status::kOk;
}

// Posts the flush's reads, rail by rail, in waves of kMaxOps (a request's operation contexts):
// the next wave waits until the contexts of the last one are all back.
void RecvCommImpl::post_flush_reads(Request& r) {
  Part& part = r.parts[0];
  while (r.stripes_posted < r.stripes) {
    const std::size_t slot = r.stripes_posted % kMaxOps;
    if (slot == 0 && r.ops_outstanding != 0) return;
    ofi::Rail& rail = lane_->rails().data(r.stripes_posted);
    const Status status = rail.flush(*part.registration, part.data, part.size, &r.ops[slot]);
    if (status == Status::kRetry) {
      queue_retry(r);
      return;
    }
    if (status != Status::kOk) {
      r.fail(Status::kError, "iflush: " + rail.last_error());
      r.stripes = r.stripes_posted;  // no further reads; done once those posted are back
      break;
    }
    ++r.stripes_posted;
    ++r.ops_outstanding;
  }
  part.done = r.stripes_done == r.stripes;
}

void RecvCommImpl::on_flush_read(Request& r, const ofi::Completion& completion) {
  --r.ops_outstanding;
  ++r.stripes_done;
  if (completion.status != Status::kOk) {
    r.fail(Status::kError, "iflush: " + std::string(completion.error_text));
    r.stripes = r.stripes_posted;
  }
  if (r.ops_outstanding == 0) post_flush_reads(r);
}

void RecvCommImpl::advance(Request& r) {
  if (r.kind == RequestKind::kFlush) {
    post_flush_reads(r);
    return;
  }
  post_in_order();
  if (!r.cts_queued) announce(r);
}

// Receives go to the provider in sequence order, the order the sender sends in. When the
// provider's queue is full, later buffers wait behind earlier ones: a queue whose entries were
// taken by receives for messages far ahead (a newer irecv finding an entry free while older
// ones waited for a retry) held none for the messages the sender could send, and both sides
// stopped.
void RecvCommImpl::post_in_order() {
  while (post_next_ != next_seq_) {
    const Slot& slot = by_seq_[post_next_ % kSeqWindow];
    Request* r = slot.request;
    if (r != nullptr && r->in_use && r->kind == RequestKind::kRecv && slot.part < r->part_count &&
        r->parts[slot.part].seq == post_next_) {
      if (!post_receive(*r, slot.part)) return;  // queued for retry: resumes here
      if (!r->cts_queued) announce(*r);
    }
    ++post_next_;
  }
}

// A buffer above the eager limit gets no eager receive: it would be posted, then cancelled for
// every large message (an error completion to read). Its sender writes instead, whatever the
// message's size (see SendCommImpl::match).
bool RecvCommImpl::post_receive(Request& r, std::size_t i) {
  Part& part = r.parts[i];
  if (part.recv_posted || part.done || part.by_write) return true;
  if (part.size > eager_max_) {
    part.by_write = true;
    return true;
  }
  const std::size_t rail = part.seq % data_rails_;
  ofi::Rail& data_rail = lane_->rails().data(rail);
  // Leaves part of the provider's queue free of posted receives (Lane::may_post_receive).
  const Status status =
      !lane_->may_post_receive(rail)
          ? Status::kRetry
          : data_rail.tagged_recv(
                part.data, part.size, part.registration ? part.registration->desc(rail) : nullptr,
                mux::encode_tag({mux::TagKind::kEager, id_, part.seq}), 0, &r.ops[i]);
  if (status == Status::kOk) {
    part.recv_posted = part.recv_outstanding = true;
    ++r.ops_outstanding;
    lane_->receive_posted(rail);
  } else if (status == Status::kRetry) {
    queue_retry(r);
    return false;
  } else {
    part.status = Status::kError;
    part.done = true;
    r.fail(Status::kError, "irecv: " + data_rail.last_error());
  }
  return true;
}

// A buffer is announced only once the provider holds its eager receive (or it needs none: its
// message comes by write, or the buffer already failed); the sender sends eagerly only
// after the announcement (see SendCommImpl::advance). So an eager message never arrives before
// its receive and never occupies a provider queue entry that posted receives need. Buffers
// whose receive waits for room in the provider's queue are announced when it is posted.
void RecvCommImpl::announce(Request& r) {
  if (batch_limit_ == 0) {
    batch_limit_ = max_cts_entries(data_rails_);
    batched_.reserve(batch_limit_);
  }
  bool all = true;
  for (std::size_t i = 0; i < r.part_count; ++i) {
    Part& part = r.parts[i];
    if (part.announced) continue;
    if (!part.recv_posted && !part.done && !part.by_write) {
      all = false;  // retried with the receive (post_receive queued the request)
      continue;
    }
    if (batch_.count == batch_limit_) flush_control();
    if (batch_.count == batch_limit_) {
      queue_retry(r);  // the batch is stuck behind back-pressure: try again later
      return;
    }
    batch_.data_rails = static_cast<std::uint8_t>(data_rails_);
    CtsEntry& entry = batch_.entries[batch_.count++];
    entry.seq = part.seq;
    entry.size = part.size;
    entry.tag = part.tag;
    entry.eager_receive = !part.by_write;
    entry.refused = part.done && part.status != Status::kOk;
    entry.address = 0;
    if (part.registration != nullptr) {
      entry.address = part.registration->remote_address(part.data);
      for (std::size_t k = 0; k < data_rails_; ++k) entry.keys[k] = part.registration->key(k);
    }
    part.announced = true;
    batched_.push_back({&r, static_cast<std::uint8_t>(i)});
    schedule_flush();
  }
  r.cts_queued = all;
}

void RecvCommImpl::flush_control() {
  if (batch_.count == 0) return;
  if (closed_ || peer_gone()) {
    batch_.count = 0;
    batched_.clear();
    return;
  }
  std::byte body[mux::kMaxControlBody];
  const std::size_t length = encode_cts(batch_, body);
  // See SendCommImpl::flush_control: an unencodable batch fails its requests.
  const Status status =
      length == 0 ? refuse_batch("clear-to-send")
                  : send_control(MessageType::kClearToSend, batch_.entries[0].seq, {body, length});
  if (status == Status::kRetry) {
    schedule_flush();
    return;
  }
  for (const Announced& a : batched_) {
    Request& r = *a.request;
    if (r.cts_sent) continue;  // failed through an earlier entry
    r.parts[a.part].told = true;
    if (status != Status::kOk) {
      // The sender cannot learn of these buffers: fail what has not arrived yet, and announce
      // no more of them.
      r.fail(Status::kError, "irecv: " + last_error_);
      r.cts_queued = r.cts_sent = true;
      cancel(r);
      continue;
    }
    r.cts_sent = r.cts_queued;
    for (std::size_t i = 0; i < r.part_count && r.cts_sent; ++i) r.cts_sent = r.parts[i].told;
  }
  batch_.count = 0;
  batched_.clear();
}

void RecvCommImpl::cancel(Request& r) {
  for (std::size_t i = 0; i < r.part_count; ++i) {
    if (r.parts[i].recv_outstanding && r.kind == RequestKind::kRecv) {
      lane_->rails().data(r.parts[i].seq % data_rails_).cancel(&r.ops[i]);
    }
  }
}

// Also readies the wait for writes still coming into unfinished buffers the sender was told of
// (see writes_may_arrive): called once, by close().
CloseNotice RecvCommImpl::close_notice() {
  std::vector<std::uint32_t> unfinished;
  for (const Request& r : requests_.built()) {
    if (!r.in_use || r.kind != RequestKind::kRecv) continue;
    for (std::size_t i = 0; i < r.part_count; ++i) {
      const Part& part = r.parts[i];
      if (part.done) continue;
      unfinished.push_back(part.seq);
      awaiting_writes_ = awaiting_writes_ || part.told;
      writes_seen_ += part.writes_seen;
    }
  }
  CloseNotice notice = notice_for(next_seq_, unfinished);
  notice.awaits_writes = awaiting_writes_;
  return notice;
}

bool RecvCommImpl::writes_may_arrive() const noexcept {
  return awaiting_writes_ && (!writes_posted_ || writes_seen_ < *writes_posted_);
}

void RecvCommImpl::fail_unfinished(const CloseNotice& notice, const std::string& why) {
  for (Request& r : requests_.built()) {
    if (!r.in_use || r.kind != RequestKind::kRecv) continue;
    for (std::size_t i = 0; i < r.part_count; ++i) {
      Part& part = r.parts[i];
      // The sender handed the message over whole: it is on its way.
      if (part.done || notice.finished(part.seq)) continue;
      part.status = Status::kPeerError;
      r.fail(Status::kPeerError,
             "irecv: " + why + " before sending message " + std::to_string(part.seq));
      if (part.recv_outstanding) {
        lane_->rails().data(part.seq % data_rails_).cancel(&r.ops[i]);  // done when it completes
      } else {
        part.done = true;
      }
    }
  }
}

void RecvCommImpl::settle_after_close() {
  fail_all(Status::kPeerError,
           "the peer closed the communicator and what it had sent did not arrive within "
           "LOOM_PEER_TIMEOUT_MS (" +
               std::to_string(core_->config().peer_timeout_ms) + " ms)");
}

void RecvCommImpl::finish_rendezvous(Part& part) {
  if (part.done || !part.rendezvous || part.recv_outstanding) return;
  if (part.status == Status::kOk && part.writes_seen < part.writes_expected) return;
  part.done = true;
  if (part.status == Status::kOk) ++stats_.rendezvous;
}

void RecvCommImpl::on_op(Request& r, std::size_t i, const ofi::Completion& completion) {
  if (r.kind == RequestKind::kFlush) {
    on_flush_read(r, completion);
    return;
  }
  Part& part = r.parts[i];
  --r.ops_outstanding;
  part.recv_outstanding = false;
  lane_->receive_finished(part.seq % data_rails_);
  switch (completion.status) {
    case Status::kOk:
      if (!completion.has_data || completion.data != part.tag) {
        part.status = Status::kInvalid;
        r.fail(Status::kInvalid, "irecv: message " + std::to_string(part.seq) + " carries tag " +
                                     std::to_string(completion.data) + ", the buffer expects " +
                                     std::to_string(part.tag));
      }
      part.delivered = completion.length;
      part.done = true;
      ++stats_.eager;
      break;
    case Status::kTruncated:
      part.status = Status::kTruncated;
      r.fail(Status::kTruncated, "irecv: message " + std::to_string(part.seq) + " of " +
                                     std::to_string(completion.length + completion.overflow) +
                                     " bytes is larger than the posted buffer of " +
                                     std::to_string(part.size) + " bytes");
      part.done = true;
      break;
    case Status::kCancelled:
      // Either the message comes by rendezvous, or the communicator is closing.
      if (part.rendezvous) {
        finish_rendezvous(part);
      } else {
        part.status = Status::kCancelled;
        r.fail(Status::kCancelled, "irecv: cancelled");
        part.done = true;
      }
      break;
    default:
      // kPeerError: the connection to the peer is gone; kError: anything else.
      part.status = completion.status == Status::kPeerError ? Status::kPeerError : Status::kError;
      r.fail(part.status, "irecv: " + std::string(completion.error_text));
      part.done = true;
  }
}

Part* RecvCommImpl::waiting_part(std::uint32_t seq, std::uint32_t mask, Request** owner,
                                 std::size_t* index) {
  const Slot& slot = by_seq_[seq % kSeqWindow];
  if (slot.request == nullptr || !slot.request->in_use ||
      slot.request->kind != RequestKind::kRecv || slot.part >= slot.request->part_count) {
    return nullptr;
  }
  Part& part = slot.request->parts[slot.part];
  if ((part.seq & mask) != (seq & mask) || part.done) return nullptr;
  *owner = slot.request;
  *index = slot.part;
  return &part;
}

void RecvCommImpl::on_ready_to_send(std::span<const std::byte> body) {
  ReadyToSend batch;
  if (const char* why = decode_rts(body, batch)) [[unlikely]] {
    util::log().warn("comm {} on lane {}: ready-to-send dropped: {}", id_, lane_->id(), why);
    return;
  }
  for (std::size_t k = 0; k < batch.count; ++k) {
    const RtsEntry& rts = batch.entries[k];
    Request* r = nullptr;
    std::size_t i = 0;
    // The sender answers a clear-to-send: the buffer is posted, unless it failed meanwhile.
    Part* part = waiting_part(rts.seq, ~0u, &r, &i);
    if (part != nullptr && !part->rendezvous) {
      apply_ready_to_send(*r, i, rts);
      continue;
    }
    util::log().warn(
        "comm {} on lane {}: ready-to-send for message {} dropped: no buffer "
        "waits for it",
        id_, lane_->id(), rts.seq);
  }
}

void RecvCommImpl::apply_ready_to_send(Request& r, std::size_t i, const RtsEntry& rts) {
  Part* part = &r.parts[i];
  part->rendezvous = true;
  if (part->writes_seen != 0 && part->writes_expected != rts.stripes) {
    part->status = Status::kError;
    r.fail(Status::kError, "irecv: stripe counts disagree for message " + std::to_string(rts.seq));
  }
  part->writes_expected = rts.stripes;
  if (rts.size > part->size) {
    part->status = Status::kTruncated;
    r.fail(Status::kTruncated, "irecv: message " + std::to_string(rts.seq) + " of " +
                                   std::to_string(rts.size) +
                                   " bytes is larger than the posted buffer of " +
                                   std::to_string(part->size) + " bytes");
  } else if (rts.tag != part->tag) {
    part->status = Status::kInvalid;
    r.fail(Status::kInvalid, "irecv: message " + std::to_string(rts.seq) + " carries tag " +
                                 std::to_string(rts.tag) + ", the buffer expects " +
                                 std::to_string(part->tag));
  } else {
    part->delivered = rts.size;
  }
  // The eager receive posted for this buffer will never match: take it back.
  if (part->recv_outstanding) {
    lane_->rails().data(part->seq % data_rails_).cancel(&r.ops[i]);
  }
  finish_rendezvous(*part);
}

void RecvCommImpl::on_control(const mux::ControlHeader& header, std::span<const std::byte> body) {
  if (on_liveness(header)) return;
  switch (static_cast<MessageType>(header.type)) {
    case MessageType::kReadyToSend:
      on_ready_to_send(body);
      return;
    case MessageType::kClose:
      on_peer_close(body);
      return;
    case MessageType::kWritesPosted: {
      WritesPosted answer;
      if (const char* why = decode_writes_posted(body, answer)) {
        util::log().warn("comm {} on lane {}: {}", id_, lane_->id(), why);
        awaiting_writes_ = false;  // nothing to count on: the close waits no longer
      } else {
        writes_posted_ = answer.writes;
      }
      return;
    }
    default:
      util::log().warn("comm {} on lane {}: unexpected control message type {} dropped", id_,
                       lane_->id(), header.type);
  }
}

void RecvCommImpl::on_remote_write(mux::WriteImmediate immediate) {
  if (closed_) {
    ++writes_seen_;  // one of those the close waits for
    return;
  }
  Request* r = nullptr;
  std::size_t i = 0;
  Part* part = waiting_part(immediate.seq, mux::kImmSeqMask, &r, &i);
  if (part == nullptr) [[unlikely]] {
    util::log().warn("comm {} on lane {}: remote write for message {} that no buffer waits for",
                     id_, lane_->id(), immediate.seq);
    return;
  }
  if (immediate.fills && !part->rendezvous) {
    // What a ready-to-send would say: the buffer's own size and tag (the sender checked them).
    apply_ready_to_send(*r, i, {part->seq, part->size, part->tag, immediate.stripes});
  } else if (!part->rendezvous) {
    part->writes_expected = immediate.stripes;  // its ready-to-send is still on the way
  } else if (immediate.stripes != part->writes_expected) {
    part->status = Status::kError;
    r->fail(Status::kError,
            "irecv: stripe counts disagree for message " + std::to_string(part->seq));
  }
  ++part->writes_seen;
  finish_rendezvous(*part);
}

}  // namespace loom::p2p
