// Eager: a message up to the receiver's eager size goes as one tagged send (tag = kind | peer
// comm id | seq, CQ data = the user's tag) into one of the eager buffers of the receiver's
// lane (mux/eager_pool.hpp), without waiting for its buffer's clear-to-send: each credit the
// receiver granted in a clear-to-send batch is a posted buffer the pool promised. The receiver
// copies the message into the buffer the irecv for its sequence number gives (at once if that
// is posted, else when it is), judges it there, alone (verdict.hpp), gives the eager buffer back
// and is promised a credit again, granted in bulk. The send is done once it left: one provider
// message per small message.
//
// Nothing waits in the provider's unexpected-message pool: a message leaves only onto a posted
// eager buffer (a credit) or, without credits, by RDMA write once its buffer is announced.
// Eager memory is the lane's pool, whatever the peers. Eager buffers live on data rail 0:
// small messages gain nothing from striping.
//
// An injected eager message may also carry a clear-to-send batch one of our receiving
// communicators owes the same peer context (mux/carried_control.hpp; fill_carrier here, the
// receiving end in on_eager).
//
// A message of up to LOOM_EAGER_FRAGMENTS eager sizes goes ahead as that many eager messages of
// its sequence number (post_fragments; the tag says which fragment of how many), each injected
// on a credit: done in the call like any inject, so isolation from a peer that stops taking
// them holds. The receiver places fragment i at i eager sizes, copies it at once where the whole
// message surely fits, and judges the message when its last fragment came (deliver_fragment).
#include <array>
#include <cassert>
#include <cstring>
#include <vector>

#include "mux/carried_control.hpp"
#include "ofi/memory_registration.hpp"
#include "ofi/nic.hpp"
#include "p2p/recv_comm.hpp"
#include "p2p/send_comm.hpp"
#include "util/cuda_driver.hpp"
#include "util/log.hpp"

