#include "mux/lane.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "loom/error.hpp"
#include "ofi/nic.hpp"
#include "util/log.hpp"
#include "util/step_trace.hpp"

namespace loom::mux {
namespace {

constexpr std::size_t kInitialCommSlots = 16;
// How long a closing lane waits for the operations of its retired communicators.
constexpr auto kLastDrain = std::chrono::milliseconds(500);
constexpr std::size_t kMaxComms = std::size_t{1} << kCommIdBits;

}  // namespace

Lane::Lane(const ofi::RailPlacement& placement, const LaneShape& shape, LaneKey key,
           std::uint64_t id, std::atomic<std::size_t>& deferred_lanes)
    : key_(key),
      id_(id),
      deferred_lanes_(&deferred_lanes),
      promise_timeout_(shape.promise_timeout) {
  if (placement.data.empty()) throw Error("open lane", "", 0, "no data rail placed");
  const auto& nic = placement.data.front()->attributes();
  if (nic.tag_bits < kUsableTagBits) {
    throw Error("open lane", nic.provider, 0,
                "the provider offers " + std::to_string(nic.tag_bits) + " tag bits; loom needs " +
                    std::to_string(kUsableTagBits));
  }
  if (nic.cq_data_bytes < 4) {
    throw Error("open lane", nic.provider, 0,
                "the provider carries " + std::to_string(nic.cq_data_bytes) +
                    " bytes of remote CQ data; loom needs 4");
  }
  rails_ = std::make_unique<ofi::RailSet>(
      placement, ofi::RailSetShape{.data_rails = placement.data.size(),
                                   .control_rails = placement.control.size(),
                                   .depths = shape.depths,
                                   .mr_cache_entries = shape.mr_cache_entries});
  rails_->set_remote_write_handler(this);
  shared_regions_ = std::make_unique<SharedRegions>(ofi::registration_targets(rails_->rails()));
  auto all = rails_->rails();
  control_ = std::make_unique<ControlChannel>(all.subspan(rails_->data_rails()),
                                              static_cast<ControlSink&>(*this));
  slots_.resize(kInitialCommSlots);
  deferred_ids_.reserve(kInitialCommSlots);
  running_ids_.reserve(kInitialCommSlots);
  util::log().debug("lane {} opened: {} data + {} control rails", id_, rails_->data_rails(),
                    rails_->control_rails());
}

Lane::~Lane() {
  if (!deferred_ids_.empty()) deferred_lanes_->fetch_sub(1, std::memory_order_relaxed);
  // The registry closes a lane once it is quiescent, or when its time ran out. Operations of
  // retired communicators (sends to a peer that went away) then get a last chance to complete,
  // with an error where the connection is gone: rxm crashes closing an endpoint whose write is
  // still queued on a connection the peer reset.
  const auto deadline = std::chrono::steady_clock::now() + kLastDrain;
  while (!quiescent() && std::chrono::steady_clock::now() < deadline) {
    rails_->progress();
    control_->retry();
    free_drained();
  }
  if (!retired_.empty()) {
    util::log().info("lane {}: closing with operations of {} closed communicator(s) in flight", id_,
                     retired_.size());
  }
  for (auto& port : retired_) port->abandon_registrations();
  eager_.reset();
  control_.reset();
  // The context's regions' registrations are bound to the rails' endpoints (FI_MR_ENDPOINT):
  // they close first.
  shared_regions_.reset();
  rails_.reset();
  retired_.clear();
  util::log().debug("lane {} closed", id_);
}

bool Lane::revoke_region(std::uint32_t slot, std::uint32_t generation) {
  bool waits = false;
  for (const Slot& s : slots_)
    if (s.port != nullptr) waits = s.port->revoke_region(slot, generation) || waits;
  return waits;
}

bool Lane::revoking() {
  bool waits = false;
  for (const Slot& s : slots_)
    if (s.port != nullptr) waits = s.port->revoking() || waits;
  return waits;
}

CommId Lane::attach(CommPort& port) {
  if (attached_ == slots_.size()) {
    if (slots_.size() == kMaxComms) {
      throw Error("attach communicator", rails_->data(0).nic().attributes().provider, 0,
                  "lane " + std::to_string(id_) + " already carries " + std::to_string(kMaxComms) +
                      " communicators");
    }
    // Ids distinct modulo n stay distinct modulo 2n: every attached id keeps a slot of its own.
    std::vector<Slot> grown(slots_.size() * 2);
    for (const Slot& slot : slots_)
      if (slot.port != nullptr) grown[slot.id & (grown.size() - 1)] = slot;
    slots_ = std::move(grown);
  }
  const std::size_t mask = slots_.size() - 1;
  CommId id = next_id_;
  while (slots_[id & mask].port != nullptr) ++id;  // wraps at 2^16
  slots_[id & mask] = Slot{&port, id};
  ++attached_;
  next_id_ = static_cast<CommId>(id + 1);
  return id;
}

void Lane::detach(CommId id) noexcept {
  Slot& slot = slots_[id & (slots_.size() - 1)];
  if (slot.id == id && slot.port != nullptr) {
    slot.port = nullptr;
    --attached_;
  }
}

void Lane::retire(std::unique_ptr<CommPort> port) {
  retired_.push_back(std::move(port));
  stats_.retired = retired_.size();
}

void Lane::free_drained() {
  std::erase_if(retired_, [](const std::unique_ptr<CommPort>& port) { return port->drained(); });
  stats_.retired = retired_.size();
}

ofi::Address Lane::acquire_peer(std::size_t rail, std::span<const std::byte> name) {
  auto key = std::make_pair(rail, std::vector<std::byte>(name.begin(), name.end()));
  if (auto it = peers_.find(key); it != peers_.end()) {
    Peer& peer = it->second;
    if (peer.references++ == 0) std::erase(released_, std::make_pair(rail, peer.address));
    return peer.address;
  }
  const ofi::Address address = rails_->rails()[rail]->insert_peer(name);
  peers_.emplace(std::move(key), Peer{address, 1});
  return address;
}

std::size_t Lane::peers() const noexcept {
  // Every peer has an entry on rail 0 (a data rail: there is always one).
  return static_cast<std::size_t>(std::count_if(
      peers_.begin(), peers_.end(), [](const auto& entry) { return entry.first.first == 0; }));
}

EagerPool& Lane::eager_pool(std::size_t buffer_size, std::size_t wanted) {
  if (!eager_) {
    // A quarter of the receive queue stays free of posted eager buffers: rendezvous writes
    // with remote CQ data consume receives on FI_RX_CQ_DATA providers, and the provider's
    // own receives (rxm's) come from the same depth.
    const std::size_t depth = rails_->data(0).depths().rx;
    const std::size_t limit = std::max<std::size_t>(depth - std::max<std::size_t>(depth / 4, 1), 1);
    const std::size_t count = std::clamp<std::size_t>(wanted, 1, limit);
    eager_ = std::make_unique<EagerPool>(*rails_, count, buffer_size,
                                         static_cast<EagerArrivalSink&>(*this), promise_timeout_);
    util::log().debug("lane {}: {} eager buffers of {} bytes", id_, count, buffer_size);
  }
  return *eager_;
}

void Lane::wait_for_credits(CommId id) {
  if (std::find(waiting_for_credits_.begin(), waiting_for_credits_.end(), id) ==
      waiting_for_credits_.end()) {
    waiting_for_credits_.push_back(id);
  }
}

void Lane::wake_credit_waiters() {
  for (CommId id : waiting_for_credits_)
    if (CommPort* port = port_of(id)) defer(*port, id);
  waiting_for_credits_.clear();
}

bool Lane::on_eager_arrival(const EagerArrival& arrival) {
  if (arrival.status != Status::kOk && arrival.status != Status::kTruncated) [[unlikely]] {
    // No message came: its tag says nothing of whose it was.
    util::log().warn("lane {}: eager receive failed: {}", id_, arrival.error_text);
    eager_->release(arrival.buffer);
    return true;
  }
  if (CommPort* port = port_of(arrival.tag.comm)) [[likely]] {
    port->on_eager(arrival);
    return true;
  }
  // A closed communicator's (its sender sent before it learned of the close): dropped.
  ++stats_.stray_eager;
  eager_->release(arrival.buffer);
  return false;
}

void Lane::release_peer(std::span<const ofi::Address> data,
                        std::span<const ofi::Address> control) noexcept {
  if (!rails_) return;  // closing: the AVs go with the endpoints
  auto release = [this](std::size_t rail, ofi::Address address) {
    for (auto& [key, peer] : peers_) {
      if (key.first != rail || peer.address != address) continue;
      if (--peer.references == 0) released_.emplace_back(rail, address);
      return;
    }
  };
  for (std::size_t i = 0; i < data.size(); ++i) release(i, data[i]);
  for (std::size_t i = 0; i < control.size(); ++i) release(rails_->data_rails() + i, control[i]);
  remove_released_peers();
}

// rxm closes its connection to a peer taken out of the AV: a control message still queued on
// it would be lost (the close notice is sent confirmed for that reason), so removal waits.
void Lane::remove_released_peers() noexcept {
  std::erase_if(released_, [this](const std::pair<std::size_t, ofi::Address>& entry) {
    const auto [rail, address] = entry;
    if (rail >= rails_->data_rails() &&
        control_->sending_to(rail - rails_->data_rails(), address)) {
      return false;
    }
    rails_->rails()[rail]->remove_peer(address);
    for (auto it = peers_.begin(); it != peers_.end(); ++it) {
      if (it->first.first != rail || it->second.address != address) continue;
      peers_.erase(it);
      break;
    }
    return true;
  });
}

void Lane::run_deferred() {
  if (deferred_ids_.empty()) return;
  has_deferred_.store(false, std::memory_order_relaxed);
  deferred_lanes_->fetch_sub(1, std::memory_order_relaxed);
  running_ids_.swap(deferred_ids_);
  for (CommId id : running_ids_) {
    if (CommPort* port = port_of(id)) {
      port->deferred_ = false;
      port->on_deferred();
    }
  }
  running_ids_.clear();
}

void Lane::post_to_inbox(std::span<const std::byte> message) {
  std::lock_guard lock(inbox_mutex_);
  const auto length = static_cast<std::uint16_t>(message.size());
  const auto* bytes = reinterpret_cast<const std::byte*>(&length);
  inbox_.insert(inbox_.end(), bytes, bytes + sizeof length);
  inbox_.insert(inbox_.end(), message.begin(), message.end());
  inbox_pending_.store(true, std::memory_order_release);
}

// The registry checked each message's trailer and the receiving communicator its size; the
// header is checked again here as the control channel checks its messages.
void Lane::dispatch_inbox() {
  {
    std::lock_guard lock(inbox_mutex_);
    draining_.swap(inbox_);
    inbox_pending_.store(false, std::memory_order_relaxed);
  }
  std::span<const std::byte> rest(draining_);
  while (rest.size() >= sizeof(std::uint16_t)) {
    std::uint16_t length = 0;
    std::memcpy(&length, rest.data(), sizeof length);
    rest = rest.subspan(sizeof length);
    if (length > rest.size()) break;  // cannot happen: post_to_inbox writes whole messages
    const std::span<const std::byte> message = rest.first(length);
    rest = rest.subspan(length);
    if (const auto header = decode_control_header(message)) {
      util::record_step(util::Step::kControlIn);
      ++stats_.carried_control;
      on_control(*header, message.subspan(kControlHeaderBytes));
    }
  }
  draining_.clear();
}

bool Lane::quiescent() const noexcept {
  if (control_->sends_in_flight()) return false;
  return std::all_of(retired_.begin(), retired_.end(), [](const std::unique_ptr<CommPort>& port) {
    return port->drained() || port->abandoned();
  });
}

std::size_t Lane::progress(ofi::RailSet::Awaiting awaiting) {
  progressed_.store(true, std::memory_order_relaxed);
  // What came carried on another lane's messages, then batched control messages and posts held
  // back by back-pressure, so what the peer waits for leaves before we look for what we wait
  // for; and the eager buffers released since the last progress.
  drain_inbox();
  run_deferred();
  if (eager_ && eager_->retry() && !waiting_for_credits_.empty()) [[unlikely]]
    wake_credit_waiters();
  const std::size_t handled = rails_->progress(awaiting);
  control_->retry();
  if (!retired_.empty()) [[unlikely]]
    free_drained();
  if (!released_.empty()) [[unlikely]]
    remove_released_peers();
  return handled;
}

LaneStats Lane::stats() const noexcept {
  LaneStats stats = stats_;
  stats.comms = attached_;
  if (eager_) {
    stats.eager_buffers = eager_->count();
    stats.eager_buffers_posted = eager_->posted();
  }
  return stats;
}

void Lane::on_remote_write(std::uint64_t data) {
  const WriteImmediate immediate = decode_immediate(static_cast<std::uint32_t>(data));
  if (CommPort* port = port_of(immediate.comm)) [[likely]] {
    port->on_remote_write(immediate);
    return;
  }
  ++stats_.stray_remote_writes;
  util::log().warn("lane {}: remote write for comm {} which is not open here; dropped", id_,
                   immediate.comm);
}

void Lane::on_control(const ControlHeader& header, std::span<const std::byte> body) {
  util::log().trace("lane {}: control type {} for comm {}", id_, header.type, header.comm);
  if (CommPort* port = port_of(header.comm)) [[likely]] {
    port->on_control(header, body);
    return;
  }
  // Expected when both ends close at once: each one's close notice finds the other gone.
  ++stats_.stray_control;
  util::log().debug("lane {}: control message type {} for comm {} which is not open here; dropped",
                    id_, header.type, header.comm);
}

}  // namespace loom::mux
