#include "ofi/completion_queue.hpp"

#include <cstdlib>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_eq.h>

#include "ofi/error.hpp"
#include "ofi/nic.hpp"
#include "providers/profile.hpp"
#include "util/log.hpp"
#include "util/step_trace.hpp"

namespace loom::ofi {
namespace {

// Errors by which a provider says the peer went away (rxm and sockets over a connection the
// peer reset or closed).
bool connection_lost(int code) {
  return code == FI_ECONNRESET || code == FI_ECONNREFUSED || code == FI_ECONNABORTED ||
         code == FI_ENOTCONN || code == EPIPE || code == FI_EHOSTUNREACH;
}

// What `code` means where the provider uses it for a peer that exited (see its profile).
const char* peer_gone(const providers::Profile& profile, int code) {
  for (const providers::PeerGoneError& error : profile.peer_gone_errors)
    if (error.code == code) return error.meaning;
  return nullptr;
}

}  // namespace

std::size_t clamp_cq_size(const NicAttributes& nic, std::size_t wanted) {
  if (nic.max_cq_entries == 0 || wanted <= nic.max_cq_entries) return wanted;
  util::log().info("completion queue on {} clamped to the device's limit: {} -> {} entries",
                   nic.domain, wanted, nic.max_cq_entries);
  return nic.max_cq_entries;
}

CompletionQueue::CompletionQueue(Nic& nic, std::size_t size)
    : nic_(&nic), rx_cq_data_(nic.attributes().rx_cq_data) {
  fi_cq_attr attr{};
  attr.format = FI_CQ_FORMAT_TAGGED;
  // The sum of the depths of every rail sharing the queue may pass what the device allows
  // (verbs' max_cqe), and fi_cq_open would then fail the lane.
  attr.size = clamp_cq_size(nic.attributes(), size);
  attr.wait_obj = FI_WAIT_NONE;
  fid_cq* cq = nullptr;
  if (int rc = fi_cq_open(nic.domain(), &attr, &cq, nullptr); rc != 0) {
    throw_fi_error("open completion queue on " + nic.attributes().domain, "fi_cq_open",
                   nic.attributes().provider, rc);
  }
  cq_.reset(cq);
}

CompletionQueue::~CompletionQueue() = default;

std::size_t CompletionQueue::progress() {
  if (dispatching_) return 0;
  const struct Dispatching {
    bool& flag;
    explicit Dispatching(bool& f) : flag(f) { flag = true; }
    ~Dispatching() { flag = false; }
  } dispatching(dispatching_);
  fi_cq_tagged_entry entries[kBatch];
  const long count = fi_cq_read(cq_.get(), entries, kBatch);
  if (count == -FI_EAGAIN) return 0;
  return dispatch(entries, count);
}

std::size_t CompletionQueue::dispatch(const fi_cq_tagged_entry* entries, long count) {
  if (count == -FI_EAVAIL) [[unlikely]] {
    read_error_entry();
    return 1;
  }
  if (count < 0) [[unlikely]] {
    // Read again at every poll: a CQ that stays broken must not flood the log.
    if (read_errors_.admit()) {
      util::log().error("fi_cq_read on {} [{}]: {}{}", nic_->attributes().domain,
                        nic_->attributes().provider, fi_error_text(count), read_errors_.suffix());
    }
    return 0;
  }
  util::record_step(util::Step::kCqEntries);
  for (long i = 0; i < count; ++i) {
    const fi_cq_tagged_entry& entry = entries[i];
    auto* op = static_cast<OpContext*>(entry.op_context);
    const bool remote_data = (entry.flags & FI_REMOTE_CQ_DATA) != 0;
    const Completion completion{.status = Status::kOk,
                                .has_data = remote_data,
                                .tag = entry.tag,
                                .data = entry.data,
                                .length = entry.len};
    // A remote write is told by its flags: its op_context is not ours (NULL on most providers,
    // garbage on shm 1.17), unless it consumed a receive posted for FI_RX_CQ_DATA, whose owner
    // posts it again before the data is handed on.
    if ((entry.flags & FI_REMOTE_WRITE) != 0 || op == nullptr) {
      if (rx_cq_data_ && op != nullptr) op->handler->on_completion(*op, completion);
      if (remote_data && remote_writes_ != nullptr) {
        remote_writes_->on_remote_write(entry.data);
      } else {
        util::log().warn("CQ on {}: completion without a context (flags {:#x}) dropped",
                         nic_->attributes().domain, entry.flags);
      }
      continue;
    }
    op->handler->on_completion(*op, completion);
  }
  return static_cast<std::size_t>(count);
}

void CompletionQueue::read_error_entry() {
  fi_cq_err_entry error{};
  const long rc = fi_cq_readerr(cq_.get(), &error, 0);
  if (rc < 0) {
    if (rc != -FI_EAGAIN && read_errors_.admit()) {
      util::log().error("fi_cq_readerr on {} [{}]: {}{}", nic_->attributes().domain,
                        nic_->attributes().provider, fi_error_text(rc), read_errors_.suffix());
    }
    return;
  }
  // Some providers (shm in 1.17) report err negated; the code is the same either way.
  const int code = std::abs(error.err);
  auto* op = static_cast<OpContext*>(error.op_context);
  if (code == FI_ECANCELED) {
    // Cancelling a posted receive is routine (every rendezvous message cancels its eager
    // receive): no text to build.
    if (op != nullptr && op->handler != nullptr) {
      op->handler->on_completion(*op, Completion{.status = Status::kCancelled});
    }
    return;
  }
  char provider_text[256] = {};
  const char* detail = fi_cq_strerror(cq_.get(), error.prov_errno, error.err_data, provider_text,
                                      sizeof provider_text);
  const char* gone = peer_gone(nic_->profile(), code);
  const std::string text = nic_->attributes().domain + " [" + nic_->attributes().provider +
                           "]: " + fi_strerror(code) + " (" +
                           std::string(detail != nullptr ? detail : "") + ")" +
                           (gone != nullptr ? std::string(": ") + gone : std::string());
  const Status status = code == FI_ETRUNC                          ? Status::kTruncated
                        : connection_lost(code) || gone != nullptr ? Status::kPeerError
                                                                   : Status::kError;
  if (op == nullptr || op->handler == nullptr) {
    if (orphan_errors_.admit()) {
      util::log().error("error completion without a context: {}{}", text, orphan_errors_.suffix());
    }
    return;
  }
  if (status == Status::kError) util::log().debug("error completion: {}", text);
  const Completion completion{.status = status,
                              .has_data = (error.flags & FI_REMOTE_CQ_DATA) != 0,
                              .tag = error.tag,
                              .data = error.data,
                              .length = error.len,
                              .overflow = error.olen,
                              .error_text = text};
  op->handler->on_completion(*op, completion);
}

}  // namespace loom::ofi
