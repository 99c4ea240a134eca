// The receiving communicator: irecv, iflush, and the dispatch of provider completions and
// control messages to the protocol concerns (clear_to_send.cpp, eager.cpp, rendezvous.cpp,
// close.cpp).
#include "p2p/recv_comm.hpp"

#include "ofi/memory_registration.hpp"
#include "util/log.hpp"

namespace loom::p2p {

RecvCommImpl::RecvCommImpl(ContextCore& core, mux::Lane& lane, std::uint64_t peer)
    : Comm(core, lane, mux::Direction::kRecv, peer) {}

// Closed: close() gave back what it held. A communicator destroyed without closing (a
// constructor that threw) lets go here.
RecvCommImpl::~RecvCommImpl() {
  if (closed_) return;
  std::lock_guard lock(lane_->lock());
  cancel_standing();
}

// An entry is used while its receive is in flight, or while the sender may ask again for a
// refusal it did not get (repeat_clearances): a receive that failed before its message came
// is finished here long before the sender matches it.
RecvCommImpl::Posted& RecvCommImpl::claim_posted(std::uint32_t seq) {
  return posted_.claim(seq, [this](const auto& slot) {
    const PartRef& ref = slot.entry.part;
    const Request* r = ref.request;
    if (r != nullptr && r->in_use() && r->kind == RequestKind::kRecv && ref.part < r->part_count &&
        r->parts[ref.part].seq == slot.seq) {
      return true;
    }
    const Announced& a = slot.entry.announced;
    return a.valid && a.announcement.refused && next_seq_ - slot.seq <= kSeqWindow;
  });
}

Status RecvCommImpl::irecv(std::span<const RecvBuffer> buffers, Request*& request) {
  request = nullptr;
  std::lock_guard lock(lane_->lock());
  if (closed_ || peer_gone()) [[unlikely]]
    return refuse_post("irecv");
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
  if (r == nullptr) [[unlikely]]
    return refuse_full("irecv");
  r->part_count = static_cast<std::uint8_t>(buffers.size());
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const std::uint32_t seq = next_seq_++;
    trail_ask(asked_until_, seq);
    r->parts[i] = Part{.data = static_cast<std::byte*>(buffers[i].data),
                       .size = buffers[i].size,
                       .tag = buffers[i].tag,
                       .registration = registrations[i],
                       .seq = seq,
                       .peer_seq = seq};
    if (registrations[i] != nullptr) hold_region(r->parts[i], buffers[i].region);
    claim_posted(seq).part = PartRef{r, static_cast<std::uint8_t>(i)};
  }
  advance(*r);
  request = r;
  return Status::kOk;
}

Status RecvCommImpl::iflush(std::span<const RecvBuffer> buffers, Request*& request) {
  request = nullptr;
  std::lock_guard lock(lane_->lock());
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
  Request* r = allocate(RequestKind::kFlush);
  if (r == nullptr) return reject(Status::kRetry, "iflush: too many requests in flight");
  // Host memory is coherent with the NIC's writes: nothing to flush unless a test forces it.
  // Device memory is flushed unless LOOM_GPU_FLUSH=0 says the platform makes the NIC's writes
  // visible to the GPU at completion. Such a request has no part: done at its first test.
  if (target == nullptr || !(settings_.force_flush || (device && settings_.gpu_flush))) {
    request = r;
    return Status::kOk;
  }
  r->part_count = 1;
  r->parts[0] = Part{.data = static_cast<std::byte*>(target->data),
                     .size = target->size,
                     .tag = target->tag,
                     .registration = registration};
  hold_region(r->parts[0], target->region);
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
  if (terminal(part.recv)) return;
  while (r.stripes_posted < r.stripes) {
    const std::size_t slot = r.stripes_posted % kMaxOps;
    if (slot == 0 && r.ops_outstanding != 0) return;
    ofi::Rail& rail = lane_->rails().data(r.stripes_posted);
    const Status status = rail.flush(*part.registration, part.data, part.size, &r.ops[slot]);
    if (status == Status::kRetry) {
      retry_later(r);
      return;
    }
    if (status != Status::kOk) {
      r.fail(Status::kError, "iflush: " + rail.last_error());
      r.stripes = r.stripes_posted;  // no further reads; decided once those posted are back
      break;
    }
    ++r.stripes_posted;
    ++r.ops_outstanding;
    if (part.recv == RecvState::kAwaitingPost) part.to(RecvState::kFlushing);
  }
  if (r.stripes_done == r.stripes) {
    part.status = r.status;
    part.to(r.status == Status::kOk ? RecvState::kDone : RecvState::kFailed);
  }
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

// A buffer only an eager message can fill waits unannounced (clear_to_send.cpp): a message sent
// ahead finishes it, else its sender asks. The others are announced: at once for a buffer above
// the eager size or when the sender holds no credit (it can do nothing before), else at the
// lane's next progress (a sender with credits does not wait for it).
void RecvCommImpl::advance(Request& r) {
  if (r.kind == RequestKind::kFlush) {
    post_flush_reads(r);
    return;
  }
  if (r.parts[0].recv == RecvState::kAwaitingPost && stay_quiet(r)) return;
  announce_posted(r);
}

void RecvCommImpl::announce_posted(Request& r) {
  check_quiet_age();
  bool urgent = credits_out_ + credits_to_grant_ == 0;
  for (std::size_t i = 0; i < r.part_count; ++i) {
    Part& part = r.parts[i];
    if (part.recv == RecvState::kAwaitingPost) part.to(RecvState::kToAnnounce);
    urgent = urgent || part.size > eager_size_;
  }
  if (r.parts[0].recv == RecvState::kQuiet || terminal(r.parts[0].recv)) return;
  announce(r);
  if (urgent) send_control_batch();
}

// A part whose message arrived keeps the outcome it has; any other fails. Writes still
// streaming into a failed buffer are what close() waits for (writes_may_arrive).
void RecvCommImpl::fail_part(Request& r, Part& part, Status status) {
  if (terminal(part.recv)) return;
  if (part.recv == RecvState::kArrived) {
    part.to(part.status == Status::kOk ? RecvState::kDone : RecvState::kFailed);
    return;
  }
  part.status = status;
  if (part.recv == RecvState::kQuiet) leave_quiet(part);
  if (part.fragments_arrived != 0) {  // a message in fragments, not all here
    take_unjudged(r, part, false);
    part.delivered = 0;
  }
  if (r.kind == RequestKind::kFlush) {
    r.stripes = r.stripes_posted;  // no further reads; those posted complete and decide it
    if (r.ops_outstanding == 0) part.to(RecvState::kFailed);
    return;
  }
  part.to(RecvState::kFailed);
}

// Only flushes post operations of a request: eager messages come through the eager buffers.
void RecvCommImpl::on_op(Request& r, std::size_t, const ofi::Completion& completion) {
  on_flush_read(r, completion);
}

void RecvCommImpl::on_control(const mux::ControlHeader& header, std::span<const std::byte> body) {
  if (on_liveness(header, body)) return;
  switch (static_cast<MessageType>(header.type)) {
    case MessageType::kReadyToSend:
      on_ready_to_send(body);
      return;
    case MessageType::kClose:
      on_peer_close(body);
      return;
    case MessageType::kWritesPosted:
      on_writes_posted(body);
      return;
    case MessageType::kAskClearance:
      on_ask_clearance(body);
      return;
    default:
      util::log().warn("comm {} on lane {}: unexpected control message type {} dropped", id_,
                       lane_->id(), header.type);
  }
}

}  // namespace loom::p2p
