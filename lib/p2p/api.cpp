// The public classes of include/loom/p2p.hpp, forwarding to lib/p2p.
#include <algorithm>
#include <utility>

#include "loom/p2p.hpp"
#include "loom/process.hpp"
#include "ofi/selection.hpp"
#include "p2p/context_core.hpp"
#include "p2p/handshake.hpp"
#include "p2p/recv_comm.hpp"
#include "p2p/send_comm.hpp"
#include "util/step_trace.hpp"

namespace loom {

Handle Handle::from_bytes(std::span<const std::byte> data) {
  if (data.size() > kMaxHandleBytes) {
    throw Error("handle", "", 0,
                std::to_string(data.size()) + " bytes is longer than a handle (" +
                    std::to_string(kMaxHandleBytes) + ")");
  }
  Handle handle;
  std::copy(data.begin(), data.end(), handle.bytes.begin());
  handle.size = data.size();
  return handle;
}

// ---- communicators ----

Communicator::Communicator(std::shared_ptr<p2p::ContextCore> context,
                           std::unique_ptr<p2p::Comm> comm)
    : context_(std::move(context)), comm_(std::move(comm)) {}

Communicator::~Communicator() {
  close();
}

MemoryRegion Communicator::register_memory(const void* data, std::size_t size, MemoryType type,
                                           int device) {
  if (!comm_) throw Error("register memory", "", 0, "communicator is closed");
  return comm_->register_memory(data, size, type, device);
}

MemoryRegion Communicator::register_memory(const void* data, std::size_t size, MemoryType type,
                                           int device, const Dmabuf& dmabuf) {
  if (!comm_) throw Error("register memory", "", 0, "communicator is closed");
  return comm_->register_memory(data, size, type, device, &dmabuf);
}

void Communicator::deregister(MemoryRegion region) {
  if (comm_) comm_->deregister(region);
}

namespace {
const std::string kClosed = "the communicator is closed";
}

Status Communicator::test(Request request, std::span<std::size_t> sizes) {
  if (!comm_) return Status::kInvalid;
  return comm_->test(request, sizes);
}

Status Communicator::wait(Request request, std::span<std::size_t> sizes,
                          std::chrono::milliseconds timeout) {
  if (!comm_) return Status::kInvalid;
  return comm_->wait(request, sizes, timeout);
}

void Communicator::close() {
  // The last communicator out of a lane closes it, and the registry must outlive that.
  if (comm_) p2p::Comm::close(std::move(comm_));
  context_.reset();
}

const std::string& Communicator::last_error() const noexcept {
  return comm_ ? comm_->last_error() : kClosed;
}

CommStats Communicator::stats() const {
  return comm_ ? comm_->stats() : CommStats{};
}

std::uint64_t Communicator::label() const noexcept {
  return comm_ ? comm_->label() : 0;
}

namespace {
// What a post gives the user: the handle of `request` where `status` is kOk. A function of this
// file, not an exported member, so that the posts inline it.
Posted posted(const p2p::Comm& comm, Status status, const p2p::Request* request) {
  return {status, status == Status::kOk ? comm.handle_of(*request) : Request{}};
}
}  // namespace

SendComm::SendComm(CommKey /*key*/, std::shared_ptr<p2p::ContextCore> context,
                   std::unique_ptr<p2p::Comm> comm)
    : Communicator(std::move(context), std::move(comm)) {}

Posted SendComm::isend(const void* data, std::size_t size, Tag tag, MemoryRegion region) {
  if (!comm_) return {Status::kInvalid, {}};
  const util::StepSpan step(util::Step::kIsendBegin, util::Step::kIsendEnd);
  Request request;
  const Status status =
      static_cast<p2p::SendCommImpl&>(*comm_).isend(data, size, tag, region, request);
  return {status, request};
}

RecvComm::RecvComm(CommKey /*key*/, std::shared_ptr<p2p::ContextCore> context,
                   std::unique_ptr<p2p::Comm> comm)
    : Communicator(std::move(context), std::move(comm)) {}

Posted RecvComm::irecv(std::span<const RecvBuffer> buffers) {
  if (!comm_) return {Status::kInvalid, {}};
  const util::StepSpan step(util::Step::kIrecvBegin, util::Step::kIrecvEnd);
  p2p::Request* request = nullptr;
  const Status status = static_cast<p2p::RecvCommImpl&>(*comm_).irecv(buffers, request);
  return posted(*comm_, status, request);
}

Posted RecvComm::iflush(std::span<const RecvBuffer> buffers) {
  if (!comm_) return {Status::kInvalid, {}};
  p2p::Request* request = nullptr;
  const Status status = static_cast<p2p::RecvCommImpl&>(*comm_).iflush(buffers, request);
  return posted(*comm_, status, request);
}

// ---- listener and connector ----

Listener::Listener(std::shared_ptr<p2p::ListenerState> state) : state_(std::move(state)) {}
Listener::Listener(Listener&&) noexcept = default;
Listener& Listener::operator=(Listener&&) noexcept = default;
Listener::~Listener() = default;
const Handle& Listener::handle() const noexcept {
  return state_->handle();
}
std::unique_ptr<RecvComm> Listener::accept() {
  return state_->accept();
}
void Listener::close() {
  state_->close();
}
ListenerStats Listener::stats() const {
  return state_->stats();
}

Connector::Connector(std::shared_ptr<p2p::ConnectorState> state) : state_(std::move(state)) {}
Connector::Connector(Connector&&) noexcept = default;
Connector& Connector::operator=(Connector&&) noexcept = default;
Connector::~Connector() = default;
std::unique_ptr<SendComm> Connector::poll() {
  return state_->poll();
}

// ---- context ----

std::vector<ProviderSetting> recommended_provider_settings(const Config& config) {
  return ofi::recommended_settings(config);
}

std::size_t remove_process_leftovers(int pid) noexcept {
  return ofi::remove_process_leftovers(pid);
}

Context::Context(const Config& config) : core_(std::make_shared<p2p::ContextCore>(config)) {}
Context::~Context() = default;

Listener Context::listen() {
  return Listener(std::make_shared<p2p::ListenerState>(core_));
}

Connector Context::connect(const Handle& handle, std::uint64_t label) {
  return Connector(
      std::make_shared<p2p::ConnectorState>(core_, handle, p2p::ConnectionKind::kTwoSided, label));
}

Region Context::register_memory(const void* data, std::size_t size, MemoryType type, int device) {
  return {core_, core_->register_region(data, size, type, device)};
}

Region::Region(Region&& other) noexcept
    : core_(std::move(other.core_)), handle_(std::exchange(other.handle_, MemoryRegion{})) {}

Region& Region::operator=(Region&& other) noexcept {
  if (this != &other) {
    reset();
    core_ = std::move(other.core_);
    handle_ = std::exchange(other.handle_, MemoryRegion{});
  }
  return *this;
}

Region::~Region() {
  reset();
}

void Region::reset() noexcept {
  if (core_ && handle_.valid()) core_->deregister_region(handle_);
  handle_ = MemoryRegion{};
  core_.reset();
}

const Config& Context::config() const noexcept {
  return core_->config();
}

std::vector<NicDescription> Context::nics() const {
  std::vector<NicDescription> out;
  const auto& localities = core_->localities();
  for (std::size_t i = 0; i < core_->nics().size(); ++i) {
    const auto& a = core_->nics()[i]->attributes();
    std::string dmabuf_note = core_->nics()[i]->dmabuf_note();
    const bool dmabuf = dmabuf_note.empty();
    out.push_back(
        {.name = a.domain,
         .provider = a.provider,
         .fabric = a.fabric,
         .address = a.address,
         .endpoint_mr = a.endpoint_mr,
         .locality = i < localities.size() ? localities[i] : std::string(),
         .device_memory = a.device_memory,
         .device_memory_note = a.device_memory_note,
         .dmabuf = dmabuf,
         .dmabuf_note = std::move(dmabuf_note),
         .link_speed_mbps = a.link_speed_bps / 1'000'000,
         .max_message_size = p2p::max_message_size(a.max_msg_size),
         .eager_max = p2p::eager_limit(core_->config().eager_max, a.max_msg_size,
                                       core_->config().peer_isolation ? a.peer_paced_above : 0),
         .lanes_per_direction = a.lanes_per_direction});
  }
  return out;
}

ContextStats Context::stats() const {
  const mux::RegistryStats registry = core_->lanes().stats();
  ContextStats stats;
  stats.lanes_opened = registry.lanes_opened;
  stats.closing_lanes = registry.closing;
  for (const auto& lane : registry.lanes) {
    LaneDescription description{
        .id = lane.id,
        .peers = lane.peers,
        .comms = lane.comms[0] + lane.comms[1],
        .send_comms = lane.comms[static_cast<std::size_t>(mux::Direction::kSend)],
        .recv_comms = lane.comms[static_cast<std::size_t>(mux::Direction::kRecv)],
        .retired = lane.retired,
        .endpoints = lane.endpoints,
        .registrations = lane.registration_table.registrations + lane.shared_region_registrations,
        .registered_bytes = lane.registration_table.bytes + lane.shared_region_bytes,
        .registrations_shared = lane.registration_table.hits,
        .registrations_made = lane.registration_table.misses,
        .context_regions = lane.shared_regions,
        .carried_control = lane.carried_control,
        .eager_buffers = lane.eager_buffers,
        .eager_buffers_posted = lane.eager_buffers_posted,
        .rails = {}};
    for (const auto& rail : lane.rails) {
      description.rails.push_back(RailDescription{.nic = rail.nic,
                                                  .data = rail.data,
                                                  .bytes_sent = rail.bytes_sent,
                                                  .bytes_written = rail.bytes_written,
                                                  .bytes_read = rail.bytes_read});
    }
    stats.lanes.push_back(std::move(description));
  }
  for (const auto& [nic, count] : registry.endpoints_per_nic) {
    stats.endpoints_per_nic.emplace_back(nic, count);
  }
  return stats;
}

}  // namespace loom
