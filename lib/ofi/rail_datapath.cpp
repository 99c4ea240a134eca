// Rail data path: posting operations and reading completions. No allocation, no lock of ours,
// no logging above trace on success; failures are logged once here, where they are decided.
#include <rdma/fabric.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <algorithm>
#include <cstdlib>

#include "ofi/error.hpp"
#include "ofi/memory_registration.hpp"
#include "ofi/nic.hpp"
#include "ofi/rail.hpp"
#include "util/log.hpp"

namespace loom::ofi {

Status Rail::post_failed(const char* call, long rc) {
  if (rc == -FI_EAGAIN) return Status::kRetry;
  ++stats_.errors;
  last_error_ = std::string(call) + " on " + describe() + ": " + fi_error_text(rc);
  util::log().error("{}", last_error_);
  return Status::kError;
}

Status Rail::send(Address peer, const void* buffer, std::size_t length, void* desc,
                  OpContext* op) {
  long rc = fi_send(endpoint_.get(), buffer, length, desc, peer, op);
  if (rc != 0) [[unlikely]] return post_failed("fi_send", rc);
  stats_.bytes_sent += length;
  return Status::kOk;
}

Status Rail::inject(Address peer, const void* buffer, std::size_t length) {
  long rc = fi_inject(endpoint_.get(), buffer, length, peer);
  if (rc != 0) [[unlikely]] return post_failed("fi_inject", rc);
  stats_.bytes_sent += length;
  return Status::kOk;
}

Status Rail::recv(void* buffer, std::size_t length, void* desc, OpContext* op) {
  long rc = fi_recv(endpoint_.get(), buffer, length, desc, FI_ADDR_UNSPEC, op);
  if (rc != 0) [[unlikely]] return post_failed("fi_recv", rc);
  return Status::kOk;
}

Status Rail::tagged_send(Address peer, const void* buffer, std::size_t length, void* desc,
                         std::uint64_t tag, std::uint32_t data, OpContext* op) {
  long rc = fi_tsenddata(endpoint_.get(), buffer, length, desc, data, peer, tag, op);
  if (rc != 0) [[unlikely]] return post_failed("fi_tsenddata", rc);
  stats_.bytes_sent += length;
  return Status::kOk;
}

Status Rail::tagged_recv(void* buffer, std::size_t length, void* desc, std::uint64_t tag,
                         std::uint64_t ignore, OpContext* op) {
  long rc = fi_trecv(endpoint_.get(), buffer, length, desc, FI_ADDR_UNSPEC, tag, ignore, op);
  if (rc != 0) [[unlikely]] return post_failed("fi_trecv", rc);
  return Status::kOk;
}

Status Rail::write(Address peer, const void* buffer, std::size_t length, void* desc,
                   std::uint64_t remote_address, std::uint64_t key, std::uint32_t data,
                   OpContext* op) {
  long rc = fi_writedata(endpoint_.get(), buffer, length, desc, data, peer, remote_address, key,
                         op);
  if (rc != 0) [[unlikely]] return post_failed("fi_writedata", rc);
  stats_.bytes_written += length;
  return Status::kOk;
}

Status Rail::read(Address peer, void* buffer, std::size_t length, void* desc,
                  std::uint64_t remote_address, std::uint64_t key, OpContext* op) {
  long rc = fi_read(endpoint_.get(), buffer, length, desc, peer, remote_address, key, op);
  if (rc != 0) [[unlikely]] return post_failed("fi_read", rc);
  stats_.bytes_read += length;
  return Status::kOk;
}

Status Rail::flush(const MemoryRegistration& registration, const void* address,
                   std::size_t length, OpContext* op) {
  length = std::min(length, FlushBuffer::kBytes);
  if (!registration.covers_rail(index_) || !registration.contains(address, length)) {
    ++stats_.errors;
    last_error_ = "flush on " + describe() + ": the buffer is not registered on this rail";
    return Status::kInvalid;
  }
  return read(self_, flush_->data(), length, flush_->registration().desc(index_),
              registration.remote_address(address), registration.key(index_), op);
}

Status Rail::cancel(OpContext* op) noexcept {
  long rc = fi_cancel(&endpoint_->fid, op);
  return rc == 0 ? Status::kOk : post_failed("fi_cancel", rc);
}

std::size_t Rail::progress() {
  fi_cq_tagged_entry entries[kCqBatch];
  long count = fi_cq_read(cq_.get(), entries, kCqBatch);
  if (count == -FI_EAGAIN) return 0;
  if (count == -FI_EAVAIL) [[unlikely]] {
    read_error_entry();
    return 1;
  }
  if (count < 0) [[unlikely]] {
    post_failed("fi_cq_read", count);
    return 0;
  }
  stats_.completions += static_cast<std::uint64_t>(count);
  for (long i = 0; i < count; ++i) {
    const fi_cq_tagged_entry& entry = entries[i];
    auto* op = static_cast<OpContext*>(entry.op_context);
    const bool remote_data = (entry.flags & FI_REMOTE_CQ_DATA) != 0;
    const bool credit = !rx_cq_data_credits_.empty() && op >= rx_cq_data_credits_.data() &&
                        op < rx_cq_data_credits_.data() + rx_cq_data_credits_.size();
    // A remote write is told by its flags: its op_context is not ours (NULL on most providers,
    // garbage on shm 1.17), unless it consumed a receive posted for FI_RX_CQ_DATA.
    if ((entry.flags & FI_REMOTE_WRITE) != 0 || op == nullptr || credit) {
      if (credit) recv(nullptr, 0, nullptr, op);
      if (remote_data && remote_writes_ != nullptr) {
        remote_writes_->on_remote_write(entry.data);
      } else {
        ++stats_.stray_remote_writes;
        util::log().warn("{}: completion without a context (flags {:#x}) dropped", describe(),
                         entry.flags);
      }
      continue;
    }
    Completion completion{.status = Status::kOk,
                          .has_data = remote_data,
                          .tag = entry.tag,
                          .data = entry.data,
                          .length = entry.len};
    op->handler->on_completion(*op, completion);
  }
  return static_cast<std::size_t>(count);
}

void Rail::read_error_entry() {
  fi_cq_err_entry error{};
  long rc = fi_cq_readerr(cq_.get(), &error, 0);
  if (rc < 0) {
    if (rc != -FI_EAGAIN) post_failed("fi_cq_readerr", rc);
    return;
  }
  ++stats_.errors;
  // Some providers (shm in 1.17) report err negated; the code is the same either way.
  const int code = std::abs(error.err);
  char provider_text[256] = {};
  const char* detail =
      fi_cq_strerror(cq_.get(), error.prov_errno, error.err_data, provider_text,
                     sizeof provider_text);
  std::string text = describe() + ": " + fi_strerror(code) + " (" +
                     std::string(detail != nullptr ? detail : "") + ")";
  Status status = code == FI_ECANCELED ? Status::kCancelled
                  : code == FI_ETRUNC  ? Status::kTruncated
                                       : Status::kError;
  auto* op = static_cast<OpContext*>(error.op_context);
  if (op == nullptr || op->handler == nullptr) {
    util::log().error("error completion without a context: {}", text);
    return;
  }
  if (status == Status::kError) util::log().debug("error completion: {}", text);
  Completion completion{.status = status,
                        .has_data = (error.flags & FI_REMOTE_CQ_DATA) != 0,
                        .tag = error.tag,
                        .data = error.data,
                        .length = error.len,
                        .overflow = error.olen,
                        .error_text = text};
  op->handler->on_completion(*op, completion);
}

}  // namespace loom::ofi