namespace loom::p2p {
namespace {

// Each entry of `from` that `match`es, taken out (the order is not kept) and handed to `take`,
// until `take` says to stop (returns false).
template <typename Entry, typename Match, typename Take>
void take_each(std::vector<Entry>& from, Match match, Take take) {
  for (std::size_t k = 0; k < from.size();) {
    if (!match(from[k])) {
      ++k;
      continue;
    }
    const Entry entry = from[k];
    from[k] = from.back();
    from.pop_back();
    if (!take(entry)) return;
  }
}

}  // namespace

// ---- sender ----

// An inject leaves no completion to generate and read: on shm that is a CQ write less under
// the receiver's queue lock, which both processes take for every message. Eager sends inject
// what fits, from host memory; writes too where the provider's profile says so (post_stripes).
bool SendCommImpl::injects(std::size_t size,
                           const ofi::MemoryRegistration* registration) const noexcept {
  // inject_max_ 0 (LOOM_INJECT_MAX=0, or a profile's no_inject) means no inject at all, not
  // "empty messages only": an empty inject waits in rxd until its sender calls in again.
  return inject_max_ != 0 && size <= inject_max_ &&
         (registration == nullptr || registration->type() == MemoryType::kHost);
}

// kAwaitingClearance: sent ahead on a credit, before its buffer's clear-to-send (the receiver
// alone judges it: verdict.hpp); kEagerReady: cleared, its credit taken by match(). Either is
// done once it left: at the inject, or at the send's completion.
void SendCommImpl::post_eager(Request& r) {
  Part& part = r.parts[0];
  const bool ahead = part.send == SendState::kAwaitingClearance;
  if (part.size > eager_size_) [[unlikely]] {
    assert(ahead);  // match() gives a credit only to a message that fits one
    post_fragments(r);
    return;
  }
  ofi::Rail& data_rail = lane_->rails().data(0);
  const bool inject = injects(part.size, part.registration);
  // Sent ahead, it names itself and the receiver places it; matched, the buffer it was placed in.
  const std::uint32_t wire_seq = ahead ? part.seq : part.peer_seq;
  const Status status =
      inject ? inject_eager(part, wire_seq, !ahead)
             : data_rail.tagged_send(
                   peer_data_[0], part.data, part.size,
                   part.registration ? part.registration->desc(0) : nullptr,
                   mux::encode_tag({mux::TagKind::kEager, peer_id_, wire_seq, false, !ahead}),
                   part.tag, &r.ops[0]);
  if (status == Status::kOk) {
    if (ahead) note_sent_ahead(outgoing_.find(part.seq), part.tag);
    if (inject) {
      part.delivered = part.size;
      part.to(SendState::kDone);
    } else {
      ++r.ops_outstanding;
      part.to(SendState::kEagerInFlight);
    }
  } else {
    break_or_retry(r, data_rail, status);
  }
}

// Fragment i carries the bytes from i eager sizes on (the receiver places it from its index),
// all of them a full eager buffer but the last. The first one to leave takes every credit the
// message needs, so that a fragment pushed back finds its credit when it goes again.
void SendCommImpl::post_fragments(Request& r) {
  Part& part = r.parts[0];
  const auto count = static_cast<std::uint8_t>(eager_buffers(part.size, eager_size_));
  ofi::Rail& data_rail = lane_->rails().data(0);
  while (part.fragments_sent < count) {
    const std::size_t offset = part.fragments_sent * eager_size_;
    const std::uint64_t wire_tag = mux::encode_tag({.kind = mux::TagKind::kEager,
                                                    .comm = peer_id_,
                                                    .seq = part.seq,
                                                    .fragment = part.fragments_sent,
                                                    .fragments = count});
    const Status status =
        data_rail.tagged_inject(peer_data_[0], part.data + offset,
                                std::min(eager_size_, part.size - offset), wire_tag, part.tag);
    if (status != Status::kOk) {
      break_or_retry(r, data_rail, status);
      return;
    }
    if (part.fragments_sent++ == 0) {
      note_sent_ahead(outgoing_.find(part.seq), part.tag);
      credits_ -= count - 1u;
      ++stats_.eager_fragmented;
    }
  }
  part.delivered = part.size;
  part.to(SendState::kDone);
}

// One eager message injected, with what a carrier takes along (none on shm: decided before any
// call or sum). A control message taken for a carrier pushed back stays held for the next.
Status SendCommImpl::inject_eager(const Part& part, std::uint32_t wire_seq, bool placed) {
  const std::size_t carrier = carry_control_ ? fill_carrier(part) : 0;
  const std::uint64_t wire_tag =
      mux::encode_tag({mux::TagKind::kEager, peer_id_, wire_seq, carrier != 0, placed});
  ofi::Rail& rail = lane_->rails().data(0);
  const Status status =
      carrier != 0 ? rail.tagged_inject(peer_data_[0], lane_->carrier_buffer().data(), carrier,
                                        wire_tag, part.tag)
                   : rail.tagged_inject(peer_data_[0], part.data, part.size, wire_tag, part.tag);
  if (status == Status::kOk && carrier != 0) carried_length_ = 0;
  return status;
}

SendCommImpl::Outgoing* SendCommImpl::inject_first(const void* data, std::size_t size, Tag tag,
                                                   const ofi::MemoryRegistration* registration,
                                                   std::uint32_t seq) {
  // post_eager's inject of a message sent ahead, decided from the same facts, with the carrier
  // it would take along. It needs no request: it is done once it left (isend gives a
  // done_at_post handle).
  if (ahead_next_ != seq || credits_ == 0 || !eager_fits(size) || !injects(size, registration) ||
      group_known(seq)) {
    return nullptr;
  }
  // Its entry before it leaves: claiming may grow the ring (an allocation), which must not fail
  // a message already sent.
  Outgoing& outgoing = claim_outgoing(seq);
  const Part part{
      .data = static_cast<std::byte*>(const_cast<void*>(data)), .size = size, .tag = tag};
  return inject_eager(part, seq, false) == Status::kOk ? &outgoing : nullptr;
}

void SendCommImpl::note_sent_ahead(Outgoing* outgoing, Tag tag) {
  --credits_;
  ++stats_.eager;
  if (outgoing != nullptr) {
    outgoing->ahead = Ahead::kUnplaced;
    outgoing->tag = tag;
  }
}

// The payload followed by a control message one of our receiving communicators owes the same
// peer context (mux/carried_control.hpp), in the lane's carrier buffer. None when no message is
// due, or when it would not fit in an inject (of the provider's size, which may exceed
// LOOM_INJECT_MAX) that the receiver's eager buffer takes. A taken message stays in
// held_control_ until an inject carries it: back-pressure must not lose it.
std::size_t SendCommImpl::fill_carrier(const Part& part) {
  const std::size_t limit = std::min(inject_size_, eager_size_);
  std::size_t control = 0;
  const std::size_t overhead = mux::kCarrierTrailerBytes + mux::kControlHeaderBytes;
  if (part.size + overhead < limit) {
    const std::size_t room =
        std::min(limit - part.size - mux::kCarrierTrailerBytes, mux::kMaxCarriedControl);
    if (carried_length_ == 0) {
      carried_length_ = lanes_.take_carried_control(*lane_, peer_context_,
                                                    {held_control_.data(), room}, carried_lane_);
    }
    // One held from a larger room waits for a smaller payload.
    if (carried_length_ <= room) control = carried_length_;
  }
  if (control == 0) return 0;
  // Grown to what the largest payload so far needs, not the inject size (16 KiB on tcp): a
  // lane of small messages keeps a small buffer.
  const std::size_t needed =
      std::min(limit, part.size + mux::kMaxCarriedControl + mux::kCarrierTrailerBytes);
  std::vector<std::byte>& carrier = lane_->carrier_buffer();
  if (carrier.size() < needed) carrier.resize(needed);
  if (part.size != 0) std::memcpy(carrier.data(), part.data, part.size);
  std::memcpy(carrier.data() + part.size, held_control_.data(), control);
  const std::size_t end = part.size + control;
  mux::encode_carrier_trailer({carrier.data() + end, mux::kCarrierTrailerBytes}, carried_lane_,
                              control, 0);
  return end + mux::kCarrierTrailerBytes;
}

// New credits: the messages waiting for one go, oldest first, and only in sequence order: one
// that must wait for its announcement (too large for its credits) holds back those after it,
// so that the messages of a group that went ahead are its first ones (p2p/group.hpp).
void SendCommImpl::send_ahead_waiting() {
  for (; seq_before(ahead_next_, next_seq_); ++ahead_next_) {
    Request* r = posted(ahead_next_);
    if (r == nullptr || !r->in_use() || r->kind != RequestKind::kSend ||
        r->parts[0].seq != ahead_next_ || r->parts[0].send != SendState::kAwaitingClearance) {
      continue;
    }
    if (!goes_ahead(r->parts[0])) return;
    post_eager(*r);
    if (r->parts[0].send == SendState::kAwaitingClearance) return;  // pushed back: retried
  }
}

// ---- receiver ----

// A lane's eager pool holds this many times one communicator's credits: a few peers sending at
// full rate at once, and a fair share for each of many.
constexpr std::size_t kPoolCredits = 4;

// At connection: the lane's eager pool (opened by its first receiving communicator), and the
// first batch promises credits out of it.
void RecvCommImpl::on_peer_connected() {
  lanes_.add_control_source(peer_context_, *lane_, id_);
  max_credits_ =
      settings_.eager_credits.value_or(lane_->rails().data(0).nic().attributes().eager_credits);
  if (max_credits_ == 0 || eager_max_ == 0 || data_rails_ == 0) return;
  pool_ = &lane_->eager_pool(eager_max_, kPoolCredits * max_credits_);
  eager_size_ = pool_->buffer_size();
  held_.reserve(max_credits_);
}

// Tops the sender's credits up to LOOM_EAGER_CREDITS as far as the pool may promise this
// communicator now (its share of the lane's); they go with the next batch. Called with each
// batch, so a communicator gets credits once its application receives on it (credits go where
// traffic is, an idle peer's communicator holds none), and again whenever a message it took
// gives its buffer back. One the pool cannot serve in full is woken when buffers come back.
void RecvCommImpl::promise_credits() {
  if (pool_ == nullptr || closed_ || peer_gone()) return;
  // Messages that came ahead of their irecvs still hold their buffers: a sender far ahead holds
  // at most LOOM_EAGER_CREDITS of the pool, however often it asks for announcements.
  const std::size_t held = credits_out_ + credits_to_grant_ + held_.size() + unjudged_.size();
  if (held >= max_credits_) return;
  // Topped up once half is missing, in one promise: credits go back at half anyway, and a
  // promise per message would sit on every message's path.
  if (2 * (max_credits_ - held) < max_credits_) return;
  const std::size_t promised = pool_->promise(max_credits_ - held, held, lane_->attached());
  // Short of its share because the pool ran dry: woken when buffers come back.
  if (promised < max_credits_ - held && pool_->unpromised() == 0) lane_->wait_for_credits(id_);
  if (promised == 0) return;
  credits_to_grant_ += promised;
  // Credits alone go back in bulk, at half (send_control_batch): until then nothing is due at
  // the lane's next progress, and a deferral per message would cost every message a turn there.
  if (2 * credits_to_grant_ >= max_credits_) defer();
}

void RecvCommImpl::cancel_standing() {
  lanes_.remove_control_source(peer_context_, *lane_, id_);
  if (pool_ == nullptr) return;
  for (const Held& held : held_) pool_->release(held.buffer);
  for (const Held& held : unjudged_) pool_->release(held.buffer);
  held_.clear();
  unjudged_.clear();
  // Messages the sender sent on these may still come: they stay promised a while.
  pool_->forget(credits_out_ + credits_to_grant_);
  credits_out_ = credits_to_grant_ = 0;
}

// The full sequence number of a message whose tag carries its low kTagSeqBits: it lies within
// a window of next_seq_ (the sender has at most kMaxRequests sends in flight).
std::uint32_t RecvCommImpl::full_seq(std::uint32_t low) const noexcept {
  const std::uint32_t delta = (low - next_seq_) & mux::kTagSeqMask;
  const std::uint32_t half = (mux::kTagSeqMask + 1) / 2;
  return delta < half ? next_seq_ + delta : next_seq_ - ((mux::kTagSeqMask + 1) - delta);
}

void RecvCommImpl::on_eager(const mux::EagerArrival& arrival) {
  if (credits_out_ != 0) --credits_out_;
  if (arrival.status != Status::kOk) {
    // Only a message larger than the credit's buffer fails here: it breaks the protocol.
    pool_->release(arrival.buffer);
    peer_lost("irecv: the peer sent " + std::to_string(arrival.length + arrival.overflow) +
              " bytes into an eager buffer of " + std::to_string(eager_size_));
    return;
  }
  std::size_t length = arrival.length;
  const std::byte* data = pool_->data(arrival.buffer);
  if (arrival.tag.fragments != 1) [[unlikely]] {
    if (const char* why = fragment_error(arrival.tag, length)) {
      pool_->release(arrival.buffer);
      peer_lost(std::string("irecv: eager message: ") + why);
      return;
    }
  } else if (arrival.tag.carrier) {
    // The control message goes to its lane whatever becomes of the payload: the peer's sender
    // there waits for it.
    mux::CarriedControl carried;
    if (const char* why = mux::decode_carrier({data, length}, carried)) [[unlikely]] {
      pool_->release(arrival.buffer);
      peer_lost(std::string("irecv: eager message: ") + why);
      return;
    }
    if (!carried.message.empty()) lanes_.post_carried(carried.target_lane, carried.message);
    length = carried.payload_length;
  }
  const Held held{.buffer = arrival.buffer,
                  .seq = full_seq(arrival.tag.seq),
                  .length = static_cast<std::uint32_t>(length),
                  .has_tag = arrival.has_data,
                  .tag = static_cast<Tag>(arrival.data),
                  .placed = arrival.tag.placed,
                  .fragment = arrival.tag.fragment,
                  .fragments = arrival.tag.fragments};
  if (!held.placed) {
    if (Request* group = group_of(held.seq)) {
      if (held.fragments != 1 && held.seq - group->parts[0].seq < group->placed_ahead) {
        deliver_placed_fragment(*group, held);
        return;
      }
      held_.push_back(held);
      place_ahead(*group);
      return;
    }
  }
  Request* r = nullptr;
  std::size_t i = 0;
  Part* part = waiting_part(held.seq, ~0u, &r, &i);
  if (part == nullptr) {
    // Its irecv comes later; or it came and failed already (the sender learns it from the
    // refusal announced): the message is dropped.
    if (seq_before(held.seq, next_seq_)) {
      release_held(held);
    } else {
      held_.push_back(held);
    }
    return;
  }
  switch (part->recv) {
    case RecvState::kQuiet:
    case RecvState::kAnnounced:
    case RecvState::kCleared:
      deliver(*r, *part, held);
      return;
    case RecvState::kAwaitingPost:
    case RecvState::kToAnnounce:
      held_.push_back(held);  // delivered once announced (announce())
      return;
    default:
      part->status = Status::kError;
      r->fail(Status::kError, "irecv: message " + std::to_string(part->seq) +
                                  " arrived eagerly into a buffer being written");
      fail_part(*r, *part, Status::kError);
      release_held(held);
  }
}

// What post_fragments never sends: the receiver places a fragment by its index alone.
const char* RecvCommImpl::fragment_error(const mux::DataTag& tag, std::size_t length) const {
  if (tag.fragment >= tag.fragments) return "a fragment's index is beyond its count";
  if (tag.carrier || tag.placed) return "a fragment is a carrier or placed";
  if (tag.fragment + 1 == tag.fragments ? length == 0 : length != eager_size_) {
    return "a fragment's length is not its place's";
  }
  return nullptr;
}

void RecvCommImpl::release_held(const Held& held) {
  pool_->release(held.buffer);
  promise_credits();
}

// An announced part whose message the eager pool holds for us: delivered from there, each of
// its fragments if it came in several.
void RecvCommImpl::deliver_held(Request& r, Part& part) {
  take_each(
      held_, [&](const Held& held) { return held.seq == part.seq; },
      [&](const Held& held) {
        assert(r.part_count == 1 || held.placed);
        deliver(r, part, held);
        return held.fragments != 1 && !terminal(part.recv) && part.recv != RecvState::kArrived;
      });
}

void RecvCommImpl::deliver_held_fragments(Request& r, Part& part, std::uint32_t message) {
  take_each(
      held_, [&](const Held& held) { return !held.placed && held.seq == message; },
      [&](const Held& held) {
        if (terminal(part.recv)) {
          release_held(held);
        } else {
          deliver(r, part, held);
        }
        return true;
      });
}

void RecvCommImpl::deliver_placed_fragment(Request& group, const Held& held) {
  for (std::size_t i = 0; i < group.part_count; ++i) {
    Part& part = group.parts[i];
    if (part.peer_seq != held.seq || part.fragments_arrived == 0) continue;
    if (terminal(part.recv)) break;
    deliver(group, part, held);
    return;
  }
  release_held(held);  // its buffer failed (the message is dropped with it)
}

Request* RecvCommImpl::group_of(std::uint32_t message) const noexcept {
  const PartRef& ref = part_ref(message);
  Request* r = ref.request;
  if (r == nullptr || !r->in_use() || r->kind != RequestKind::kRecv || r->part_count < 2 ||
      ref.part >= r->part_count || r->parts[ref.part].seq != message) {
    return nullptr;
  }
  return r;
}

// The messages that came ahead into a grouped receive are its first ones (p2p/group.hpp):
// placed in sequence order as they arrive, each by tag, the way the sender places them once it
// learns the group; a message in fragments by its first to arrive, the others follow it. A
// message waits in held_ for those before it, and for its buffer's announcement.
void RecvCommImpl::place_ahead(Request& r) {
  const std::uint32_t first = r.parts[0].seq;
  std::array<Tag, kMaxParts> tags{};
  for (std::size_t i = 0; i < r.part_count; ++i) tags[i] = r.parts[i].tag;
  while (r.placed_ahead < r.part_count) {
    const std::uint32_t message = first + r.placed_ahead;
    std::size_t k = 0;
    while (k < held_.size() && (held_[k].placed || held_[k].seq != message)) ++k;
    if (k == held_.size()) return;  // not here yet
    const Held held = held_[k];
    const Tag tag = held.has_tag ? held.tag : ~r.parts[0].tag;
    const std::size_t index = place_in_group(tags.data(), r.part_count, r.taken_ahead, tag);
    assert(index < r.part_count);  // the group's first messages take at most all its buffers
    Part& part = r.parts[index];
    if (part.recv == RecvState::kAwaitingPost || part.recv == RecvState::kToAnnounce) return;
    held_[k] = held_.back();
    held_.pop_back();
    r.taken_ahead |= static_cast<GroupTaken>(1u << index);
    ++r.placed_ahead;
    part.peer_seq = message;
    if (part.recv == RecvState::kAnnounced || part.recv == RecvState::kCleared) {
      deliver(r, part, held);
    } else {
      // Failed before it came (its refusal was announced): the message is dropped.
      release_held(held);
    }
    if (held.fragments != 1) deliver_held_fragments(r, part, message);
  }
}

// Inline: every message that arrives is copied here.
[[gnu::always_inline]] inline void RecvCommImpl::copy_in(Request& r, Part& part, std::size_t offset,
                                                         const Held& held) {
  if (part.registration == nullptr || part.registration->type() == MemoryType::kHost) [[likely]] {
    std::memcpy(part.data + offset, pool_->data(held.buffer), held.length);
    return;
  }
  copy_to_device(r, part, offset, held);
}

void RecvCommImpl::copy_to_device(Request& r, Part& part, std::size_t offset, const Held& held) {
  try {
    util::cuda::Driver::instance().copy_to_device(part.registration->device(), part.data + offset,
                                                  pool_->data(held.buffer), held.length);
  } catch (const Error& e) {
    part.status = Status::kError;
    r.fail(Status::kError, std::string("irecv: copy into device memory: ") + e.what());
  }
}

// The receiver's verdict on a message sent ahead, its alone (the sender finished the send when
// it left); only a message that fits is copied. The buffer goes back to the pool, and the credit
// with it. A part the sender was told of finishes once the batch announcing it left.
void RecvCommImpl::deliver(Request& r, Part& part, const Held& held) {
  if (held.fragments != 1) [[unlikely]] {
    deliver_fragment(r, part, held);
    return;
  }
  const Announcement facts{
      .seq = part.seq, .size = part.size, .tag = part.tag, .refused = part.status != Status::kOk};
  const Tag tag = held.has_tag ? held.tag : ~part.tag;
  const Verdict verdict = judge(facts, held.length, tag);
  if (verdict == Verdict::kFits && held.length != 0) copy_in(r, part, 0, held);
  release_held(held);
  settle_arrival(r, part, facts, verdict, held.length, tag);
}

// A fragment is copied into its place at once where the whole message surely fits (its size lies
// within the last of its fragments' eager buffers), dropped where it surely does not, and held
// for the verdict otherwise, which the last fragment to arrive brings, with the size.
void RecvCommImpl::deliver_fragment(Request& r, Part& part, const Held& held) {
  const auto bit = static_cast<std::uint8_t>(1u << held.fragment);
  if (part.fragments_arrived == 0) part.fragments = held.fragments;
  if (held.fragments != part.fragments || (part.fragments_arrived & bit) != 0) [[unlikely]] {
    release_held(held);
    if (part.status == Status::kOk) {
      part.status = Status::kError;
      r.fail(Status::kError, "irecv: message " + std::to_string(part.peer_seq) +
                                 ": its eager fragments disagree (a count, or one twice)");
    }
    fail_part(r, part, part.status);
    return;
  }
  part.fragments_arrived |= bit;
  part.delivered += held.length;  // the message's size once all came
  const Announcement facts{
      .seq = part.seq, .size = part.size, .tag = part.tag, .refused = part.status != Status::kOk};
  const Tag tag = held.has_tag ? held.tag : ~part.tag;
  const bool surely_fits = judge(facts, part.fragments * eager_size_, tag) == Verdict::kFits;
  const bool may_fit = judge(facts, (part.fragments - 1u) * eager_size_ + 1, tag) == Verdict::kFits;
  if (surely_fits) {
    copy_in(r, part, held.fragment * eager_size_, held);
  } else if (may_fit) {
    Held kept = held;
    kept.seq = part.seq;
    unjudged_.push_back(kept);
  }
  if (surely_fits || !may_fit) release_held(held);
  if (part.fragments_arrived != (1u << part.fragments) - 1u) return;
  const std::size_t length = part.delivered;
  part.delivered = 0;
  const Verdict verdict = judge(facts, length, tag);
  if (!surely_fits) take_unjudged(r, part, verdict == Verdict::kFits);
  settle_arrival(r, part, facts, verdict, length, tag);
  if (part.status == Status::kOk) ++stats_.eager_fragmented;
}

void RecvCommImpl::take_unjudged(Request& r, Part& part, bool keep) {
  take_each(
      unjudged_, [&](const Held& held) { return held.seq == part.seq; },
      [&](const Held& held) {
        if (keep && part.status == Status::kOk) copy_in(r, part, held.fragment * eager_size_, held);
        release_held(held);
        return true;
      });
}

void RecvCommImpl::settle_arrival(Request& r, Part& part, const Announcement& facts,
                                  Verdict verdict, std::size_t length, Tag tag) {
  if (verdict != Verdict::kFits && part.status == Status::kOk) {
    part.status = status_of(verdict);
    r.fail(part.status, explain(verdict, Side::kReceiver, part.seq, facts, length, tag));
  }
  if (part.status == Status::kOk) {
    part.delivered = length;
    ++stats_.eager;
  }
  if (part.recv == RecvState::kCleared || part.recv == RecvState::kQuiet) {
    if (part.recv == RecvState::kQuiet) leave_quiet(part);
    part.to(part.status == Status::kOk ? RecvState::kDone : RecvState::kFailed);
  } else {
    part.to(RecvState::kArrived);  // reported once the batch announcing it left
  }
}

}  // namespace loom::p2p
