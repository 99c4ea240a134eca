// The public classes of include/loom/rma.hpp, forwarding to p2p/rma_comm.hpp.
#include "loom/rma.hpp"
#include "p2p/context_core.hpp"
#include "p2p/handshake.hpp"
#include "p2p/rma_comm.hpp"

namespace loom {
namespace {
const std::string kClosed = "the connection is closed";
}

RmaInitiator::RmaInitiator(CommKey /*key*/, std::shared_ptr<p2p::ContextCore> context,
                           std::unique_ptr<p2p::Comm> comm)
    : context_(std::move(context)), comm_(std::move(comm)) {}

RmaInitiator::~RmaInitiator() {
  close();
}

namespace {
p2p::RmaInitiatorImpl& initiator(const std::unique_ptr<p2p::Comm>& comm) {
  return static_cast<p2p::RmaInitiatorImpl&>(*comm);
}
p2p::RmaTargetImpl& target(const std::unique_ptr<p2p::Comm>& comm) {
  return static_cast<p2p::RmaTargetImpl&>(*comm);
}
}  // namespace

RemoteRegion RmaInitiator::import_region(std::span<const std::byte> descriptor) {
  if (!comm_) throw Error("import region", "", 0, kClosed);
  return initiator(comm_).import_region(descriptor);
}

void RmaInitiator::forget(RemoteRegion region) {
  if (comm_) initiator(comm_).forget(region);
}

Posted RmaInitiator::write(std::span<const RmaBlock> blocks,
                           std::optional<Notification> notification, NotifyProtocol protocol) {
  if (!comm_) return {Status::kInvalid, {}};
  p2p::Request* request = nullptr;
  const Status status =
      initiator(comm_).post(p2p::RequestKind::kWrite, blocks, notification, request, protocol);
  return {status, status == Status::kOk ? comm_->handle_of(*request) : Request{}};
}

Posted RmaInitiator::read(std::span<const RmaBlock> blocks) {
  if (!comm_) return {Status::kInvalid, {}};
  p2p::Request* request = nullptr;
  const Status status = initiator(comm_).post(p2p::RequestKind::kRead, blocks, std::nullopt,
                                              request, NotifyProtocol::kAfterCompletion);
  return {status, status == Status::kOk ? comm_->handle_of(*request) : Request{}};
}

Status RmaInitiator::test(Request request) {
  if (!comm_) return Status::kInvalid;
  return comm_->test(request, {});
}

Status RmaInitiator::wait(Request request, std::chrono::milliseconds timeout) {
  if (!comm_) return Status::kInvalid;
  return comm_->wait(request, {}, timeout);
}

void RmaInitiator::close() {
  if (comm_) p2p::Comm::close(std::move(comm_));
  context_.reset();
}

const std::string& RmaInitiator::last_error() const noexcept {
  return comm_ ? comm_->last_error() : kClosed;
}

RmaStats RmaInitiator::stats() const {
  return comm_ ? initiator(comm_).rma_stats() : RmaStats{};
}

std::uint64_t RmaInitiator::label() const noexcept {
  return comm_ ? comm_->label() : 0;
}

RmaTarget::RmaTarget(CommKey /*key*/, std::shared_ptr<p2p::ContextCore> context,
                     std::unique_ptr<p2p::Comm> comm)
    : context_(std::move(context)), comm_(std::move(comm)) {}

RmaTarget::~RmaTarget() {
  close();
}

std::vector<std::byte> RmaTarget::export_region(const MemoryRegion& region) {
  if (!comm_) throw Error("export region", "", 0, kClosed);
  return target(comm_).export_region(region);
}

std::optional<Notification> RmaTarget::poll() {
  if (!comm_) return std::nullopt;
  return target(comm_).poll_notification();
}

void RmaTarget::close() {
  if (comm_) p2p::Comm::close(std::move(comm_));
  context_.reset();
}

const std::string& RmaTarget::last_error() const noexcept {
  return comm_ ? comm_->last_error() : kClosed;
}

RmaStats RmaTarget::stats() const {
  return comm_ ? target(comm_).rma_stats() : RmaStats{};
}

std::uint64_t RmaTarget::label() const noexcept {
  return comm_ ? comm_->label() : 0;
}

RmaConnector::RmaConnector(std::shared_ptr<p2p::ConnectorState> state) : state_(std::move(state)) {}
RmaConnector::RmaConnector(RmaConnector&&) noexcept = default;
RmaConnector& RmaConnector::operator=(RmaConnector&&) noexcept = default;
RmaConnector::~RmaConnector() = default;
std::unique_ptr<RmaInitiator> RmaConnector::poll() {
  return state_->poll_rma();
}

std::unique_ptr<RmaTarget> Listener::accept_rma() {
  return state_->accept_rma();
}

RmaConnector Context::connect_rma(const Handle& handle, std::uint64_t label) {
  return RmaConnector(
      std::make_shared<p2p::ConnectorState>(core_, handle, p2p::ConnectionKind::kOneSided, label));
}

}  // namespace loom
