#include "mux/control_channel.hpp"

#include <algorithm>
#include <bitset>
#include <cstring>

#include "ofi/memory_registration.hpp"
#include "ofi/nic.hpp"
#include "util/log.hpp"
#include "util/wire.hpp"

namespace loom::mux {

static_assert(kControlHeaderBytes == 2 + 1 + 1 + 2 + 2);
static_assert(kMaxControlMessage <= 0xFFFF + kControlHeaderBytes);
static_assert(std::is_standard_layout_v<ofi::OpContext>);

bool encode_control_header(std::span<std::byte> out, const ControlHeader& header) noexcept {
  util::WireWriter w(out);
  w.u16(kControlMagic);
  w.u8(kProtocolVersion);
  w.u8(header.type);
  w.u16(header.comm);
  w.u16(header.length);
  return w.ok();
}

std::optional<ControlHeader> decode_control_header(std::span<const std::byte> message) noexcept {
  util::WireReader r(message);
  const auto magic = r.u16();
  const auto version = r.u8();
  ControlHeader header{.type = r.u8(), .comm = r.u16(), .length = r.u16()};
  if (!r.ok() || magic != kControlMagic || version != kProtocolVersion ||
      header.length != r.remaining()) {
    return std::nullopt;
  }
  return header;
}

namespace {

// A provider whose receive queue is shallower than kRxSlotsPerRail (FI_SHM_RX_SIZE,
// FI_OFI_RXM_RX_SIZE or a device limit; the rails' depths are clamped to it) refuses the
// receives beyond it, without saying why: post what fits.
std::size_t receive_slots(std::span<ofi::Rail* const> rails) {
  std::size_t slots = ControlChannel::kRxSlotsPerRail;
  for (const ofi::Rail* rail : rails) slots = std::min(slots, rail->depths().rx);
  return std::max<std::size_t>(slots, 1);
}

}  // namespace

ControlChannel::ControlChannel(std::span<ofi::Rail* const> rails, ControlSink& sink)
    : rails_(rails.begin(), rails.end()),
      sink_(&sink),
      rx_per_rail_(receive_slots(rails)),
      rx_slab_(std::make_unique<std::byte[]>(rails.size() * rx_per_rail_ * kMaxControlMessage)),
      tx_slab_(std::make_unique<std::byte[]>(kTxSlots * kMaxControlMessage)) {
  const std::vector<ofi::RegistrationTarget> targets = ofi::registration_targets(rails_);
  rx_registration_ = std::make_unique<ofi::MemoryRegistration>(
      targets, rx_slab_.get(), rails.size() * rx_per_rail_ * kMaxControlMessage);
  tx_registration_ = std::make_unique<ofi::MemoryRegistration>(targets, tx_slab_.get(),
                                                               kTxSlots * kMaxControlMessage);
  rx_slots_.resize(rails.size() * rx_per_rail_);
  reposts_.reserve(rx_slots_.size());
  for (std::uint32_t i = 0; i < rx_slots_.size(); ++i) {
    rx_slots_[i] = Slot{.op = {.handler = this},
                        .receive = true,
                        .rail = static_cast<std::uint32_t>(i / rx_per_rail_),
                        .index = i};
  }
  tx_slots_.resize(kTxSlots);
  free_tx_.reserve(kTxSlots);
  for (std::uint32_t i = 0; i < kTxSlots; ++i) {
    tx_slots_[i] = Slot{.op = {.handler = this}, .receive = false, .rail = 0, .index = i};
    free_tx_.push_back(kTxSlots - 1 - i);
  }
  for (Slot& slot : rx_slots_) {
    if (post_receive(slot) != Status::kOk) {
      throw Error("open control channel", rails_[slot.rail]->nic().attributes().provider, 0,
                  "cannot post control receives on " + rails_[slot.rail]->describe() + ": " +
                      rails_[slot.rail]->last_error());
    }
  }
}

// Posted receives point into rx_slab_: cancel them so no completion can name a slot after this.
// The endpoints close right after (the owner's declaration order), which drops them for good.
// Slots waiting in reposts_ are not posted: there is nothing to cancel.
ControlChannel::~ControlChannel() {
  for (Slot& slot : rx_slots_) {
    if (slot.posted) static_cast<void>(rails_[slot.rail]->cancel(&slot.op));
  }
}

std::byte* ControlChannel::rx_buffer(const Slot& slot) noexcept {
  return rx_slab_.get() + std::size_t{slot.index} * kMaxControlMessage;
}

std::byte* ControlChannel::tx_buffer(const Slot& slot) noexcept {
  return tx_slab_.get() + std::size_t{slot.index} * kMaxControlMessage;
}

Status ControlChannel::post_receive(Slot& slot) {
  ofi::Rail& rail = *rails_[slot.rail];
  const Status status = rail.recv(rx_buffer(slot), kMaxControlMessage,
                                  rx_registration_->desc(rail.index()), &slot.op);
  slot.posted = status == Status::kOk;
  return status;
}

Status ControlChannel::send(std::size_t rail_index, ofi::Address peer, std::uint8_t type,
                            CommId comm, std::span<const std::byte> body, bool confirmed) {
  if (body.size() > kMaxControlBody) return Status::kInvalid;
  ofi::Rail& rail = *rails_[rail_index];
  const std::size_t total = kControlHeaderBytes + body.size();
  const ControlHeader header{type, comm, static_cast<std::uint16_t>(body.size())};
  if (!confirmed && total <= rail.nic().attributes().inject_size) {
    std::byte message[kMaxControlMessage];
    encode_control_header(message, header);
    if (!body.empty()) std::memcpy(message + kControlHeaderBytes, body.data(), body.size());
    return rail.inject(peer, message, total);
  }
  if (free_tx_.empty()) return Status::kRetry;
  Slot& slot = tx_slots_[free_tx_.back()];
  std::byte* buffer = tx_buffer(slot);
  encode_control_header({buffer, kControlHeaderBytes}, header);
  if (!body.empty()) std::memcpy(buffer + kControlHeaderBytes, body.data(), body.size());
  Status status = rail.send(peer, buffer, total, tx_registration_->desc(rail.index()), &slot.op);
  if (status == Status::kOk) {
    free_tx_.pop_back();
    slot.rail = static_cast<std::uint32_t>(rail_index);
    slot.to = peer;
  }
  return status;
}

Status ControlChannel::send_or_queue(std::size_t rail, ofi::Address peer, std::uint8_t type,
                                     CommId comm, std::span<const std::byte> body,
                                     std::chrono::steady_clock::time_point deadline) {
  // Behind what waits already: the peer takes a communicator's messages in order.
  const Status status = outbox_.empty() ? send(rail, peer, type, comm, body, true) : Status::kRetry;
  if (status != Status::kRetry) return status;
  outbox_.push_back(Queued{.rail = rail,
                           .peer = peer,
                           .type = type,
                           .comm = comm,
                           .body = {body.begin(), body.end()},
                           .deadline = deadline});
  return Status::kOk;
}

bool ControlChannel::sending_to(std::size_t rail, ofi::Address peer) const noexcept {
  for (const Queued& queued : outbox_)
    if (queued.rail == rail && queued.peer == peer) return true;
  if (free_tx_.size() == kTxSlots) return false;
  std::bitset<kTxSlots> free;
  for (std::uint32_t index : free_tx_) free.set(index);
  for (const Slot& slot : tx_slots_) {
    if (!free[slot.index] && slot.rail == rail && slot.to == peer) return true;
  }
  return false;
}

void ControlChannel::take_back() {
  while (!reposts_.empty()) {
    if (post_receive(rx_slots_[reposts_.back()]) != Status::kOk) break;
    reposts_.pop_back();
  }
  if (!outbox_.empty()) [[unlikely]]
    send_queued();
}

void ControlChannel::send_queued() {
  const auto now = std::chrono::steady_clock::now();
  std::size_t sent = 0;
  for (; sent < outbox_.size(); ++sent) {
    Queued& queued = outbox_[sent];
    const Status status = now > queued.deadline ? Status::kError
                                                : send(queued.rail, queued.peer, queued.type,
                                                       queued.comm, queued.body, true);
    if (status == Status::kRetry) break;
    if (status != Status::kOk) {
      util::log().debug("control message type {} for comm {} on {} dropped: {}", queued.type,
                        queued.comm, rails_[queued.rail]->describe(),
                        now > queued.deadline ? "the peer took nothing until its deadline"
                                              : rails_[queued.rail]->last_error());
    }
  }
  outbox_.erase(outbox_.begin(), outbox_.begin() + static_cast<std::ptrdiff_t>(sent));
}

void ControlChannel::on_completion(ofi::OpContext& op, const ofi::Completion& completion) {
  Slot& slot = *reinterpret_cast<Slot*>(&op);
  if (!slot.receive) {
    if (completion.status != Status::kOk) {
      util::log().warn("control send on {} failed: {}", rails_[0]->describe(),
                       completion.error_text);
    }
    free_tx_.push_back(slot.index);
    return;
  }
  slot.posted = false;
  if (completion.status == Status::kCancelled) return;  // closing
  if (completion.status == Status::kOk) {
    std::span<const std::byte> message{rx_buffer(slot), completion.length};
    if (auto header = decode_control_header(message)) {
      util::log().trace("control type {} for comm {} ({} bytes) on control rail {} slot {}",
                        header->type, header->comm, header->length, slot.rail, slot.index);
      sink_->on_control(*header, message.subspan(kControlHeaderBytes));
    } else {
      util::log().warn("control message of {} bytes dropped on {}: bad magic, version or length",
                       completion.length, rails_[slot.rail]->describe());
    }
  } else {
    // Reposted at once: a receive queue that keeps failing would log at every poll.
    if (receive_errors_.admit()) {
      util::log().warn("control receive on {} failed: {}{}", rails_[slot.rail]->describe(),
                       completion.error_text, receive_errors_.suffix());
    }
  }
  if (post_receive(slot) != Status::kOk) reposts_.push_back(slot.index);
}

}  // namespace loom::mux
